"""``python -m probing.study CONFIG``: run a study (see :mod:`probing.study.runner`)."""

import sys

from .runner import main

sys.exit(main())
