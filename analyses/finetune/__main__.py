"""``python -m analyses.finetune``: :func:`analyses.finetune.main`."""

import sys

from analyses.finetune import main

if __name__ == "__main__":
    sys.exit(main())
