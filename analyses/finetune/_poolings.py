"""Pooling choices for fine-tuning: which positions of a rendered example a pooling reads, and how.

The names are the token choices of :mod:`analyses.selection` (one grammar for probes and fine-tuning:
``cls``, ``sep<i>``, ``sep_last``, ``lit<i>``, ``mean``, ``max``, ``first_word``, ``mean_s<i>``, ``pos<k>``),
parsed by :func:`analyses.selection.parse_choice` and described by
:data:`analyses.selection.TOKEN_CHOICES`. Positions come from the rendered token roles of
:func:`probing.formats.render`, never from searching token ids, so a pooling means the same thing for
BERT's ``[CLS]``/``[SEP]`` and RoBERTa's ``<s>``/``</s>``; padding is never selected.

>>> get_pooling("pos3").position
3
>>> get_pooling("sep1").reduce, get_pooling("max").reduce
('mean', 'max')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np
import torch

from analyses.selection import TOKEN_CHOICES, parse_choice
from probing.formats import Rendered

#: Every pooling name pattern with its description: the token choices of :mod:`analyses.selection`.
POOLINGS: dict[str, str] = TOKEN_CHOICES


@dataclass(frozen=True)
class Pooling:
    """A pooling choice: which positions of a rendered example it reads, and how it reduces them.

    ``select(r) -> positions: (n_selected,) int64`` (empty when the example has no such position);
    ``reduce`` is ``"mean"`` or ``"max"`` over the selected positions (one position: either is that
    position's vector).
    """

    name: str
    reduce: Literal["mean", "max"]
    select: Callable[[Rendered], np.ndarray] = field(repr=False, compare=False)
    position: int | None = None


def _where(r: Rendered, keep: Callable[[int], bool], which: slice = slice(None)) -> np.ndarray:
    return np.asarray([t for t in range(len(r)) if keep(t)][which], dtype=np.int64)


def _selector(kind: str, arg: int | None) -> Callable[[Rendered], np.ndarray]:
    """Positions of ``kind`` (a key of :data:`POOLINGS`) with its number ``arg`` in one rendering."""
    selectors: dict[str, Callable[[Rendered], np.ndarray]] = {
        "cls": lambda r: _where(r, lambda t: r.role[t] == "cls", slice(0, 1)),
        "sep<i>": lambda r: _where(r, lambda t: r.role[t] == "sep" and r.sentence[t] == arg and r.index[t] == 0,
                                   slice(0, 1)),
        "sep_last": lambda r: _where(r, lambda t: r.role[t] == "sep", slice(-1, None)),
        "lit<i>": lambda r: _where(r, lambda t: r.role[t] == "lit" and r.sentence[t] == arg and r.index[t] == 0,
                                   slice(0, 1)),
        "mean": lambda r: _where(r, lambda t: r.role[t] == "word"),
        "max": lambda r: _where(r, lambda t: r.role[t] == "word"),
        "first_word": lambda r: _where(r, lambda t: r.role[t] == "word", slice(0, 1)),
        "mean_s<i>": lambda r: _where(r, lambda t: r.role[t] == "word" and r.sentence[t] == arg),
        "pos<k>": lambda r: np.asarray([arg] if arg < len(r) else [], dtype=np.int64),
    }
    return selectors[kind]


def get_pooling(name: str | Pooling) -> Pooling:
    """A pooling by token-choice name (:func:`analyses.selection.parse_choice`), e.g. ``sep1``, ``pos3``.

    Unknown names are a ValueError listing the valid ones."""
    if isinstance(name, Pooling):
        return name
    if not isinstance(name, str):
        raise ValueError(f"unknown pooling {name!r}; valid: {', '.join(POOLINGS)}")
    try:
        kind, arg = parse_choice(name)
    except ValueError:
        raise ValueError(f"unknown pooling {name!r}; valid: {', '.join(POOLINGS)} (e.g. 'sep1', 'pos3')") from None
    return Pooling(name, "max" if kind == "max" else "mean", _selector(kind, arg),
                   position=arg if kind == "pos<k>" else None)


def pooling_mask(rendered: Sequence[Rendered], pooling: str | Pooling, T: int | None = None) -> np.ndarray:
    """Positions each example's pool reads: ``mask: (batch, T) bool`` (``T`` defaults to the longest).

    Raises ValueError naming the pooling and the first example that has no such position (e.g.
    ``sep1`` on a format without ``[SEP]``, ``pos5`` on a 4-token example).
    """
    p = get_pooling(pooling)
    T = max(len(r) for r in rendered) if T is None else T
    mask = np.zeros((len(rendered), T), dtype=bool)
    for b, r in enumerate(rendered):
        pos = p.select(r)
        if pos.size == 0:
            if p.position is not None:
                shortest = min(len(x) for x in rendered)
                raise ValueError(f"pooling {p.name!r} needs position {p.position}, but the shortest example "
                                 f"has {shortest} tokens; use pos<k> with k < {shortest}")
            raise ValueError(f"pooling {p.name!r} selects no position in example {b} (roles {r.role})")
        mask[b, pos] = True
    return mask


def pool(hidden: torch.Tensor, mask: torch.Tensor, reduce: str) -> torch.Tensor:
    """Pool ``hidden: Float[Tensor, "batch pos dim"]`` over ``mask: Bool[Tensor, "batch pos"]``.

    ``"mean"``: ``sum_t m_bt h_bt / sum_t m_bt``; ``"max"``: ``max_{t: m_bt} h_bt`` element-wise.
    Returns ``Float[Tensor, "batch dim"]``. Every row of ``mask`` must select at least one position.
    """
    if hidden.ndim != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(f"hidden must be (batch, pos, dim) and mask (batch, pos); got {tuple(hidden.shape)=} "
                         f"and {tuple(mask.shape)=}")
    counts = mask.sum(dim=1)
    if (counts == 0).any():
        raise ValueError(f"mask rows {torch.nonzero(counts == 0).flatten().tolist()} select no position")
    m = mask.unsqueeze(-1)
    if reduce == "mean":
        return (hidden * m.to(hidden.dtype)).sum(dim=1) / counts.unsqueeze(-1).to(hidden.dtype)
    if reduce == "max":
        return hidden.masked_fill(~m, float("-inf")).amax(dim=1)
    raise ValueError(f"unknown reduce {reduce!r}; valid: 'mean', 'max'")
