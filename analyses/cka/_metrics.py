"""Centred kernel alignment (CKA) between two representations of the same items.

Kornblith, Norouzi, Lee & Hinton (2019), "Similarity of Neural Network Representations Revisited"
(ICML), define

    CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))                       (eq. 4)

for Gram matrices ``K``, ``L`` (n_items, n_items) of representations ``X`` (n_items, d1) and
``Y`` (n_items, d2). With the biased estimator HSIC(K, L) = tr(KHLH) / (n-1)^2 (Gretton et al. 2005,
``H = I - 11ᵀ/n``) and a linear kernel, CKA has the feature-space form (eq. 5, columns centred)

    linear CKA(X, Y) = ||Yᵀ X||_F^2 / (||Xᵀ X||_F ||Yᵀ Y||_F),

which costs O(n d^2) instead of O(n^2 d). "Debiased" CKA replaces every HSIC by the unbiased
U-statistic of Song et al. (2012, JMLR 13, "Feature Selection via Dependence Maximization", eq. 5);
its linear form can also be written in feature space (Kornblith et al.'s published code). The
conventions here (RBF bandwidth, U-centring) follow that published code so results agree with it.

Everything is accumulated in float64 whatever the input dtype, after scaling each input by a power
of two (exact, so no result changes) so that no sum of squares over- or underflows: CKA is scale
invariant from 1e-200 to 1e200. Every variant needs at least :data:`MIN_ITEMS` (4) items and raises
``ValueError`` below. Inputs may be numpy arrays or torch
tensors; with a tensor the computation runs on the tensor's device (numpy inputs are moved there).
A representation whose rows are all identical (e.g. ``[CLS]`` at the embedding layer) has no defined
CKA (0/0): the functions return ``nan`` with a :class:`CKAUndefinedWarning`, never 1.0.

Public API: :func:`linear_cka`, :func:`rbf_cka`, :func:`gram_cka`, :func:`linear_cka_matrix`,
:class:`CKAUndefinedWarning`, :data:`MIN_ITEMS`; the streaming accumulators :class:`StreamingCKAMatrix`
and :class:`StreamingLinearCKA` live in :mod:`analyses.cka._streaming` and are re-exported here. The
cache-reading runners and the command line are :mod:`analyses.cka._runner`.

>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(100, 8))
>>> Q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
>>> round(linear_cka(X, 3.0 * X @ Q + 1.0), 12)
1.0
"""


from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
import torch

from analyses.cka._numerics import (MIN_ITEMS, Array, CKAUndefinedWarning, _as_float64, _centred_unit, _check_n,
                                    _debiased_dot, _device_of, _flat_dot, _is_constant, _outer_self, _prepare, _ratio,
                                    _sq, _to_backend, _undefined, _unit_scale, _zero_variance_msg, _zeros)
from analyses.cka._streaming import StreamingCKAMatrix, StreamingLinearCKA

__all__ = [
    "MIN_ITEMS",
    "CKAUndefinedWarning",
    "linear_cka",
    "rbf_cka",
    "gram_cka",
    "linear_cka_matrix",
    "StreamingCKAMatrix",
    "StreamingLinearCKA",
]


# --------------------------------------------------------------------------- in-memory linear CKA


def _checked_pair(X: Array, Y: Array, debiased: bool):
    """``(X, Y, None)`` ready for CKA (checked, float64), or ``(X, Y, nan)`` with a
    :class:`CKAUndefinedWarning` when either has zero variance."""
    X, Y = _prepare([X, Y], ["X", "Y"])
    n = X.shape[0]
    _check_n(n, debiased)
    for name, A in (("X", X), ("Y", Y)):
        if _is_constant(A):
            return X, Y, _undefined(_zero_variance_msg(name, n))
    return X, Y, None


