"""Confidence intervals: a cluster bootstrap over groups (examples or documents), a t interval over
folds, and a ratio (micro-F1) bootstrap.

Tokens of one example share a context, so their measurements are correlated; resampling tokens as if
they were independent gives intervals that are too narrow. :func:`bootstrap_ci` resamples whole
groups (examples) with replacement, the cluster bootstrap (Davison & Hinkley 1997, "Bootstrap Methods
and their Application", sec. 3.8; Field & Welsh 2007, "Bootstrapping clustered data"), through
:func:`scipy.stats.bootstrap` over group indices. :func:`bootstrap_cis` does several columns and
statistics on the same resamples in one pass.

The comparisons built on these intervals (paired differences, Holm, power) are in :mod:`analyses.stats`.
"""

from __future__ import annotations

import inspect
import math
from typing import Literal, Mapping, Sequence, get_args

import numpy as np
import scipy
from scipy import stats as _sps

Statistic = Literal["mean", "median"]
CIMethod = Literal["percentile", "BCa"]
#: The choices, declared once; used for validation and dispatch.
STATISTICS: tuple[str, ...] = get_args(Statistic)
CI_METHODS: tuple[str, ...] = get_args(CIMethod)

# Elements per batch of resamples (resamples x groups): a batch's index and multiplicity arrays take
# about 50 bytes per element, so this bounds the bootstrap's scratch at about 12 MB whatever the number
# of groups (4M, before, reached 200 MB and grew with n up to 4,000 groups at 1,000 resamples). The
# batch size does not change the resamples drawn (scipy draws them batch by batch from one generator),
# only the rounding of the matrix products (last bit).
_BATCH_ELEMENTS = 250_000

# scipy >= 1.15 takes ``rng``; older releases take ``random_state``. Both accept a Generator.
RNG_KW = "rng" if "rng" in inspect.signature(_sps.bootstrap).parameters else "random_state"
# Statistics returning several values at once: scipy >= 1.12. Older scipy gets one call per output,
# with the same seed and hence the same resamples: identical results, only slower.
_MULTI_OUTPUT = tuple(int(p) for p in scipy.__version__.split(".")[:2]) >= (1, 12)


def _median_window_half(sd_rank: float, max_group: int) -> int:
    """Half-width of the median's scan window in sorted positions (see :func:`_MedianFromCounts`):
    8 standard deviations of the median's rank plus twice the largest group (a jackknife drops one
    group). Any value gives exact results; a larger one only costs time."""
    return int(8.0 * sd_rank + 2.0 * max_group + 16)


def check_confidence(confidence: float) -> float:
    """``confidence`` as a float in (0, 1); ValueError otherwise."""
    confidence = float(confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence=}")
    return confidence


#: Resamples a percentile interval must leave outside itself. Its ends are the (1 - c)/2 and (1 + c)/2
#: quantiles of the B resampled statistics, so B (1 - c) of them lie outside it: with B = 1 none do, and
#: the "interval" is one resample, of zero width, which need not contain the estimate. Five outside (2.5
#: beyond each end) puts resamples on both sides of each end, so each end is read between draws rather
#: than from the extreme one. This is a floor below which there is no interval, not a recommendation:
#: Efron & Tibshirani (1993, "An Introduction to the Bootstrap") advise about 1,000 for percentile
#: intervals. Sign-flip p-values share the floor: from 100 sign vectors p can reach 1 / 101, below 0.01.
RESAMPLES_OUTSIDE = 5
#: The default resamples of every interval (and of the commands' ``--resamples``).
DEFAULT_RESAMPLES = 1000


def min_resamples(confidence: float = 0.95) -> int:
    """The fewest resamples from which a ``confidence`` interval can be computed:
    ``ceil(RESAMPLES_OUTSIDE / (1 - confidence))``, 100 at 95%.

    >>> min_resamples(0.95), min_resamples(0.9), min_resamples(0.99)
    (100, 50, 500)
    """
    confidence = check_confidence(confidence)
    return math.ceil(round(RESAMPLES_OUTSIDE / (1.0 - confidence), 6))


#: The fewest resamples at the 95% every table reports (:func:`min_resamples`).
MIN_RESAMPLES = min_resamples(0.95)


