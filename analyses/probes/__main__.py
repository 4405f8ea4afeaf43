"""``python -m analyses.probes``: :func:`analyses.probes.main`."""

import sys

from analyses.probes import main

if __name__ == "__main__":
    sys.exit(main())
