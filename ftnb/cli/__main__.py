"""``python -m ftnb.cli``: the same as the ``ftnb`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
