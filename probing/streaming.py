"""Drift and linear CKA between two formats computed during the forward pass, with no cache on disk.

For corpora whose states do not fit on disk: every batch of examples is run through the model in
format A and in format B (the same examples in the same batch), the positions each measurement needs
are gathered on the device, and float64 accumulators on the device are updated; nothing is written.
Memory is O(batch + d² per layer and token choice) plus two integers per example (the planned
lengths), whatever the corpus size; a corpus given as a (possibly lazy) ``Sequence`` is indexed, never
copied, and freed heap pages are handed back to the system as the run goes (glibc ``malloc_trim``),
so the resident size does not creep up with heap fragmentation (``benchmarks/memory.py``). Planning and
the forward pass are the extractor's own (:mod:`probing.planning`, :mod:`probing.forward`).

    from probing.streaming import stream_compare
    tables = stream_compare(examples, "pair", "concat", model="all-MiniLM-L6-v2")
    tables["drift"], tables["cka"], tables["memory"]

What it gives, row for row comparable with the cached runners (same keys, same metric names):

* ``drift`` (as :func:`analyses.drift.run_drift` with ``standardise=False``): per layer and role group
  (``cls``, ``sep<i>``, ``s<i> words``, ..., and ``all``) ``cosine_mean``, ``drift_mean`` (mean of
  1 − cos) and ``relative_l2_mean`` (mean of ||a − b|| / ||a||) over every token key stored in both
  formats (Token keys of :mod:`probing.formats`; words by their first subword, or the mean of their
  subwords with ``subword="mean"``). Confidence intervals are a *Poisson* cluster bootstrap over
  examples (each example gets a Poisson(1) weight per resample, drawn from a generator seeded by
  ``(seed, example index // 1024)``, so they do not depend on batching; Hanley & MacGibbon 2006,
  "Creating non-parametric bootstrap samples using Poisson frequencies", Comput. Methods Programs
  Biomed. 83; Chamandy et al. 2012, "Estimating uncertainty for massive data streams", Google):
  the same target as the cached path's multinomial cluster bootstrap, not the same draws, so the
  intervals agree in distribution, not digit for digit. Medians, the anisotropy baseline and the
  normalised drift need the whole set of cosines or random pairs across the corpus and are not
  computed here (use the cached path for them); ``standardise`` needs a first pass for the means
  and is not offered.
* ``cka`` (as :func:`analyses.similarity.run_cka_formats`): per layer and token choice, linear CKA
  (Kornblith et al. 2019, eq. 5) and its debiased form between format A and format B, from
  :class:`analyses.cka.StreamingLinearCKA` accumulators. Choices are those of
  :data:`analyses.selection.TOKEN_CHOICES` (one vector per example) and ``s<i> words`` (every word
  token of sentence i, aligned by key); ``word_groups=True`` adds ``s<i> words`` for every sentence
  whose words both formats hold.
* ``memory``: the accumulators and their bytes (the same for any corpus size).

Only roles in ``roles`` count as "stored" (default cls, sep, word, as the extractor), so every
choice sees exactly the tokens a cache of the same request would hold. The numbers equal the cached
path's to float rounding: per-example states depend slightly on batch composition (padding changes
the shapes of the matrix products), ~1e-7 relative in float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import sys
import warnings
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from .examples import Example
from .formats import Format, FormatError, render, special_token_ids, tokenize_sentences
from .forward import collate, forward, length_batches, running
from .heap import HeapTrimmer
from .models import DTYPES, LoadedModel, pick_device
from .planning import (ON_OVERFLOW, ROLES, ExtractError, parse_layers, parse_roles, plan, render_shard,
                       sentence_lengths)

#: CKA metrics that can be accumulated in one pass (RBF CKA needs the n x n Gram matrix).
STREAM_METRICS: dict[str, bool] = {"linear_cka": False, "linear_cka_debiased": True}  # name -> debiased
#: Drift metrics written, the same names as :data:`analyses.drift_metrics.DRIFT_METRICS` uses.
STREAM_DRIFT_METRICS: tuple[str, ...] = ("cosine_mean", "drift_mean", "relative_l2_mean")
SUBWORD_MODES: tuple[str, ...] = ("first", "mean")

_CHUNK = 1024  # examples rendered at a time; also the block of the bootstrap weights' generator
_CODE = {r: i for i, r in enumerate(ROLES)}
_WORD, _CLS, _SEP = _CODE["word"], _CODE["cls"], _CODE["sep"]
_WORD_GROUP = re.compile(r"s(\d+) words")


# ---------------------------------------------------------------------------------------------------
# Accumulators


class DriftAccumulator:
    """Running float64 sums for cosine drift per (layer, role group), on one device.

    ``sums``: (L, G, 4) token count, Σcos, Σ(1 − cos), Σ relative L2. ``boot``: (R, L, G, 4) the same
    sums weighted by each example's Poisson(1) weight in resample r (None without a bootstrap).
    ``n_examples``: (G,) examples with at least one token in the group. Groups are registered as they
    appear (their number depends on the formats, not on the corpus size).
    """

    def __init__(self, n_layers: int, n_resamples: int, device: torch.device):
        self.device = device
        self.groups: list[str] = []
        self.sums = torch.zeros((n_layers, 0, 4), dtype=torch.float64, device=device)
        self.boot = (torch.zeros((n_resamples, n_layers, 0, 4), dtype=torch.float64, device=device)
                     if n_resamples > 0 else None)
        self.n_examples = np.zeros(0, dtype=np.int64)
        self.n_all = 0  # examples with at least one paired token
        self.bad = torch.zeros((), dtype=torch.int64, device=device)

    def group_ids(self, labels: Sequence[str]) -> np.ndarray:
        """Ids of ``labels``, registering new ones (the accumulators grow by one group each)."""
        new = [g for g in dict.fromkeys(labels) if g not in self.groups]
        if new:
            self.groups.extend(new)
            k = len(new)
            self.sums = torch.cat([self.sums, self.sums.new_zeros(self.sums.shape[0], k, 4)], 1)
            if self.boot is not None:
                self.boot = torch.cat([self.boot, self.boot.new_zeros(*self.boot.shape[:2], k, 4)], 2)
            self.n_examples = np.concatenate([self.n_examples, np.zeros(k, dtype=np.int64)])
        index = {g: i for i, g in enumerate(self.groups)}
        return np.asarray([index[g] for g in labels], dtype=np.int64)

    def count_examples(self, slot: np.ndarray, group: np.ndarray) -> None:
        """Add the examples of one batch: ``slot`` (n,) example in the batch, ``group`` (n,) group id."""
        G = len(self.groups)
        present = np.unique(slot * G + group) % G
        self.n_examples += np.bincount(present, minlength=G)
        self.n_all += int(np.unique(slot).size)

    def update(self, layer: int, A: torch.Tensor, B: torch.Tensor, slot: torch.Tensor, group: torch.Tensor,
               n_slots: int, weights: torch.Tensor | None) -> None:
        """Add one batch at layer index ``layer``. A, B: (n, dim) float64 paired states; slot, group:
        (n,) example-in-batch and group id of each row; weights: (n_slots, R) Poisson weights."""
        aa, bb, ab = (A * A).sum(1), (B * B).sum(1), (A * B).sum(1)
        cos = (ab / torch.sqrt(aa * bb)).clamp(-1.0, 1.0)  # the formula of analyses.drift_metrics
        d = A - B
        rel = torch.sqrt((d * d).sum(1)) / torch.sqrt(aa)
        self.bad += (~torch.isfinite(cos)).sum() + (~torch.isfinite(rel)).sum()
        vals = torch.stack([torch.ones_like(cos), cos, 1.0 - cos, rel], 1)
        G = len(self.groups)
        per = torch.zeros((n_slots * G, 4), dtype=torch.float64, device=self.device)
        per.index_add_(0, slot * G + group, vals)  # per (example, group) sums
        self.sums[layer] += per.view(n_slots, G, 4).sum(0)
        if self.boot is not None:
            self.boot[:, layer] += (weights.T @ per.view(n_slots, G * 4)).view(-1, G, 4)

    def tensors(self) -> dict[str, Any]:
        out = {"drift.sums": self.sums, "drift.n_examples": self.n_examples}
        if self.boot is not None:
            out["drift.bootstrap"] = self.boot
        return out

    def result(self, confidence: float) -> list[dict]:
        """Rows (layer index, role, metric, value, ci_low, ci_high, n, n_examples), groups in order of
        first appearance, then ``all``."""
        if int(self.bad):
            raise ValueError(f"{int(self.bad)} token states have zero norm or non-finite values in format A "
                             "or B, so no cosine (the cached path refuses them too)")
        sums = self.sums.cpu().numpy()
        boot = self.boot.cpu().numpy() if self.boot is not None else None
        cells = [(g, [i], int(self.n_examples[i])) for i, g in enumerate(self.groups)]
        cells.append(("all", list(range(len(self.groups))), self.n_all))
        alpha = (1.0 - confidence) / 2
        rows = []
        for li in range(sums.shape[0]):
            for role, gi, n_ex in cells:
                s = sums[li, gi].sum(0)
                n = int(round(s[0]))
                if n == 0:
                    continue
                if boot is not None:
                    b = boot[:, li, gi].sum(1)  # (R, 4)
                    with np.errstate(invalid="ignore", divide="ignore"):
                        stats = b[:, 1:] / b[:, :1]
                for m, metric in enumerate(STREAM_DRIFT_METRICS):
                    low = high = float("nan")
                    if boot is not None and n_ex >= 2:
                        ok = stats[:, m][np.isfinite(stats[:, m])]
                        if ok.size:
                            low, high = (float(v) for v in np.quantile(ok, [alpha, 1 - alpha]))
                    rows.append({"layer_index": li, "role": role, "metric": metric, "value": float(s[m + 1] / s[0]),
                                 "ci_low": low, "ci_high": high, "n": n, "n_examples": n_ex})
        return rows


def _poisson_weights(start: int, stop: int, n_resamples: int, seed: int) -> np.ndarray:
    """(stop - start, R) Poisson(1) weights of examples start..stop-1, drawn per block of ``_CHUNK``
    examples from ``default_rng([seed, block])``: the same for an example whatever the batching."""
    parts = []
    for block in range(start // _CHUNK, (stop - 1) // _CHUNK + 1):
        w = np.random.default_rng([seed, block]).poisson(1.0, size=(_CHUNK, n_resamples))
        lo, hi = max(start, block * _CHUNK), min(stop, (block + 1) * _CHUNK)
        parts.append(w[lo - block * _CHUNK:hi - block * _CHUNK])
    return np.concatenate(parts).astype(np.float64)


# ---------------------------------------------------------------------------------------------------
# Which positions each measurement needs, per batch (host side, small integer arrays)


@dataclass
class _Stored:
    """Stored positions of a batch's examples in one format, concatenated in (example, position) order."""

    slot: np.ndarray  # (m,) example within the batch
    pos: np.ndarray  # (m,) position in the sequence
    role: np.ndarray  # (m,) role code (index into extract.ROLES)
    sentence: np.ndarray
    index: np.ndarray
    subword: np.ndarray


