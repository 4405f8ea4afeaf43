"""Choosing what to measure in a cache: role groups of tokens, and one vector per example.

Token choices (one vector per example), declared once in :data:`TOKEN_CHOICES`:

======================  ===========================================================================
``cls``                 the first classification token ([CLS] / <s>), wherever the format puts it
``sep<i>``              the [SEP] that follows sentence i (``sep1``: the middle one in ``pair``)
``sep<i>_<j>``          the j-th [SEP] in a row after sentence i (RoBERTa's pair ``<s> a </s></s> b </s>``
                        has ``sep1``, ``sep1_2`` and ``sep2``)
``sep_last``            the last [SEP] of the sequence
``lit<i>``              the literal token (``'|'`` in a template) that follows sentence i: an ordinary word
                        where a special token would stand
``mean``                mean of all word tokens (every subword, special tokens excluded)
``max``                 element-wise max over word tokens
``first_word``          the first subword of the first word of the sequence
``mean_s<i>``           mean of the word tokens of sentence i
``pos<k>``              the token at position k (k = 0 is the first position)
======================  ===========================================================================

Role groups (many tokens per example), for drift, attention and interventions, named by the same
grammar (:func:`group_name`): ``cls`` (the first classification token), ``sep<i>`` and ``sep<i>_<j>``,
``cls<i>`` (a further classification token after sentence i, as in ``bertsum``), ``s<i> words``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from probing.cache import Cache
from probing.formats import role_of

#: Word rows read (and pooled in float64) at a time by :func:`pooled`; whole examples are never split.
POOL_CHUNK_ROWS = 8192

TOKEN_CHOICES: dict[str, str] = {
    "cls": "the first classification token",
    "sep<i>": "the [SEP] after sentence i",
    "sep<i>_<j>": "the j-th [SEP] in a row after sentence i",
    "sep_last": "the last [SEP]",
    "lit<i>": "the literal token after sentence i",
    "mean": "mean of the word tokens (special tokens excluded)",
    "max": "element-wise max over the word tokens",
    "first_word": "first subword of the first word",
    "mean_s<i>": "mean of the word tokens of sentence i",
    "pos<k>": "the token at position k",
}
_PATTERNS: dict[str, str] = {
    "cls": r"cls", "sep<i>": r"sep(\d+)", "sep<i>_<j>": r"sep(\d+)_(\d+)", "sep_last": r"sep_last",
    "lit<i>": r"lit(\d+)", "mean": r"mean", "max": r"max",
    "first_word": r"first_word", "mean_s<i>": r"mean_s(\d+)", "pos<k>": r"pos(\d+)",
}


def parse_choice(choice: str) -> tuple[str, int | tuple[int, int] | None]:
    """``"sep1"`` -> ``("sep<i>", 1)``, ``"sep1_2"`` -> ``("sep<i>_<j>", (1, 2))``; unknown names are a
    ValueError listing the valid ones."""
    for name, pat in _PATTERNS.items():
        m = re.fullmatch(pat, choice)
        if m:
            args = tuple(int(g) for g in m.groups())
            if name == "sep<i>_<j>" and args[1] < 2:
                raise ValueError(f"token choice {choice!r}: the j of sep<i>_<j> counts from 2 (sep{args[0]} is the "
                                 "first [SEP] after sentence i)")
            return name, (args if len(args) > 1 else args[0] if args else None)
    raise ValueError(f"unknown token choice {choice!r}; valid: {', '.join(TOKEN_CHOICES)}")


def group_name(role: str, sentence: int, index: int) -> str:
    """The grammar's name of a token key's group: words -> ``s<i> words``; the classification token
    before any sentence -> ``cls``; a special token after sentence i -> ``<role><i>`` for the first in a
    row, ``<role><i>_<j>`` for the j-th (``sep1``, ``sep1_2``).

    >>> group_name("sep", 1, 0), group_name("sep", 1, 1), group_name("cls", 0, 0), group_name("word", 2, 5)
    ('sep1', 'sep1_2', 'cls', 's2 words')
    """
    if role == "word":
        return f"s{sentence} words"
    if role == "cls" and sentence == 0 and index == 0:
        return "cls"
    return f"{role}{sentence}" + (f"_{index + 1}" if index else "")


def special_keys(fmt, n_sentences: int) -> dict[str, tuple[str, int, int]]:
    """For a :class:`probing.formats.Format` laid out for ``n_sentences``: each special token's
    occurrence name as extraction's attention groups write it (``sep0`` = the first [SEP] from the
    start) -> its key ``(role, sentence, index)`` (as :func:`probing.formats.render` assigns it)."""
    keys: dict[str, tuple[str, int, int]] = {}
    last, gap, seen = 0, {}, {}
    for kind, value, _ in fmt.expand(n_sentences):
        if kind == "sentence":
            last, gap = value, {}
            continue
        role = role_of(str(value))
        j, o = gap.get(role, 0), seen.get(role, 0)
        gap[role], seen[role] = j + 1, o + 1
        keys[f"{role}{o}"] = (role, last, j)
    return keys


def attention_group_names(cache: Cache, groups: list[str]) -> list[str]:
    """Extraction's attention group names (``cls0``, ``sep0``, ``sep1``, ``s1``, ...: counted from the
    start of the sequence) -> the grammar's names (``cls``, ``sep1``, ``sep2``, ``s1 words``: the
    [SEP] after sentence 1 is ``sep1`` here as in every token choice). The first [CLS] is ``cls``."""
    from probing.formats import Format

    fmt = Format(cache.manifest["format"]["name"], cache.manifest["format"]["template"])
    k = max([int(g[1:]) for g in groups if re.fullmatch(r"s\d+", g)] or [fmt.min_sentences()])
    keys = special_keys(fmt, k)
    out = []
    for g in groups:
        if re.fullmatch(r"s\d+", g):
            out.append(f"{g} words")
        elif g == "cls0":
            out.append("cls")
        elif g in keys:
            out.append(group_name(*keys[g]))
        else:
            raise ValueError(f"{cache.path}: attention group {g!r} is not in format {fmt.name!r} ({fmt.template})")
    if len(set(out)) != len(out):
        raise ValueError(f"{cache.path}: attention groups {groups} do not name distinct groups ({out})")
    return out


def is_role(tokens: pd.DataFrame, role: str) -> np.ndarray:
    """(n_tokens,) bool: rows of a token table whose role is ``role``, compared column-wise (``to_numpy()`` of a
    string column would make a Python string per token first)."""
    return tokens["role"].eq(role).to_numpy(dtype=bool, na_value=False, copy=True)


def _single_rows(tok: pd.DataFrame, mask: np.ndarray, choice: str, cache: Cache) -> tuple[np.ndarray, np.ndarray]:
    sub = tok[mask]
    if sub.empty:
        raise ValueError(f"{cache.format_name}: no token matches choice {choice!r} "
                         f"(roles stored: {sorted(set(tok['role']))})")
    sub = sub.drop_duplicates("example", keep="first")
    return sub["example"].to_numpy(), sub.index.to_numpy()


def choice_rows(cache: Cache, choice: str) -> tuple[np.ndarray, np.ndarray]:
    """For single-token choices: ``(examples, rows)``, one row per example that has the token."""
    kind, arg = parse_choice(choice)
    tok = cache.tokens
    if kind == "cls":
        return _single_rows(tok, is_role(tok, "cls"), choice, cache)
    if kind in ("sep<i>", "sep<i>_<j>", "lit<i>"):
        sentence, j = arg if kind == "sep<i>_<j>" else (arg, 1)
        role = "lit" if kind == "lit<i>" else "sep"
        mask = is_role(tok, role) & (tok["sentence"].to_numpy() == sentence) & (tok["index"].to_numpy() == j - 1)
        return _single_rows(tok, mask, choice, cache)
    if kind == "sep_last":
        sub = tok[is_role(tok, "sep")]
        if sub.empty:
            raise ValueError(f"{cache.format_name}: no [SEP] stored")
        sub = sub.drop_duplicates("example", keep="last")
        return sub["example"].to_numpy(), sub.index.to_numpy()
    if kind == "first_word":
        return _single_rows(tok, is_role(tok, "word"), choice, cache)
    if kind == "pos<k>":
        return _single_rows(tok, tok["position"].to_numpy() == arg, choice, cache)
    raise ValueError(f"{choice!r} pools several tokens; use pooled()")


@dataclass(frozen=True)
class ItemRows:
    """Which stored rows make each item's vector: item k is ``reduce`` (``"mean"`` or ``"max"``, in float64)
    over ``rows[starts[k]:starts[k + 1]]``, or that one row when ``reduce`` is None.
    ``examples``: (m,) corpus index of each item; ``rows``: stored rows, item by item; ``starts``: (m + 1,)."""

    examples: np.ndarray
    rows: np.ndarray
    starts: np.ndarray
    reduce: str | None = None

    def __len__(self) -> int:
        return len(self.examples)

    def take(self, items: np.ndarray | slice) -> "ItemRows":
        """The items ``items`` (positions, or a slice), in that order."""
        k = np.arange(len(self))[items]
        if len(k) == len(self) and (k == np.arange(len(self))).all():
            return self  # every item in order: no copy of the row index
        lengths = self.starts[k + 1] - self.starts[k]
        offsets = np.r_[0, np.cumsum(lengths)]
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        return ItemRows(self.examples[k], self.rows[np.repeat(self.starts[k], lengths) + within], offsets, self.reduce)


def item_rows(cache: Cache, choice: str) -> ItemRows:
    """The stored rows behind each example's vector for ``choice`` (see :func:`pooled`)."""
    kind, arg = parse_choice(choice)
    if kind not in ("mean", "max", "mean_s<i>"):
        ex, rows = choice_rows(cache, choice)
        return ItemRows(ex, rows, np.arange(len(rows) + 1))
    tok = cache.tokens
    mask = is_role(tok, "word")
    if kind == "mean_s<i>":
        mask &= tok["sentence"].to_numpy() == arg
    rows = np.flatnonzero(mask)
    if rows.size == 0:
        raise ValueError(f"{cache.format_name}: choice {choice!r} needs word tokens; extract with --roles ...,word")
    ex = tok["example"].to_numpy()[rows]
    starts = np.flatnonzero(np.r_[True, ex[1:] != ex[:-1]])  # rows are stored example by example
    return ItemRows(ex[starts], rows, np.r_[starts, len(ex)], "max" if kind == "max" else "mean")


