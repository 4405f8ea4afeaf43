"""``python -m probing.study.why [CONFIG]``: the why study (see :mod:`probing.study.why.cli`)."""

import sys

from .cli import main

sys.exit(main())
