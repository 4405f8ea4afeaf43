"""Streaming linear CKA: mergeable accumulators that see the items batch by batch and give the same
numbers as :func:`analyses.cka.linear_cka` / :func:`analyses.cka.linear_cka_matrix` on all items at once.

Kornblith et al. (2019), eq. 5 in feature space, from running moments about a shift; the debiased form
(Song et al. 2012) from the extra moments documented in :meth:`StreamingCKAMatrix.result`. Statistics
are plain arrays (``state_dict``), never pickled.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from analyses.cka._numerics import (Array, _check_n, _col_max, _col_min, _copy, _debiased_dot, _device_of, _exponent,
                                    _flat_dot, _ldexp, _maximum, _minimum, _outer_self, _prepare, _ratio, _sq,
                                    _to_backend, _undefined, _zero_variance_msg, _zeros)

__all__ = ["StreamingCKAMatrix", "StreamingLinearCKA"]


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

    >>> from analyses.cka import linear_cka
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