def pool(cache: Cache, layer: int | None, items: ItemRows) -> np.ndarray:
    """The vectors of ``items`` at ``layer``: (m, hidden) float32; ``layer=None``: every stored layer,
    (m, n_layers_stored, hidden). Reads all their rows at once: callers chunk (:meth:`ItemRows.chunks`)."""
    X = cache.states(layer, items.rows)
    if items.reduce is None:
        return X
    X = X.astype(np.float64)
    local = items.starts[:-1]
    if items.reduce == "max":
        return np.maximum.reduceat(X, local, axis=0).astype(np.float32)
    counts = np.diff(items.starts).reshape((-1,) + (1,) * (X.ndim - 1))
    return (np.add.reduceat(X, local, axis=0) / counts).astype(np.float32)


def item_chunks(max_rows: int, *items: ItemRows):
    """Slices of consecutive whole items with at most ``max_rows`` rows in each of ``items`` (which list the same
    items), at least one item each."""
    k, m = 0, len(items[0])
    while k < m:
        k_end = min(max(k + 1, int(np.searchsorted(it.starts, it.starts[k] + max_rows, side="right")) - 1)
                    for it in items)
        yield slice(k, k_end)
        k = k_end


def pool_chunked(cache: Cache, layer: int, items: ItemRows) -> np.ndarray:
    """:func:`pool` of every item at ``layer``, reading :data:`POOL_CHUNK_ROWS` rows (whole items) at a time:
    each vector is the same, bit for bit, as from the whole layer at once, and only one chunk of the layer
    is held in float64."""
    out = np.empty((len(items), cache.hidden_size), dtype=np.float32)
    for part in item_chunks(POOL_CHUNK_ROWS, items):
        out[part] = pool(cache, layer, items.take(part))
    return out


