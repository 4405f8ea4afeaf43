"""``python -m analyses.contextuality``: :func:`analyses.contextuality.main`."""

import sys

from analyses.contextuality import main

if __name__ == "__main__":
    sys.exit(main())
