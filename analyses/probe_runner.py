"""Probe runner: read caches, build targets, fit every (layer x token choice) probe, write a tidy table.

    python -m analyses.probes CACHE --choices cls,mean,sep1 --targets topic,length,bow_s1 \
        [--random-cache CACHE_OF_RANDOM_INIT_MODEL] --out results

Targets, declared once in :data:`TARGETS`:

* ``<label>``: any example label stored with the corpus (``topic``, ``is_next``, ``swapped``, ...)
* ``length``: length of sentence 1 in words, in 3 equal-count bins (short / medium / long)
* ``bow_s<i>``: the content of sentence i, as a multi-label bag of words over the ``--vocab`` most
  frequent lower-cased words of that sentence across the corpus (stop words included: they are content
  too); scored by micro-F1 and macro AUC
* ``segment``: token-level: which sentence a word token belongs to (first subwords; control task: a
  random sentence per word type, Hewitt & Liang 2019)

Every probe uses the protocol of :mod:`analyses.probes` (standardised features, C by grouped inner CV,
grouped outer CV over examples, majority baseline, control task and selectivity). With
``random_cache`` (the same format extracted with ``--random-init``) the same probes are fit on the
randomly initialised model (``model_kind = random_init``); it must be the baseline of ``cache``:
random weights, the same architecture, corpus, format and layers
(:func:`probing.cache.check_comparable` with ``random_baseline=True``), or the run is refused.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from analyses.drift import model_label
from analyses.probes import cross_validate_probe, probe_many, probe_rows
from analyses.results import (CLI_ERRORS, add_output_options, cache_identity, cli_error, keep_table, make_table,
                              parse_layers, stored_table)
from analyses.selection import parse_choice, pooled
from probing.cache import Cache, check_comparable
from probing.cli import ArgumentParser

TARGETS: dict[str, str] = {
    "<label>": "an example label stored with the corpus (topic, is_next, swapped, ...)",
    "length": "words in sentence 1, 3 equal-count bins",
    "length<k>": "words in sentence 1, k equal-count bins (length6: SentEval's SentLen has 6 classes)",
    "bow_s<i>": "bag of words of sentence i (multi-label, top --vocab words)",
    "segment": "token level: the sentence a word token belongs to",
}
_WORD = re.compile(r"[a-z0-9']+")


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def example_target(cache: Cache, target: str, examples: np.ndarray, vocab: int = 50) -> tuple[np.ndarray, bool]:
    """Target values for corpus indices ``examples``: ``(y, multilabel)``."""
    table = cache.examples.loc[examples]
    m = re.fullmatch(r"length(\d*)", target)
    if m:
        bins = int(m.group(1) or 3)
        if bins < 2:
            raise ValueError(f"target {target!r}: need at least 2 length bins")
        n = np.asarray([len(s.split()) for s in table["sentence_1"]])
        edges = np.unique(np.quantile(n, np.arange(1, bins) / bins))
        return np.searchsorted(edges, n, side="right"), False
    m = re.fullmatch(r"bow_s(\d+)", target)
    if m:
        col = f"sentence_{m.group(1)}"
        if col not in table.columns:
            raise ValueError(f"target {target!r}: the corpus has no sentence {m.group(1)}")
        docs = [set(words_of(s)) for s in cache.examples[col]]
        common = [w for w, _ in Counter(w for d in docs for w in d).most_common(vocab)]
        rows = [set(words_of(s)) for s in table[col]]
        Y = np.asarray([[w in r for w in common] for r in rows], dtype=np.int64)
        Y = Y[:, (Y.sum(0) > 0) & (Y.sum(0) < len(Y))]  # a word present everywhere or nowhere says nothing
        if Y.shape[1] == 0:
            raise ValueError(f"target {target!r}: no word varies across examples")
        return Y, True
    y = cache.labels(target, examples)
    if y.dtype.kind == "f":
        raise ValueError(f"label {target!r} is continuous; probes need classes")
    return y, False


def _token_features(cache: Cache, layers: Sequence[int], max_tokens: int, seed: int):
    tok = cache.tokens
    rows = np.flatnonzero((tok["role"].to_numpy() == "word") & (tok["subword"].to_numpy() == 0))
    if len(rows) == 0:
        raise ValueError(f"{cache.path.name}: target 'segment' needs word tokens (extract with --roles ...,word)")
    if len(rows) > max_tokens:
        ex = tok["example"].to_numpy()[rows]
        keep = np.random.default_rng(seed).permutation(np.unique(ex))
        counts = pd.Series(ex).value_counts()
        chosen = keep[np.cumsum(counts.loc[keep].to_numpy()) <= max_tokens]
        rows = rows[np.isin(ex, chosen)]
    y = tok["sentence"].to_numpy()[rows]
    groups = tok["example"].to_numpy()[rows]
    types = pd.Series(tok["word_text"].to_numpy()[rows]).str.lower().factorize()[0]
    features = {(layer, "word"): cache.states(layer, rows) for layer in layers}
    return features, y, groups, types


BACKENDS = ("auto", "torch", "sklearn")


def clip_intervals(df: pd.DataFrame) -> pd.DataFrame:
    """A t-interval over a few folds can reach past the metric's range (accuracy 1.03): clip it to
    [0, 1], or [-1, 1] for selectivity (a difference of two scores)."""
    lo = np.where(df["metric"].astype(str) == "selectivity", -1.0, 0.0)
    for col in ("ci_low", "ci_high"):
        df[col] = np.clip(pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float), lo, 1.0)
    return df


def fit_probes(features: dict, y: np.ndarray, groups: np.ndarray, *, meta: dict, n_splits: int, seed: int,
               control_types, backend: str, device: str | None, Cs=None, inner_splits: int = 3,
               max_iter: int = 1000) -> pd.DataFrame:
    """All feature sets' probes: batched in torch (``probe_many``, the default; on the CPU with one
    thread, which is faster than several on small machines: see benchmarks/RESULTS.md), or one
    scikit-learn cross-validation per feature set (the reference path)."""
    import torch

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    extra = {"inner_splits": inner_splits, "max_iter": max_iter}
    if Cs is not None:
        extra["Cs"] = tuple(Cs)
    if backend in ("auto", "torch"):
        on_gpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
        return clip_intervals(probe_many(features, y, groups, meta=meta, n_splits=n_splits, seed=seed,
                                         control_types=control_types, device=device,
                                         num_threads=None if on_gpu else 1, **extra))
    rows = []
    for (layer, role), X in features.items():
        res = cross_validate_probe(X, y, groups, n_splits=n_splits, seed=seed, control_types=control_types, **extra)
        rows.extend(probe_rows(res, **meta, layer=layer, role=role, seed=seed, feature=str((layer, role))))
    return clip_intervals(make_table(rows))


def run_probes(cache: Cache, choices: Sequence[str] = ("cls", "mean"), targets: Sequence[str] = ("topic",), *,
               layers: Sequence[int] | None = None, random_cache: Cache | None = None, n_splits: int = 5,
               seed: int = 0, control: bool = True, vocab: int = 50, max_tokens: int = 6000,
               device: str | None = None, backend: str = "auto", Cs: Sequence[float] | None = None,
               inner_splits: int = 3, max_iter: int = 1000, bow_Cs: Sequence[float] | None = None,
               out: str | Path | None = None, force: bool = False, progress: bool = True) -> pd.DataFrame:
    """Probes for every layer x token choice x target, on ``cache`` and optionally ``random_cache``.

    ``Cs`` is the grid the inner CV chooses C from; ``bow_Cs``, if given, replaces it for the
    multi-label bag-of-words targets (one value = a fixed C, no inner CV: many labels make those
    probes the slowest, and the study uses this to stay within its time budget)."""
    import torch

    for c in choices:
        parse_choice(c)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if random_cache is not None:
        # the baseline must be this model's architecture with random weights, same corpus and format
        check_comparable(cache, random_cache, random_baseline=True)
    layers = list(layers if layers is not None else cache.layers)
    run_device = None if backend == "sklearn" else (device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = {"cache": cache_identity(cache), "random": cache_identity(random_cache) if random_cache else None,
              "backend": "sklearn" if backend == "sklearn" else "torch", "device": run_device,
              "choices": list(choices), "targets": list(targets), "layers": layers, "n_splits": n_splits,
              "seed": seed, "control": control, "vocab": vocab, "max_tokens": max_tokens,
              "Cs": None if Cs is None else list(Cs), "inner_splits": inner_splits, "max_iter": max_iter,
              "bow_Cs": None if bow_Cs is None else list(bow_Cs)}
    path, done = stored_table(out, "probe", config, force)
    if done is not None:
        return done
    frames = []
    pairs = [(cache, "trained")] + ([(random_cache, "random_init")] if random_cache is not None else [])
    for c, _ in pairs:  # an unknown label fails before any probe is fitted
        for target in targets:
            if target != "segment" and not re.fullmatch(r"length\d*|bow_s\d+", target):
                c.labels(target)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(pairs) * len(targets), desc=f"probes {cache.format_name}", disable=not progress,
               file=sys.stderr)
    for c, kind in pairs:
        pooled_cache: dict = {}
        for target in targets:
            meta = {"analysis": "probe", "model": model_label(c), "corpus": c.manifest["corpus"]["name"],
                    "format": c.format_name, "target": target}
            if target == "segment":
                features, y, groups, types = _token_features(c, layers, max_tokens, seed)
                df = fit_probes(features, y, groups, meta=meta, n_splits=n_splits, seed=seed,
                                control_types=types if control else None, backend=backend, device=device, Cs=Cs,
                                inner_splits=inner_splits, max_iter=max_iter)
            else:
                features, common = {}, None
                for choice in choices:
                    for layer in layers:
                        if (layer, choice) not in pooled_cache:
                            pooled_cache[(layer, choice)] = pooled(c, layer, choice)
                        ex, _ = pooled_cache[(layer, choice)]
                        common = ex if common is None else np.intersect1d(common, ex)
                for choice in choices:
                    for layer in layers:
                        ex, X = pooled_cache[(layer, choice)]
                        features[(layer, choice)] = X[np.searchsorted(ex, common)]
                y, multilabel = example_target(c, target, common, vocab)
                df = fit_probes(features, y, common, meta=meta, n_splits=n_splits, seed=seed,
                                control_types=common if control and not multilabel else None, backend=backend,
                                device=device, Cs=bow_Cs if multilabel and bow_Cs is not None else Cs,
                                inner_splits=inner_splits, max_iter=max_iter)
            df["model_kind"] = kind
            frames.append(df)
            bar.update(1)
    bar.close()
    df = pd.concat(frames, ignore_index=True) if frames else make_table([])
    return keep_table(df, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m analyses.probes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Linear probes (logistic regression, standardised features, C by grouped inner CV) on "
                    "cached states, scored by cross-validation grouped by example, with the majority "
                    "baseline, a control task (Hewitt & Liang 2019) and selectivity; optionally the same "
                    "probes on a randomly initialised model's cache.",
        epilog="targets:\n" + "\n".join(f"  {k:<10} {v}" for k, v in TARGETS.items())
               + "\ntoken choices: cls, sep<i>, sep_last, mean, max, first_word, mean_s<i>, pos<k>",
    )
    p.add_argument("cache", help="cache directory")
    p.add_argument("--choices", default="cls,mean", help="token choices (default cls,mean)")
    p.add_argument("--targets", default="topic", help="comma list of targets (default topic)")
    p.add_argument("--layers", default=None, help="comma list of layers (default: all stored)")
    p.add_argument("--random-cache", default=None, help="cache of the same format from --random-init")
    p.add_argument("--folds", type=int, default=5, help="outer cross-validation folds (default 5)")
    p.add_argument("--vocab", type=int, default=50, help="words in bag-of-words targets (default 50)")
    p.add_argument("--max-tokens", type=int, default=6000, help="token-level targets: at most this many tokens")
    p.add_argument("--no-control", action="store_true", help="skip the control task")
    p.add_argument("--device", default=None, help="torch device for the batched probes (default: CUDA if available)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="torch (default): all probes batched, on the GPU when present; sklearn: one CV per probe (reference)")
    add_output_options(p)
    args = p.parse_args(argv)
    try:
        cache = Cache.open(args.cache)
        rnd = Cache.open(args.random_cache) if args.random_cache else None
        layers = parse_layers(args.layers)
        df = run_probes(cache, args.choices.split(","), args.targets.split(","), layers=layers, random_cache=rnd,
                        n_splits=args.folds, seed=args.seed, control=not args.no_control, vocab=args.vocab,
                        max_tokens=args.max_tokens, device=args.device, backend=args.backend, out=args.out,
                        force=args.force)
    except CLI_ERRORS as err:
        return cli_error(err)
    main_metric = df["metric"].isin(["accuracy", "micro_f1"])
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(df[main_metric].pivot_table(index="layer", columns=["model_kind", "target", "role"], values="value",
                                          sort=False).to_string())
    return 0