def pooled(cache: Cache, layer: int, choice: str) -> tuple[np.ndarray, np.ndarray]:
    """One vector per example for ``choice`` at ``layer``: ``(examples (n,), X (n, hidden))``
    (:func:`item_rows`, :func:`pool_chunked`)."""
    items = item_rows(cache, choice)
    return items.examples, pool_chunked(cache, layer, items)


def role_groups(tokens: pd.DataFrame) -> dict[str, np.ndarray]:
    """Row numbers per role group, named by :func:`group_name`: ``cls``, ``sep<i>`` (the [SEP] after
    sentence i), ``sep<i>_<j>`` (a further [SEP] in a row), ``cls<i>``, ``s<i> words``, and other
    special roles by name. Without a [CLS] before the first sentence, ``cls`` is every [CLS]."""
    groups: dict[str, np.ndarray] = {}
    role = tokens["role"].to_numpy()
    sent = tokens["sentence"].to_numpy()
    idx = tokens["index"].to_numpy()
    for r in sorted(set(role) - {"word"}):
        m = role == r
        if r == "cls" and not (m & (sent == 0)).any():
            groups["cls"] = np.flatnonzero(m)
        elif r in ("sep", "cls"):
            for s, j in sorted(set(zip(sent[m].tolist(), idx[m].tolist()))):
                groups[group_name(r, s, j)] = np.flatnonzero(m & (sent == s) & (idx == j))
        else:
            groups[r] = np.flatnonzero(m)
    w = role == "word"
    for s in sorted(set(sent[w])):
        groups[f"s{s} words"] = np.flatnonzero(w & (sent == s))
    return groups


def word_rows(tokens: pd.DataFrame, subword: str = "first") -> Callable | np.ndarray:
    """Rows of word tokens to use per word: ``first`` subword only (``mean`` is handled by callers
    with :func:`analyses.drift.subword_pool`)."""
    if subword not in ("first", "mean"):
        raise ValueError(f"subword must be 'first' or 'mean', got {subword!r}")
    m = is_role(tokens, "word")
    if subword == "first":
        m &= tokens["subword"].to_numpy() == 0
    return np.flatnonzero(m)
