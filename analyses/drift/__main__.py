"""``python -m analyses.drift``: :func:`analyses.drift.main`."""

import sys

from analyses.drift import main

if __name__ == "__main__":
    sys.exit(main())
