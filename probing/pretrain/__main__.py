"""``python -m probing.pretrain CONFIG``: :func:`probing.pretrain.main`."""

import sys

from probing.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
