"""Cosine drift: how much a token's hidden state changes between two input formats.

Pure functions of arrays. ``A`` and ``B`` are paired states of the same token keys at one layer,
``(n_tokens, dim)``, row ``i`` of each being the same token under format A and format B. Raw cosines
of BERT-like states are high for any two tokens (anisotropy, Ethayarajh 2019), so each drift comes
with the layer's random-pair baseline and a drift normalised by the baseline of its own role group
(how far that group's tokens lie apart in different inputs); per-dimension standardisation
(Timkey & van Schijndel 2021) is offered against rogue dimensions. All arithmetic is in float64 and
processed in row blocks, so memory stays flat for memory-mapped inputs and for lazy row sources
(:meth:`probing.cache.Cache.layer_rows`, which :func:`analyses.drift.run_drift` passes).
"""

from __future__ import annotations

import warnings
from typing import Literal, Sequence, get_args

import numpy as np
from scipy import sparse as _sparse

from analyses.stats import bootstrap_ci, bootstrap_cis, check_resamples, CIMethod

PoolMode = Literal["first", "mean"]
#: Subword pooling choices, declared once.
POOL_MODES: tuple[str, ...] = get_args(PoolMode)

#: The metric names :func:`drift_summary` writes, in order.
DRIFT_METRICS: tuple[str, ...] = (
    "cosine_mean", "cosine_median", "drift_mean", "drift_median",
    "relative_l2_mean", "relative_l2_median", "normalised_drift", "normalised_drift_median",
    "anisotropy_baseline",
)

_BLOCK_ROWS = 8192  # rows per float64 block: bounds temporaries for (n, 1024) inputs to ~64 MB


def _check_2d(X, name: str) -> np.ndarray:
    # keeps a memmap a memmap, and a lazy row source (probing.cache.LayerRows) lazy: both are read in row blocks
    X = X if isinstance(X, np.ndarray) or getattr(X, "lazy_rows", False) else np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_tokens, dim), got {name}.shape={X.shape}")
    if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got {name}.dtype={X.dtype}")
    return X


def _check_pair(A, B) -> tuple[np.ndarray, np.ndarray]:
    A = _check_2d(A, "A")
    B = _check_2d(B, "B")
    if A.shape != B.shape:
        raise ValueError(f"A and B must have the same shape (paired rows): {A.shape=} vs {B.shape=}")
    return A, B


def _check_labels(labels, n: int, name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one per row), got {name}.shape={labels.shape}")
    return labels


# Squared norms inside [_LO, _HI] are computed without overflow or loss of precision; rows outside
# are recomputed after scaling by their largest absolute entry (rare: states are O(1)-O(100)).
_LO, _HI = 1e-200, 1e200


def _in_range(x: np.ndarray) -> np.ndarray:
    return (x >= _LO) & (x <= _HI)


def _max_abs(x: np.ndarray) -> np.ndarray:
    return np.abs(x).max(axis=1, initial=0.0)


def _block_cos_rel(a: np.ndarray, b: np.ndarray, want_cos: bool, want_rel: bool):
    """Cosine and relative L2 of matching rows of two float64 blocks (NaN where undefined)."""
    aa = np.einsum("ij,ij->i", a, a)
    cos = rel = None
    if want_cos:
        bb = np.einsum("ij,ij->i", b, b)
        ab = np.einsum("ij,ij->i", a, b)
        cos = np.full(aa.shape, np.nan)
        ok = _in_range(aa) & _in_range(bb)
        cos[ok] = ab[ok] / np.sqrt(aa[ok] * bb[ok])
        redo = np.flatnonzero(~ok)
        if redo.size:
            sa, sb = _max_abs(a[redo]), _max_abs(b[redo])
            fine = (sa > 0) & (sb > 0) & np.isfinite(sa) & np.isfinite(sb)
            x = a[redo[fine]] / sa[fine, None]
            y = b[redo[fine]] / sb[fine, None]
            cos[redo[fine]] = np.einsum("ij,ij->i", x, y) / np.sqrt(
                np.einsum("ij,ij->i", x, x) * np.einsum("ij,ij->i", y, y))
        np.clip(cos, -1.0, 1.0, out=cos)
    if want_rel:
        d = a - b
        dd = np.einsum("ij,ij->i", d, d)
        rel = np.full(aa.shape, np.nan)
        ok = _in_range(aa) & ((dd == 0) | _in_range(dd))
        rel[ok] = np.sqrt(dd[ok]) / np.sqrt(aa[ok])
        redo = np.flatnonzero(~ok)
        if redo.size:
            sa = _max_abs(a[redo])
            fine = (sa > 0) & np.isfinite(sa)
            x = a[redo[fine]] / sa[fine, None]
            y = d[redo[fine]] / sa[fine, None]
            rel[redo[fine]] = np.sqrt(np.einsum("ij,ij->i", y, y) / np.einsum("ij,ij->i", x, x))
    return cos, rel


