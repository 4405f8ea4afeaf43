"""The numerical ground every CKA estimator here stands on: one code path for numpy arrays and torch
tensors, input validation, exact power-of-two scaling, and the algebra the estimators share (the
feature-space debiased HSIC, the ratio, the minimum number of items).

Pure functions of arrays, no I/O. The estimators are in :mod:`analyses.cka` (in memory) and
:mod:`analyses.cka._streaming` (batch by batch).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
import torch

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
        # gemm need not sum (i, j) and (j, i) of the diagonal block in the same order (OpenBLAS's AVX2 kernels
        # do not): its upper triangle is mirrored too, so the result is exactly symmetric, as syrk's is
        block = G[s:e, s:e]
        lower = np.tril_indices(e - s, -1)
        block[lower] = block.T[lower]
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
