"""The fine-tuning experiment's table (DESIGN.md Q8, :func:`analyses.pooling.run_pooling_experiment`):
its baseline, summary and paired-difference rows, and the readers of it.

Besides the standard columns (``docs/TABLES.md``, section ``finetune_pooling``), a row is about one
``pooling`` (a token choice of :mod:`analyses.pooling_choices`: ``cls``, ``mean``, ``sep1``, ...) in
one ``condition`` (``fine_tuned`` or ``frozen``). ``role``, a stored token role in every other table,
is empty here. A paired difference (``metric="accuracy_diff"``) is side A − side B with both sides
named: A = (``pooling``, ``condition``), B = (``pooling_b``, ``condition_b``). Fine-tuned − frozen of
one pooling has ``pooling_b == pooling``; a pooling − the reference pooling has
``condition_b == condition``. The rows that depend on no pooling have ``pooling`` empty: the
baselines (``best_constant``, ``majority_baseline``, ``chance``) with ``condition="baseline"``, and
``n_skipped``.

>>> diff_label({"pooling": "cls", "condition": "frozen", "pooling_b": "mean", "condition_b": "frozen"})
'cls − mean (frozen)'
>>> diff_label({"pooling": "cls", "condition": "fine_tuned", "pooling_b": "cls", "condition_b": "frozen"})
'cls (fine_tuned − frozen)'
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.results import make_table

#: ``condition`` of the rows that score no model: the best constant, the training majority, chance.
BASELINE = "baseline"
#: ``metric`` of a run's test accuracy, and of the pooled summary over runs, per condition.
RUN_METRICS: dict[str, str] = {"fine_tuned": "test_accuracy", "frozen": "frozen_test_accuracy"}
SUMMARY_METRICS: dict[str, str] = {"fine_tuned": "test_accuracy_mean", "frozen": "frozen_test_accuracy_mean"}


def best_constant(y: np.ndarray, n_classes: int) -> float:
    """The largest class share of ``y: (n,)`` class indices (-1: a class unseen in training, which no
    constant predicts): the best accuracy a constant prediction reaches."""
    y = np.asarray(y)
    return float(np.bincount(y[y >= 0], minlength=n_classes).max() / len(y))


def baseline_rows(base: Mapping, y_test: np.ndarray, n_classes: int, majority: int | None = None) -> list[dict]:
    """The baseline rows of ``y_test: (n,)``: ``best_constant`` (:func:`best_constant`), with ``majority``
    (the training majority class) ``majority_baseline`` (its test accuracy), and ``chance`` (1 / number
    of classes); ``pooling`` empty, ``condition`` :data:`BASELINE`."""
    values = [("best_constant", best_constant(y_test, n_classes))]
    if majority is not None:
        values.append(("majority_baseline", float((np.asarray(y_test) == majority).mean())))
    values.append(("chance", 1.0 / n_classes))
    return [{**base, "pooling": None, "condition": BASELINE, "metric": m, "value": v, "n": int(len(y_test))}
            for m, v in values]


def summary_rows(base: Mapping, poolings: Sequence[str], item: pd.DataFrame, runs: pd.DataFrame, best: float,
                 warn: Callable[[str], None]) -> list[dict]:
    """Per pooling and condition, the accuracy over all out-of-fold test items.

    ``item``: per (pooling, condition, example) the item's correctness averaged over seeds and repeats
    (``correct``) and its document (``doc``); ``runs``: the per-run accuracy rows; ``best``: the pooled
    best constant. ``value`` = mean correctness, ``ci_low``/``ci_high`` a cluster bootstrap over
    documents (:func:`analyses.intervals.bootstrap_ci`), ``sd`` over runs, ``n_runs``, ``n`` = items;
    ``warning`` when below ``best`` (also passed to ``warn``) or when runs did not converge."""
    from analyses.intervals import bootstrap_ci

    rows = []
    for p in poolings:
        for condition in ("frozen", "fine_tuned"):
            it = item.loc[(p, condition)]
            point, lo, hi = bootstrap_ci(it["correct"].to_numpy(float), it["doc"].to_numpy(), "mean",
                                         n_resamples=1000, seed=0)
            acc = runs[(runs["pooling"] == p) & (runs["condition"] == condition)]
            problems = [f"{(~acc['converged'].astype(bool)).sum()} of {len(acc)} runs did not converge"] \
                if not acc["converged"].astype(bool).all() else []
            if point < best:
                problems.insert(0, f"accuracy {point:.3f} below the best constant {best:.3f}")
                warn(f"Q8 {condition} {p}: {problems[0]}")
            rows.append({**base, "pooling": p, "condition": condition, "metric": SUMMARY_METRICS[condition],
                         "value": point, "ci_low": lo, "ci_high": hi, "n": len(it), "n_runs": len(acc),
                         "sd": float(acc["value"].std(ddof=1)) if len(acc) > 1 else math.nan,
                         "warning": "; ".join(problems)})
    return rows


def diff_rows(base: Mapping, poolings: Sequence[str], item: pd.DataFrame, ref: str) -> list[dict]:
    """``accuracy_diff`` rows, paired per test item (:func:`analyses.paired.paired_difference`, clusters =
    documents), Holm-adjusted over all of them (``p_holm``): per pooling fine-tuned − frozen, then per
    condition each pooling − ``ref``. ``item`` as in :func:`summary_rows`."""
    from analyses.paired import add_holm, paired_difference

    pairs = [((p, "fine_tuned"), (p, "frozen")) for p in poolings]
    pairs += [((p, c), (ref, c)) for c in ("fine_tuned", "frozen") for p in poolings if p != ref]
    rows = []
    for (pa, ca), (pb, cb) in pairs:
        j = item.loc[(pa, ca)].add_suffix("_a").join(item.loc[(pb, cb)].add_suffix("_b"), how="inner")
        r = paired_difference(j["correct_a"].to_numpy(float), j["correct_b"].to_numpy(float), j["doc_a"].to_numpy(),
                              n_resamples=1000, seed=0)
        rows.append({**base, "pooling": pa, "condition": ca, "pooling_b": pb, "condition_b": cb,
                     "metric": "accuracy_diff", **r})
    return add_holm(pd.DataFrame(rows), ["metric"]).to_dict("records") if rows else []


def finish_table(rows: Sequence[Mapping]) -> pd.DataFrame:
    """The rows as a tidy table (:func:`analyses.results.make_table`) with stable dtypes, so a stored
    table reads back equal: NA (not None) where a column does not apply."""
    df = make_table(rows)
    df["converged"] = df["converged"].astype("boolean")
    df["warning"] = df["warning"].fillna("").astype(str)
    for col in ("role", "pooling", "pooling_b", "condition_b"):  # empty cells: NA, kept as such by Parquet
        df[col] = df[col].astype("string") if col in df.columns else pd.Series(pd.NA, index=df.index, dtype="string")
    for col in ("repeat", "fold", "epoch", "n_runs", "n_train"):
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    return df


def diff_label(r: Mapping) -> str:
    """An ``accuracy_diff`` row in words: ``cls − mean (frozen)``, or ``cls (fine_tuned − frozen)``."""
    if r["pooling"] == r["pooling_b"]:
        return f"{r['pooling']} ({r['condition']} − {r['condition_b']})"
    if r["condition"] == r["condition_b"]:
        return f"{r['pooling']} − {r['pooling_b']} ({r['condition']})"
    return f"{r['pooling']} {r['condition']} − {r['pooling_b']} {r['condition_b']}"


def pooled_baselines(df: pd.DataFrame) -> pd.Series:
    """``metric -> value`` of the rows over all test items that depend on no pooling: ``best_constant``,
    ``chance`` and ``n_skipped``."""
    rows = df[df["pooling"].isna() & df["fold"].isna()]
    return rows.set_index("metric")["value"]


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """The per-pooling summary rows as a small table: pooling, condition, mean, ci_low, ci_high (cluster
    bootstrap over documents), sd over runs, runs, warning."""
    s = df[df["metric"].isin(list(SUMMARY_METRICS.values()))]
    return pd.DataFrame({"pooling": s["pooling"].to_numpy(), "condition": s["condition"].to_numpy(),
                         "mean": s["value"].astype(float).to_numpy(), "ci_low": s["ci_low"].astype(float).to_numpy(),
                         "ci_high": s["ci_high"].astype(float).to_numpy(), "sd": s["sd"].astype(float).to_numpy(),
                         "runs": s["n_runs"].to_numpy(), "warning": s["warning"].fillna("").to_numpy()})
