"""Paired comparisons of probes on the same out-of-fold items (the item tables of
:func:`analyses.probes.run_probes` with ``items=True``): :func:`compare_probes`.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from analyses.stats import check_resamples
from analyses.results import make_table
from analyses.stats import DETECTABLE_EFFECT, groups_needed, holm, paired_difference

#: Columns that identify one probe in the result and item tables.
ITEM_KEYS: tuple[str, ...] = ("model_kind", "model", "corpus", "format", "target", "layer", "choice")


def _describe(condition: Mapping[str, object]) -> str:
    return ",".join(f"{k}={v}" for k, v in condition.items())


def compare_probes(items: pd.DataFrame, a: Mapping[str, object], b: Mapping[str, object], *,
                   family: str | None = None, n_resamples: int = 2000, seed: int = 0,
                   confidence: float = 0.95) -> pd.DataFrame:
    """Paired differences between two sets of probes, on the same out-of-fold items.

    ``items``: the item table of :func:`run_probes` (``items=True``), possibly concatenated over
    caches (formats) of the same corpus. ``a`` / ``b``: column filters naming the two conditions,
    e.g. ``a={"choice": "cls"}, b={"choice": "mean"}`` (same cache), ``a={"format": "pair_cls_first"},
    b={"format": "pair_cls_last"}`` (two caches of the same examples: the same splits when the
    labels, groups and seed agree), ``a={"model_kind": "trained"}, b={"model_kind": "random_init"}``.
    Rows of ``a`` and ``b`` are matched on the :data:`ITEM_KEYS` not named in the filters (``model``
    is left out of the match too when ``model_kind`` is compared: a random-init model has its own
    label; a key empty on one side only, such as the layer of ``choice = "length_only"``, is not
    matched, so ``b={"choice": "length_only"}`` is compared with every layer of ``a``), then on
    ``example`` and ``token``; each matched cell (e.g. one layer x target) gives one
    row: :func:`analyses.stats.paired_difference` of ``correct`` (a − b; 0/1 accuracy, or per-item F1
    for multi-label targets) over the cell's items, clustered by ``group``.

    Returns a tidy table (``make_table``): the cell's keys, ``analysis = "probe_comparison"``,
    ``metric = "difference"``, ``condition_a`` / ``condition_b`` (the filters as ``k=v``),
    ``value``, ``ci_low``, ``ci_high``, ``p_value``, ``se``, ``mde``, ``n``, ``n_groups``, ``n_resamples``,
    ``groups_needed`` (groups that would detect :data:`analyses.stats.DETECTABLE_EFFECT`, by
    :func:`analyses.stats.groups_needed`), ``grouping``,
    ``same_folds`` (whether every matched item was in the same outer fold under both), ``family``
    (default ``"<a> vs <b>"``) and ``p_holm``: Holm-adjusted over all rows of this call, the declared
    family (:func:`analyses.stats.holm`). Raises ``ValueError`` when a filter names an unknown
    column or matches no row, when no item matches, or for fewer ``n_resamples`` than an interval needs
    (:func:`analyses.stats.check_resamples`).
    """
    n_resamples = check_resamples(n_resamples, confidence)
    for name, cond in (("a", a), ("b", b)):
        if not cond:
            raise ValueError(f"compare_probes: condition {name} is empty; give a column filter such as choice='cls'")
        unknown = [k for k in cond if k not in items.columns]
        if unknown:
            raise ValueError(f"compare_probes: condition {name}={dict(cond)} names unknown columns {unknown}; "
                             f"item columns: {list(items.columns)}")
    named = set(a) | set(b)
    on = [k for k in ITEM_KEYS if k not in named and not (k == "model" and "model_kind" in named)]

    def select(cond):
        mask = np.ones(len(items), dtype=bool)
        for k, v in cond.items():
            mask &= (items[k] == v).to_numpy(dtype=bool, na_value=False)
        return items[mask]

    A, B = select(a), select(b)
    for name, cond, part in (("a", a, A), ("b", b, B)):
        if part.empty:
            raise ValueError(f"compare_probes: condition {name}={dict(cond)} matches no item")
    cols = ["example", "token", "group", "fold", "correct", "grouping"]
    # A key empty on one side only (the layer of a length_only probe) is not matched: that side's
    # probe is compared with every cell of the other.
    empty_a = {k for k in on if A[k].isna().all()}
    empty_b = {k for k in on if B[k].isna().all()}
    shared = [k for k in on if (k in empty_a) == (k in empty_b)]
    keys = shared + ["example", "token"]
    merged = A[[k for k in on if k not in empty_a or k in empty_b] + cols].merge(
        B[[k for k in on if k not in empty_b or k in empty_a] + cols], on=keys, suffixes=("_a", "_b"))
    if merged.empty:
        raise ValueError(f"compare_probes: no item of a={dict(a)} matches one of b={dict(b)} on {keys}")
    bad = (merged["group_a"].astype(str) != merged["group_b"].astype(str))
    if bad.any():
        raise ValueError(f"compare_probes: {int(bad.sum())} matched items have different groups in a and b; "
                         "they are not the same items")
    family = family if family is not None else f"{_describe(a)} vs {_describe(b)}"
    rows = []
    for cell, part in merged.groupby(on, sort=False, dropna=False) if on else [((), merged)]:
        cell = cell if isinstance(cell, tuple) else (cell,)
        res = paired_difference(part["correct_a"].to_numpy(float), part["correct_b"].to_numpy(float),
                                part["group_a"].astype(str).to_numpy(), n_resamples=n_resamples, seed=seed,
                                confidence=confidence)
        rows.append({**dict(zip(on, cell)), "analysis": "probe_comparison", "metric": "difference",
                     "condition_a": _describe(a), "condition_b": _describe(b), **res,
                     "groups_needed": groups_needed(DETECTABLE_EFFECT, res["se"], res["n_groups"])
                     if np.isfinite(res["se"]) else pd.NA,
                     "grouping": part["grouping_a"].iloc[0], "seed": seed,
                     "same_folds": bool((part["fold_a"] == part["fold_b"]).all()), "family": family})
    df = make_table(rows)
    df["p_holm"] = holm(df["p_value"].to_numpy(float))
    return df