def _stored(rendered: Sequence, batch: Sequence[int], codes: np.ndarray) -> _Stored:
    cols: dict[str, list] = {k: [] for k in ("slot", "pos", "role", "sentence", "index", "subword")}
    for b, i in enumerate(batch):
        r = rendered[i]
        role = np.fromiter((_CODE[x] for x in r.role), dtype=np.int64, count=len(r))
        keep = np.flatnonzero(np.isin(role, codes))
        cols["slot"].append(np.full(keep.size, b, dtype=np.int64))
        cols["pos"].append(keep)
        cols["role"].append(role[keep])
        cols["sentence"].append(r.sentence[keep].astype(np.int64))
        cols["index"].append(r.index[keep].astype(np.int64))
        cols["subword"].append(r.subword[keep].astype(np.int64))
    return _Stored(**{k: np.concatenate(v) for k, v in cols.items()})


def _keys(a: _Stored, b: _Stored) -> tuple[np.ndarray, np.ndarray]:
    """One integer per stored token of (example, role, sentence, index, subword): the token key."""
    dims = tuple(int(max(x.max(initial=0), y.max(initial=0))) + 1
                 for x, y in ((a.slot, b.slot), (a.role, b.role), (a.sentence, b.sentence),
                              (a.index, b.index), (a.subword, b.subword)))
    def key(s):
        return np.ravel_multi_index((s.slot, s.role, s.sentence, s.index, s.subword), dims)
    return key(a), key(b)


