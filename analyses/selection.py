"""Choosing what to measure in a cache: role groups of tokens, and one vector per example.

Token choices (one vector per example), declared once in :data:`TOKEN_CHOICES`:

======================  ===========================================================================
``cls``                 the first classification token ([CLS] / <s>), wherever the format puts it
``sep<i>``              the [SEP] that follows sentence i (``sep1``: the middle one in ``pair``)
``sep_last``            the last [SEP] of the sequence
``mean``                mean of all word tokens (every subword, special tokens excluded)
``max``                 element-wise max over word tokens
``first_word``          the first subword of the first word of the sequence
``mean_s<i>``           mean of the word tokens of sentence i
``pos<k>``              the token at position k (k = 0 is the first position)
======================  ===========================================================================

Role groups (many tokens per example) for drift: ``cls``, ``sep<i>``, ``s<i> words``.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np
import pandas as pd

from probing.cache import Cache

TOKEN_CHOICES: dict[str, str] = {
    "cls": "the first classification token",
    "sep<i>": "the [SEP] after sentence i",
    "sep_last": "the last [SEP]",
    "mean": "mean of the word tokens (special tokens excluded)",
    "max": "element-wise max over the word tokens",
    "first_word": "first subword of the first word",
    "mean_s<i>": "mean of the word tokens of sentence i",
    "pos<k>": "the token at position k",
}
_PATTERNS: dict[str, str] = {
    "cls": r"cls", "sep<i>": r"sep(\d+)", "sep_last": r"sep_last", "mean": r"mean", "max": r"max",
    "first_word": r"first_word", "mean_s<i>": r"mean_s(\d+)", "pos<k>": r"pos(\d+)",
}


def parse_choice(choice: str) -> tuple[str, int | None]:
    """``"sep1"`` -> ``("sep<i>", 1)``; unknown names are a ValueError listing the valid ones."""
    for name, pat in _PATTERNS.items():
        m = re.fullmatch(pat, choice)
        if m:
            return name, (int(m.group(1)) if m.groups() else None)
    raise ValueError(f"unknown token choice {choice!r}; valid: {', '.join(TOKEN_CHOICES)}")


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
    role = tok["role"].to_numpy()
    if kind == "cls":
        return _single_rows(tok, role == "cls", choice, cache)
    if kind == "sep<i>":
        mask = (role == "sep") & (tok["sentence"].to_numpy() == arg) & (tok["index"].to_numpy() == 0)
        return _single_rows(tok, mask, choice, cache)
    if kind == "sep_last":
        sub = tok[role == "sep"]
        if sub.empty:
            raise ValueError(f"{cache.format_name}: no [SEP] stored")
        sub = sub.drop_duplicates("example", keep="last")
        return sub["example"].to_numpy(), sub.index.to_numpy()
    if kind == "first_word":
        return _single_rows(tok, role == "word", choice, cache)
    if kind == "pos<k>":
        return _single_rows(tok, tok["position"].to_numpy() == arg, choice, cache)
    raise ValueError(f"{choice!r} pools several tokens; use pooled()")


def pooled(cache: Cache, layer: int, choice: str) -> tuple[np.ndarray, np.ndarray]:
    """One vector per example for ``choice`` at ``layer``: ``(examples (n,), X (n, hidden))``."""
    kind, arg = parse_choice(choice)
    if kind not in ("mean", "max", "mean_s<i>"):
        ex, rows = choice_rows(cache, choice)
        return ex, cache.states(layer, rows)
    tok = cache.tokens
    mask = tok["role"].to_numpy() == "word"
    if kind == "mean_s<i>":
        mask &= tok["sentence"].to_numpy() == arg
    rows = np.flatnonzero(mask)
    if rows.size == 0:
        raise ValueError(f"{cache.format_name}: choice {choice!r} needs word tokens; extract with --roles ...,word")
    X = cache.states(layer, rows).astype(np.float64)
    ex = tok["example"].to_numpy()[rows]
    starts = np.flatnonzero(np.r_[True, ex[1:] != ex[:-1]])  # rows are stored example by example
    if kind == "max":
        out = np.maximum.reduceat(X, starts, axis=0)
    else:
        counts = np.diff(np.r_[starts, len(ex)])
        out = np.add.reduceat(X, starts, axis=0) / counts[:, None]
    return ex[starts], out.astype(np.float32)


def role_groups(tokens: pd.DataFrame) -> dict[str, np.ndarray]:
    """Row numbers per role group: ``cls``, ``sep<i>`` (the [SEP] after sentence i), ``s<i> words``,
    and other special roles by name."""
    groups: dict[str, np.ndarray] = {}
    role = tokens["role"].to_numpy()
    sent = tokens["sentence"].to_numpy()
    idx = tokens["index"].to_numpy()
    for r in sorted(set(role) - {"word"}):
        m = role == r
        if r == "sep":
            for s in sorted(set(sent[m])):
                groups[f"sep{s}"] = np.flatnonzero(m & (sent == s) & (idx == 0))
        elif r == "cls":
            groups["cls"] = np.flatnonzero(m & (sent == 0) & (idx == 0)) if (m & (sent == 0)).any() else np.flatnonzero(m)
        else:
            groups[r] = np.flatnonzero(m)
    w = role == "word"
    for s in sorted(set(sent[w])):
        groups[f"s{s} words"] = np.flatnonzero(w & (sent == s))
    return groups


def word_rows(tokens: pd.DataFrame, subword: str = "first") -> Callable | np.ndarray:
    """Rows of word tokens to use per word: ``first`` subword only (``mean`` is handled by callers
    with :func:`analyses.drift_metrics.subword_pool`)."""
    if subword not in ("first", "mean"):
        raise ValueError(f"subword must be 'first' or 'mean', got {subword!r}")
    m = tokens["role"].to_numpy() == "word"
    if subword == "first":
        m &= tokens["subword"].to_numpy() == 0
    return np.flatnonzero(m)