def _cos_rel(A, B, want_cos: bool = True, want_rel: bool = True, mean=None, std=None):
    """Row-block loop over (n, dim) inputs: bounded float64 temporaries, memmaps read block by block.
    With ``mean``/``std`` (dim,), each block is standardised first (no standardised copy of A, B)."""
    A, B = _check_pair(A, B)
    n = A.shape[0]
    cos = np.empty(n) if want_cos else None
    rel = np.empty(n) if want_rel else None
    for s in range(0, n, _BLOCK_ROWS):
        a = np.asarray(A[s:s + _BLOCK_ROWS], dtype=np.float64)
        b = np.asarray(B[s:s + _BLOCK_ROWS], dtype=np.float64)
        if mean is not None:
            a = (a - mean) / std
            b = (b - mean) / std
        c, r = _block_cos_rel(a, b, want_cos, want_rel)
        if want_cos:
            cos[s:s + _BLOCK_ROWS] = c
        if want_rel:
            rel[s:s + _BLOCK_ROWS] = r
    return cos, rel


def rowwise_cosine(A, B) -> np.ndarray:
    """Cosine similarity of matching rows: ``cos_i = <a_i, b_i> / (||a_i|| · ||b_i||)``.

    A, B: (n, dim). Returns (n,) float64, computed in float64 as ``<a,b> / sqrt(<a,a> <b,b>)``
    (rows with extreme magnitudes are first scaled by their largest absolute entry, so nothing
    overflows or underflows) and clipped to [-1, 1]. Identical rows give exactly 1.0
    (``sqrt(fl(x²)) == x`` in IEEE arithmetic). A row whose norm is zero (in A or B) has no
    direction: its cosine is NaN, never a silent 0/0; callers that aggregate must decide what to do
    with it (:func:`drift_summary` raises). Non-finite rows also give NaN.

    >>> rowwise_cosine([[1.0, 0.0], [1.0, 1.0]], [[2.0, 0.0], [-1.0, -1.0]]).tolist()
    [1.0, -1.0]
    """
    return _cos_rel(A, B, want_rel=False)[0]


def relative_l2(A, B) -> np.ndarray:
    """Relative Euclidean change of matching rows: ``||a_i − b_i|| / ||a_i||``.

    A, B: (n, dim); A is the reference format. Returns (n,) float64 (exactly 0 for identical rows).
    Unlike the cosine it also sees changes of norm. A zero-norm row of A gives NaN, never a silent
    0/0.

    >>> relative_l2([[3.0, 4.0]], [[3.0, 4.0]]).tolist(), relative_l2([[3.0, 4.0]], [[0.0, 0.0]]).tolist()
    ([0.0], [1.0])
    """
    return _cos_rel(A, B, want_cos=False)[1]