def too_few_resamples(n_resamples: int, confidence: float = 0.95) -> str | None:
    """Why ``n_resamples`` cannot give a ``confidence`` interval (fewer than :func:`min_resamples`), or
    None when they can: the one wording of the refusal, for functions and command lines alike.

    >>> too_few_resamples(1000) is None
    True
    """
    least = min_resamples(confidence)
    if n_resamples >= least:
        return None
    return (f"a {float(confidence):.0%} interval needs at least {least} resamples ({RESAMPLES_OUTSIDE} of them "
            f"outside it; fewer give an interval of no width that can exclude its own estimate)")


def check_resamples(n_resamples, confidence: float = 0.95) -> int:
    """``n_resamples`` as an int, refused (ValueError naming the value) unless it is a whole number of at
    least :func:`min_resamples` ``(confidence)``. Every entry point that resamples (bootstrap intervals,
    sign-flip p-values, the runners that write tables of them) calls this before any work.

    >>> check_resamples(200)
    200
    """
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer, float, np.floating)) \
            or not math.isfinite(n_resamples) or int(n_resamples) != n_resamples:
        raise ValueError(f"n_resamples must be a whole number, got {n_resamples=!r}")
    problem = too_few_resamples(n_resamples, confidence)
    if problem is not None:
        raise ValueError(f"n_resamples={int(n_resamples)}: {problem}")
    return int(n_resamples)


def check_values(values, name: str = "values") -> np.ndarray:
    """``values`` as a non-empty, finite, 1-D float64 array; ValueError naming ``name`` otherwise."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {name}.shape={v.shape}")
    if v.size == 0:
        raise ValueError(f"{name} is empty ({name}.shape={v.shape})")
    bad = ~np.isfinite(v)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"{name} has {idx.size} non-finite entries (NaN or inf), first at indices "
            f"{idx[:10].tolist()}: {v[idx[:10]].tolist()}"
        )
    return v


def _weighted_median_sorted(v_sorted: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Median of each row's multiset: ``v_sorted`` (n,) ascending, repeated ``w[b, i]`` times.

    w: (batch, n) non-negative integer multiplicities. Returns (batch,), equal to ``np.median`` of
    the expanded multiset (mean of the two middle elements when its size is even).
    """
    cw = np.cumsum(w, axis=1)
    total = cw[:, -1]
    lo_rank = (total - 1) // 2
    hi_rank = total // 2
    # The element of 0-based rank r is the first position whose cumulative count exceeds r.
    lo = (cw <= lo_rank[:, None]).sum(axis=1)
    hi = (cw <= hi_rank[:, None]).sum(axis=1)
    return 0.5 * (v_sorted[lo] + v_sorted[hi])


#: Elements of a median's block table (groups x blocks, float64: 2 MB); the block length grows past 64
#: sorted positions only where the scan window times the number of groups would exceed it.
_BLOCK_TABLE_ELEMENTS = 250_000


