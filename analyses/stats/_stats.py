"""Paired comparisons, power and interval formatting, built on the intervals of :mod:`analyses.stats._intervals`.

Paired comparisons (:func:`paired_difference`): the mean per-item difference between two conditions
measured on the same items, with a cluster-bootstrap CI and a cluster sign-flip permutation p-value;
:func:`holm` adjusts a family of p-values. Power: :func:`cluster_se`, :func:`minimum_detectable_effect`
and :func:`groups_needed`. :func:`format_interval` prints an interval with enough digits that it
never collapses to a point.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats as _sps

from analyses.stats._intervals import bootstrap_ci, check_confidence, check_resamples, check_values, group_codes


#: The difference in accuracy the study's headline comparisons should be able to detect (issue 11).
DETECTABLE_EFFECT = 0.03


def cluster_se(values, groups) -> float:
    """Cluster-robust standard error of the item-weighted mean of ``values`` (n,) over ``groups`` (n,).

    ``se = sqrt(G / (G - 1) · Σ_g (S_g − m C_g)²) / n`` with per-group sums ``S_g``, counts ``C_g``,
    mean ``m`` and ``G`` groups: the sandwich variance of a mean under clustering (Cameron & Miller
    2015, "A Practitioner's Guide to Cluster-Robust Inference", eq. 11 with the G/(G−1) correction),
    the large-sample value of the cluster bootstrap's standard deviation. NaN with one group.

    >>> round(cluster_se([0.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"]), 3)
    0.5
    """
    v = check_values(values)
    codes, n_groups = group_codes(groups, v.size)
    if n_groups < 2:
        return float("nan")
    m = v.mean()
    resid = np.bincount(codes, weights=v - m, minlength=n_groups)
    return float(np.sqrt(n_groups / (n_groups - 1) * np.sum(resid ** 2)) / v.size)


def minimum_detectable_effect(se: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true effect a two-sided test at level ``alpha`` detects with probability ``power``:
    ``(z_{1−α/2} + z_{power}) · se`` (normal approximation; Bloom 1995, "Minimum Detectable Effects").
    With the defaults the factor is 2.80.

    >>> round(minimum_detectable_effect(0.01), 4)
    0.028
    """
    check_confidence(1.0 - alpha)
    check_confidence(power)
    return float((_sps.norm.ppf(1.0 - alpha / 2.0) + _sps.norm.ppf(power)) * se)


def groups_needed(effect: float, se: float, n_groups: int, alpha: float = 0.05, power: float = 0.8) -> int:
    """How many groups (documents) would detect ``effect``, given standard error ``se`` observed with
    ``n_groups`` groups: the standard error scales as ``1/sqrt(G)``, so
    ``G* = ceil(n_groups · (minimum_detectable_effect(se) / effect)²)``. Compare with ``n_groups``:
    ``G* <= n_groups`` means this sample can detect ``effect``.

    >>> groups_needed(0.03, se=0.015, n_groups=100)
    197
    """
    if not effect > 0:
        raise ValueError(f"effect must be positive, got {effect=}")
    if not (np.isfinite(se) and se >= 0):
        raise ValueError(f"se must be a finite non-negative number, got {se=}")
    return int(math.ceil(n_groups * (minimum_detectable_effect(se, alpha, power) / effect) ** 2 - 1e-9))


def accuracy_mde(n_groups: int, items_per_group: float = 1.0, chance: float = 0.5, icc: float = 0.0,
                 alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable accuracy above ``chance`` before any data is seen: binomial standard error
    ``sqrt(p(1−p) / n)`` at ``p = chance`` with ``n = n_groups · items_per_group`` items, inflated by
    the design effect ``1 + (items_per_group − 1) · icc`` of clustered items (Kish 1965).

    >>> round(accuracy_mde(600), 3)
    0.057
    """
    n = n_groups * items_per_group
    if not n > 0:
        raise ValueError(f"need a positive number of items, got {n_groups=} x {items_per_group=}")
    deff = 1.0 + (items_per_group - 1.0) * icc
    return minimum_detectable_effect(math.sqrt(chance * (1.0 - chance) / n * deff), alpha, power)


def wald_p_value(value, se):
    """Two-sided p of ``value = 0`` from its standard error, ``2 Φ(−|value| / se)`` (elementwise); where
    ``se = 0``, 1 for a zero value and 0 otherwise; NaN where either is NaN. A float for scalar input.

    >>> round(wald_p_value(0.0196, 0.01), 3), wald_p_value(0.0, 0.0), wald_p_value(0.1, 0.0)
    (0.05, 1.0, 0.0)
    """
    v, s = np.asarray(value, dtype=np.float64), np.asarray(se, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(s > 0, 2.0 * _sps.norm.sf(np.abs(v) / s), np.where(v != 0, 0.0, 1.0))
    p = np.where(np.isnan(v) | np.isnan(s), np.nan, p)
    return float(p) if p.ndim == 0 else p


#: The sequential sign-flip test stops drawing once this many sign vectors reach the observed |sum|
#: (Besag & Clifford 1991, "Sequential Monte Carlo p-values", Biometrika 78(2)).
SEQUENTIAL_EXCEEDANCES = 10
#: ... or after this many times ``n_resamples`` draws: the smallest p it can give is then
#: 1 / (20 n_resamples + 1), so Holm over up to α (20 n + 1) / 2 rows (500 at n = 1,000) can pass.
SEQUENTIAL_FACTOR = 20
# Elements (sign vectors x groups) per batch of draws.
_SIGN_BATCH_ELEMENTS = 1 << 21


def sign_flip_p_value(differences, groups, n_resamples: int = 2000, seed: int = 0) -> float:
    """Two-sided p-value of "mean per-item difference = 0" by a cluster sign-flip permutation test.

    differences: (n,) paired per-item differences a − b; groups: (n,) clusters. Under the null the two
    conditions are exchangeable within a group, so each group's sum of differences flips sign with
    probability 1/2; p is the share of sign vectors whose flipped sum reaches the observed one in
    absolute value. Exact (every sign vector) when ``2**G <= n_resamples``; otherwise ``n_resamples``
    random sign vectors, ``p = (1 + k) / (1 + n_resamples)`` for ``k`` of them reaching it, unless
    ``k`` is below :data:`SEQUENTIAL_EXCEEDANCES`: then drawing goes on until that many do, after ``L``
    draws, ``p = SEQUENTIAL_EXCEEDANCES / L`` (Besag & Clifford 1991), or until
    :data:`SEQUENTIAL_FACTOR` × ``n_resamples`` draws, ``p = (1 + k) / (1 + draws)``. A fixed count bottoms
    out at ``2 / (n_resamples + 1)``, which Holm over more than α (n + 1) / 2 rows (25 at n = 1,000:
    a 12-layer model's Q4 family has 36) could never pass, however strong the difference.
    All differences 0 gives p = 1.

    >>> sign_flip_p_value([1.0, 2.0, 3.0], [0, 1, 2])  # of the 8 sign vectors, only ±(1, 2, 3) reach 6
    0.25
    """
    n_resamples = check_resamples(n_resamples)
    d = check_values(differences, "differences")
    codes, n_groups = group_codes(groups, d.size)
    sums = np.bincount(codes, weights=d, minlength=n_groups)
    if not np.any(sums != 0):
        return 1.0
    total = float(sums.sum())
    # ties count as reaching it (conservative), up to the rounding of a sum of n_groups terms
    bar = abs(total) - 1e-12 * float(np.abs(sums).sum())
    if n_groups < 63 and 2 ** n_groups <= n_resamples:
        flips = (np.arange(2 ** n_groups)[:, None] >> np.arange(n_groups)) & 1
        return float(np.mean(np.abs(total - 2.0 * (flips @ sums)) >= bar))
    rng = np.random.default_rng(seed)
    batch = max(1, min(n_resamples, _SIGN_BATCH_ELEMENTS // n_groups))

    def reaching(size: int) -> np.ndarray:
        """Which of ``size`` new random sign vectors give a flipped sum reaching the observed one."""
        flips = rng.integers(0, 2, size=(size, n_groups), dtype=np.int8)
        return np.abs(total - 2.0 * (flips @ sums)) >= bar

    drawn = reached = 0
    while drawn < n_resamples:  # the fixed count
        size = min(batch, n_resamples - drawn)
        reached += int(reaching(size).sum())
        drawn += size
    if reached >= SEQUENTIAL_EXCEEDANCES:
        return (1 + reached) / (1 + drawn)
    limit = SEQUENTIAL_FACTOR * n_resamples
    while drawn < limit:  # sequential: until the SEQUENTIAL_EXCEEDANCES-th reaching draw
        hits = reaching(min(batch, limit - drawn))
        if reached + int(hits.sum()) >= SEQUENTIAL_EXCEEDANCES:
            at = int(np.flatnonzero(hits)[SEQUENTIAL_EXCEEDANCES - reached - 1])
            return SEQUENTIAL_EXCEEDANCES / (drawn + at + 1)
        reached += int(hits.sum())
        drawn += hits.size
    return (1 + reached) / (1 + drawn)


def paired_difference(a, b, groups, n_resamples: int = 2000, seed: int = 0, confidence: float = 0.95,
                      alpha: float = 0.05, power: float = 0.8) -> dict[str, float]:
    """Difference between two conditions measured on the same items: ``mean(a − b)``.

    a, b: (n,) per-item values of the two conditions (e.g. 0/1 correctness of two probes on the same
    out-of-fold items), paired by position; groups: (n,) clusters (documents, or examples).
    Returns a dict:

    - ``value``: mean per-item difference; ``ci_low``/``ci_high``: cluster-bootstrap percentile CI
      (:func:`bootstrap_ci` of the differences);
    - ``p_value``: cluster sign-flip permutation test (:func:`sign_flip_p_value`);
    - ``se``: :func:`cluster_se` of the differences; ``mde``: :func:`minimum_detectable_effect` at it;
    - ``n``: items; ``n_groups``: groups; ``value_a``/``value_b``: the means of ``a`` and ``b``;
      ``n_resamples``: the resamples behind the CI and the p-value.

    >>> r = paired_difference([1, 1, 1, 0], [0, 0, 1, 0], [0, 1, 2, 3], n_resamples=200)
    >>> r["value"], r["n"], r["n_groups"]
    (0.5, 4, 4)
    """
    n_resamples = check_resamples(n_resamples, confidence)
    va = check_values(a, "a")
    vb = check_values(b, "b")
    if va.shape != vb.shape:
        raise ValueError(f"a and b must be paired item by item; got {va.shape=} and {vb.shape=}")
    d = va - vb
    codes, n_groups = group_codes(groups, d.size)
    value, lo, hi = bootstrap_ci(d, codes, "mean", n_resamples=n_resamples, confidence=confidence, seed=seed)
    se = cluster_se(d, codes)
    return {"value": value, "ci_low": lo, "ci_high": hi,
            "p_value": sign_flip_p_value(d, codes, n_resamples=n_resamples, seed=seed),
            "se": se, "mde": minimum_detectable_effect(se, alpha, power) if np.isfinite(se) else float("nan"),
            "n": int(d.size), "n_groups": n_groups, "value_a": float(va.mean()), "value_b": float(vb.mean()),
            "n_resamples": n_resamples}


#: The keys of :func:`paired_difference`'s result that carry the values' unit (the rest: a p-value and counts).
SCALED_KEYS = ("value", "ci_low", "ci_high", "se", "mde", "value_a", "value_b")


def scale_difference(result: dict, by: float) -> dict:
    """:func:`paired_difference`'s ``result`` for ``a / by`` and ``b / by`` (one positive constant, e.g. a
    group's spread between inputs), without resampling again: the mean, the percentile CI's bounds, the
    cluster SE and the MDE scale with the values; the sign-flip ``p_value`` and the counts do not.

    >>> scale_difference({"value": 0.2, "ci_low": 0.1, "ci_high": 0.3, "p_value": 0.01, "n": 4}, 2.0)["ci_high"]
    0.15
    """
    if not by > 0:
        raise ValueError(f"scale must be positive, got {by!r}")
    return {k: (v / by if k in SCALED_KEYS else v) for k, v in result.items()}


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): sorted ascending, the i-th of m
    (from 0) times m - i, the running maximum, capped at 1; NaN entries stay NaN and do not count in the
    family. Returns an array shaped like ``p_values``. The same numbers as
    ``statsmodels.stats.multitest.multipletests(p, method="holm")[1]`` (tests/test_paired.py compares
    them), written out because statsmodels' Holm branch calls ``gc.collect()`` on every call
    (statsmodels 0.15; its PR #8671 proposed removing it): 0.27 s a call in a process holding a model
    and figures, 39 of the 95 s of a --quick study of a tiny model.

    >>> holm([0.01, 0.04, float("nan")]).round(2).tolist()
    [0.02, 0.04, nan]
    """
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        q = p[ok]
        if ((q < 0) | (q > 1)).any():
            raise ValueError(f"p-values must lie in [0, 1], got {q[(q < 0) | (q > 1)][:3].tolist()}")
        order = np.argsort(q, kind="stable")
        adjusted = np.minimum(np.maximum.accumulate(q[order] * np.arange(q.size, 0, -1)), 1.0)
        out_ok = np.empty_like(q)
        out_ok[order] = adjusted
        out[ok] = out_ok
    return out


def add_holm(df: pd.DataFrame, family: Sequence[str]) -> pd.DataFrame:
    """Add ``p_holm``: :func:`holm` of ``p_value`` within each family of rows sharing the ``family``
    columns (e.g. every layer of one role group and metric)."""
    df = df.copy()
    df["p_holm"] = np.nan
    if df.empty:
        return df
    codes = df.groupby(list(family), sort=False, dropna=False).ngroup().to_numpy()
    for c in np.unique(codes):
        m = codes == c
        df.loc[m, "p_holm"] = holm(df.loc[m, "p_value"].to_numpy(dtype=float))
    return df


def digits_for(*values: float, minimum: int = 3, maximum: int = 10) -> int:
    """The fewest decimals (>= ``minimum``) at which the given values that differ print differently
    and no non-zero value prints as zero.

    >>> digits_for(0.0021, 0.0024, 0.0019)
    4
    >>> digits_for(0.5, 0.5)
    3
    >>> digits_for(-0.0012, -0.0004)
    4
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    distinct = len(set(finite))
    for d in range(minimum, maximum + 1):
        if len({round(v, d) for v in finite}) == distinct and all(round(v, d) != 0 for v in finite if v != 0):
            return d
    return maximum


def format_interval(value: float, lo: float, hi: float, signed: bool = False, distinct_from: Sequence[float] = (),
                    label: str = "95% CI") -> str:
    """``"0.0021 (95% CI 0.0018 to 0.0024)"``: at least three decimals, and as many more as it takes
    for numbers that differ (the value, the bounds, and each of ``distinct_from``, e.g. a threshold the
    text compares them with) to print differently, so an interval never collapses to a point unless it
    is one. ``signed``: a leading ``+`` on positive numbers (differences). A NaN value prints
    ``undefined``; NaN bounds print ``(CI n/a)``.

    >>> format_interval(0.00213, 0.00181, 0.00242)
    '0.0021 (95% CI 0.0018 to 0.0024)'
    >>> format_interval(0.007, 0.006, 0.008, signed=True)
    '+0.007 (95% CI +0.006 to +0.008)'
    >>> format_interval(0.5, float("nan"), float("nan"))
    '0.500 (CI n/a)'
    """
    if value is None or not math.isfinite(value):
        return "undefined"
    sign = "+" if signed else ""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{value:{sign}.{digits_for(value, *distinct_from)}f} (CI n/a)"
    d = digits_for(value, lo, hi, *distinct_from)
    prefix = f"{label} " if label else ""
    return f"{value:{sign}.{d}f} ({prefix}{lo:{sign}.{d}f} to {hi:{sign}.{d}f})"
