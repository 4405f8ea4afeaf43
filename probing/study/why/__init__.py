"""The "why" study (docs/WHY.md): BERT-like encoders pretrained here (:mod:`probing.pretrain`), one choice
changed at a time with several pretraining seeds, measured on held-out text with the seed questions' protocol.

``python -m probing.study.why [CONFIG]``; from Python :func:`run_why` with :func:`load_why_config`.
"""

from .cli import main
from .config import CONFIG_DIR, ROLES, WhyConfig, WhySettings, load_why_config, packaged_configs, parse_why_config
from .run import run_why
from .study import QUESTIONS, RULES, WhyResult, comparison_rows, model_runs, specs_for

__all__ = ["CONFIG_DIR", "QUESTIONS", "ROLES", "RULES", "WhyConfig", "WhyResult", "WhySettings", "comparison_rows",
           "load_why_config", "main", "model_runs", "packaged_configs", "parse_why_config", "run_why", "specs_for"]