class _MedianFromCounts:
    """Median of the pooled values of a resample, from its group multiplicities.

    A resample is a vector of multiplicities ``m_g`` (b, G); its median is the mean of the values of
    rank ``(N-1)//2`` and ``N//2`` (N = Σ m_g C_g) in the sorted values, each value repeated by its
    group's multiplicity. Only a window of sorted positions around the full-sample median is scanned:
    the weighted count below the window is one matrix-vector product. Rows whose middle ranks fall
    outside the window (rare: the window spans 8 standard deviations of the median's rank under
    resampling, ``sqrt(Σ_g (below_g − C_g/2)²)``) are redone over all values, so the result is exact.

    The window is cut into blocks of ``block`` sorted positions, and a table holds how many values of
    each group lie before each block: one matrix product gives every resample's weighted count at every
    block start, which finds the block holding each middle rank, and only that block's ``block``
    positions are summed one by one. A running sum over the whole window per resample (before: 31k
    positions for a drift column of 69k tokens in 124 documents) took 15x as long.
    """

    def __init__(self, v: np.ndarray, codes: np.ndarray, counts: np.ndarray):
        n, n_groups = v.size, counts.size
        order = np.argsort(v, kind="stable")
        self.v_sorted = v[order]
        self.g_sorted = codes[order]
        mid = n // 2
        below_mid = np.bincount(self.g_sorted[:mid], minlength=n_groups)
        sd_rank = float(np.sqrt(((below_mid - counts / 2.0) ** 2).sum()))
        half = _median_window_half(sd_rank, int(counts.max()))
        self.p0, p1 = max(0, mid - half), min(n, mid + half + 1)
        self.below_p0 = np.bincount(self.g_sorted[:self.p0], minlength=n_groups).astype(np.float64)
        self.g_win = self.g_sorted[self.p0:p1]
        self.width = p1 - self.p0
        self.block = max(64, -(-n_groups * self.width // _BLOCK_TABLE_ELEMENTS))
        n_blocks = -(-self.width // self.block)
        # the window padded to whole blocks with a group of its own (code n_groups), counted 0 times
        self.g_pad = np.concatenate([self.g_win, np.full(n_blocks * self.block - self.width, n_groups,
                                                         dtype=self.g_win.dtype)])
        table = np.zeros((n_groups + 1, n_blocks + 1))
        np.add.at(table, (self.g_pad, np.repeat(np.arange(1, n_blocks + 1), self.block)), 1.0)
        self.before_block = np.cumsum(table[:n_groups], axis=1)  # (G, blocks + 1): values of g before block k

    def _position(self, mult: np.ndarray, at_block: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Window position of the value of ``rank`` in each row, its block found from ``at_block``
        (the weighted count before each block start)."""
        k = (at_block <= rank[:, None]).sum(axis=1) - 1
        rows = np.arange(rank.size)
        within = mult[rows[:, None], self.g_pad[k[:, None] * self.block + np.arange(self.block)]]
        cum = np.cumsum(within, axis=1) + at_block[rows, k][:, None]
        return k * self.block + (cum <= rank[:, None]).sum(axis=1)

    def __call__(self, mult: np.ndarray, multf: np.ndarray, total: np.ndarray) -> np.ndarray:
        rows = mult.shape[0]
        before = (multf @ self.below_p0).astype(np.int64)
        at_block = (multf @ self.before_block).astype(np.int64) + before[:, None]  # exact: integer counts
        lo_rank, hi_rank = (total - 1) // 2, total // 2
        inside = (before <= lo_rank) & (at_block[:, -1] > hi_rank)
        out = np.empty(rows)
        if inside.any():
            m = np.concatenate([mult[inside], np.zeros((int(inside.sum()), 1), dtype=mult.dtype)], axis=1)
            at = at_block[inside]
            lo = self._position(m, at, lo_rank[inside])
            hi = self._position(m, at, hi_rank[inside])
            out[inside] = 0.5 * (self.v_sorted[self.p0 + lo] + self.v_sorted[self.p0 + hi])
        if not inside.all():
            out[~inside] = _weighted_median_sorted(self.v_sorted, mult[~inside][:, self.g_sorted])
        return out


def bootstrap_cis(
    columns: Mapping[str, np.ndarray],
    groups,
    statistics: Sequence[Statistic] = STATISTICS,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
    method: CIMethod = "percentile",
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Cluster-bootstrap CIs of several statistics of several columns, on shared resamples.

    columns: name -> (n,) finite values, all measured on the same n tokens; groups: (n,) cluster
    labels. Returns ``{(name, statistic): (point, low, high)}`` for every column and statistic, each
    equal to ``bootstrap_ci(columns[name], groups, statistic, ...)`` with the same arguments (the
    same seed draws the same resamples), computed in one pass. See :func:`bootstrap_ci`.
    """
    for s in statistics:
        if s not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {s!r}")
    if method not in CI_METHODS:
        raise ValueError(f"method must be one of {CI_METHODS}, got {method=!r}")
    confidence = check_confidence(confidence)
    n_resamples = check_resamples(n_resamples, confidence)
    if not columns:
        raise ValueError("columns is empty: nothing to bootstrap")
    cols = {name: check_values(v, name) for name, v in columns.items()}
    n = next(iter(cols.values())).size
    for name, v in cols.items():
        if v.shape != (n,):
            raise ValueError(f"columns differ in length: {name!r} has shape {v.shape}, expected ({n},)")
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ValueError(f"groups must have shape ({n},), one label per value; got groups.shape={g.shape}")
    _, codes = np.unique(g, return_inverse=True)
    codes = codes.reshape(-1)
    n_groups = int(codes.max()) + 1

    out: dict[tuple[str, str], tuple[float, float, float]] = {}
    todo: list[tuple[str, str]] = []
    for name, v in cols.items():
        for s in statistics:
            point = float(v.mean()) if s == "mean" else float(np.median(v))
            if n_groups == 1:
                out[name, s] = (point, float("nan"), float("nan"))
            elif v.min() == v.max():  # degenerate bootstrap distribution: BCa would return NaN
                out[name, s] = (point, point, point)
            else:
                out[name, s] = (point, float("nan"), float("nan"))
                todo.append((name, s))
    if not todo:
        return out

    counts_i = np.bincount(codes, minlength=n_groups)
    counts = counts_i.astype(np.float64)
    mean_cols = [name for name, s in todo if s == "mean"]
    sums = np.stack([np.bincount(codes, weights=cols[c], minlength=n_groups) for c in mean_cols],
                    axis=1) if mean_cols else np.zeros((n_groups, 0))
    medians = {name: _MedianFromCounts(cols[name], codes, counts) for name, s in todo if s == "median"}

    def stat_all(idx, axis=-1):
        idx = np.moveaxis(np.asarray(idx, dtype=np.intp), axis, -1)
        lead = idx.shape[:-1]
        idx2 = idx.reshape(-1, idx.shape[-1])
        rows = idx2.shape[0]
        flat = (idx2 + (np.arange(rows)[:, None] * n_groups)).ravel()
        mult = np.bincount(flat, minlength=rows * n_groups).reshape(rows, n_groups)
        multf = mult.astype(np.float64)  # exact: integer counts far below 2**53
        total = multf @ counts
        mean_vals = (multf @ sums) / total[:, None]
        total_i = total.astype(np.int64)
        res, k = [], 0
        for name, s in todo:
            if s == "mean":
                res.append(mean_vals[:, k])
                k += 1
            else:
                res.append(medians[name](mult, multf, total_i))
        return np.stack(res).reshape((len(todo),) + lead)

    width = n_groups + max([m.width for m in medians.values()], default=0)
    kw = dict(n_resamples=n_resamples, batch=max(1, _BATCH_ELEMENTS // width), vectorized=True,
              confidence_level=confidence, method=method)
    if _MULTI_OUTPUT:
        res = _sps.bootstrap((np.arange(n_groups),), stat_all, **kw,
                             **{RNG_KW: np.random.default_rng(seed)})
        lows, highs = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
    else:
        lows, highs = [], []
        for k in range(len(todo)):
            res = _sps.bootstrap((np.arange(n_groups),), lambda i, axis=-1, k=k: stat_all(i, axis)[k],
                                 **kw, **{RNG_KW: np.random.default_rng(seed)})
            lows.append(res.confidence_interval.low)
            highs.append(res.confidence_interval.high)
    for key, lo, hi in zip(todo, lows, highs):
        out[key] = (out[key][0], float(lo), float(hi))
    return out


def bootstrap_ci(
    values,
    groups,
    statistic: Statistic = "mean",
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
    method: CIMethod = "percentile",
) -> tuple[float, float, float]:
    """Cluster-bootstrap confidence interval of the mean or median of ``values``.

    values: (n,) finite numbers. groups: (n,) cluster labels (any sortable dtype: example ids).
    Each resample draws ``n_groups`` groups with replacement and pools all values of the drawn groups
    (a group drawn twice counts twice); the statistic is computed on the pooled values.

    - ``"mean"``: the token-weighted mean ``sum(values) / n``. Resampled as
      ``Σ_g m_g S_g / Σ_g m_g C_g`` with per-group sums ``S_g``, counts ``C_g`` and multiplicities
      ``m_g`` (a ratio estimator), vectorised; 50k values in 5k groups with 1000 resamples take
      about 0.1 s.
    - ``"median"``: the median of the pooled values (``np.median`` of the expanded multiset), by an
      exact weighted median over the once-sorted values.

    ``method`` is passed to :func:`scipy.stats.bootstrap`: ``"percentile"`` or ``"BCa"`` (Efron 1987,
    bias-corrected and accelerated; the acceleration uses the jackknife over groups, which costs
    O(n_groups²) and is several times slower for thousands of groups).

    Returns ``(point, low, high)``: the statistic on all values, and the interval's ends.

    Edge cases: with a single group the between-group variance is unknown and the interval is
    ``(nan, nan)`` (no error: a caller may legitimately have one example in a cell). When all values
    are equal the bootstrap distribution is degenerate and the interval is ``(point, point)``.
    Raises ``ValueError`` for NaN/inf values, mismatched shapes, or an unknown statistic/method.
    Deterministic given ``seed``.

    >>> bootstrap_ci([1.0, 1.0, 3.0, 3.0], ["a", "a", "b", "b"], n_resamples=200)[0]
    2.0
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic=!r}")
    return bootstrap_cis({"values": values}, groups, (statistic,), n_resamples=n_resamples,
                         confidence=confidence, seed=seed, method=method)["values", statistic]


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Student-t interval of a mean: ``mean ± t_{(1+confidence)/2, n-1} · s / sqrt(n)``.

    values: (n,) finite numbers, e.g. one score per cross-validation fold; ``s`` is the sample
    standard deviation (ddof=1). Returns ``(mean, low, high)``; with ``n == 1`` the interval is
    ``(nan, nan)``. Fold scores share training data, so this interval is approximate (Bengio &
    Grandvalet 2004, "No Unbiased Estimator of the Variance of K-Fold Cross-Validation").

    >>> t_interval([1.0, 2.0, 3.0])[0]
    2.0
    """
    confidence = check_confidence(confidence)
    v = check_values(values)
    n = v.size
    mean = float(v.mean())
    if n == 1:
        return mean, float("nan"), float("nan")
    half = float(_sps.t.ppf(0.5 + confidence / 2.0, df=n - 1) * v.std(ddof=1) / np.sqrt(n))
    return mean, mean - half, mean + half



def fold_t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """:func:`t_interval` over the finite values only (e.g. per-fold scores, some undefined):
    ``(mean, low, high)``; ``(nan, nan, nan)`` when none is finite, ``(mean, nan, nan)`` with one.
    Folds share training rows, so the interval tends to be too narrow (Nadeau & Bengio 2003).

    >>> fold_t_interval([1.0, float("nan"), 3.0])[0]
    2.0
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    return t_interval(v, confidence)


# --------------------------------------------------------------------------------------------------
# Ratio estimators (micro-F1)


def group_codes(groups, n: int) -> tuple[np.ndarray, int]:
    """``(codes, n_groups)``: ``groups`` (n,) as integer codes 0..n_groups-1."""
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ValueError(f"groups must have shape ({n},), one label per value; got groups.shape={g.shape}")
    _, codes = np.unique(g, return_inverse=True)
    codes = codes.reshape(-1)
    return codes, int(codes.max()) + 1


def ratio_bootstrap_ci(numerator, denominator, groups, n_resamples: int = DEFAULT_RESAMPLES, confidence: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """Cluster-bootstrap percentile CI of a ratio of sums ``Σ numerator / Σ denominator``.

    numerator, denominator: (n,) per-item values (e.g. micro-F1 = ``Σ 2TP_i / Σ (2TP_i + FP_i + FN_i)``);
    groups: (n,) cluster labels, resampled whole as in :func:`bootstrap_ci`. Returns
    ``(point, low, high)``; ``(point, nan, nan)`` with one group; ``nan`` point when the denominator
    sums to 0.

    >>> ratio_bootstrap_ci([1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1], n_resamples=100)[0]
    0.75
    """
    num = check_values(numerator, "numerator")
    den = check_values(denominator, "denominator")
    if num.shape != den.shape:
        raise ValueError(f"numerator and denominator differ in shape: {num.shape=} and {den.shape=}")
    confidence = check_confidence(confidence)
    n_resamples = check_resamples(n_resamples, confidence)
    codes, n_groups = group_codes(groups, num.size)
    total = den.sum()
    point = float(num.sum() / total) if total > 0 else float("nan")
    if n_groups == 1 or not np.isfinite(point):
        return point, float("nan"), float("nan")
    sn = np.bincount(codes, weights=num, minlength=n_groups)
    sd = np.bincount(codes, weights=den, minlength=n_groups)
    rng = np.random.default_rng(seed)
    num_sums, den_sums = np.empty(n_resamples), np.empty(n_resamples)
    step = max(1, _BATCH_ELEMENTS // n_groups)  # the same draws as one (n_resamples, n_groups) call
    for s in range(0, n_resamples, step):
        draws = rng.integers(0, n_groups, size=(min(step, n_resamples - s), n_groups))
        num_sums[s:s + step], den_sums[s:s + step] = sn[draws].sum(1), sd[draws].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = num_sums[den_sums > 0] / den_sums[den_sums > 0]
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return point, float(lo), float(hi)
