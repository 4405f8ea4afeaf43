"""Which positions each streamed measurement needs, per batch: small integer arrays built on the host
(token keys of both formats, rows aligned by key, the rows of each token choice) and sent to the device
once per batch. Used by :mod:`analyses.drift._streaming`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from probing.planning import ROLES

if TYPE_CHECKING:
    from analyses.drift._stream_drift import DriftAccumulator

ROLE_CODE = {r: i for i, r in enumerate(ROLES)}
WORD, CLS, SEP = ROLE_CODE["word"], ROLE_CODE["cls"], ROLE_CODE["sep"]
WORD_GROUP = re.compile(r"s(\d+) words")



@dataclass
class Stored:
    """Stored positions of a batch's examples in one format, concatenated in (example, position) order."""

    slot: np.ndarray  # (m,) example within the batch
    pos: np.ndarray  # (m,) position in the sequence
    role: np.ndarray  # (m,) role code (index into extract.ROLES)
    sentence: np.ndarray
    index: np.ndarray
    subword: np.ndarray


def stored_positions(rendered: Sequence, batch: Sequence[int], codes: np.ndarray) -> Stored:
    cols: dict[str, list] = {k: [] for k in ("slot", "pos", "role", "sentence", "index", "subword")}
    for b, i in enumerate(batch):
        r = rendered[i]
        role = np.fromiter((ROLE_CODE[x] for x in r.role), dtype=np.int64, count=len(r))
        keep = np.flatnonzero(np.isin(role, codes))
        cols["slot"].append(np.full(keep.size, b, dtype=np.int64))
        cols["pos"].append(keep)
        cols["role"].append(role[keep])
        cols["sentence"].append(r.sentence[keep].astype(np.int64))
        cols["index"].append(r.index[keep].astype(np.int64))
        cols["subword"].append(r.subword[keep].astype(np.int64))
    return Stored(**{k: np.concatenate(v) for k, v in cols.items()})


def token_keys(a: Stored, b: Stored) -> tuple[np.ndarray, np.ndarray]:
    """One integer per stored token of (example, role, sentence, index, subword): the token key."""
    dims = tuple(int(max(x.max(initial=0), y.max(initial=0))) + 1
                 for x, y in ((a.slot, b.slot), (a.role, b.role), (a.sentence, b.sentence),
                              (a.index, b.index), (a.subword, b.subword)))
    def key(s):
        return np.ravel_multi_index((s.slot, s.role, s.sentence, s.index, s.subword), dims)
    return key(a), key(b)


