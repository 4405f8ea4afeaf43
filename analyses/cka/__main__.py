"""``python -m analyses.cka``: :func:`analyses.cka.main`."""

import sys

from analyses.cka import main

if __name__ == "__main__":
    sys.exit(main())
