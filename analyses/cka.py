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
:class:`StreamingCKAMatrix`, :class:`StreamingLinearCKA`, :class:`CKAUndefinedWarning`, :data:`MIN_ITEMS`.

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

Array = Any  # np.ndarray or torch.Tensor, shape stated in each docstring


class CKAUndefinedWarning(RuntimeWarning):
    """CKA is undefined for these inputs (zero variance, or a non-positive debiased self-HSIC)."""


# --------------------------------------------------------------------------- backend helpers
# One code path serves numpy arrays and torch tensors: the arithmetic below uses only operators
# both support (+, -, *, @, .T, slicing, .sum(0)); the few that differ live here.


def _device_of(arrays: Sequence[Any]) -> torch.device | None:
    """The torch device the computation runs on, or None for numpy. Devices must agree."""
    devices = {a.device for a in arrays if isinstance(a, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"torch inputs are on different devices {sorted(map(str, devices))}")
    return devices.pop() if devices else None


def _as_float64(A: Any, name: str, device: torch.device | None) -> Array:
    """Validate a 2-D finite array and return it as float64 on ``device`` (None: numpy)."""
    if isinstance(A, torch.Tensor):
        A = A.detach()
        if A.is_complex():
            raise ValueError(f"{name} must be real, got dtype {A.dtype}")
    else:
        A = np.asarray(A)
        if not (np.issubdtype(A.dtype, np.number) or A.dtype == np.bool_) or np.iscomplexobj(A):
            raise ValueError(f"{name} must be a real numeric array, got dtype {A.dtype}")
    shape = tuple(A.shape)
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D (n_items, dim), got {name}.shape={shape}")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"{name} is empty: {name}.shape={shape}")
    if device is None:
        A = A.astype(np.float64, copy=False)
        bad = int(A.size - np.count_nonzero(np.isfinite(A)))
    else:
        A = (torch.from_numpy(A) if isinstance(A, np.ndarray) else A).to(device, torch.float64)
        bad = int((~torch.isfinite(A)).sum())
    if bad:
        raise ValueError(f"{name} (shape {shape}) contains {bad} non-finite values (NaN or inf)")
    return A


def _prepare(arrays: Sequence[Any], names: Sequence[str]) -> list[Array]:
    """``arrays`` as float64 on a common backend (not copied if already so), checked to share n_items."""
    device = _device_of(arrays)
    out = [_as_float64(A, nm, device) for A, nm in zip(arrays, names)]
    n0 = out[0].shape[0]
    for A, nm in zip(out[1:], names[1:]):
        if A.shape[0] != n0:
            raise ValueError(
                f"{names[0]}.shape={tuple(out[0].shape)} and {nm}.shape={tuple(A.shape)} "
                "differ in n_items (dimension 0)"
            )
    return out


def _zeros(shape: tuple[int, ...], device: torch.device | None) -> Array:
    if device is None:
        return np.zeros(shape, dtype=np.float64)
    return torch.zeros(shape, dtype=torch.float64, device=device)


def _to_backend(A: Array, device: torch.device | None) -> Array:
    if device is None:
        return A.detach().cpu().numpy() if isinstance(A, torch.Tensor) else np.asarray(A)
    return (torch.from_numpy(A) if isinstance(A, np.ndarray) else A).to(device, torch.float64)


def _copy(A: Array) -> Array:
    return A.clone() if isinstance(A, torch.Tensor) else A.copy()


def _col_min(A: Array) -> Array:
    return torch.amin(A, 0) if isinstance(A, torch.Tensor) else A.min(0)


def _col_max(A: Array) -> Array:
    return torch.amax(A, 0) if isinstance(A, torch.Tensor) else A.max(0)


def _minimum(a: Array, b: Array) -> Array:
    return torch.minimum(a, b) if isinstance(a, torch.Tensor) else np.minimum(a, b)


def _maximum(a: Array, b: Array) -> Array:
    return torch.maximum(a, b) if isinstance(a, torch.Tensor) else np.maximum(a, b)


def _flat_dot(a: Array, b: Array) -> float:
    """sum(a * b) without an n x n temporary (BLAS dot on the flattened arrays)."""
    if isinstance(a, torch.Tensor):
        return float(torch.dot(a.reshape(-1), b.reshape(-1)))
    return float(np.dot(a.ravel(), b.ravel()))


def _sq(A: Array) -> float:
    """Squared Frobenius norm."""
    return _flat_dot(A, A)


_SYRK_BLOCK = 4096


def _outer_self(A: Array) -> Array:
    """``A @ A.T`` for ``A: (m, k)``, as a symmetric ``(m, m)`` float64 array.

    numpy sends ``A @ A.T`` to BLAS syrk, which segfaults with OpenBLAS for large m (numpy issue
    #19685; here from m ~ 16,000). For m above ``_SYRK_BLOCK`` the product is built from row blocks
    (gemm on the upper triangle, mirrored), so no syrk call sees more than ``_SYRK_BLOCK`` rows.
    """
    m = A.shape[0]
    if isinstance(A, torch.Tensor) or m <= _SYRK_BLOCK:
        return A @ A.T
    G = np.empty((m, m))
    for s in range(0, m, _SYRK_BLOCK):
        e = min(s + _SYRK_BLOCK, m)
        np.matmul(A[s:e], A[s:].T, out=G[s:e, s:])
        G[e:, s:e] = G[s:e, e:].T
    return G


def _is_constant(A: Array) -> bool:
    """True when every row equals the first (zero variance). Exact: float64 conversion keeps ties."""
    return bool((A == A[0]).all())


def _undefined(reason: str) -> float:
    warnings.warn(reason, CKAUndefinedWarning, stacklevel=3)
    return math.nan


def _zero_variance_msg(name: str, n: int) -> str:
    return (
        f"{name} has zero variance (all {n} rows identical, e.g. [CLS] at the embedding layer): "
        "its centred Gram matrix is 0, so CKA is 0/0 and undefined; returning nan"
    )


def _debiased_dot(xty: float, sum_rs: float, sum_r: float, sum_s: float, n: int) -> float:
    """Unbiased linear HSIC times n(n-3), in feature space.

    For centred X, Y with squared row norms r_i, s_i: Song et al.'s (2012) U-statistic with
    K = XXᵀ, L = YYᵀ expands to ||YᵀX||² - n/(n-2) Σ r_i s_i + Σr Σs / ((n-1)(n-2))
    (the form in Kornblith et al.'s code).
    """
    return xty - n / (n - 2.0) * sum_rs + sum_r * sum_s / ((n - 1.0) * (n - 2.0))


def _ratio(xy: float, xx: float, yy: float, debiased: bool) -> float:
    if not (xx > 0 and yy > 0):
        return _undefined(
            f"{'debiased ' if debiased else ''}self-similarity estimate is not positive "
            f"(HSIC(X,X)~{xx:.3g}, HSIC(Y,Y)~{yy:.3g}); CKA undefined, returning nan"
        )
    return xy / (math.sqrt(xx) * math.sqrt(yy))


#: The fewest items any CKA here accepts. Below 4 the number says nothing about the representations:
#: with n = 2 centred items span one direction, so linear CKA is 1 for any X and Y; with n = 3 it is
#: fixed by two directions per side; the debiased estimator divides by n(n - 3).
MIN_ITEMS = 4


def _check_n(n: int, debiased: bool = False) -> None:
    if n < MIN_ITEMS:
        why = ("the U-statistic divides by n(n-3)" if debiased else
               "with n = 2 linear CKA is 1 for any inputs, and n = 3 is nearly as fixed")
        raise ValueError(f"{'debiased ' if debiased else ''}CKA needs n_items >= {MIN_ITEMS} ({why}), got {n=}")


def _exponent(A: Array) -> int:
    """The binary exponent e of max|A| (max|A| in [2^(e-1), 2^e)); 0 for an all-zero array."""
    m = float(abs(A).max())
    return math.frexp(m)[1] if m > 0 else 0


def _ldexp(A: Array, k) -> Array:
    """``A * 2**k`` exactly (k: int or int array broadcastable to A), without forming 2**k when it
    would overflow: numpy's ldexp, or in torch two exactly representable halves."""
    if not isinstance(A, torch.Tensor):
        return np.ldexp(A, np.asarray(k, dtype=np.int64))
    k = torch.as_tensor(np.asarray(k, dtype=np.float64), device=A.device)
    half = torch.floor(k / 2)
    return A * torch.exp2(half) * torch.exp2(k - half)


def _unit_scale(A: Array) -> Array:
    """``A`` times the power of two that brings max|A| into [0.5, 1).

    CKA is invariant to scaling each input, and a power of two is exact in floating point, so this
    changes no result bit for bit, while the sums of squares and fourth powers below neither
    overflow (|x| > 1e77) nor underflow (|x| < 1e-75) at extreme scales.
    """
    return _ldexp(A, -_exponent(A))


def _centred_unit(A: Array) -> Array:
    """Columns of ``A: (n, d)`` centred, scaled to max-abs in [0.5, 1): before centring, so the mean
    cannot overflow, and after, so a small spread about a large mean does not underflow."""
    A = _unit_scale(A)
    return _unit_scale(A - A.mean(0))


# --------------------------------------------------------------------------- in-memory linear CKA


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
    X, Y = _prepare([X, Y], ["X", "Y"])
    n = X.shape[0]
    _check_n(n, debiased)
    for name, A in (("X", X), ("Y", Y)):
        if _is_constant(A):
            return _undefined(_zero_variance_msg(name, n))
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
    X, Y = _prepare([X, Y], ["X", "Y"])
    n = X.shape[0]
    _check_n(n, debiased)
    for name, A in (("X", X), ("Y", Y)):
        if _is_constant(A):
            return _undefined(_zero_variance_msg(name, n))
    K = _rbf_gram(X, sigma, "X")
    L = _rbf_gram(Y, sigma, "Y") if K is not None else None
    if K is None or L is None:
        return math.nan
    return _gram_cka_(K, L, debiased, names=("X's RBF Gram", "Y's RBF Gram"))


# --------------------------------------------------------------------------- streaming linear CKA

# In self mode (Ys is None) the Y-side statistics are the X-side ones; these keys are not stored.
_SELF_ALIAS = {
    "shift_y": "shift_x", "sy": "sx", "miny": "minx", "maxy": "maxx",
    "sb": "sa", "sbb": "saa", "sax": "say", "sby": "say", "sbx": "say",
}
_DEBIASED_KEYS = ("sa", "sb", "saa", "sbb", "sab", "sax", "sby", "say", "sbx")
#: Per-layer binary exponents of the units the statistics are kept in (int64 numpy, never on a device).
_EXPONENT_KEYS = ("exp_x", "exp_y")


class StreamingCKAMatrix:
    """Mergeable accumulator of linear CKA between every (X layer, Y layer) pair, over batches.

    ``update(Xs, Ys)`` takes one batch: ``Xs`` a sequence of L_x arrays ``(batch, d_i)``, ``Ys`` of
    L_y arrays ``(batch, e_j)`` for the same items (or ``Ys=None`` on every call to compare ``Xs``
    with itself). ``result()`` returns the ``(L_x, L_y)`` matrix, equal to
    :func:`linear_cka_matrix` on the concatenated batches (to 1e-10 in the tests), with memory
    independent of the number of items.

    Sufficient statistics, all float64, about a shift ``s`` (the first batch's mean, for numerical
    stability; x below means x - s): n, Σx, Σxyᵀ (one (Σd × Σe) matrix for all pairs), per-layer
    Σx_i x_iᵀ, per-feature min/max (exact zero-variance detection), and for ``debiased=True`` the
    squared row norms a_i = ||x_i||² per layer with Σa, Σa², Σa bᵀ, Σa xᵀ, Σa yᵀ. The centred
    quantities of Kornblith et al. (2019, eq. 5) and the feature-space debiased HSIC follow by
    expanding ||x - μ||² = a - 2xᵀμ + ||μ||² (see :meth:`result`).

    Each layer's statistics are kept in units of 2^exp (``exp_x``, ``exp_y``: per-layer int64): set
    from the first batch's spread, raised when a later batch (or a merged accumulator) is larger, the
    statistics then rescaled exactly by powers of two, so nothing over- or underflows whatever the
    inputs' scale. Min/max stay in the inputs' units.

    Accumulators live on ``device`` (a torch device), or on the device of the first torch batch,
    or in numpy when the first batch is numpy and ``device`` is None. ``merge(other)`` adds another
    accumulator's statistics (re-expressed about this one's shift); ``state_dict()`` /
    ``from_state_dict()`` move them between processes as plain numpy arrays.
    """

    def __init__(self, debiased: bool = False, device: str | torch.device | None = None):
        self.debiased = bool(debiased)
        self.device = None if device is None else torch.device(device)
        self._st: dict[str, Any] | None = None
        self._layout: tuple | None = None  # (dims_x, dims_y or None)
        self._backend_set = device is not None

    # ---- layout helpers
    @property
    def n_items(self) -> int:
        """Number of items accumulated so far."""
        return 0 if self._st is None else int(self._st["n"])

    @property
    def self_mode(self) -> bool:
        return self._layout is not None and self._layout[1] is None

    def _g(self, key: str) -> Any:
        if self.self_mode and key in _SELF_ALIAS:
            key = _SELF_ALIAS[key]
        return self._st[key]

    def _offsets(self, dims):
        return np.cumsum([0] + list(dims))

    def _masks(self, dims):
        """(L, D) block indicator: row l is 1 on layer l's features."""
        M = np.zeros((len(dims), int(sum(dims))))
        o = self._offsets(dims)
        for i in range(len(dims)):
            M[i, o[i]:o[i + 1]] = 1.0
        return _to_backend(M, self.device)

    def _gxx_blocks(self, side: str) -> list:
        if self.self_mode:
            o = self._offsets(self._layout[0])
            G = self._st["gxy"]
            return [G[o[i]:o[i + 1], o[i]:o[i + 1]] for i in range(len(o) - 1)]
        return self._st["gxx" if side == "x" else "gyy"]

    # ---- accumulation
    def _batch(self, layers: Sequence[Any], side: str):
        if isinstance(layers, (np.ndarray, torch.Tensor)) or not isinstance(layers, (list, tuple)):
            raise ValueError(f"{side}s must be a list or tuple of (batch, dim) arrays, got {type(layers).__name__}")
        if not layers:
            raise ValueError(f"{side}s is empty: need at least one layer")
        return list(layers)

    def update(self, Xs: Sequence[Array], Ys: Sequence[Array] | None = None) -> "StreamingCKAMatrix":
        """Add one batch. ``Xs``: L_x arrays ``(batch, d_i)``; ``Ys``: L_y arrays ``(batch, e_j)`` or None."""
        Xs = self._batch(Xs, "X")
        Ys = None if Ys is None else self._batch(Ys, "Y")
        names = [f"Xs[{i}]" for i in range(len(Xs))] + [f"Ys[{j}]" for j in range(len(Ys or []))]
        raw = Xs + (Ys or [])
        if not self._backend_set:
            self.device = _device_of(raw)
            self._backend_set = True
        if self.device is None:
            moved = [A.detach().cpu().numpy() if isinstance(A, torch.Tensor) else A for A in raw]
        else:
            moved = [A if isinstance(A, torch.Tensor) else torch.from_numpy(np.asarray(A)) for A in raw]
            moved = [A.to(self.device) for A in moved]
        arrs = _prepare(moved, names)
        Xs, Ys = arrs[: len(Xs)], (None if Ys is None else arrs[len(Xs):])
        layout = (tuple(A.shape[1] for A in Xs), None if Ys is None else tuple(A.shape[1] for A in Ys))
        if self._layout is None:
            self._layout = layout
        elif layout != self._layout:
            raise ValueError(f"batch layout (dims_x, dims_y)={layout} differs from the first batch's {self._layout}")
        if self._st is None:
            self._init_state(Xs, Ys)
        self._accumulate(Xs, Ys)
        return self

    # ---- scale: each layer is stored in units of 2^exp, so no sum of squares over- or underflows
    def _first_exponents(self, layers) -> np.ndarray:
        """Per layer, the exponent that brings the first batch's spread about its mean to max-abs
        ~1 (as :func:`_centred_unit`): ``exp = e(max|A|) + e(max|A/2^e - mean|)``."""
        out = []
        for A in layers:
            e = _exponent(A)
            U = _ldexp(A, -e)
            out.append(e + _exponent(U - U.mean(0)))
        return np.asarray(out, dtype=np.int64)

    def _feature_exp(self, exps: np.ndarray, dims) -> np.ndarray:
        return np.repeat(np.asarray(exps, dtype=np.int64), list(dims))

    def _in_units(self, layers, side: str) -> list:
        """The batch's layers in the state's units, raising a layer's exponent first (and rescaling
        the statistics) where the batch's values, shifted, would exceed 2^8 in them."""
        key, dims = ("exp_x", self._layout[0]) if side == "x" else ("exp_y", self._layout[1])
        shift_key = "shift_x" if side == "x" else "shift_y"
        o = self._offsets(dims)
        exps = self._st[key].copy()
        for i, A in enumerate(layers):
            exps[i] = max(exps[i], _exponent(A) - 960)  # so A / 2^exp below cannot overflow
        scaled = []
        for i, A in enumerate(layers):
            U = _ldexp(A, -exps[i])
            m = float(abs(U - _ldexp(self._st[shift_key][o[i]:o[i + 1]], self._st[key][i] - exps[i])).max())
            if m > 256.0:
                exps[i] += math.frexp(m)[1]
                U = _ldexp(A, -exps[i])
            scaled.append(U)
        if (exps != self._st[key]).any():
            new = {"exp_x": self._st["exp_x"], "exp_y": self._st.get("exp_y")}
            new[key] = exps
            self._st = self._rescaled(new["exp_x"], new["exp_y"])
        return scaled

    def _rescaled(self, exp_x: np.ndarray, exp_y: np.ndarray | None) -> dict:
        """The statistics re-expressed in units of 2^exp_x (and 2^exp_y): exact powers of two. Each
        statistic scales with its degree in x and y (e.g. Σxyᵀ by 2^(kx+ky), Σa² by 2^(4kx))."""
        st = dict(self._st)
        kx = np.asarray(st["exp_x"], dtype=np.int64) - np.asarray(exp_x, dtype=np.int64)
        fx = self._feature_exp(kx, self._layout[0])
        if self.self_mode:
            ky, fy = kx, fx
        else:
            ky = np.asarray(st["exp_y"], dtype=np.int64) - np.asarray(exp_y, dtype=np.int64)
            fy = self._feature_exp(ky, self._layout[1])
        degree = {"shift_x": fx, "sx": fx, "gxy": fx[:, None] + fy[None, :],
                  "sa": 2 * kx, "saa": 4 * kx, "sab": 2 * kx[:, None] + 2 * ky[None, :],
                  "say": 2 * kx[:, None] + fy[None, :]}
        if not self.self_mode:
            degree.update(shift_y=fy, sy=fy, sb=2 * ky, sbb=4 * ky, sax=2 * kx[:, None] + fx[None, :],
                          sby=2 * ky[:, None] + fy[None, :], sbx=2 * ky[:, None] + fx[None, :])
            st["gxx"] = [_ldexp(B, 2 * kx[i]) for i, B in enumerate(st["gxx"])]
            st["gyy"] = [_ldexp(B, 2 * ky[j]) for j, B in enumerate(st["gyy"])]
            st["exp_y"] = np.asarray(exp_y, dtype=np.int64)
        for key, k in degree.items():
            if key in st:
                st[key] = _ldexp(st[key], k)
        st["exp_x"] = np.asarray(exp_x, dtype=np.int64)
        return st

    def _init_state(self, Xs, Ys) -> None:
        dev = self.device
        cat = (lambda a: np.concatenate(a)) if dev is None else (lambda a: torch.cat(a))
        dims_x, dims_y = self._layout
        Dx, Lx = int(sum(dims_x)), len(dims_x)
        exp_x = self._first_exponents(Xs)
        st: dict[str, Any] = {"n": 0, "exp_x": exp_x,
                              "shift_x": cat([_ldexp(A, -exp_x[i]).mean(0) for i, A in enumerate(Xs)])}
        st["sx"] = _zeros((Dx,), dev)
        st["minx"] = cat([_col_min(A) for A in Xs])
        st["maxx"] = cat([_col_max(A) for A in Xs])
        if Ys is None:
            st["gxy"] = _zeros((Dx, Dx), dev)
            if self.debiased:
                st.update(sa=_zeros((Lx,), dev), saa=_zeros((Lx,), dev), sab=_zeros((Lx, Lx), dev),
                          say=_zeros((Lx, Dx), dev))
        else:
            Dy, Ly = int(sum(dims_y)), len(dims_y)
            st["exp_y"] = exp_y = self._first_exponents(Ys)
            st["shift_y"] = cat([_ldexp(A, -exp_y[i]).mean(0) for i, A in enumerate(Ys)])
            st["sy"] = _zeros((Dy,), dev)
            st["miny"] = cat([_col_min(A) for A in Ys])
            st["maxy"] = cat([_col_max(A) for A in Ys])
            st["gxy"] = _zeros((Dx, Dy), dev)
            st["gxx"] = [_zeros((d, d), dev) for d in dims_x]
            st["gyy"] = [_zeros((d, d), dev) for d in dims_y]
            if self.debiased:
                st.update(sa=_zeros((Lx,), dev), sb=_zeros((Ly,), dev), saa=_zeros((Lx,), dev),
                          sbb=_zeros((Ly,), dev), sab=_zeros((Lx, Ly), dev), sax=_zeros((Lx, Dx), dev),
                          sby=_zeros((Ly, Dy), dev), say=_zeros((Lx, Dy), dev), sbx=_zeros((Ly, Dx), dev))
        self._st = st
        self._mx = self._masks(dims_x)
        self._my = self._mx if Ys is None else self._masks(dims_y)

    def _shifted_concat(self, layers, shift):
        dims = [A.shape[1] for A in layers]
        o = self._offsets(dims)
        nb = layers[0].shape[0]
        if self.device is None:
            buf = np.empty((nb, int(o[-1])))
            for i, A in enumerate(layers):
                np.subtract(A, shift[o[i]:o[i + 1]], out=buf[:, o[i]:o[i + 1]])
            return buf
        return torch.cat(layers, dim=1) - shift

    def _accumulate(self, Xs, Ys) -> None:
        self._st["minx"] = _minimum(self._st["minx"], _cat_backend([_col_min(A) for A in Xs]))
        self._st["maxx"] = _maximum(self._st["maxx"], _cat_backend([_col_max(A) for A in Xs]))
        if Ys is not None:
            self._st["miny"] = _minimum(self._st["miny"], _cat_backend([_col_min(A) for A in Ys]))
            self._st["maxy"] = _maximum(self._st["maxy"], _cat_backend([_col_max(A) for A in Ys]))
        Xs = self._in_units(Xs, "x")  # min/max above stay in the inputs' units: only equality matters
        Ys = None if Ys is None else self._in_units(Ys, "y")
        st = self._st
        Xc = self._shifted_concat(Xs, st["shift_x"])
        st["n"] += Xc.shape[0]
        st["sx"] += Xc.sum(0)
        if Ys is None:
            Yc = Xc
        else:
            Yc = self._shifted_concat(Ys, st["shift_y"])
            st["sy"] += Yc.sum(0)
            ox, oy = self._offsets(self._layout[0]), self._offsets(self._layout[1])
            for i in range(len(ox) - 1):
                B = Xc[:, ox[i]:ox[i + 1]]
                st["gxx"][i] += _outer_self(B.T)
            for j in range(len(oy) - 1):
                B = Yc[:, oy[j]:oy[j + 1]]
                st["gyy"][j] += _outer_self(B.T)
        st["gxy"] += _outer_self(Xc.T) if Ys is None else Xc.T @ Yc
        if self.debiased:
            a = (Xc * Xc) @ self._mx.T  # (batch, L_x) squared row norms per layer
            st["sa"] += a.sum(0)
            st["saa"] += (a * a).sum(0)
            st["say"] += a.T @ Yc
            if Ys is None:
                st["sab"] += a.T @ a
            else:
                b = (Yc * Yc) @ self._my.T
                st["sb"] += b.sum(0)
                st["sbb"] += (b * b).sum(0)
                st["sab"] += a.T @ b
                st["sax"] += (a.T @ Xc) * self._mx
                st["sby"] += (b.T @ Yc) * self._my
                st["sbx"] += b.T @ Xc

    # ---- shifting and merging
    def _reshifted(self, new_shift_x: Array, new_shift_y: Array | None) -> dict:
        """The statistics re-expressed about new shifts (x' = x + δ, δ = old shift - new shift)."""
        g, n = self._g, self._st["n"]
        mx, my = self._mx, self._my
        d = g("shift_x") - new_shift_x
        e = d if self.self_mode else g("shift_y") - new_shift_y
        sx, sy, G = g("sx"), g("sy"), self._st["gxy"]
        new = dict(self._st)
        new["shift_x"] = new_shift_x
        new["sx"] = sx + n * d
        new["gxy"] = G + sx[:, None] * e[None, :] + d[:, None] * sy[None, :] + n * (d[:, None] * e[None, :])
        if not self.self_mode:
            new["shift_y"] = new_shift_y
            new["sy"] = sy + n * e
            for key, side, shift, s in (("gxx", "x", d, sx), ("gyy", "y", e, sy)):
                o = self._offsets(self._layout[0] if side == "x" else self._layout[1])
                new[key] = [
                    B + s[o[i]:o[i + 1], None] * shift[None, o[i]:o[i + 1]]
                    + shift[o[i]:o[i + 1], None] * s[None, o[i]:o[i + 1]]
                    + n * (shift[o[i]:o[i + 1], None] * shift[None, o[i]:o[i + 1]])
                    for i, B in enumerate(self._st[key])
                ]
        if not self.debiased:
            return new
        # a' = a + 2Δx + c with Δ (L, D) = mask * δ and c = ||δ_l||² per layer (likewise b', Ε, e_)
        Dm, Em = mx * d[None, :], my * e[None, :]
        c, ec = (d * d) @ mx.T, (e * e) @ my.T
        Dsx, Esy = Dm @ sx, Em @ sy
        sa, sb = g("sa"), g("sb")

        def saa_new(saa, sax, D, Dsx_, cc, s_a, blocks, shift, dims):
            o = self._offsets(dims)
            q = _stack_backend([shift[o[i]:o[i + 1]] @ B @ shift[o[i]:o[i + 1]] for i, B in enumerate(blocks)], shift)
            return saa + 4 * (sax * D).sum(1) + 4 * q + 2 * cc * s_a + 4 * cc * Dsx_ + n * cc * cc

        new["saa"] = saa_new(g("saa"), g("sax"), Dm, Dsx, c, sa, self._gxx_blocks("x"), d, self._layout[0])
        new["sa"] = sa + 2 * Dsx + n * c
        new["sab"] = (g("sab") + 2 * (g("say") @ Em.T) + sa[:, None] * ec[None, :] + 2 * (Dm @ g("sbx").T)
                      + 4 * (Dm @ G @ Em.T) + 2 * Dsx[:, None] * ec[None, :] + c[:, None] * sb[None, :]
                      + 2 * c[:, None] * Esy[None, :] + n * (c[:, None] * ec[None, :]))
        new["say"] = (g("say") + sa[:, None] * e[None, :] + 2 * (Dm @ G) + 2 * Dsx[:, None] * e[None, :]
                      + c[:, None] * sy[None, :] + n * (c[:, None] * e[None, :]))
        if not self.self_mode:
            new["sb"] = sb + 2 * Esy + n * ec
            new["sbb"] = saa_new(g("sbb"), g("sby"), Em, Esy, ec, sb, self._gxx_blocks("y"), e, self._layout[1])
            new["sbx"] = (g("sbx") + sb[:, None] * d[None, :] + 2 * (Em @ G.T) + 2 * Esy[:, None] * d[None, :]
                          + ec[:, None] * sx[None, :] + n * (ec[:, None] * d[None, :]))
            for key, M, s_, sh, dl, cl, s_a, side in (
                ("sax", mx, sx, d, Dsx, c, sa, "x"), ("sby", my, sy, e, Esy, ec, sb, "y"),
            ):
                blocks = self._gxx_blocks(side)
                dims = self._layout[0] if side == "x" else self._layout[1]
                o = self._offsets(dims)
                DG = _zeros(tuple(M.shape), self.device)
                for i, B in enumerate(blocks):
                    DG[i, o[i]:o[i + 1]] = sh[o[i]:o[i + 1]] @ B
                new[key] = (M * (self._st[key] + s_a[:, None] * sh[None, :] + 2 * dl[:, None] * sh[None, :]
                                 + cl[:, None] * s_[None, :] + n * (cl[:, None] * sh[None, :])) + 2 * DG)
        return new

    def merge(self, other: "StreamingCKAMatrix") -> "StreamingCKAMatrix":
        """Add ``other``'s items to this accumulator (same layout and ``debiased``); returns self."""
        if not isinstance(other, StreamingCKAMatrix):
            raise TypeError(f"can only merge a StreamingCKAMatrix, got {type(other).__name__}")
        if other._st is None:
            return self
        if self.debiased and not other.debiased:
            raise ValueError("cannot merge: self accumulates debiased statistics and other does not")
        if self._layout is not None and self._layout != other._layout:
            raise ValueError(f"cannot merge layouts {self._layout} and {other._layout} (dims_x, dims_y)")
        if not self._backend_set:
            self.device, self._backend_set = other.device, True
        o = other._moved_to(self.device, keep_debiased=self.debiased)
        if self._st is None:
            self._layout = o._layout
            self._st, self._mx, self._my = o._st, o._mx, o._my
            return self
        exp_x = np.maximum(self._st["exp_x"], o._st["exp_x"])  # both in the larger units: nothing overflows
        exp_y = None if self.self_mode else np.maximum(self._st["exp_y"], o._st["exp_y"])
        self._st, o._st = self._rescaled(exp_x, exp_y), o._rescaled(exp_x, exp_y)
        st = self._st
        oth = o._reshifted(st["shift_x"], None if self.self_mode else st["shift_y"])
        for key, val in oth.items():
            if key in ("shift_x", "shift_y", "exp_x", "exp_y"):
                continue
            if key in ("minx", "miny"):
                st[key] = _minimum(st[key], val)
            elif key in ("maxx", "maxy"):
                st[key] = _maximum(st[key], val)
            elif key in ("gxx", "gyy"):
                st[key] = [A + B for A, B in zip(st[key], val)]
            elif key == "n":
                st["n"] += val
            elif key in st:
                st[key] = st[key] + val
        return self

    def _moved_to(self, device, keep_debiased: bool) -> "StreamingCKAMatrix":
        """A copy of self with statistics on ``device`` (debiased statistics dropped if not kept)."""
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.device, out.debiased = device, self.debiased and keep_debiased
        out._st = {}
        for key, val in self._st.items():
            if key in _DEBIASED_KEYS and not out.debiased:
                continue
            if key == "n":
                out._st[key] = int(val)
            elif key in _EXPONENT_KEYS:
                out._st[key] = np.array(val, dtype=np.int64)
            elif isinstance(val, list):
                out._st[key] = [_to_backend(_copy(v), device) for v in val]
            else:
                out._st[key] = _to_backend(_copy(val), device)
        out._mx = out._masks(self._layout[0])
        out._my = out._mx if self.self_mode else out._masks(self._layout[1])
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Statistics as plain numpy arrays (savable with ``np.savez``/safetensors, no pickle)."""
        if self._st is None:
            raise ValueError("empty accumulator: call update() first")
        dims_x, dims_y = self._layout
        out = {
            "debiased": np.array(self.debiased), "dims_x": np.array(dims_x, dtype=np.int64),
            "dims_y": np.array(dims_y if dims_y is not None else [], dtype=np.int64),
            "self_mode": np.array(dims_y is None),
        }
        for key, val in self._st.items():
            if isinstance(val, list):
                for i, v in enumerate(val):
                    out[f"{key}.{i}"] = _to_backend(v, None).copy()
            else:
                out[key] = np.array(val) if key == "n" else _to_backend(val, None).copy()
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray], device: str | torch.device | None = None):
        """Inverse of :meth:`state_dict`; statistics go to ``device`` (None: numpy)."""
        acc = cls(debiased=bool(state["debiased"]), device=device)
        dims_x = tuple(int(v) for v in state["dims_x"])
        dims_y = None if bool(state["self_mode"]) else tuple(int(v) for v in state["dims_y"])
        acc._layout = (dims_x, dims_y)
        st: dict[str, Any] = {}
        for key, val in state.items():
            if key in ("debiased", "dims_x", "dims_y", "self_mode"):
                continue
            if key == "n":
                st["n"] = int(val)
            elif key in _EXPONENT_KEYS:
                st[key] = np.asarray(val, dtype=np.int64)
            elif "." in key:
                base, i = key.split(".")
                st.setdefault(base, {})[int(i)] = _to_backend(np.asarray(val, dtype=np.float64), acc.device)
            else:
                st[key] = _to_backend(np.asarray(val, dtype=np.float64), acc.device)
        for key in ("gxx", "gyy"):
            if key in st:
                st[key] = [st[key][i] for i in range(len(st[key]))]
        for key, dims in (("exp_x", dims_x), ("exp_y", dims_y)):
            if dims is not None and key not in st:  # saved before the statistics were scaled: units of 1
                st[key] = np.zeros(len(dims), dtype=np.int64)
        acc._st = st
        acc._mx = acc._masks(dims_x)
        acc._my = acc._mx if dims_y is None else acc._masks(dims_y)
        return acc

    # ---- result
    def result(self, debiased: bool | None = None) -> np.ndarray:
        """The ``(L_x, L_y)`` CKA matrix (float64 numpy) over all items so far.

        With μ, ν the means about the shift and a, b the squared row norms: centred cross moment
        ``C = Σxyᵀ - nμνᵀ``; ``Σ||x-μ||² = Σa - n||μ||²``; and
        ``Σ||x-μ||²||y-ν||² = Σab - 2νᵀΣay - 2μᵀΣbx + 4μᵀ(Σxyᵀ)ν + ||ν||²Σa + ||μ||²Σb - 3n||μ||²||ν||²``,
        which feed :func:`_debiased_dot`. ``debiased`` defaults to the constructor's choice.
        """
        if self._st is None:
            raise ValueError("empty accumulator: call update() before result()")
        debiased = self.debiased if debiased is None else bool(debiased)
        if debiased and not self.debiased:
            raise ValueError("debiased result requested but debiased statistics were not accumulated "
                             "(construct with debiased=True)")
        g, n = self._g, int(self._st["n"])
        _check_n(n, debiased)
        dims_x = self._layout[0]
        dims_y = dims_x if self.self_mode else self._layout[1]
        ox, oy = self._offsets(dims_x), self._offsets(dims_y)
        Lx, Ly = len(dims_x), len(dims_y)

        def layer_stats(side, o, dims, s, mn, mx_):
            consts, means, selfs = [], [], []
            blocks = self._gxx_blocks(side)
            sa = g("sa" if side == "x" else "sb") if debiased else None
            saa = g("saa" if side == "x" else "sbb") if debiased else None
            sax = g("sax" if side == "x" else "sby") if debiased else None
            for i in range(len(dims)):
                sl = slice(o[i], o[i + 1])
                consts.append(bool((mn[sl] == mx_[sl]).all()))
                mu = s[sl] / n
                means.append(mu)
                hxx = _sq(blocks[i] - n * (mu[:, None] * mu[None, :]))
                if debiased:
                    P = _flat_dot(mu, mu)
                    sum_r = float(sa[i]) - n * P
                    sum_rr = (float(saa[i]) - 4 * _flat_dot(mu, sax[i, sl]) + 4 * float(mu @ blocks[i] @ mu)
                              + 2 * P * float(sa[i]) - 3 * n * P * P)
                    hxx = (_debiased_dot(hxx, sum_rr, sum_r, sum_r, n), sum_r, P)
                selfs.append(hxx)
            return consts, means, selfs

        cx, mux, hx = layer_stats("x", ox, dims_x, g("sx"), g("minx"), g("maxx"))
        cy, muy, hy = (cx, mux, hx) if self.self_mode else layer_stats("y", oy, dims_y, g("sy"), g("miny"), g("maxy"))
        for side, consts in (("X", cx),) + ((("Y", cy),) if not self.self_mode else ()):
            for i, c in enumerate(consts):
                if c:
                    _undefined(f"layer {i} of {side} " + _zero_variance_msg("", n).lstrip())
        G = self._st["gxy"]
        out = np.full((Lx, Ly), np.nan)
        for i in range(Lx):
            for j in range(Ly):
                if cx[i] or cy[j] or (self.self_mode and j < i):
                    continue
                mu, nu = mux[i], muy[j]
                Gij = G[ox[i]:ox[i + 1], oy[j]:oy[j + 1]]
                hxy = _sq(Gij - n * (mu[:, None] * nu[None, :]))
                if debiased:
                    (xx, sum_r, P), (yy, sum_s, Q) = hx[i], hy[j]
                    sum_rs = (float(g("sab")[i, j]) - 2 * _flat_dot(nu, g("say")[i, oy[j]:oy[j + 1]])
                              - 2 * _flat_dot(mu, g("sbx")[j, ox[i]:ox[i + 1]]) + 4 * float(mu @ Gij @ nu)
                              + Q * float(g("sa")[i]) + P * float(g("sb")[j]) - 3 * n * P * Q)
                    hxy = _debiased_dot(hxy, sum_rs, sum_r, sum_s, n)
                else:
                    xx, yy = hx[i], hy[j]
                out[i, j] = _ratio(hxy, xx, yy, debiased)
        if self.self_mode:
            lower = np.tril_indices(Lx, -1)
            out[lower] = out.T[lower]
        return out


def _cat_backend(parts: list) -> Array:
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts).to(torch.float64)
    return np.concatenate(parts).astype(np.float64, copy=False)


def _stack_backend(parts: list, like: Array) -> Array:
    if isinstance(like, torch.Tensor):
        return torch.stack([p.reshape(()) for p in parts])
    return np.array([float(p) for p in parts])


class StreamingLinearCKA(StreamingCKAMatrix):
    """Streaming linear CKA for one pair: ``update(X, Y)`` with ``X: (batch, d1)``, ``Y: (batch, d2)``.

    ``result()`` returns a float equal to ``linear_cka(X_all, Y_all, debiased)`` (1e-10 in the tests).
    See :class:`StreamingCKAMatrix` for the statistics, devices and merging.

    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.normal(size=(500, 6)), rng.normal(size=(500, 4))
    >>> acc = StreamingLinearCKA()
    >>> for k in range(0, 500, 128):
    ...     _ = acc.update(X[k:k + 128], Y[k:k + 128])
    >>> bool(abs(acc.result() - linear_cka(X, Y)) < 1e-12)
    True
    """

    def update(self, X: Array, Y: Array) -> "StreamingLinearCKA":  # type: ignore[override]
        """Add one batch: ``X: (batch, d1)``, ``Y: (batch, d2)`` (the same items, in order)."""
        return super().update([X], [Y])

    def result(self, debiased: bool | None = None) -> float:  # type: ignore[override]
        """Linear CKA over all items so far (float; nan with a warning under zero variance)."""
        return float(super().result(debiased)[0, 0])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m analyses.cka`` / ``probing cka``: the cache-reading runners of :mod:`analyses.similarity`."""
    from analyses.similarity import main as similarity_main  # lazy: similarity imports this module

    return int(similarity_main(argv) or 0)


if __name__ == "__main__":
    import sys

    sys.exit(main())