def linear_cka(X: Array, Y: Array, debiased: bool = False) -> float:
    """Linear CKA between ``X: (n_items, d1)`` and ``Y: (n_items, d2)``.

    Feature-space form (Kornblith et al. 2019, eq. 5): with columns centred,
    ``||YᵀX||_F² / (||XᵀX||_F ||YᵀY||_F)``, O(n·d²) time, no n×n matrix. With ``debiased=True`` each
    HSIC is the unbiased estimator of Song et al. (2012), in feature space (see
    :func:`_debiased_dot`); it may be slightly negative. Both need n_items >= :data:`MIN_ITEMS` (4).

    Computed in float64 on the inputs' device (torch) or with numpy. Returns ``nan`` with a
    :class:`CKAUndefinedWarning` when X or Y has zero variance. Raises ``ValueError`` for non-2-D,
    non-finite or empty input, for differing n_items and for n_items < 4.
    """
    X, Y, undefined = _checked_pair(X, Y, debiased)
    if undefined is not None:
        return undefined
    n = X.shape[0]
    Xc = _centred_unit(X)
    Yc = _centred_unit(Y)
    xy = _sq(Xc.T @ Yc)
    xx = _sq(_outer_self(Xc.T))
    yy = _sq(_outer_self(Yc.T))
    if debiased:
        r = (Xc * Xc).sum(1)
        s = (Yc * Yc).sum(1)
        sr, ss = float(r.sum()), float(s.sum())
        xy = _debiased_dot(xy, _flat_dot(r, s), sr, ss, n)
        xx = _debiased_dot(xx, _flat_dot(r, r), sr, sr, n)
        yy = _debiased_dot(yy, _flat_dot(s, s), ss, ss, n)
    return _ratio(xy, xx, yy, debiased)


def _centred_concat(layers: Sequence[Any], side: str, device, first: tuple[str, tuple]):
    """Validate layers ``(n_items, d_i)`` and centre each into one float64 ``(n_items, Σd_i)`` array.

    Returns the array, per-layer views of it, and per-layer zero-variance flags. One layer is
    converted at a time, so peak memory is the output plus one layer.
    """
    shapes = [tuple(np.shape(A)) if not isinstance(A, torch.Tensor) else tuple(A.shape) for A in layers]
    dims = [s[1] if len(s) == 2 else 0 for s in shapes]
    o = np.cumsum([0] + dims)
    n = shapes[0][0] if shapes[0] else 0
    buf = None
    consts = []
    for i, A in enumerate(layers):
        name = f"{side}[{i}]"
        A = _as_float64(A, name, device)
        if A.shape[0] != first[1][0]:
            raise ValueError(
                f"{first[0]}.shape={first[1]} and {name}.shape={tuple(A.shape)} differ in n_items (dimension 0)"
            )
        if buf is None:
            buf = _zeros((n, int(o[-1])), device) if device is not None else np.empty((n, int(o[-1])))
        consts.append(_is_constant(A))
        buf[:, o[i]:o[i + 1]] = _centred_unit(A)
    return buf, [buf[:, o[i]:o[i + 1]] for i in range(len(layers))], consts


