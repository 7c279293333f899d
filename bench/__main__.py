"""``python -m bench``: see :mod:`bench.runner` and ``python -m bench --help``."""

import sys

from bench.runner import main

if __name__ == "__main__":
    sys.exit(main())
