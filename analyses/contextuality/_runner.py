"""How contextual are the word representations? The measures of Ethayarajh 2019, per layer.

Ethayarajh 2019, "How Contextual are Contextualized Word Representations? Comparing the Geometry of
BERT, ELMo, and GPT-2 Embeddings", EMNLP, sec. 3.3-3.4. Over the word tokens of one cache:

- ``anisotropy_baseline``: mean cosine of uniformly random word tokens from different examples
  (:func:`analyses.drift.anisotropy_baseline_ci`; CI: cluster bootstrap over the example of
  each pair's first token). ``n`` = number of pairs.
- ``self_similarity``: for a word type w seen in n >= ``min_contexts`` distinct examples (one
  occurrence per example, at most ``max_contexts`` examples sampled with ``seed``), the mean cosine
  over all ordered pairs j != k of its n occurrence vectors, ``1/(n(n-1)) Σ_j Σ_{k≠j} cos(v_j, v_k)``;
  averaged over word types. 1: the same vector in every context (static); low: context-specific.
  ``self_similarity_adjusted`` = ``self_similarity`` − the layer's anisotropy baseline.
- ``intra_similarity``: for each sentence of >= 2 words, the mean cosine between each word vector and
  the sentence's mean word vector, ``1/m Σ_i cos(v_i, mean_k v_k)``; averaged over sentences.
  ``intra_similarity_adjusted`` = ``intra_similarity`` − the anisotropy baseline.
- ``mev`` (maximum explainable variance): for the same word types, ``σ_1² / Σ_i σ_i²`` of the
  (n × d) matrix of the n occurrence vectors, uncentred as in the paper: the share of the matrix's
  squared norm that its best rank-1 approximation (one static vector) keeps; averaged over types.
  Between 1/min(n, d) and 1. ``mev_adjusted`` = mean over types of ``mev(w)`` − the MEV of n word
  tokens drawn at random: for each type, n examples drawn without replacement with probability
  proportional to their number of words, one word uniformly within each (the same n as the type,
  since MEV falls with n: n isotropic vectors give about 1/n).
- ``mev_centred`` / ``mev_centred_adjusted``: the same with each type's occurrences centred on their
  mean first, i.e. the first principal component's share of explained variance, which is what the
  authors' released code computes (scikit-learn PCA). Types whose occurrences have no variance are
  left out of the centred mean (``n`` counts the types used).

A word is the subword tokens sharing (example, sentence, word index); its vector is its first subword
(``subword="first"``, default) or the mean of its subwords (``"mean"``). Its type is its surface text
(the cache's ``word_text``, or the joined subword tokens without their ``##`` / ``Ġ`` / ``▁`` / ``</w>``
markers where that column is missing or empty), lower-cased by default. A context is an example: a
type's first occurrence in each example is used, so repeats inside one example do not count as
contexts. The same occurrences and the same random tokens are used at every layer.

CIs are 95% bootstraps (:func:`analyses.stats.bootstrap_ci`): over word types for self-similarity and
MEV (each type one cluster), over examples for intra-similarity (the sentences of one example form
one cluster). The adjusted self- and intra-similarity CIs are the raw CIs shifted by the baseline's
point value (the baseline's own uncertainty is not propagated, as for normalised drift); the
adjusted MEV's CI comes from bootstrapping the per-type differences.

The measures, and the choice of words and occurrences, are pure functions in
:mod:`analyses.contextuality._metrics`; this module is the runner (cache -> table) and its command:

    python -m analyses.contextuality caches/MODEL/single-... --out results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, cache_identity, cli_error, keep_table,
                              make_table, model_label, result_path, stored_table)
from analyses.drift import POOL_MODES, anisotropy_baseline_ci, subword_pool
from analyses.contextuality._metrics import (choose_contexts, intra_similarity, max_explainable_variance,
                                             random_word_sets, self_similarity, word_table)
from analyses.stats import bootstrap_ci, bootstrap_cis, check_resamples
from probing.cache import Cache
from probing.cli import ArgumentParser
from probing.layers import cache_layers

#: The metrics of the table, in order.
METRICS: tuple[str, ...] = (
    "anisotropy_baseline", "self_similarity", "self_similarity_adjusted", "intra_similarity",
    "intra_similarity_adjusted", "mev", "mev_adjusted", "mev_centred", "mev_centred_adjusted",
)


# ---------------------------------------------------------------------------------------------------
# Runner


def _layers(cache: Cache, layers: Sequence[int] | None) -> list[int]:
    return cache_layers(cache, layers)


def _config(cache: Cache, layers, min_contexts, max_contexts, subword, lowercase, n_pairs, n_resamples,
            seed) -> dict:
    return {"cache": cache_identity(cache), "layers": layers, "min_contexts": min_contexts,
            "max_contexts": max_contexts, "subword": subword, "lowercase": lowercase, "n_pairs": n_pairs,
            "n_resamples": n_resamples, "seed": seed,
            "metrics": list(METRICS)}  # a table without the centred MEV is recomputed, not reused


def contextuality_path(cache: Cache, out: str | Path, *, layers: Sequence[int] | None = None,
                       min_contexts: int = 5, max_contexts: int = 50, subword: str = "first",
                       lowercase: bool = True, n_pairs: int = 10000, n_resamples: int = 1000,
                       seed: int = 0) -> Path:
    """Where :func:`run_contextuality` with these options writes its table."""
    return result_path(out, "contextuality", _config(cache, _layers(cache, layers), min_contexts, max_contexts,
                                                      subword, lowercase, n_pairs, n_resamples, seed))


def _check_options(min_contexts, max_contexts, subword, n_pairs, n_resamples) -> None:
    if subword not in POOL_MODES:
        raise ValueError(f"subword must be one of {POOL_MODES}, got {subword!r}")
    if int(min_contexts) != min_contexts or min_contexts < 2:
        raise ValueError(f"min_contexts must be an integer >= 2 (pairs of contexts), got {min_contexts!r}")
    if int(max_contexts) != max_contexts or max_contexts < min_contexts:
        raise ValueError(f"max_contexts must be an integer >= min_contexts ({min_contexts}), got {max_contexts!r}")
    if int(n_pairs) != n_pairs or n_pairs < 1:
        raise ValueError(f"n_pairs must be a positive integer, got {n_pairs!r}")
    check_resamples(n_resamples)


def run_contextuality(cache: Cache, *, layers: Sequence[int] | None = None, min_contexts: int = 5,
                      max_contexts: int = 50, subword: str = "first", lowercase: bool = True,
                      n_pairs: int = 10000, n_resamples: int = 1000, seed: int = 0,
                      out: str | Path | None = None, force: bool = False, progress: bool = False) -> pd.DataFrame:
    """Anisotropy baseline, self-similarity, intra-sentence similarity and MEV of the cache's words,
    raw and adjusted for anisotropy, per layer (module docstring: definitions).

    Returns the tidy table of :func:`analyses.results.make_table`: analysis="contextuality",
    role="word", metric one of :data:`METRICS`, value with its 95% CI, and ``n`` = word types
    (self-similarity, MEV), sentences (intra-similarity) or random pairs (baseline); extra columns
    ``n_examples``, ``subword``, ``lowercase``, ``min_contexts``, ``max_contexts``. With ``out``,
    writes it there (:func:`contextuality_path`) and reuses it unless ``force``.

    Raises ``ValueError`` for a cache without word tokens, no word type in ``min_contexts``
    examples, fewer than 2 examples, or bad options.
    """
    _check_options(min_contexts, max_contexts, subword, n_pairs, n_resamples)
    n_resamples = int(n_resamples)
    layers = _layers(cache, layers)
    path, done = stored_table(out, "contextuality", _config(cache, layers, min_contexts, max_contexts, subword,
                                                            lowercase, n_pairs, n_resamples, seed), force)
    if done is not None:
        return done

    tokens = cache.tokens
    try:
        words, word_of_row = word_table(tokens, lowercase=lowercase)
    except ValueError as err:
        raise ValueError(f"{cache.path.name}: {err}") from None
    w_ex = words["example"].to_numpy()
    if np.unique(w_ex).size < 2:
        raise ValueError(f"{cache.path.name}: the words come from {np.unique(w_ex).size} example(s); "
                         "the measures need at least 2")
    sel, sel_type, names, available = choose_contexts(words["type"].to_numpy(dtype=object), w_ex, min_contexts,
                                                      max_contexts, seed)
    if names.size == 0:
        n_ctx = pd.DataFrame({"t": words["type"], "e": w_ex}).drop_duplicates().groupby("t").size()
        top = n_ctx.sort_values(ascending=False).head(3)
        raise ValueError(f"{cache.path.name}: no word type occurs in {min_contexts} or more examples "
                         f"(most: {', '.join(f'{t!r} in {k}' for t, k in top.items())}); use a larger corpus "
                         f"or a smaller min_contexts")
    n_types = names.size
    sizes = np.bincount(sel_type, minlength=n_types)
    rnd, rnd_set = random_word_sets(sizes, w_ex, seed)
    sent = words.groupby(["example", "sentence"], sort=False).ngroup().to_numpy()
    sent_size = np.bincount(sent)
    sent_keep = sent_size >= 2
    sent_ex = np.zeros(sent_size.size, dtype=w_ex.dtype)
    sent_ex[sent] = w_ex
    if not sent_keep.any():
        raise ValueError(f"{cache.path.name}: no sentence has 2 or more words: intra-sentence similarity is undefined")
    word_rows = np.flatnonzero(tokens["role"].to_numpy() == "word")
    word_sub = tokens["subword"].to_numpy()[word_rows]
    first_rows = words["first_row"].to_numpy()

    base = {"analysis": "contextuality", "model": model_label(cache), "corpus": cache.manifest["corpus"]["name"],
            "format": cache.format_name, "format_b": "", "role": "word", "target": "", "seed": seed}
    kw = dict(n_resamples=n_resamples, seed=seed)
    type_groups = np.arange(n_types)
    n_ex_types = int(np.unique(w_ex[sel]).size)
    n_ex_sent = int(np.unique(sent_ex[sent_keep]).size)
    records = []

    def row(layer, metric, point, lo, hi, n, n_examples):
        records.append({**base, "layer": layer, "metric": metric, "value": float(point), "ci_low": float(lo),
                        "ci_high": float(hi), "n": int(n), "n_examples": int(n_examples), "n_resamples": n_resamples})

    for layer in tqdm(layers, desc=f"contextuality {cache.format_name}", disable=not progress, file=sys.stderr):
        if subword == "first":
            X = cache.states(layer, first_rows)
        else:
            X, _ = subword_pool(cache.states(layer, word_rows), word_of_row, word_sub, "mean")
        b, b_lo, b_hi = anisotropy_baseline_ci(X, w_ex, n_pairs=n_pairs, seed=seed, n_resamples=n_resamples)
        ss = self_similarity(X[sel], sel_type)
        mev = max_explainable_variance(X[sel], sel_type)
        mev_rand = max_explainable_variance(X[rnd], rnd_set)
        ci = bootstrap_cis({"ss": ss, "mev": mev, "mev_adj": mev - mev_rand}, type_groups, ("mean",), **kw)
        intra = intra_similarity(X, sent)[sent_keep]
        i_pt, i_lo, i_hi = bootstrap_ci(intra, sent_ex[sent_keep], "mean", **kw)
        n_sent = int(sent_keep.sum())
        row(layer, "anisotropy_baseline", b, b_lo, b_hi, n_pairs, np.unique(w_ex).size)
        row(layer, "self_similarity", *ci["ss", "mean"], n_types, n_ex_types)
        row(layer, "self_similarity_adjusted", *(v - b for v in ci["ss", "mean"]), n_types, n_ex_types)
        row(layer, "intra_similarity", i_pt, i_lo, i_hi, n_sent, n_ex_sent)
        row(layer, "intra_similarity_adjusted", i_pt - b, i_lo - b, i_hi - b, n_sent, n_ex_sent)
        row(layer, "mev", *ci["mev", "mean"], n_types, n_ex_types)
        row(layer, "mev_adjusted", *ci["mev_adj", "mean"], n_types, n_ex_types)
        mev_c = max_explainable_variance(X[sel], sel_type, centred=True)
        mev_c_adj = mev_c - max_explainable_variance(X[rnd], rnd_set, centred=True)
        keep = np.isfinite(mev_c_adj)
        if keep.any():
            ci_c = bootstrap_cis({"c": mev_c[keep], "c_adj": mev_c_adj[keep]}, np.arange(int(keep.sum())),
                                 ("mean",), **kw)
            n_c = int(keep.sum())
            n_ex_c = int(np.unique(w_ex[sel][np.isin(sel_type, np.flatnonzero(keep))]).size)
            row(layer, "mev_centred", *ci_c["c", "mean"], n_c, n_ex_c)
            row(layer, "mev_centred_adjusted", *ci_c["c_adj", "mean"], n_c, n_ex_c)
    df = make_table(records)
    df["subword"] = subword
    df["lowercase"] = bool(lowercase)
    df["min_contexts"] = int(min_contexts)
    df["max_contexts"] = int(max_contexts)
    return keep_table(df, path)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Layer x metric table of the values, metrics in :data:`METRICS` order, for printing."""
    t = df.pivot_table(index="layer", columns="metric", values="value", sort=False)
    return t[[m for m in METRICS if m in t.columns]]