def linear_cka_matrix(Xs: Sequence[Array], Ys: Sequence[Array] | None = None, debiased: bool = False) -> np.ndarray:
    """Linear CKA for every pair of layers: ``out[i, j] = linear_cka(Xs[i], Ys[j], debiased)``.

    ``Xs``: L_x arrays ``(n_items, d_i)``; ``Ys``: L_y arrays ``(n_items, e_j)``, or None to compare
    ``Xs`` with itself (symmetric result, half the work). Returns ``(L_x, L_y)`` float64 numpy.

    Each layer is centred once and each self-term ``||XᵢᵀXᵢ||_F`` computed once; all cross terms
    come from one product of the column-concatenated layers (Kornblith et al. 2019, eq. 5).
    Layers with zero variance give nan rows/columns and a :class:`CKAUndefinedWarning` each.
    """
    self_mode = Ys is None
    for side, layers in (("Xs", Xs), ("Ys", Ys)):
        if isinstance(layers, (np.ndarray, torch.Tensor)):
            raise ValueError(f"{side} must be a sequence of (n_items, dim) arrays (one per layer), "
                             f"got one array of shape {tuple(layers.shape)}; wrap it in a list")
    Xs, Ys = list(Xs), (None if self_mode else list(Ys))
    if not Xs or (Ys is not None and not Ys):
        raise ValueError(f"need at least one layer on each side, got {len(Xs)} X and {len(Ys or [])} Y layers")
    device = _device_of(Xs + (Ys or []))
    first = ("Xs[0]", tuple(np.shape(Xs[0])))
    Xcat, Xcs, const_x = _centred_concat(Xs, "Xs", device, first)
    n = Xcat.shape[0]
    _check_n(n, debiased)
    if self_mode:
        Ycat, Ycs, const_y = Xcat, Xcs, const_x
    else:
        Ycat, Ycs, const_y = _centred_concat(Ys, "Ys", device, first)
    for side, consts in (("Xs", const_x),) + ((("Ys", const_y),) if not self_mode else ()):
        for i, c in enumerate(consts):
            if c:
                _undefined(_zero_variance_msg(f"{side}[{i}]", n))

    G = _outer_self(Xcat.T) if self_mode else Xcat.T @ Ycat  # (Σd_i, Σe_j): every cross term at once
    ox = np.cumsum([0] + [A.shape[1] for A in Xcs])
    oy = np.cumsum([0] + [A.shape[1] for A in Ycs])

    def self_terms(cs, offsets):
        if self_mode:
            blocks = [G[offsets[i]:offsets[i + 1], offsets[i]:offsets[i + 1]] for i in range(len(cs))]
        else:
            blocks = [_outer_self(A.T) for A in cs]
        return [_sq(B) for B in blocks]

    xx = self_terms(Xcs, ox)
    yy = xx if self_mode else self_terms(Ycs, oy)
    if debiased:
        def row_norms(cs):
            R = [(A * A).sum(1) for A in cs]
            return (np.stack(R, 1) if device is None else torch.stack(R, 1))
        Rx = row_norms(Xcs)
        Ry = Rx if self_mode else row_norms(Ycs)
        RxRy = _to_backend(Rx.T @ Ry, None)
        sx = _to_backend(Rx.sum(0), None)
        sy = _to_backend(Ry.sum(0), None)
        rr_x = _to_backend((Rx * Rx).sum(0), None)
        rr_y = _to_backend((Ry * Ry).sum(0), None)
        xx = [_debiased_dot(xx[i], rr_x[i], sx[i], sx[i], n) for i in range(len(Xcs))]
        yy = xx if self_mode else [_debiased_dot(yy[j], rr_y[j], sy[j], sy[j], n) for j in range(len(Ycs))]

    out = np.full((len(Xcs), len(Ycs)), np.nan)
    for i in range(len(Xcs)):
        for j in range(len(Ycs)):
            if const_x[i] or const_y[j] or (self_mode and j < i):
                continue
            xy = _sq(G[ox[i]:ox[i + 1], oy[j]:oy[j + 1]])
            if debiased:
                xy = _debiased_dot(xy, RxRy[i, j], sx[i], sy[j], n)
            out[i, j] = _ratio(xy, xx[i], yy[j], debiased)
    if self_mode:
        lower = np.tril_indices(len(Xcs), -1)
        out[lower] = out.T[lower]
    return out


# --------------------------------------------------------------------------- Gram-form CKA


def _centre_gram_(K: Array, debiased: bool) -> Array:
    """Centre a symmetric Gram matrix in place.

    Biased: ``HKH``. Debiased: the U-centring of Székely & Rizzo (2014, Ann. Stat. 42(6)), as in
    Kornblith et al.'s code: zero diagonal, subtract row/column sums / (n-2), add back the total /
    ((n-1)(n-2)), zero diagonal. Then ``<Ũ(K), Ũ(L)>_F / (n(n-3))`` equals Song et al.'s (2012)
    unbiased HSIC.
    """
    n = K.shape[0]
    idx = np.arange(n) if not isinstance(K, torch.Tensor) else torch.arange(n, device=K.device)
    if debiased:
        K[idx, idx] = 0.0
        means = K.sum(0) / (n - 2)
        means = means - means.sum() / (2 * (n - 1))
    else:
        means = K.mean(0)
        means = means - means.mean() / 2
    K -= means[:, None]
    K -= means[None, :]
    if debiased:
        K[idx, idx] = 0.0
    return K


def _gram_cka_(K: Array, L: Array, debiased: bool, names=("gram_x", "gram_y")) -> float:
    """CKA of two float64 Gram matrices, centring them in place."""
    norms = []
    for name, M in zip(names, (K, L)):
        scale = math.sqrt(_sq(M))
        _centre_gram_(M, debiased)
        norms.append(_sq(M))
        # a constant Gram matrix centres to rounding noise: treat it as zero variance
        if not debiased and math.sqrt(norms[-1]) <= M.shape[0] * 1e-15 * scale:
            return _undefined(
                f"{name} has zero variance after centring (||HKH||_F = {math.sqrt(norms[-1]):.3g}, "
                f"||K||_F = {scale:.3g}): CKA is 0/0 and undefined; returning nan"
            )
    return _ratio(_flat_dot(K, L), norms[0], norms[1], debiased)