def random_pair_indices(example_ids, n_pairs: int = 10000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_pairs`` ordered row pairs ``(i, j)`` uniformly among pairs from different examples.

    example_ids: (n,) example label of each row. Returns ``(i, j)``, each (n_pairs,) int64, with
    ``example_ids[i] != example_ids[j]``; pairs are drawn with replacement. Exact and without
    rejection: ``i`` is drawn with probability proportional to ``n − size(example of i)`` and ``j``
    uniformly among the rows of other examples, so every valid ordered pair has probability
    ``1 / (n² − Σ_e size_e²)``. Raises ``ValueError`` with fewer than 2 distinct examples.
    """
    if int(n_pairs) != n_pairs or n_pairs < 1:
        raise ValueError(f"n_pairs must be a positive integer, got {n_pairs=!r}")
    ids = np.asarray(example_ids)
    if ids.ndim != 1:
        raise ValueError(f"example_ids must be 1-D, got example_ids.shape={ids.shape}")
    _, codes, sizes = np.unique(ids, return_inverse=True, return_counts=True)
    codes = codes.reshape(-1)
    if sizes.size < 2:
        raise ValueError(
            f"random pairs from different examples need at least 2 examples, got {sizes.size} "
            f"({ids.size} rows)"
        )
    n = ids.size
    rng = np.random.default_rng(seed)
    others = (n - sizes[codes]).astype(np.float64)
    i = rng.choice(n, size=int(n_pairs), p=others / others.sum())
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    e = codes[i]
    r = rng.integers(0, n - sizes[e])
    r = r + sizes[e] * (r >= starts[e])  # skip the block of i's own example
    j = order[r]
    return i.astype(np.int64), j.astype(np.int64)


def _take_rows(parts: Sequence[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` of the row-wise concatenation of ``parts``, as float64, without concatenating."""
    out = np.empty((idx.size, parts[0].shape[1]))
    start = 0
    for part in parts:
        sel = np.flatnonzero((idx >= start) & (idx < start + part.shape[0]))
        out[sel] = part[idx[sel] - start]
        start += part.shape[0]
    return out


def _pair_cosines(parts, ids, n_pairs, seed, mean=None, std=None, rows=None):
    """Cosines of random pairs from different examples of ``ids`` (the example of each row of ``parts``,
    or with ``rows`` of those rows of ``parts`` only), and the example of each pair's first row."""
    di, dj = random_pair_indices(ids, n_pairs=n_pairs, seed=seed)
    i, j = (di, dj) if rows is None else (rows[di], rows[dj])
    xi, xj = _take_rows(parts, i), _take_rows(parts, j)
    if mean is not None:
        xi, xj = (xi - mean) / std, (xj - mean) / std
    cos = rowwise_cosine(xi, xj)
    bad = np.isnan(cos)
    if bad.any():
        where = np.unique(np.concatenate([i[bad], j[bad]]))
        raise ValueError(f"zero-norm or non-finite rows of X met in random pairs: rows {where[:10].tolist()}")
    return cos, ids[di]


def random_pair_cosines(X, example_ids, n_pairs: int = 10000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of random row pairs from different examples (see :func:`random_pair_indices`).

    X: (n, dim); example_ids: (n,). Returns ``(cos, first_example)``: (n_pairs,) float64 cosines and
    the example id of each pair's first row (the cluster label used for a bootstrap CI). Raises
    ``ValueError`` if a sampled row has zero norm.
    """
    X = _check_2d(X, "X")
    ids = _check_labels(example_ids, X.shape[0], "example_ids")
    return _pair_cosines([X], ids, n_pairs, seed)


def anisotropy_baseline(X, example_ids, n_pairs: int = 10000, seed: int = 0) -> float:
    """Anisotropy baseline: mean cosine of random row pairs drawn from different examples.

    Ethayarajh 2019, "How Contextual are Contextualized Word Representations?", sec. 3.4: the expected
    cosine ``E[cos(x_i, x_j)]`` of uniformly sampled words from different contexts. X: (n, dim) states
    of one layer; example_ids: (n,). Near 0 for isotropic data, near 1 when all states share a large
    common direction. Raises ``ValueError`` with fewer than 2 examples. For its CI see
    :func:`anisotropy_baseline_ci`.
    """
    cos, _ = random_pair_cosines(X, example_ids, n_pairs=n_pairs, seed=seed)
    return float(cos.mean())


def anisotropy_baseline_ci(
    X, example_ids, n_pairs: int = 10000, seed: int = 0, n_resamples: int = 1000,
    confidence: float = 0.95, method: CIMethod = "percentile",
) -> tuple[float, float, float]:
    """:func:`anisotropy_baseline` with a cluster-bootstrap CI: ``(point, low, high)``.

    Pairs are clustered by the example of their first row; the dependence through the second row is
    ignored, so the interval is somewhat narrow when examples are few. It covers the sampling of
    examples and pairs, the point itself being the same as :func:`anisotropy_baseline`.
    """
    cos, first = random_pair_cosines(X, example_ids, n_pairs=n_pairs, seed=seed)
    return bootstrap_ci(cos, first, "mean", n_resamples=n_resamples, confidence=confidence,
                        seed=seed, method=method)


def fit_standardization(reference) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and standard deviation (ddof=0) of ``reference``, in float64.

    reference: (n, dim), or a list/tuple of (n_k, dim) arrays taken as their row-wise union (e.g.
    ``[A, B]``, both formats' tokens, without concatenating them). Dimensions with zero variance get
    std 1 (they are centred to 0 and carry no information), as in scikit-learn's ``StandardScaler``.
    Computed in row blocks (two passes), so memory stays flat.
    """
    parts = list(reference) if isinstance(reference, (list, tuple)) else [reference]
    parts = [_check_2d(p, "reference") for p in parts]
    if not parts:
        raise ValueError("reference is an empty list")
    dims = {p.shape[1] for p in parts}
    if len(dims) != 1:
        raise ValueError(f"reference arrays differ in dim: shapes {[p.shape for p in parts]}")
    n = sum(p.shape[0] for p in parts)
    if n < 1:
        raise ValueError(f"reference has no rows: shapes {[p.shape for p in parts]}")

    def blocks():
        for p in parts:
            for s in range(0, p.shape[0], _BLOCK_ROWS):
                yield np.asarray(p[s:s + _BLOCK_ROWS], dtype=np.float64)

    total = np.zeros(dims.pop())
    for blk in blocks():
        total += blk.sum(axis=0)
    mean = total / n
    ss = np.zeros_like(mean)
    for blk in blocks():
        d = blk - mean
        ss += np.einsum("ij,ij->j", d, d)
    if not (np.isfinite(mean).all() and np.isfinite(ss).all()):
        raise ValueError("reference holds non-finite values (NaN or inf)")
    std = np.sqrt(ss / n)
    std[std == 0] = 1.0
    return mean, std


def standardize(X, mean=None, std=None) -> np.ndarray:
    """Per-dimension z-scoring ``z_id = (x_id − μ_d) / σ_d``, in float64.

    Timkey & van Schijndel 2021, "All Bark and No Bite: Rogue Dimensions in Transformer Language
    Models Obscure Representational Quality", sec. 5: a few dimensions with huge mean and variance
    dominate cosine similarity; standardising each dimension removes their weight. X: (n, dim).
    mean, std: (dim,), fitted on a reference set with :func:`fit_standardization` (e.g. the union of
    both formats' tokens at the layer, so both sides get the same transform); both ``None`` fits
    them on X itself. Returns (n, dim) float64.
    """
    X = _check_2d(X, "X")
    if (mean is None) != (std is None):
        raise ValueError(f"give both mean and std or neither; got mean is None={mean is None}, "
                         f"std is None={std is None}")
    if mean is None:
        mean, std = fit_standardization(X)
    mean = np.asarray(mean, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    if mean.shape != (X.shape[1],) or std.shape != (X.shape[1],):
        raise ValueError(f"mean and std must have shape ({X.shape[1]},) to match {X.shape=}; "
                         f"got {mean.shape=}, {std.shape=}")
    bad = ~(np.isfinite(std) & (std > 0))
    if bad.any():
        d = np.flatnonzero(bad)
        raise ValueError(f"std must be positive and finite; dims {d[:10].tolist()} have {std[d[:10]].tolist()}")
    return (np.asarray(X, dtype=np.float64) - mean) / std


def normalised_drift(cos_mean: float, baseline: float) -> float:
    """Drift normalised by the anisotropy baseline: ``(1 − cos) / (1 − baseline)``.

    cos_mean: a token's (mean) cosine between formats; baseline: the mean cosine of random token pairs
    from different examples at the same layer (:func:`anisotropy_baseline`). 0 when the states are
    identical; 1 when a token is as far from itself across formats as random tokens are from each
    other; above 1 when farther. Raises ``ValueError`` when ``baseline >= 1`` (no spread to normalise
    by) or either value lies outside [-1, 1].

    >>> normalised_drift(1.0, 0.5), normalised_drift(0.5, 0.5), normalised_drift(0.75, 0.5)
    (0.0, 1.0, 0.5)
    """
    c, b = float(cos_mean), float(baseline)
    if not -1.0 <= c <= 1.0:
        raise ValueError(f"cos_mean must be a cosine in [-1, 1], got {cos_mean=!r}")
    if not -1.0 <= b < 1.0:
        raise ValueError(f"baseline must lie in [-1, 1) so that 1 - baseline > 0, got {baseline=!r}")
    return (1.0 - c) / (1.0 - b)


def _row(role, metric, value, low, high, n, n_examples, n_groups, seed) -> dict:
    return {"role": role, "target": "", "metric": metric, "value": float(value),
            "ci_low": float(low), "ci_high": float(high), "n": int(n),
            "n_examples": int(n_examples), "n_groups": int(n_groups), "seed": seed}


def drift_summary(
    A, B, example_ids, groups, baseline_X=None, baseline_example_ids=None, *,
    standardise: bool = False, n_resamples: int = 1000, confidence: float = 0.95,
    method: CIMethod = "percentile", n_pairs: int = 10000, seed: int = 0,
    overall_label: str | None = "all", clusters=None,
) -> list[dict]:
    """Cosine drift between two formats at one layer, per role group, with cluster-bootstrap CIs.

    A, B: (n, dim) paired states (row i = the same token key in format A and format B).
    example_ids: (n,) example of each row. groups: (n,) role group label of each row ("cls", "sep1",
    "s1 words", ...). clusters: (n,) the unit the bootstrap resamples (documents, from
    :func:`analyses.stats.cache_groups`); ``None``: the examples. baseline_X: (m, dim) states for the
    anisotropy baseline, with baseline_example_ids (m,); ``None`` uses the union of A's and B's rows.
    standardise: z-score every dimension (Timkey & van Schijndel 2021) with mean/std fitted on the
    baseline set, applied to A, B and the baseline set alike.

    For each group in order of first appearance, then for all rows under ``overall_label`` (unless
    ``None``), one dict per metric of :data:`DRIFT_METRICS`:

    - ``cosine_mean`` / ``cosine_median``: of ``cos_i`` (:func:`rowwise_cosine`);
    - ``drift_mean`` / ``drift_median``: of ``1 − cos_i``;
    - ``relative_l2_mean`` / ``relative_l2_median``: of ``||a_i − b_i|| / ||a_i||``;
    - ``normalised_drift`` / ``normalised_drift_median``: :func:`normalised_drift` of the mean / median
      cosine against the group's own random-pair baseline (below), its CI mapped from the cosine's CI
      with the baseline held fixed (the baseline's own uncertainty is not propagated). A group is
      measured against how far apart its own tokens lie in different examples, not against all tokens:
      in a sentence encoder's middle layers [CLS] is nearly the same vector for every input (random
      pairs of [CLS] at 1 − cos ≈ 1e-5 in all-MiniLM-L6-v2), so its raw drift is tiny even where the
      format moves it as far as another input would. The overall cell and every cell when
      ``baseline_X`` is given use the overall baseline. NaN where the spread ``1 − baseline`` is under
      :data:`MIN_SPREAD` (the embedding layer's [CLS]), with a warning when the overall baseline is >= 1;

    - ``anisotropy_baseline`` (groups only, unless ``baseline_X`` is given): :func:`group_baseline`, the
      mean cosine of ``n_pairs`` random pairs of the group's rows (both formats) from different examples,
      with its CI, ``n`` = number of pairs;

    and one ``anisotropy_baseline`` row for role ``"all"`` (whatever ``overall_label``, ``n`` = number of
    pairs, ``n_examples`` = examples in the baseline set) with its CI (:func:`anisotropy_baseline_ci`).
    Keys: ``role, target, metric, value, ci_low, ci_high, n`` (tokens), ``n_examples``, ``n_groups``
    (clusters in the cell), ``seed``, ``n_resamples``, matching :data:`analyses.results.RESULT_COLUMNS` plus
    ``n_examples``, ``n_groups`` and ``n_resamples``; the caller fills analysis, model, corpus, format, format_b, layer
    and the grouping's name. CIs are cluster bootstraps over ``clusters``
    (:func:`analyses.stats.bootstrap_ci`, same ``seed`` for every cell); with one cluster they are
    NaN. The anisotropy baseline's pairs are clustered by the example of their first row.

    Raises ``ValueError`` on shape mismatches, fewer than 2 baseline examples, or rows with zero norm
    (their cosine is undefined).
    """
    n_resamples = check_resamples(n_resamples, confidence)
    A, B = _check_pair(A, B)
    n = A.shape[0]
    if n == 0:
        raise ValueError(f"A and B have no rows: {A.shape=}")
    ex = _check_labels(example_ids, n, "example_ids")
    grp = _check_labels(groups, n, "groups")
    clu = ex if clusters is None else _check_labels(clusters, n, "clusters")
    if overall_label is not None and overall_label in set(grp.tolist()):
        raise ValueError(f"a group is named {overall_label!r}, the same as overall_label; rename one")
    if baseline_X is None:
        if baseline_example_ids is not None:
            raise ValueError("baseline_example_ids given without baseline_X")
        base_parts, base_ex = [A, B], np.concatenate([ex, ex])
    else:
        base = _check_2d(baseline_X, "baseline_X")
        if base.shape[1] != A.shape[1]:
            raise ValueError(f"baseline_X must have A's dim: {base.shape=} vs {A.shape=}")
        if baseline_example_ids is None:
            raise ValueError("baseline_X needs baseline_example_ids (the example of each row)")
        base_parts = [base]
        base_ex = _check_labels(baseline_example_ids, base.shape[0], "baseline_example_ids")
    # Standardised rows are made block by block and for the sampled pairs only: no full copies.
    mean, std = fit_standardization(base_parts) if standardise else (None, None)

    cos, rel = _cos_rel(A, B, mean=mean, std=std)
    bad = np.isnan(cos)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(f"{idx.size} rows have zero norm or non-finite values in A or B, so no "
                         f"cosine; first rows {idx[:10].tolist()}")
    drift = 1.0 - cos

    kw = dict(n_resamples=n_resamples, confidence=confidence, seed=seed, method=method)
    pair_cos, pair_first = _pair_cosines(base_parts, base_ex, n_pairs, seed, mean, std)
    b_all = bootstrap_ci(pair_cos, pair_first, "mean", **kw)
    if b_all[0] >= 1.0:
        warnings.warn(f"anisotropy baseline is {b_all[0]!r} (>= 1): normalised drift is undefined (NaN)",
                      RuntimeWarning, stacklevel=2)

    cells: list[tuple[str, np.ndarray]] = [(g, grp == g) for g in dict.fromkeys(grp.tolist())]
    if overall_label is not None:
        cells.append((overall_label, np.ones(n, dtype=bool)))

    rows: list[dict] = []
    for role, mask in cells:
        c_ids = clu[mask]
        n_tok, n_ex, n_cl = int(mask.sum()), int(np.unique(ex[mask]).size), int(np.unique(c_ids).size)
        ci = bootstrap_cis({"cosine": cos[mask], "drift": drift[mask], "relative_l2": rel[mask]},
                           c_ids, ("mean", "median"), **kw)
        for name in ("cosine", "drift", "relative_l2"):
            for stat in ("mean", "median"):
                rows.append(_row(role, f"{name}_{stat}", *ci[name, stat], n_tok, n_ex, n_cl, seed))
        # each group against its own spread: a group whose states barely vary between inputs ([CLS] in a
        # sentence encoder's middle layers) is not measured against the spread of every token
        own = baseline_X is None and role != overall_label
        b = (group_baseline([A, B], np.concatenate([ex, ex]), np.concatenate([mask, mask]), n_pairs,
                            mean=mean, std=std, **kw) if own else b_all)
        for stat, metric in (("mean", "normalised_drift"), ("median", "normalised_drift_median")):
            c, c_low, c_high = ci["cosine", stat]
            rows.append(_row(role, metric, _normalised(c, b[0]), _normalised(c_high, b[0]),
                             _normalised(c_low, b[0]), n_tok, n_ex, n_cl, seed))
        if own:
            rows.append(_row(role, "anisotropy_baseline", *b, n_pairs, n_ex, n_ex, seed))
    n_base_ex = np.unique(base_ex).size
    rows.append(_row("all", "anisotropy_baseline", *b_all, n_pairs, n_base_ex, n_base_ex, seed))
    for r in rows:
        r["n_resamples"] = n_resamples
    return rows


#: The least spread ``1 − baseline`` a normalised drift is divided by: states identical between inputs
#: up to float rounding (the embedding layer's [CLS]) have ``1 − cos`` of about 1e-15, and a ratio of two
#: such numbers means nothing.
MIN_SPREAD = 1e-12


def _normalised(c: float, baseline: float) -> float:
    """:func:`normalised_drift`, NaN where the cosine is NaN or the spread ``1 − baseline`` is under
    :data:`MIN_SPREAD`."""
    if np.isnan(c) or np.isnan(baseline) or 1.0 - baseline < MIN_SPREAD:
        return float("nan")
    return normalised_drift(c, baseline)


def group_pair_cosines(parts, example_ids, mask, n_pairs: int = 10000, seed: int = 0, mean=None,
                       std=None) -> tuple[np.ndarray, np.ndarray] | None:
    """Cosines of ``n_pairs`` random pairs of the rows ``mask`` selects from the row-wise union of
    ``parts`` (two formats' states of the same tokens), from different examples (:func:`random_pair_indices`),
    and the example of each pair's first row; None when those rows span fewer than two examples."""
    rows = np.flatnonzero(mask)
    ids = np.asarray(example_ids)[rows]
    if np.unique(ids).size < 2:
        return None
    return _pair_cosines(parts, ids, n_pairs, seed, mean, std, rows=rows)


def pair_spread(parts, example_ids, mask, n_pairs: int = 10000, seed: int = 0) -> float:
    """How far apart the rows ``mask`` selects lie in different examples: 1 − the mean of
    :func:`group_pair_cosines`; NaN when they span fewer than two examples. What the paired runners
    divide a group's drift by (:mod:`analyses.paired`, :mod:`analyses.interventions`)."""
    got = group_pair_cosines(parts, example_ids, mask, n_pairs, seed)
    return float("nan") if got is None else 1.0 - float(got[0].mean())


def group_baseline(parts, example_ids, mask, n_pairs: int = 10000, *, seed: int = 0, mean=None, std=None,
                   **ci_kw) -> tuple[float, float, float]:
    """The random-pair baseline of one group of rows, :func:`group_pair_cosines`' mean, with its bootstrap
    CI over the first row's example (``ci_kw``: those of :func:`analyses.stats.bootstrap_ci`);
    ``(nan, nan, nan)`` when the group spans fewer than two examples. What :func:`drift_summary`
    normalises each role group's drift by."""
    got = group_pair_cosines(parts, example_ids, mask, n_pairs, seed, mean, std)
    if got is None:
        return float("nan"), float("nan"), float("nan")
    return bootstrap_ci(*got, "mean", seed=seed, **ci_kw)


def subword_pool(states, word_ids, subword_index, mode: PoolMode = "first") -> tuple[np.ndarray, np.ndarray]:
    """Pool subword rows into one row per word.

    states: (n_tokens, dim); word_ids: (n_tokens,) integer id of each row's word, unique per word
    across the whole array (e.g. a factorised word key); subword_index: (n_tokens,) position of the
    row within its word (0 for the first subword). ``mode="first"`` takes the row with subword index 0
    (as BERT's token-level tasks do, Devlin et al. 2019 sec. 5.3) and returns it unchanged in
    ``states.dtype``; ``mode="mean"`` averages all subwords of the word in float64.

    Returns ``(pooled, words)``: pooled (n_words, dim) and words (n_words,) the sorted unique word ids,
    row k of ``pooled`` belonging to ``words[k]``. Vectorised: one sort, then a sparse word-by-row
    indicator product in row blocks (memory stays flat).
    Raises ``ValueError`` if a (word, subword) pair occurs twice, or, for ``"first"``, if a word has
    no subword 0.
    """
    if mode not in POOL_MODES:
        raise ValueError(f"mode must be one of {POOL_MODES}, got {mode=!r}")
    S = _check_2d(states, "states")
    n = S.shape[0]
    w = _check_labels(word_ids, n, "word_ids")
    sub = _check_labels(subword_index, n, "subword_index")
    if not (np.issubdtype(w.dtype, np.integer) and np.issubdtype(sub.dtype, np.integer)):
        raise ValueError(f"word_ids and subword_index must be integer arrays, got {w.dtype=}, {sub.dtype=}")
    if n == 0:
        return S[:0].copy() if mode == "first" else np.zeros((0, S.shape[1])), w[:0].copy()
    order = np.lexsort((sub, w))
    ws, ss = w[order], sub[order]
    dup = (ws[1:] == ws[:-1]) & (ss[1:] == ss[:-1])
    if dup.any():
        k = np.flatnonzero(dup)[:5]
        pairs = list(zip(ws[k].tolist(), ss[k].tolist()))
        raise ValueError(f"(word_id, subword_index) pairs occur more than once: {pairs}")
    starts = np.flatnonzero(np.concatenate([[True], ws[1:] != ws[:-1]]))
    words = ws[starts]
    if mode == "first":
        missing = ss[starts] != 0
        if missing.any():
            raise ValueError(f"words without subword 0: word_ids {words[missing][:10].tolist()} "
                             f"start at subword {ss[starts][missing][:10].tolist()}")
        return np.asarray(S[order[starts]]), words
    counts = np.diff(np.append(starts, n))
    # word of each sorted row as 0..n_words-1; sum rows per word with a sparse indicator product
    # (much faster than np.add.reduceat on 2-D), in row blocks that end at word boundaries
    word_pos = np.cumsum(np.concatenate([[True], ws[1:] != ws[:-1]])) - 1
    out = np.empty((words.size, S.shape[1]))
    s = 0
    while s < n:
        k = int(np.searchsorted(starts, s + _BLOCK_ROWS, side="left"))
        e = int(starts[k]) if k < starts.size else n
        c0, c1 = int(word_pos[s]), int(word_pos[e - 1]) + 1
        ind = _sparse.csr_matrix((np.ones(e - s), (word_pos[s:e] - c0, np.arange(e - s))),
                                 shape=(c1 - c0, e - s))
        out[c0:c1] = ind @ np.asarray(S[order[s:e]], dtype=np.float64)
        s = e
    out /= counts[:, None]
    return out, words
