"""``python -m ftnb``: the same as the ``ftnb`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
