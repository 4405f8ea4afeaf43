"""The fine-tuning experiment's table (DESIGN.md Q8, :func:`analyses.finetune.run_pooling_experiment`):
its baseline, summary and paired-difference rows, and the readers of it.

Besides the standard columns (``docs/TABLES.md``, section ``finetune_pooling``), a row is about one
``pooling`` (a token choice of :mod:`analyses.finetune._poolings`: ``cls``, ``mean``, ``sep1``, ...) in
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

from analyses.stats import DEFAULT_RESAMPLES, check_confidence, check_resamples, group_codes
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


def seed_document_ci(a: np.ndarray, b: np.ndarray | None, docs: np.ndarray, n_resamples: int = DEFAULT_RESAMPLES,
                     confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float, float]:
    """Two-stage bootstrap of a fine-tuned accuracy (``b`` None) or of a paired difference over training seeds
    and documents: ``(point, low, high, se)``.

    a: (n_items, S) correctness of side A per training seed (each averaged over repeats), S >= 1 (with one seed
    the seed stage draws that seed every time: a bootstrap over documents alone); b: (n_items,
    S) for a side fine-tuned with the same seeds (resampled with the same draw: runs of one seed share their
    data order) or (n_items, 1) for the frozen probe. Each resample draws S seeds with replacement, then the
    documents with replacement; its statistic is the item-weighted mean over the drawn documents' items of
    (A's mean over the drawn seeds − B's). So the interval holds the randomness of training (the head's
    initialisation, dropout, batch order) beside the sampling of test documents, which a bootstrap over
    documents of seed-averaged items leaves out. With few seeds the seed stage is crude (it draws from S
    values) and errs narrow. ``se``: the standard deviation of the resampled statistics.

    >>> a = np.array([[1., 0.], [1., 0.], [1., 0.], [1., 0.]])  # seed 0 gets every item right, seed 1 none
    >>> point, lo, hi, se = seed_document_ci(a, None, np.arange(4), n_resamples=200)
    >>> point, lo, hi
    (0.5, 0.0, 1.0)
    """
    a = np.asarray(a, dtype=float)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"a must be (n_items, seeds) with at least 1 seed, got shape {a.shape}")
    n, n_seeds = a.shape
    if b is not None:
        b = np.asarray(b, dtype=float)
        if b.ndim != 2 or b.shape[0] != n or b.shape[1] not in (1, n_seeds):
            raise ValueError(f"b must be (n_items, {n_seeds}) or (n_items, 1) beside a {a.shape}, got {b.shape}")
    if not (np.isfinite(a).all() and (b is None or np.isfinite(b).all())):
        raise ValueError("correctness must be finite: every item predicted by every seed")
    confidence = check_confidence(confidence)
    n_resamples = check_resamples(n_resamples, confidence)
    codes, n_docs = group_codes(docs, n)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_seeds, size=(n_resamples, n_seeds))
    weight = np.zeros((n_resamples, n_seeds))
    np.add.at(weight, (np.arange(n_resamples)[:, None], draws), 1.0 / n_seeds)
    per_item = a @ weight.T  # (n_items, resamples): A's mean over each resample's seeds
    point = a.mean(axis=1)
    if b is not None:
        per_item = per_item - (b @ weight.T if b.shape[1] == n_seeds else b)
        point = point - b.mean(axis=1)
    doc_sums = np.zeros((n_docs, n_resamples))
    np.add.at(doc_sums, codes, per_item)
    counts = np.bincount(codes, minlength=n_docs).astype(float)
    mult = rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=n_resamples).astype(float)
    stats = (mult * doc_sums.T).sum(axis=1) / (mult @ counts)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(point.mean()), float(lo), float(hi), float(stats.std(ddof=1))


def summary_rows(base: Mapping, poolings: Sequence[str], item: pd.DataFrame, runs: pd.DataFrame, best: float,
                 warn: Callable[[str], None], by_seed: Mapping[tuple[str, str], pd.DataFrame] | None = None, *,
                 n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> list[dict]:
    """Per pooling and condition, the accuracy over all out-of-fold test items.

    ``item``: per (pooling, condition, example) the item's correctness averaged over seeds and repeats
    (``correct``) and its document (``doc``); ``runs``: the per-run accuracy rows; ``best``: the pooled
    best constant. ``value`` = mean correctness, ``ci_low``/``ci_high`` a cluster bootstrap over
    documents (:func:`analyses.stats.bootstrap_ci`), ``sd`` over runs, ``n_runs``, ``n`` = items;
    ``warning`` when below ``best`` (also passed to ``warn``) or when runs did not converge.
    ``by_seed``: per (pooling, condition) the items' correctness per training seed (examples × seeds, in
    ``item``'s order), given for the fine-tuned sides when there are several seeds: their CI is then
    :func:`seed_document_ci` over seeds and documents, and ``ci_seeds`` says over how many seeds. Every CI
    draws ``n_resamples`` resamples from ``seed`` (the row's ``n_resamples``)."""
    from analyses.stats import bootstrap_ci

    n_resamples = check_resamples(n_resamples)
    rows = []
    for p in poolings:
        for condition in ("frozen", "fine_tuned"):
            it = item.loc[(p, condition)]
            extra = {}
            if by_seed is not None and (p, condition) in by_seed:
                per_seed = by_seed[(p, condition)].loc[it.index]
                point, lo, hi, _ = seed_document_ci(per_seed.to_numpy(float), None, it["doc"].to_numpy(),
                                                    n_resamples=n_resamples, seed=seed)
                extra["ci_seeds"] = per_seed.shape[1]
            else:
                point, lo, hi = bootstrap_ci(it["correct"].to_numpy(float), it["doc"].to_numpy(), "mean",
                                             n_resamples=n_resamples, seed=seed)
            acc = runs[(runs["pooling"] == p) & (runs["condition"] == condition)]
            problems = [f"{(~acc['converged'].astype(bool)).sum()} of {len(acc)} runs did not converge"] \
                if not acc["converged"].astype(bool).all() else []
            if point < best:
                problems.insert(0, f"accuracy {point:.3f} below the best constant {best:.3f}")
                warn(f"Q8 {condition} {p}: {problems[0]}")
            rows.append({**base, "pooling": p, "condition": condition, "metric": SUMMARY_METRICS[condition],
                         "value": point, "ci_low": lo, "ci_high": hi, "n_resamples": n_resamples, "n": len(it),
                         "n_runs": len(acc),
                         "sd": float(acc["value"].std(ddof=1)) if len(acc) > 1 else math.nan,
                         "warning": "; ".join(problems), **extra})
    return rows


def diff_rows(base: Mapping, poolings: Sequence[str], item: pd.DataFrame, ref: str,
              by_seed: Mapping[tuple[str, str], pd.DataFrame] | None = None, *, n_resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> list[dict]:
    """``accuracy_diff`` rows, paired per test item (:func:`analyses.stats.paired_difference`, clusters =
    documents), Holm-adjusted over all of them (``p_holm``): per pooling fine-tuned − frozen, then per
    condition each pooling − ``ref``. ``item`` and ``by_seed`` as in :func:`summary_rows`: where a side is
    fine-tuned with several seeds, the CI, ``se`` and ``mde`` come from :func:`seed_document_ci` (seeds and
    documents; ``ci_seeds``), the p-value still from the sign-flip test of the seed-averaged items. Every CI and
    p-value draws ``n_resamples`` resamples from ``seed``."""
    from analyses.stats import add_holm, minimum_detectable_effect, paired_difference

    n_resamples = check_resamples(n_resamples)
    pairs = [((p, "fine_tuned"), (p, "frozen")) for p in poolings]
    pairs += [((p, c), (ref, c)) for c in ("fine_tuned", "frozen") for p in poolings if p != ref]
    rows = []
    for (pa, ca), (pb, cb) in pairs:
        j = item.loc[(pa, ca)].add_suffix("_a").join(item.loc[(pb, cb)].add_suffix("_b"), how="inner")
        r = paired_difference(j["correct_a"].to_numpy(float), j["correct_b"].to_numpy(float), j["doc_a"].to_numpy(),
                              n_resamples=n_resamples, seed=seed)
        if by_seed is not None and (pa, ca) in by_seed:
            side_a = by_seed[(pa, ca)].loc[j.index].to_numpy(float)
            side_b = (by_seed[(pb, cb)].loc[j.index].to_numpy(float) if (pb, cb) in by_seed
                      else j[["correct_b"]].to_numpy(float))
            _, lo, hi, se = seed_document_ci(side_a, side_b, j["doc_a"].to_numpy(), n_resamples=n_resamples, seed=seed)
            r.update(ci_low=lo, ci_high=hi, se=se, mde=minimum_detectable_effect(se), ci_seeds=side_a.shape[1])
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
    if "ci_seeds" in df.columns:  # only with several training seeds (their CIs resample the seeds)
        df["ci_seeds"] = pd.to_numeric(df["ci_seeds"]).astype("Int64")
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
