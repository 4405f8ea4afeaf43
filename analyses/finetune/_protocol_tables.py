"""Tidy tables of the shared fine-tuning protocol's predictions: the accuracy of each set of runs, and paired
differences between them on the same test items.

A question declares its runs (:class:`analyses.finetune.RunSpec`: task, format, pooling, training size, seed,
frozen or not); :func:`protocol_table` reads the protocol's predictions table
(:func:`analyses.finetune.run_protocol`) back for those runs and writes, per **setting** (task, format, pooling,
training size, fine-tuned or frozen; the training seeds pooled):

* a ``majority`` row per task: the accuracy of always predicting the most frequent test label (chance);
* an ``accuracy`` row: the share of test items predicted right, averaged over the seeds, with a two-stage
  bootstrap interval (seeds, then documents: :func:`analyses.finetune.accuracy`);
* an ``accuracy_diff`` row for each setting against the **reference** of its kind (``compare="format"``: the
  same run with the reference format; ``"pooling"``: with the reference pooling), fine-tuned against fine-tuned
  and frozen against frozen, paired per test item (:func:`analyses.finetune.compare_runs`); and one for each
  fine-tuned setting against the frozen probe of the same setting (what fine-tuning adds).

Every difference is side A − side B (``value = value_a − value_b``), with the bootstrap standard error ``se``
the study's rules (:mod:`probing.study.rules`) turn into simultaneous intervals. The columns are documented in
docs/TABLES.md (``finetune_protocol``).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from analyses.finetune._protocol import RunSpec, accuracy, compare_runs
from analyses.results import make_table
from analyses.stats import DEFAULT_RESAMPLES

#: What the table compares each setting with: the format (Q6: where the classification token sits) or the
#: pooling (Q8: which tokens the head reads).
COMPARE = ("format", "pooling")
FINE_TUNED, FROZEN = "fine_tuned", "frozen"


def _setting(spec: RunSpec) -> tuple:
    return (spec.task, spec.format.split("=", 1)[0], spec.pooling, spec.n_train, spec.frozen)


def settings(specs: Iterable[RunSpec]) -> dict[tuple, list[RunSpec]]:
    """The runs of ``specs`` by setting ``(task, format, pooling, n_train, frozen)`` (first-seen order); a setting's
    runs differ only in their seed (and conditions)."""
    out: dict[tuple, list[RunSpec]] = {}
    for s in specs:
        runs = out.setdefault(_setting(s), [])
        if s.name not in [r.name for r in runs]:
            runs.append(s)
    return out


def run_where(runs: Sequence[RunSpec], condition: str = "clean") -> dict[str, Any]:
    """The selection of the predictions table that holds ``runs`` evaluated under ``condition``."""
    return {"run": sorted({r.name for r in runs}), "condition": condition}


def _facts(P: pd.DataFrame, where: Mapping[str, Any]) -> dict[str, Any]:
    """What the selected runs were: training items, epochs and optimiser steps (fine-tuned runs)."""
    sel = P[P["run"].isin(where["run"])]
    facts: dict[str, Any] = {"n_train": int(sel["n_train"].iloc[0])}
    for col in ("epochs", "steps"):
        if col in sel.columns and sel[col].notna().any():
            facts[col] = int(sel[col].dropna().iloc[0])
    return facts


def _interval(r: Mapping[str, Any], n_resamples: int) -> dict[str, Any]:
    return {"value": r["value"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "se": r["se"], "n": r["n_items"],
            "ci_seeds": r["n_seeds"] if r["n_seeds"] > 1 else pd.NA, "n_groups": r["n_groups"],
            "grouping": "document", "n_resamples": n_resamples}


def majority(P: pd.DataFrame, task: str) -> dict[str, Any]:
    """The accuracy of always predicting the most frequent label of ``task``'s test items (chance, the floor a
    fine-tuned model must clear to have learnt the task): ``value`` and ``n`` (test items)."""
    items = P[P["task"] == task].drop_duplicates("item")
    if items.empty:
        raise ValueError(f"the predictions hold no test item of task {task!r}")
    shares = items["label"].astype(str).value_counts(normalize=True)
    return {"value": float(shares.iloc[0]), "n": len(items), "n_groups": int(items["doc"].nunique())}


def protocol_table(P: pd.DataFrame, specs: Sequence[RunSpec], *, compare: str, reference: str,
                   analysis: str = "finetune_protocol", model: str = "", corpus: str = "",
                   n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """The accuracy and paired-difference rows of the runs ``specs`` (module docstring), read from ``P`` (the
    protocol's predictions). ``compare``: ``"format"`` or ``"pooling"``; ``reference``: the format or pooling
    every other one is compared with. A declared run missing from ``P`` is a ValueError naming it."""
    if compare not in COMPARE:
        raise ValueError(f"compare must be one of {COMPARE}, got {compare!r}")
    missing = sorted({s.name for s in specs} - set(P["run"]))
    if missing:
        raise ValueError(f"the predictions hold no run {missing[0]!r} ({len(missing)} declared run(s) missing)")
    by_setting = settings(specs)
    base = {"analysis": analysis, "model": model, "corpus": corpus, "seed": seed}
    rows = []
    where = {key: run_where(runs) for key, runs in by_setting.items()}

    def describe(key: tuple) -> dict[str, Any]:
        task, fmt, pooling, _, frozen = key
        return {"format": fmt, "target": task, "pooling": pooling, "condition": FROZEN if frozen else FINE_TUNED,
                **_facts(P, where[key])}

    for task in dict.fromkeys(k[0] for k in by_setting):
        rows.append({**base, "target": task, "metric": "majority", **majority(P, task)})
    for key in by_setting:
        r = accuracy(P, where[key], n_resamples=n_resamples, seed=seed)
        rows.append({**base, **describe(key), "metric": "accuracy", **_interval(r, n_resamples)})
    index = 1 if compare == "format" else 2
    for key in by_setting:
        pairs = []
        if key[index] != reference:
            ref = key[:index] + (reference,) + key[index + 1:]
            if ref in by_setting:
                pairs.append(ref)
        if not key[4] and key[:4] + (True,) in by_setting:
            pairs.append(key[:4] + (True,))
        for other in pairs:
            # compare_runs gives b − a: side A of the row is b
            r = compare_runs(P, where[other], where[key], n_resamples=n_resamples, seed=seed)
            b = describe(other)
            rows.append({**base, **describe(key), "metric": "accuracy_diff", "format_b": b["format"],
                         "pooling_b": b["pooling"], "condition_b": b["condition"], **_interval(r, n_resamples),
                         "value_a": r["value_b"], "value_b": r["value_a"]})
    return make_table(rows)