HELP = """\
How contextual are a cache's word representations? The measures of Ethayarajh 2019 ("How Contextual
are Contextualized Word Representations?", EMNLP), per layer, over the cache's word tokens:

  anisotropy_baseline  mean cosine of random pairs of word tokens from different examples: what any
                       two words score at this layer (high = anisotropic, all vectors in a narrow cone).
  self_similarity      per word type seen in >= --min-contexts examples (one occurrence per example,
                       at most --max-contexts sampled): mean cosine between its occurrences over all
                       pairs; averaged over types. 1 = the same vector in every context.
  intra_similarity     per sentence (>= 2 words): mean cosine between each word and the sentence's
                       mean word vector; averaged over sentences.
  mev                  maximum explainable variance per type: sigma_1^2 / sum sigma_i^2 of its
                       (occurrences x hidden) matrix, the share one static vector can explain;
                       averaged over types.
  mev_centred          the same with each type's occurrences centred on their mean (the first principal
                       component's explained-variance ratio, as the paper's released code computes it).
  *_adjusted           self/intra similarity minus the anisotropy baseline; for MEV, minus the MEV of
                       as many random word tokens from different examples (per type, then averaged).

A word is the subword tokens of one (example, sentence, word index); its type is its surface text
(lower-cased unless --cased). 95% bootstrap CIs: over word types (self-similarity, MEV), over examples
(intra-similarity). Writes a tidy table (CSV + Parquet) to --out and prints the values per layer.
"""


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m analyses.contextuality", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cache", help="cache directory holding word tokens (extracted with --roles word or cls,sep,word)")
    add_layers_option(p)
    p.add_argument("--min-contexts", type=int, default=5,
                   help="a word type counts if it occurs in at least this many examples (default 5, as the paper)")
    p.add_argument("--max-contexts", type=int, default=50,
                   help="at most this many occurrences per type, sampled with --seed (default 50)")
    p.add_argument("--subword", default="first", choices=POOL_MODES,
                   help="a word's vector: its first subword, or the mean over its subwords (default first)")
    p.add_argument("--cased", action="store_true", help="do not lower-case word types ('The' and 'the' differ)")
    p.add_argument("--pairs", type=int, default=10000, help="random pairs for the anisotropy baseline (default 10000)")
    add_output_options(p, resamples=True)
    args = p.parse_args(argv)
    try:
        cache = Cache.open(args.cache)
        layers = args.layers
        opts = dict(layers=layers, min_contexts=args.min_contexts, max_contexts=args.max_contexts,
                    subword=args.subword, lowercase=not args.cased, n_pairs=args.pairs,
                    n_resamples=args.resamples, seed=args.seed)
        df = run_contextuality(cache, **opts, out=args.out, force=args.force, progress=not args.no_progress)
        path = contextuality_path(cache, args.out, **opts)
    except CLI_ERRORS as err:
        return cli_error(err)
    n = df.drop_duplicates("metric").set_index("metric")["n"]
    print(f"{model_label(cache)}, {cache.manifest['corpus']['name']}, format {cache.format_name}: "
          f"{n['self_similarity']} word types in >= {args.min_contexts} examples, "
          f"{n['intra_similarity']} sentences, {n['anisotropy_baseline']} random pairs")
    with pd.option_context("display.width", 160, "display.precision", 3):
        print(summary_table(df).to_string())
    print(f"table: {path}")
    return 0