def align_keys(ka: np.ndarray, kb: np.ndarray, rows_a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of A (among ``rows_a``) and of B with the same key (keys are unique within a format)."""
    _, ia, ib = np.intersect1d(ka[rows_a], kb, assume_unique=True, return_indices=True)
    return rows_a[ia], ib


def role_group_labels(role: np.ndarray, sentence: np.ndarray, index: np.ndarray) -> list[str]:
    """Role group of each token, exactly as :func:`analyses.drift.group_labels` names it."""
    from analyses.drift._runner import group_labels

    combo = np.stack([role, sentence, np.where(role == WORD, 0, index)], 1)
    uniq, inv = np.unique(combo, axis=0, return_inverse=True)
    names = group_labels(pd.DataFrame({"role": [ROLES[r] for r in uniq[:, 0]], "sentence": uniq[:, 1],
                                       "index": uniq[:, 2]}))
    return [names[k] for k in inv.reshape(-1)]


SINGLE = ("cls", "sep<i>", "sep_last", "first_word", "pos<k>")


def choice_rows(s: Stored, kind: str, arg: int | None) -> np.ndarray:
    """Rows of ``s`` the choice uses: for single tokens the first (``sep_last``: last) per example."""
    if kind == "cls":
        m = s.role == CLS
    elif kind == "sep<i>":
        m = (s.role == SEP) & (s.sentence == arg) & (s.index == 0)
    elif kind == "sep_last":
        m = s.role == SEP
    elif kind == "pos<k>":
        m = s.pos == arg
    elif kind == "mean_s<i>":
        m = (s.role == WORD) & (s.sentence == arg)
    else:  # mean, max, first_word
        m = s.role == WORD
    rows = np.flatnonzero(m)
    if kind in SINGLE:
        if kind == "sep_last":
            _, last = np.unique(s.slot[rows[::-1]], return_index=True)
            return rows[::-1][last]
        _, first = np.unique(s.slot[rows], return_index=True)
        return rows[first]
    return rows


@dataclass
class ChoiceIndex:
    kind: str
    n_items: int
    flat_a: torch.Tensor
    flat_b: torch.Tensor
    item_a: torch.Tensor | None = None  # pooled choices: item of each gathered row
    item_b: torch.Tensor | None = None
    count_a: torch.Tensor | None = None  # (n_items,) rows per item
    count_b: torch.Tensor | None = None


@dataclass
class DriftIndex:
    flat_a: torch.Tensor
    flat_b: torch.Tensor
    unit: torch.Tensor | None  # subword="mean": word of each aligned row
    unit_count: torch.Tensor | None
    n_units: int
    slot: torch.Tensor  # (n_units,)
    group: torch.Tensor


def parse_stream_choice(choice: str) -> tuple[str, int | None]:
    from analyses.selection import TOKEN_CHOICES, parse_choice

    m = WORD_GROUP.fullmatch(choice)
    if m:
        return "words", int(m.group(1))
    try:
        return parse_choice(choice)
    except ValueError:
        raise ValueError(f"unknown token choice {choice!r}; valid: {', '.join(TOKEN_CHOICES)}, "
                         f"'s<i> words'") from None


def index_batch(sa: Stored, sb: Stored, Ta: int, Tb: int, choices: dict[str, tuple[str, int | None]],
                 drift: DriftAccumulator | None, subword: str, words_only: bool,
                 device: torch.device) -> tuple[DriftIndex | None, dict[str, ChoiceIndex]]:
    def dev(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(device, non_blocking=True)

    ka, kb = token_keys(sa, sb)
    is_word = sa.role == WORD
    d_index = None
    if drift is not None:
        keep = np.ones(len(ka), dtype=bool)
        if subword == "first":
            keep &= ~is_word | (sa.subword == 0)
        if words_only:
            keep &= is_word
        ra, rb = align_keys(ka, kb, np.flatnonzero(keep))
        if ra.size:
            if subword == "mean":  # one unit per word (example, sentence, index); specials their own
                ukey = np.stack([sa.slot[ra], sa.role[ra], sa.sentence[ra], sa.index[ra]], 1)
                _, first, inv = np.unique(ukey, axis=0, return_index=True, return_inverse=True)
                inv = inv.reshape(-1)
                urows = ra[first]
                unit, unit_count, n_units = dev(inv), dev(np.bincount(inv)), len(first)
            else:
                urows, unit, unit_count, n_units = ra, None, None, len(ra)
            group = drift.group_ids(role_group_labels(sa.role[urows], sa.sentence[urows], sa.index[urows]))
            drift.count_examples(sa.slot[urows], group)
            d_index = DriftIndex(dev(sa.slot[ra] * Ta + sa.pos[ra]), dev(sb.slot[rb] * Tb + sb.pos[rb]),
                                  unit, unit_count, n_units, dev(sa.slot[urows]), dev(group))
    c_index = {}
    for name, (kind, arg) in choices.items():
        if kind == "words":
            ra, rb = align_keys(ka, kb, np.flatnonzero(is_word & (sa.sentence == arg)))
            if ra.size:
                c_index[name] = ChoiceIndex(kind, ra.size, dev(sa.slot[ra] * Ta + sa.pos[ra]),
                                             dev(sb.slot[rb] * Tb + sb.pos[rb]))
            continue
        ra, rb = choice_rows(sa, kind, arg), choice_rows(sb, kind, arg)
        items = np.intersect1d(sa.slot[ra], sb.slot[rb])
        if items.size == 0:
            continue
        ra, rb = ra[np.isin(sa.slot[ra], items)], rb[np.isin(sb.slot[rb], items)]
        ci = ChoiceIndex(kind, items.size, dev(sa.slot[ra] * Ta + sa.pos[ra]), dev(sb.slot[rb] * Tb + sb.pos[rb]))
        if kind not in SINGLE:
            ia, ib = np.searchsorted(items, sa.slot[ra]), np.searchsorted(items, sb.slot[rb])
            ci.item_a, ci.item_b = dev(ia), dev(ib)
            ci.count_a = dev(np.bincount(ia, minlength=items.size))
            ci.count_b = dev(np.bincount(ib, minlength=items.size))
        c_index[name] = ci
    return d_index, c_index


def pool_rows(X: torch.Tensor, item: torch.Tensor, count: torch.Tensor, n: int, kind: str) -> torch.Tensor:
    """(rows, dim) -> (n, dim) float64: mean (``mean``, ``mean_s<i>``) or element-wise max per item."""
    X = X.double()
    if kind == "max":
        out = torch.full((n, X.shape[1]), -torch.inf, dtype=torch.float64, device=X.device)
        return out.scatter_reduce_(0, item[:, None].expand(-1, X.shape[1]), X, "amax")
    out = torch.zeros((n, X.shape[1]), dtype=torch.float64, device=X.device).index_add_(0, item, X)
    return out / count[:, None]