def _align(ka: np.ndarray, kb: np.ndarray, rows_a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of A (among ``rows_a``) and of B with the same key (keys are unique within a format)."""
    _, ia, ib = np.intersect1d(ka[rows_a], kb, assume_unique=True, return_indices=True)
    return rows_a[ia], ib


def _group_labels(role: np.ndarray, sentence: np.ndarray, index: np.ndarray) -> list[str]:
    """Role group of each token, exactly as :func:`analyses.drift.group_labels` names it."""
    from analyses.drift import group_labels

    combo = np.stack([role, sentence, np.where(role == _WORD, 0, index)], 1)
    uniq, inv = np.unique(combo, axis=0, return_inverse=True)
    names = group_labels(pd.DataFrame({"role": [ROLES[r] for r in uniq[:, 0]], "sentence": uniq[:, 1],
                                       "index": uniq[:, 2]}))
    return [names[k] for k in inv.reshape(-1)]


_SINGLE = ("cls", "sep<i>", "sep_last", "first_word", "pos<k>")


def _choice_rows(s: _Stored, kind: str, arg: int | None) -> np.ndarray:
    """Rows of ``s`` the choice uses: for single tokens the first (``sep_last``: last) per example."""
    if kind == "cls":
        m = s.role == _CLS
    elif kind == "sep<i>":
        m = (s.role == _SEP) & (s.sentence == arg) & (s.index == 0)
    elif kind == "sep_last":
        m = s.role == _SEP
    elif kind == "pos<k>":
        m = s.pos == arg
    elif kind == "mean_s<i>":
        m = (s.role == _WORD) & (s.sentence == arg)
    else:  # mean, max, first_word
        m = s.role == _WORD
    rows = np.flatnonzero(m)
    if kind in _SINGLE:
        if kind == "sep_last":
            _, last = np.unique(s.slot[rows[::-1]], return_index=True)
            return rows[::-1][last]
        _, first = np.unique(s.slot[rows], return_index=True)
        return rows[first]
    return rows


@dataclass
class _ChoiceIndex:
    kind: str
    n_items: int
    flat_a: torch.Tensor
    flat_b: torch.Tensor
    item_a: torch.Tensor | None = None  # pooled choices: item of each gathered row
    item_b: torch.Tensor | None = None
    count_a: torch.Tensor | None = None  # (n_items,) rows per item
    count_b: torch.Tensor | None = None


@dataclass
class _DriftIndex:
    flat_a: torch.Tensor
    flat_b: torch.Tensor
    unit: torch.Tensor | None  # subword="mean": word of each aligned row
    unit_count: torch.Tensor | None
    n_units: int
    slot: torch.Tensor  # (n_units,)
    group: torch.Tensor


def _parse_choice(choice: str) -> tuple[str, int | None]:
    from analyses.selection import TOKEN_CHOICES, parse_choice

    m = _WORD_GROUP.fullmatch(choice)
    if m:
        return "words", int(m.group(1))
    try:
        return parse_choice(choice)
    except ValueError:
        raise ValueError(f"unknown token choice {choice!r}; valid: {', '.join(TOKEN_CHOICES)}, "
                         f"'s<i> words'") from None


def _index_batch(sa: _Stored, sb: _Stored, Ta: int, Tb: int, choices: dict[str, tuple[str, int | None]],
                 drift: DriftAccumulator | None, subword: str, words_only: bool,
                 device: torch.device) -> tuple[_DriftIndex | None, dict[str, _ChoiceIndex]]:
    def dev(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(device, non_blocking=True)

    ka, kb = _keys(sa, sb)
    is_word = sa.role == _WORD
    d_index = None
    if drift is not None:
        keep = np.ones(len(ka), dtype=bool)
        if subword == "first":
            keep &= ~is_word | (sa.subword == 0)
        if words_only:
            keep &= is_word
        ra, rb = _align(ka, kb, np.flatnonzero(keep))
        if ra.size:
            if subword == "mean":  # one unit per word (example, sentence, index); specials their own
                ukey = np.stack([sa.slot[ra], sa.role[ra], sa.sentence[ra], sa.index[ra]], 1)
                _, first, inv = np.unique(ukey, axis=0, return_index=True, return_inverse=True)
                inv = inv.reshape(-1)
                urows = ra[first]
                unit, unit_count, n_units = dev(inv), dev(np.bincount(inv)), len(first)
            else:
                urows, unit, unit_count, n_units = ra, None, None, len(ra)
            group = drift.group_ids(_group_labels(sa.role[urows], sa.sentence[urows], sa.index[urows]))
            drift.count_examples(sa.slot[urows], group)
            d_index = _DriftIndex(dev(sa.slot[ra] * Ta + sa.pos[ra]), dev(sb.slot[rb] * Tb + sb.pos[rb]),
                                  unit, unit_count, n_units, dev(sa.slot[urows]), dev(group))
    c_index = {}
    for name, (kind, arg) in choices.items():
        if kind == "words":
            ra, rb = _align(ka, kb, np.flatnonzero(is_word & (sa.sentence == arg)))
            if ra.size:
                c_index[name] = _ChoiceIndex(kind, ra.size, dev(sa.slot[ra] * Ta + sa.pos[ra]),
                                             dev(sb.slot[rb] * Tb + sb.pos[rb]))
            continue
        ra, rb = _choice_rows(sa, kind, arg), _choice_rows(sb, kind, arg)
        items = np.intersect1d(sa.slot[ra], sb.slot[rb])
        if items.size == 0:
            continue
        ra, rb = ra[np.isin(sa.slot[ra], items)], rb[np.isin(sb.slot[rb], items)]
        ci = _ChoiceIndex(kind, items.size, dev(sa.slot[ra] * Ta + sa.pos[ra]), dev(sb.slot[rb] * Tb + sb.pos[rb]))
        if kind not in _SINGLE:
            ia, ib = np.searchsorted(items, sa.slot[ra]), np.searchsorted(items, sb.slot[rb])
            ci.item_a, ci.item_b = dev(ia), dev(ib)
            ci.count_a = dev(np.bincount(ia, minlength=items.size))
            ci.count_b = dev(np.bincount(ib, minlength=items.size))
        c_index[name] = ci
    return d_index, c_index


def _pool(X: torch.Tensor, item: torch.Tensor, count: torch.Tensor, n: int, kind: str) -> torch.Tensor:
    """(rows, dim) -> (n, dim) float64: mean (``mean``, ``mean_s<i>``) or element-wise max per item."""
    X = X.double()
    if kind == "max":
        out = torch.full((n, X.shape[1]), -torch.inf, dtype=torch.float64, device=X.device)
        return out.scatter_reduce_(0, item[:, None].expand(-1, X.shape[1]), X, "amax")
    out = torch.zeros((n, X.shape[1]), dtype=torch.float64, device=X.device).index_add_(0, item, X)
    return out / count[:, None]


# ---------------------------------------------------------------------------------------------------
# Checks before any forward pass


def _check_structure(lm: LoadedModel, fa: Format, fb: Format, examples: Sequence[Example], codes: np.ndarray,
                     choices: dict[str, tuple[str, int | None]], word_groups: bool, subword: str,
                     words_only: bool, drift: bool) -> dict[str, tuple[str, int | None]]:
    """Render one example per sentence count in both formats: the formats must share token keys,
    every choice must exist in both; returns the choices with the word groups added."""
    reps = list({e.n_sentences: e for e in examples}.values())
    spec = [special_token_ids(lm.tokenizer, f) for f in (fa, fb)]
    shared_any, found, sentences = False, set(), set()
    for ex in reps:
        ts = tokenize_sentences(lm.tokenizer, list(ex.sentences))
        ra, rb = render(fa, ex, ts, spec[0]), render(fb, ex, ts, spec[1])
        sa, sb = _stored([ra], [0], codes), _stored([rb], [0], codes)
        ka, kb = _keys(sa, sb)
        keep = np.ones(len(ka), dtype=bool)
        if subword == "first":
            keep &= (sa.role != _WORD) | (sa.subword == 0)
        if words_only:
            keep &= sa.role == _WORD
        shared_any |= _align(ka, kb, np.flatnonzero(keep))[0].size > 0
        words, _ = _align(ka, kb, np.flatnonzero(sa.role == _WORD))
        sentences.update(sa.sentence[words].tolist())
        for name, (kind, arg) in choices.items():
            if kind == "words":
                if arg in set(sa.sentence[words].tolist()):
                    found.add(name)
            elif _choice_rows(sa, kind, arg).size and _choice_rows(sb, kind, arg).size:
                found.add(name)
    roles = [ROLES[c] for c in codes]
    if drift and not shared_any:
        raise ValueError(f"formats {fa.name!r} ({fa.template}) and {fb.name!r} ({fb.template}) share no token "
                         f"keys among roles {roles}" + (" (words only)" if words_only else ""))
    missing = [c for c in choices if c not in found]
    if missing:
        raise ValueError(f"token choice(s) {missing} do not occur in both {fa.name!r} ({fa.template}) and "
                         f"{fb.name!r} ({fb.template}) with roles {roles}")
    out = dict(choices)
    if word_groups:
        for s in sorted(sentences):
            out.setdefault(f"s{s} words", ("words", s))
    if not out and not drift:
        raise ValueError(f"nothing to compare between {fa.name!r} and {fb.name!r}: no choice, no word group, "
                         "drift off")
    return out


def _plan_lengths(lm: LoadedModel, fmts: Sequence[Format], examples: Sequence[Example], *, layers, roles,
                  dtype, on_overflow, corpus_name) -> tuple[list, np.ndarray]:
    """Check every example in both formats (lengths, special tokens, sentences) chunk by chunk, with
    the extractor's own planning; returns one plan per format and the (2, n) token counts, 0 where an
    example is skipped in either format (so it is skipped in both)."""
    n = len(examples)
    lengths = np.zeros((len(fmts), n), dtype=np.int64)
    plans: list = [None] * len(fmts)
    corpus = {"name": corpus_name, "fingerprint": "", "n_examples": n}
    for start in range(0, n, _CHUNK):
        part = [examples[i] for i in range(start, min(start + _CHUNK, n))]
        lengths_of = sentence_lengths(lm.tokenizer, list(dict.fromkeys(s for e in part for s in e.sentences)))
        for f, fmt in enumerate(fmts):
            # the zero-segment-ids note is printed once, not once per chunk
            quiet = contextlib.redirect_stderr(io.StringIO()) if start else contextlib.nullcontext()
            try:
                with quiet:
                    p = plan(lm, fmt, part, lengths_of, corpus=corpus, root=Path("."), layers=layers, roles=roles,
                             dtype=dtype, storage_dtype="float32", on_overflow=on_overflow, shard_mb=1.0,
                             attention=False)
            except ExtractError as err:
                if on_overflow == "skip" and "every example is longer" in str(err):
                    continue  # this chunk is all skipped; other chunks may not be
                raise
            lengths[f, start:start + len(part)] = p.lengths
            plans[f] = plans[f] or p
    lengths[:, (lengths == 0).any(0)] = 0
    if not lengths.any() or any(p is None for p in plans):
        raise ExtractError(f"every example is longer than the model's limit of {lm.max_length} in "
                           f"format {fmts[0].name!r} or {fmts[1].name!r}")
    return [dataclasses.replace(p, lengths=lengths[f], n_stored=np.zeros(0, np.int64), shards=[], skipped=[])
            for f, p in enumerate(plans)], lengths


# ---------------------------------------------------------------------------------------------------
# The public entry point


def stream_compare(
    examples: Sequence[Example],
    format_a: str | Format,
    format_b: str | Format,
    *,
    model: str | LoadedModel | None = None,
    random_init: bool = False,
    seed: int = 0,
    layers: str | Sequence[int] | None = None,
    roles: str | Sequence[str] | None = None,
    choices: Sequence[str] = ("cls", "mean"),
    word_groups: bool = True,
    metrics: Sequence[str] = ("linear_cka", "linear_cka_debiased"),
    drift: bool = True,
    subword: str = "first",
    words_only: bool = False,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    bootstrap_seed: int = 0,
    batch_tokens: int = 8192,
    max_batch: int = 256,
    on_overflow: str = "error",
    device: str | None = "auto",
    dtype: str = "float32",
    corpus_name: str = "custom",
    progress: bool = True,
) -> dict[str, pd.DataFrame]:
    """Drift and linear CKA between ``format_a`` and ``format_b`` over ``examples``, without a cache.

    Args mirror :func:`probing.extract.extract` (model, layers, roles, dtype, batching, overflow) and
    the cached runners: ``choices`` and ``metrics`` as :func:`analyses.similarity.run_cka_formats`
    (``linear_cka``, ``linear_cka_debiased``), ``subword``/``words_only`` as
    :func:`analyses.drift.run_drift`; ``word_groups`` adds CKA of ``s<i> words`` for every sentence
    both formats hold; ``n_resamples`` Poisson-bootstrap resamples for the drift CIs (0: none);
    ``drift=False`` skips drift.

    Returns ``{"drift": ..., "cka": ..., "memory": ...}``: tidy tables (:func:`analyses.results.make_table`)
    with the cached runners' columns and metric names, and the accumulators' sizes in bytes.
    Raises ``ValueError`` (naming the offending value) for an unknown choice or metric, formats that
    share no token key, a choice absent from a format; ``ExtractError`` for overlong examples.
    """
    if isinstance(choices, str):
        choices = [c.strip() for c in choices.split(",") if c.strip()]
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    if subword not in SUBWORD_MODES:
        raise ValueError(f"subword must be one of {SUBWORD_MODES}, got {subword!r}")
    bad = [m for m in metrics if m not in STREAM_METRICS]
    if bad:
        raise ValueError(f"metric(s) {bad} cannot be streamed; choose from {list(STREAM_METRICS)} "
                         "(RBF CKA needs the n x n Gram matrix: use the cached path)")
    parsed = {c: _parse_choice(c) for c in dict.fromkeys(choices)}
    if on_overflow not in ON_OVERFLOW:
        raise ValueError(f"on_overflow must be one of {ON_OVERFLOW}, got {on_overflow!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if isinstance(n_resamples, bool) or int(n_resamples) != n_resamples or n_resamples < 0:
        raise ValueError(f"n_resamples must be an integer >= 0, got {n_resamples=!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence=}")
    if batch_tokens < 1 or max_batch < 1:
        raise ValueError(f"{batch_tokens=} and {max_batch=} must be positive")
    fa, fb = (f if isinstance(f, Format) else Format.parse(f) for f in (format_a, format_b))
    if not isinstance(examples, Sequence):
        examples = list(examples)  # a Sequence (even a lazy one) is only indexed, never copied
    if not len(examples):
        raise ValueError("the corpus is empty")
    for f in (fa, fb):
        need = f.min_sentences()
        short = next((ex for ex in examples if ex.n_sentences < need), None)
        if short is not None:
            raise FormatError(f"format {f.name!r} ({f.template}) needs {need} sentences but example "
                              f"{short.id!r} has {short.n_sentences}")
    dev = pick_device(device)
    if dev.type == "cpu" and dtype == "float16":
        raise ValueError("dtype float16 needs a GPU; on the CPU use float32 or bfloat16")
    with running(model, device=dev, dtype=dtype, random_init=random_init, seed=seed) as lm:
        return _stream(lm, examples, fa, fb, layers=layers, roles=roles, parsed=parsed, word_groups=word_groups,
                       metrics=metrics, drift=drift, subword=subword, words_only=words_only, n_resamples=n_resamples,
                       confidence=confidence, bootstrap_seed=bootstrap_seed, batch_tokens=batch_tokens,
                       max_batch=max_batch, on_overflow=on_overflow, dev=dev, dtype=dtype, corpus_name=corpus_name,
                       progress=progress)


def _stream(lm: LoadedModel, examples: Sequence[Example], fa: Format, fb: Format, *, layers, roles, parsed,
            word_groups, metrics, drift, subword, words_only, n_resamples, confidence, bootstrap_seed, batch_tokens,
            max_batch, on_overflow, dev, dtype, corpus_name, progress) -> dict[str, pd.DataFrame]:
    from analyses.cka import StreamingLinearCKA
    from analyses.results import make_table

    layer_list = parse_layers(layers, lm.n_layers)
    role_list = parse_roles(roles)
    codes = np.asarray([_CODE[r] for r in role_list], dtype=np.int64)
    if not metrics:  # no CKA asked for: no CKA accumulators
        parsed, word_groups = {}, False
    all_choices = _check_structure(lm, fa, fb, examples, codes, parsed, word_groups, subword, words_only, drift)
    plans, lengths = _plan_lengths(lm, (fa, fb), examples, layers=layer_list, roles=role_list, dtype=dtype,
                                   on_overflow=on_overflow, corpus_name=corpus_name)

    L = len(layer_list)
    acc_drift = DriftAccumulator(L, int(n_resamples), dev) if drift else None
    wanted = [m for m in dict.fromkeys(metrics)]
    debiased = any(STREAM_METRICS[m] for m in wanted)
    acc_cka = {(c, li): StreamingLinearCKA(debiased=debiased, device=dev) for c in all_choices for li in range(L)}
    H = lm.hidden_size
    n_kept = int((lengths[0] > 0).sum())
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_kept, desc=f"stream {fa.name} vs {fb.name}", unit="ex", dynamic_ncols=True, file=sys.stderr)
    trim = HeapTrimmer()
    with torch.inference_mode():
        for start in range(0, len(examples), _CHUNK):
            stop = min(start + _CHUNK, len(examples))
            idx, rend_a, _ = render_shard(lm, plans[0], examples, start, stop)
            idx_b, rend_b, _ = render_shard(lm, plans[1], examples, start, stop)
            if idx != idx_b:  # cannot happen: both plans keep the same examples
                raise RuntimeError("formats kept different examples")
            if not idx:
                continue
            W = _poisson_weights(start, stop, int(n_resamples), bootstrap_seed) if n_resamples and drift else None
            longest = [max(len(x), len(y)) for x, y in zip(rend_a, rend_b)]
            for batch in length_batches(longest, batch_tokens, max_batch):
                in_a, in_b = collate([rend_a[i] for i in batch], lm, dev), collate([rend_b[i] for i in batch], lm, dev)
                hs_a, hs_b = forward(lm, in_a).hidden_states, forward(lm, in_b).hidden_states
                Ta, Tb = in_a.T, in_b.T
                sa, sb = _stored(rend_a, batch, codes), _stored(rend_b, batch, codes)
                d_index, c_index = _index_batch(sa, sb, Ta, Tb, all_choices, acc_drift, subword, words_only, dev)
                weights = None
                if W is not None and d_index is not None:
                    weights = torch.from_numpy(W[[idx[i] - start for i in batch]]).to(dev)
                for li, layer in enumerate(layer_list):
                    _accumulate_layer(li, hs_a[layer].reshape(-1, H), hs_b[layer].reshape(-1, H), d_index, c_index,
                                      acc_drift, acc_cka, len(batch), weights)
                del hs_a, hs_b, d_index, c_index, weights
                trim()
                if bar is not None:
                    bar.update(len(batch))
        if bar is not None:
            bar.close()
        tables = _tables(lm, fa, fb, layer_list, corpus_name, acc_drift, acc_cka, all_choices, wanted, confidence,
                         bootstrap_seed, subword, words_only)
    return {k: make_table(v) if k != "memory" else pd.DataFrame(v) for k, v in tables.items()}


def _accumulate_layer(li: int, Ha: torch.Tensor, Hb: torch.Tensor, d_index: _DriftIndex | None,
                      c_index: dict[str, _ChoiceIndex], acc_drift: DriftAccumulator | None, acc_cka: dict,
                      n_slots: int, weights: torch.Tensor | None) -> None:
    """Update every accumulator of layer index ``li`` from one batch's states ``Ha: (B*T_a, hidden)``
    and ``Hb: (B*T_b, hidden)`` (flattened (batch, position))."""
    if d_index is not None:
        A = Ha.index_select(0, d_index.flat_a).double()
        B = Hb.index_select(0, d_index.flat_b).double()
        if d_index.unit is not None:
            A = _pool(A, d_index.unit, d_index.unit_count, d_index.n_units, "mean")
            B = _pool(B, d_index.unit, d_index.unit_count, d_index.n_units, "mean")
        acc_drift.update(li, A, B, d_index.slot, d_index.group, n_slots, weights)
    for name, ci in c_index.items():
        X, Y = Ha.index_select(0, ci.flat_a), Hb.index_select(0, ci.flat_b)
        if ci.item_a is not None:
            X = _pool(X, ci.item_a, ci.count_a, ci.n_items, ci.kind)
            Y = _pool(Y, ci.item_b, ci.count_b, ci.n_items, ci.kind)
        acc_cka[name, li].update(X, Y)


def _model_label(lm: LoadedModel) -> str:
    return lm.name + (f" (random init, seed {lm.seed})" if lm.random_init else "")


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def _tables(lm, fa, fb, layer_list, corpus_name, acc_drift, acc_cka, choices, metrics, confidence, bseed,
            subword, words_only) -> dict[str, list[dict]]:
    base = {"model": _model_label(lm), "corpus": corpus_name, "format": fa.name, "format_b": fb.name}
    drift_rows = []
    if acc_drift is not None:
        ci = "poisson cluster bootstrap over examples" if acc_drift.boot is not None else "none"
        for r in acc_drift.result(confidence):
            li = r.pop("layer_index")
            drift_rows.append({**base, "analysis": "drift", "layer": layer_list[li], "target": "",
                               "seed": bseed, **r, "standardised": False, "subword": subword,
                               "words_only": words_only, "ci_method": ci, "streaming": True})
    cka_rows = []
    for name in choices:
        for li, layer in enumerate(layer_list):
            acc = acc_cka[name, li]
            for m in metrics:
                note = ""
                if acc.n_items < 4:
                    v, note = float("nan"), f"only {acc.n_items} items in both formats (need 4)"
                else:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        v = float(acc.result(debiased=STREAM_METRICS[m]))
                    if np.isnan(v):
                        note = "; ".join(str(w.message) for w in caught)
                cka_rows.append({**base, "analysis": "cka", "layer": layer, "role": name, "target": name,
                                 "metric": m, "value": v, "n": acc.n_items, "seed": 0, "note": note,
                                 "streaming": True})
    memory = []
    if acc_drift is not None:
        for k, v in acc_drift.tensors().items():
            memory.append({"accumulator": k, "shape": str(tuple(v.shape)), "bytes": _nbytes(v)})
    for (name, li), acc in acc_cka.items():
        st = acc._st or {}
        memory.append({"accumulator": f"cka.{name}.layer{layer_list[li]}",
                       "shape": f"{len(st)} statistics", "bytes": sum(_nbytes(v) for v in st.values())})
    return {"drift": drift_rows, "cka": cka_rows, "memory": memory}
