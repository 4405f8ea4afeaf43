"""The why study's run: pretrain (or reuse) every run of a config, measure each model, decide, write the report."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from typing import Callable

from probing.study.rules import decide

from .config import WhyConfig
from .report import write_report
from .representation import measured_pairs, representation_predictions, representation_rows
from .study import (RULES, WhyResult, accuracy_table, answers, comparison_rows, measuring_tasks, model_runs,
                    predictions)

__all__ = ["run_why"]


def run_why(cfg: WhyConfig, *, force: bool = False, progress: bool = True, command: str = "",
            log: Callable[[str], None] = print) -> WhyResult:
    """Pretrain (or reuse) every run of ``cfg``, measure each model and write ``<out>/report.md`` and
    ``<out>/tables/``."""
    from probing.pretrain import TRAINING_RECORD, pretrain

    seconds = {}
    t0 = time.perf_counter()
    models = model_runs(cfg)
    finished = all((m.path / ("config.json" if m.step is not None else TRAINING_RECORD)).is_file() for m in models)
    if not finished:  # reading the corpus (pysbd) alone takes half a minute: only when a run is left to train
        pretrain(cfg.pretrain, progress=progress, log=log)
    seconds["pretraining"] = time.perf_counter() - t0
    missing = [str(m.path) for m in models if not (m.path / "config.json").is_file()]
    if missing:
        raise FileNotFoundError(f"the pretraining left no model at {missing[:3]}: a run writes its snapshots while it "
                                f"trains, so a run finished before [pretrain.train] snapshots was set has none (delete "
                                f"the run's directory to train it again)")
    t1 = time.perf_counter()
    tasks = measuring_tasks(cfg)  # read once: the protocol's tasks and the representation measures' pairs
    P = predictions(cfg, models, force=force, progress=progress, log=log, tasks=tasks)
    seconds["measuring"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    measured, replaced = measured_pairs(tasks["topic"].examples)
    R = representation_predictions(models, measured, replaced, Path(cfg.why.out) / "caches", device=cfg.why.device,
                                   progress=progress, log=log)
    shares, representation = representation_rows(R, cfg.why.bootstrap_resamples)
    seconds["representations"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    rows = decide(pd.concat([comparison_rows(P, cfg.pretrain.train.steps, cfg.why.bootstrap_resamples),
                             representation], ignore_index=True), RULES)
    acc = accuracy_table(P, cfg.why.bootstrap_resamples)
    seconds["comparisons"] = time.perf_counter() - t2
    result = WhyResult(Path(cfg.why.out), P, rows, acc, answers(rows, acc), seconds, shares)
    write_report(cfg, result, models, command=command)
    return result