def gram_cka(gram_x: Array, gram_y: Array, debiased: bool = False) -> float:
    """CKA of two precomputed symmetric Gram matrices ``(n_items, n_items)``.

    ``<HKH, HLH>_F / (||HKH||_F ||HLH||_F)`` (Kornblith et al. 2019, eqs. 3-4; the 1/(n-1)² of
    tr(KHLH)/(n-1)² cancels). ``debiased=True`` uses U-centring (see :func:`_centre_gram_`),
    i.e. Song et al.'s (2012) unbiased HSIC. Inputs are not modified.
    """
    K, L = _prepare([gram_x, gram_y], ["gram_x", "gram_y"])
    for name, M in (("gram_x", K), ("gram_y", L)):
        if M.shape[0] != M.shape[1]:
            raise ValueError(f"{name} must be square (n_items, n_items), got {name}.shape={tuple(M.shape)}")
        asym = float(abs(M - M.T).max())
        if asym > 1e-8 * max(float(abs(M).max()), 1e-300):
            raise ValueError(f"{name} must be symmetric; max |K - Kᵀ| = {asym:.3g}")
    _check_n(K.shape[0], debiased)
    return _gram_cka_(_unit_scale(K), _unit_scale(L), debiased)


def _median(A: Array) -> float:
    """Median of all entries, numpy's convention (mean of the two middle values for even size)."""
    if not isinstance(A, torch.Tensor):
        return float(np.median(A))
    flat = A.reshape(-1)
    m = flat.numel()
    lo = float(torch.kthvalue(flat, (m + 1) // 2).values)
    hi = lo if m % 2 else float(torch.kthvalue(flat, m // 2 + 1).values)
    return (lo + hi) / 2


def _rbf_gram(X: Array, sigma: float, name: str) -> Array | None:
    """RBF Gram ``exp(-D / (2 σ² median(D)))`` for squared distances D (n, n) of ``X: (n, d)``.

    Kornblith et al.'s convention (``gram_rbf(x, threshold)``): bandwidth = σ × median distance,
    with the median over the full n×n matrix, zero diagonal included. None if that median is 0.
    """
    Xc = _centred_unit(X)  # distances are translation invariant; centring reduces cancellation
    D = _outer_self(Xc)
    sq = (Xc * Xc).sum(1)
    D *= -2.0
    D += sq[:, None]
    D += sq[None, :]
    D = D.clip(min=0.0) if isinstance(D, torch.Tensor) else np.maximum(D, 0.0, out=D)
    idx = np.arange(len(sq)) if not isinstance(D, torch.Tensor) else torch.arange(len(sq), device=D.device)
    D[idx, idx] = 0.0
    med = _median(D)
    if not med > 0:
        warnings.warn(
            f"median squared distance of {name} is {med}: more than half of its item pairs are "
            "identical, so the RBF bandwidth (sigma x median distance) is 0; CKA undefined, returning nan",
            CKAUndefinedWarning, stacklevel=3,
        )
        return None
    D *= -1.0 / (2.0 * sigma**2 * med)
    return D.exp() if isinstance(D, torch.Tensor) else np.exp(D, out=D)


def rbf_cka(X: Array, Y: Array, sigma: float = 0.5, debiased: bool = False) -> float:
    """CKA with RBF kernels between ``X: (n_items, d1)`` and ``Y: (n_items, d2)``; Gram form, O(n²).

    ``k(x_i, x_j) = exp(-||x_i - x_j||² / (2 σ² median_{k,l} ||x_k - x_l||²))``: bandwidth σ times
    the median distance (Kornblith et al. 2019, Sec. 3 and their ``gram_rbf``; σ = 0.5 in their
    demo; median over all n² entries). ``debiased`` as in :func:`gram_cka`. float64 throughout.
    Zero variance in X or Y gives nan and a :class:`CKAUndefinedWarning`.
    """
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a positive finite number, got {sigma=!r}")
    X, Y, undefined = _checked_pair(X, Y, debiased)
    if undefined is not None:
        return undefined
    K = _rbf_gram(X, sigma, "X")
    L = _rbf_gram(Y, sigma, "Y") if K is not None else None
    if K is None or L is None:
        return math.nan
    return _gram_cka_(K, L, debiased, names=("X's RBF Gram", "Y's RBF Gram"))
