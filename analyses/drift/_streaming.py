"""Drift and linear CKA between two formats computed during the forward pass, with no cache on disk.

For corpora whose states do not fit on disk: every batch of examples is run through the model in
format A and in format B (the same examples in the same batch), the positions each measurement needs
are gathered on the device, and float64 accumulators on the device are updated; nothing is written.
Memory is O(batch + d² per layer and token choice) plus two integers per example (the planned
lengths), whatever the corpus size; a corpus given as a (possibly lazy) ``Sequence`` is indexed, never
copied, and freed heap pages are handed back to the system as the run goes (glibc ``malloc_trim``),
so the resident size does not creep up with heap fragmentation (``benchmarks/memory.py``). Planning and
the forward pass are the extractor's own (:mod:`probing.planning`, :mod:`probing.forward`).

    from analyses.drift._streaming import stream_compare
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
* ``cka`` (as :func:`analyses.cka.run_cka_formats`): per layer and token choice, linear CKA
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
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from probing.examples import Example
from probing.formats import Format, FormatError, render, resolve_format, special_token_ids, tokenize_sentences
from probing.forward import collate, forward, length_batches, running
from probing.heap import HeapTrimmer
from probing.models import DTYPES, LoadedModel, pick_device
from probing.planning import (ON_OVERFLOW, ROLES, ExtractError, parse_layers, parse_roles, plan, render_shard,
                       sentence_lengths)
from analyses.stats import check_confidence, check_resamples
from analyses.drift._stream_drift import BLOCK, STREAM_DRIFT_METRICS, DriftAccumulator, poisson_weights
from analyses.drift._stream_index import (ROLE_CODE, WORD, ChoiceIndex, DriftIndex, align_keys, choice_rows,
                                          index_batch, parse_stream_choice, pool_rows, stored_positions, token_keys)

__all__ = ["stream_compare", "STREAM_METRICS", "STREAM_DRIFT_METRICS", "SUBWORD_MODES", "DriftAccumulator"]

#: CKA metrics that can be accumulated in one pass (RBF CKA needs the n x n Gram matrix).
STREAM_METRICS: dict[str, bool] = {"linear_cka": False, "linear_cka_debiased": True}  # name -> debiased
SUBWORD_MODES: tuple[str, ...] = ("first", "mean")

_CHUNK = BLOCK  # examples rendered at a time: one block of the bootstrap weights' generator


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
        sa, sb = stored_positions([ra], [0], codes), stored_positions([rb], [0], codes)
        ka, kb = token_keys(sa, sb)
        keep = np.ones(len(ka), dtype=bool)
        if subword == "first":
            keep &= (sa.role != WORD) | (sa.subword == 0)
        if words_only:
            keep &= sa.role == WORD
        shared_any |= align_keys(ka, kb, np.flatnonzero(keep))[0].size > 0
        words, _ = align_keys(ka, kb, np.flatnonzero(sa.role == WORD))
        sentences.update(sa.sentence[words].tolist())
        for name, (kind, arg) in choices.items():
            if kind == "words":
                if arg in set(sa.sentence[words].tolist()):
                    found.add(name)
            elif choice_rows(sa, kind, arg).size and choice_rows(sb, kind, arg).size:
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
    the cached runners: ``choices`` and ``metrics`` as :func:`analyses.cka.run_cka_formats`
    (``linear_cka``, ``linear_cka_debiased``), ``subword``/``words_only`` as
    :func:`analyses.drift.run_drift`; ``word_groups`` adds CKA of ``s<i> words`` for every sentence
    both formats hold; ``n_resamples`` Poisson-bootstrap resamples for the drift CIs (0: none; else at least
    :func:`analyses.stats.min_resamples` of ``confidence``);
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
    parsed = {c: parse_stream_choice(c) for c in dict.fromkeys(choices)}
    if on_overflow not in ON_OVERFLOW:
        raise ValueError(f"on_overflow must be one of {ON_OVERFLOW}, got {on_overflow!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    confidence = check_confidence(confidence)
    if isinstance(n_resamples, bool) or n_resamples != 0:  # 0: no CI; any other count must give one
        n_resamples = check_resamples(n_resamples, confidence)
    if batch_tokens < 1 or max_batch < 1:
        raise ValueError(f"{batch_tokens=} and {max_batch=} must be positive")
    fa, fb = (f if isinstance(f, Format) else Format.parse(f) for f in (format_a, format_b))
    if not isinstance(examples, Sequence):
        examples = list(examples)  # a Sequence (even a lazy one) is only indexed, never copied
    if not len(examples):
        raise ValueError("the corpus is empty")
    for f in (fa, fb):
        if f.is_unresolved:
            continue  # native: resolved against the tokenizer below, to a template every example fills
        need = f.min_sentences()
        short = next((ex for ex in examples if ex.n_sentences < need), None)
        if short is not None:
            raise FormatError(f"format {f.name!r} ({f.template}) needs {need} sentences but example "
                              f"{short.id!r} has {short.n_sentences}")
    dev = pick_device(device)
    if dev.type == "cpu" and dtype == "float16":
        raise ValueError("dtype float16 needs a GPU; on the CPU use float32 or bfloat16")
    with running(model, device=dev, dtype=dtype, random_init=random_init, seed=seed) as lm:
        if fa.is_unresolved or fb.is_unresolved:  # native, as extraction resolves it
            n_min = min(ex.n_sentences for ex in examples)
            fa, fb = (resolve_format(f, lm.tokenizer, n_min) for f in (fa, fb))
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
    codes = np.asarray([ROLE_CODE[r] for r in role_list], dtype=np.int64)
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
            W = poisson_weights(start, stop, int(n_resamples), bootstrap_seed) if n_resamples and drift else None
            longest = [max(len(x), len(y)) for x, y in zip(rend_a, rend_b)]
            for batch in length_batches(longest, batch_tokens, max_batch):
                in_a, in_b = collate([rend_a[i] for i in batch], lm, dev), collate([rend_b[i] for i in batch], lm, dev)
                hs_a, hs_b = forward(lm, in_a).hidden_states, forward(lm, in_b).hidden_states
                Ta, Tb = in_a.T, in_b.T
                sa, sb = stored_positions(rend_a, batch, codes), stored_positions(rend_b, batch, codes)
                d_index, c_index = index_batch(sa, sb, Ta, Tb, all_choices, acc_drift, subword, words_only, dev)
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


def _accumulate_layer(li: int, Ha: torch.Tensor, Hb: torch.Tensor, d_index: DriftIndex | None,
                      c_index: dict[str, ChoiceIndex], acc_drift: DriftAccumulator | None, acc_cka: dict,
                      n_slots: int, weights: torch.Tensor | None) -> None:
    """Update every accumulator of layer index ``li`` from one batch's states ``Ha: (B*T_a, hidden)``
    and ``Hb: (B*T_b, hidden)`` (flattened (batch, position))."""
    if d_index is not None:
        A = Ha.index_select(0, d_index.flat_a).double()
        B = Hb.index_select(0, d_index.flat_b).double()
        if d_index.unit is not None:
            A = pool_rows(A, d_index.unit, d_index.unit_count, d_index.n_units, "mean")
            B = pool_rows(B, d_index.unit, d_index.unit_count, d_index.n_units, "mean")
        acc_drift.update(li, A, B, d_index.slot, d_index.group, n_slots, weights)
    for name, ci in c_index.items():
        X, Y = Ha.index_select(0, ci.flat_a), Hb.index_select(0, ci.flat_b)
        if ci.item_a is not None:
            X = pool_rows(X, ci.item_a, ci.count_a, ci.n_items, ci.kind)
            Y = pool_rows(Y, ci.item_b, ci.count_b, ci.n_items, ci.kind)
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
        resamples = acc_drift.boot.shape[0] if acc_drift.boot is not None else None
        for r in acc_drift.result(confidence):
            li = r.pop("layer_index")
            drift_rows.append({**base, "analysis": "drift", "layer": layer_list[li], "target": "",
                               "seed": bseed, **r, "standardised": False, "subword": subword,
                               "words_only": words_only, "ci_method": ci, "n_resamples": resamples,
                               "streaming": True})
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
                cka_rows.append({**base, "analysis": "cka", "layer": layer, "choice": name, "choice_b": name,
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
