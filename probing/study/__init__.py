"""The study: a TOML config in, figures and a report out (``python -m probing.study CONFIG``).

This package is the top layer: it uses the foundation (:mod:`probing`: text -> cache), the analyses
(cache -> tables) and the figures (tables -> files); none of those imports it.

    from probing.study import run
    report = run("seed_questions", quick=True)   # path of report.md
"""

from __future__ import annotations

from .runner import (CONFIG_DIR, DEFAULT_CONFIG, QUESTIONS, StudyConfig, StudyError, config_path,  # noqa: F401
                     load_config, main, packaged_configs, run_limits, run_study, section_specs, sections, skip_counts,
                     study_jobs)


def run(config=DEFAULT_CONFIG, **options):
    """Run a study: ``config`` is a packaged name (``"seed_questions"``), a TOML path or None (the
    default study); ``options`` as :func:`probing.study.runner.run_study` takes them (``quick``,
    ``overrides``, ``force_analyses``, ``trust_remote_code``, ``log``). Returns the path of report.md."""
    return run_study(config, **options)
