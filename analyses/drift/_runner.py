"""Cosine drift between two caches (formats A and B of the same model and corpus), per layer and
role group, with cluster-bootstrap CIs over documents (examples when the corpus has no ``doc``
label; :mod:`analyses.stats._grouping`) and the anisotropy baseline.

    python -m analyses.drift caches/MODEL/pair-... caches/MODEL/concat-... --out results

Q1 (drop the middle [SEP]): ``pair`` vs ``concat``. Q2 and the "context effect": ``single`` vs
``pair`` (sentence 1's words alone and inside the pair), ``single2`` vs ``pair`` for sentence 2.
The metric functions live in :mod:`analyses.drift._metrics`; this module only reads, aligns and writes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.drift._metrics import POOL_MODES, drift_summary, subword_pool
from analyses.stats import cache_groups, check_resamples
from analyses.selection import is_role
from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, cache_identity, cli_error,
                              keep_table, make_table, model_label, stored_table, table_lines)
from probing.cache import Cache, align, check_comparable
from probing.cli import ArgumentParser
from probing.heap import hand_back_freed
from probing.layers import shared_layers


def group_labels(tokens: pd.DataFrame) -> np.ndarray:
    """Role group of each token row: ``cls``, ``sep<i>`` (the [SEP] after sentence i), ``s<i> words``."""
    # one label per distinct (role, sentence, index), shared by its rows: no string object per token
    keys = tokens[["role", "sentence", "index"]]
    codes, uniq = pd.MultiIndex.from_frame(keys).factorize() if len(keys) else (np.zeros(0, int), [])
    out = np.empty(len(uniq), dtype=object)
    for i, (r, s, j) in enumerate(uniq):
        if r == "word":
            out[i] = f"s{s} words"
        elif r == "sep":
            out[i] = f"sep{s}" if j == 0 else f"sep{s}.{j}"
        elif r == "cls":
            out[i] = "cls" if s == 0 and j == 0 else f"cls@{s}.{j}"
        else:
            out[i] = r
    return out[codes]


def paired_rows(a: Cache, b: Cache, subword: str, words_only: bool = False):
    """Aligned rows of both caches; for ``subword="first"`` only first subwords of words are kept."""
    tok = a.tokens
    keep = np.ones(len(tok), dtype=bool)
    is_word = is_role(tok, "word")
    if subword == "first":
        keep &= ~is_word | (tok["subword"].to_numpy() == 0)
    if words_only:
        keep &= is_word
    rows_a, rows_b = align(a, b, rows_a=np.flatnonzero(keep))
    if len(rows_a) == 0:
        raise ValueError(f"{a.format_name} and {b.format_name} share no token keys"
                         + (" among words" if words_only else ""))
    return rows_a, rows_b


def run_drift(a: Cache, b: Cache, *, layers: Sequence[int] | None = None, subword: str = "first",
              standardise: bool = False, words_only: bool = False, n_resamples: int = 1000,
              n_pairs: int = 10000, seed: int = 0, out: str | Path | None = None, force: bool = False,
              progress: bool = True) -> pd.DataFrame:
    """Drift of every token key present in both caches, per layer and role group.

    Returns the tidy table of :func:`analyses.drift.drift_summary` rows with analysis="drift",
    format=A, format_b=B, layer, model and corpus filled in, and ``grouping`` (``document`` or
    ``example``: what the bootstrap resampled, :func:`analyses.stats.cache_groups`) beside
    ``n_groups``. With ``out``, writes it there (and reuses
    an earlier identical result unless ``force``).
    """
    n_resamples = check_resamples(n_resamples)
    if subword not in POOL_MODES:
        raise ValueError(f"subword must be one of {POOL_MODES}, got {subword!r}")
    check_comparable(a, b, same_model=True)  # drift compares two formats of one model on one corpus
    layers = shared_layers(layers, a, b)
    config = {"a": cache_identity(a), "b": cache_identity(b), "layers": layers, "subword": subword,
              "standardise": standardise, "words_only": words_only, "n_resamples": n_resamples,
              "n_pairs": n_pairs, "seed": seed, "clusters": "doc label, else example"}
    path, done = stored_table(out, "drift", config, force)
    if done is not None:
        return done
    rows_a, rows_b = paired_rows(a, b, subword, words_only)
    cols = ["example", "role", "sentence", "index", "subword"]
    tok = a.tokens.iloc[rows_a, [a.tokens.columns.get_loc(c) for c in cols]]  # only the columns used
    groups = group_labels(tok)
    examples = tok["example"].to_numpy()
    clusters, grouping = cache_groups(a, examples)
    if subword == "mean":
        is_word = is_role(tok, "word")
        word_key = (pd.MultiIndex.from_frame(tok[["example", "sentence", "index"]]).factorize()[0] if len(tok)
                    else np.zeros(0, int))
        word_key = np.where(is_word, word_key, -1 - np.arange(len(tok)))  # specials: their own "word"
    records = []
    for layer in tqdm(layers, desc=f"drift {a.format_name} vs {b.format_name}", disable=not progress,
                      file=sys.stderr):
        # what the pairing, the labels and the last layer's bootstrap freed, handed back before this layer's
        # float64 blocks, so that they do not come on top of it
        hand_back_freed()
        # lazy: the metrics read both formats' rows in blocks, and only the per-token cosines stay in memory
        A = a.layer_rows(layer, rows_a)
        B = b.layer_rows(layer, rows_b)
        g, ex, cl = groups, examples, clusters
        if subword == "mean":
            sub = tok["subword"].to_numpy()
            A, words = subword_pool(A, word_key, sub, "mean")
            B, _ = subword_pool(B, word_key, sub, "mean")
            first = pd.Series(np.arange(len(word_key))).groupby(word_key).first().reindex(words).to_numpy()
            g, ex, cl = groups[first], examples[first], clusters[first]
        for r in drift_summary(A, B, ex, g, standardise=standardise, n_resamples=n_resamples,
                               n_pairs=n_pairs, seed=seed, clusters=cl):
            r.update(analysis="drift", model=model_label(a), corpus=a.manifest["corpus"]["name"],
                     format=a.format_name, format_b=b.format_name, layer=layer,
                     grouping="example" if r["metric"] == "anisotropy_baseline" else grouping)
            records.append(r)
    df = make_table(records)
    df["standardised"] = standardise
    df["subword"] = subword
    return keep_table(df, path)


def summary_table(df: pd.DataFrame, metric: str = "drift_mean") -> pd.DataFrame:
    """Layer x role group table of one metric, for printing."""
    sub = df[df["metric"] == metric]
    return sub.pivot_table(index="layer", columns="role", values="value", sort=False)


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m analyses.drift",
        description="Cosine drift of the same tokens between two formats' caches, per layer and role "
                    "group, with 95% cluster-bootstrap CIs over documents (examples when the corpus has "
                    "no doc label), the anisotropy baseline "
                    "(mean cosine of random token pairs from different examples) and drift normalised "
                    "by it. Writes a tidy table (CSV + Parquet).",
    )
    p.add_argument("cache_a", help="cache directory of format A (e.g. caches/all-MiniLM-L6-v2/pair-...)")
    p.add_argument("cache_b", help="cache directory of format B, same model and corpus")
    add_layers_option(p, "every layer stored in both")
    p.add_argument("--subword", default="first", choices=POOL_MODES,
                   help="word tokens: first subword only, or mean over subwords (default first)")
    p.add_argument("--standardise", action="store_true",
                   help="z-score each dimension before the cosine (Timkey & van Schijndel 2021)")
    p.add_argument("--context", action="store_true",
                   help="words only: the context effect, e.g. 'single' vs 'pair' caches")
    p.add_argument("--pairs", type=int, default=10000,
                   help="random pairs for each anisotropy baseline: of all tokens, and of each role group, which "
                        "that group's normalised drift is divided by (default 10000)")
    add_output_options(p, resamples=True)
    args = p.parse_args(argv)
    try:
        a, b = Cache.open(args.cache_a), Cache.open(args.cache_b)
        layers = args.layers
        df = run_drift(a, b, layers=layers, subword=args.subword, standardise=args.standardise,
                       words_only=args.context, n_resamples=args.resamples, n_pairs=args.pairs,
                       seed=args.seed, out=args.out, force=args.force,
                       progress=not args.no_progress)
    except CLI_ERRORS as err:
        return cli_error(err)
    with pd.option_context("display.width", 160, "display.precision", 4):
        print(f"1 - cos (mean) between {a.format_name} and {b.format_name}:")
        print(summary_table(df).to_string())
        base = df[(df["metric"] == "anisotropy_baseline") & (df["role"] == "all")].set_index("layer")["value"]
        print("anisotropy baseline (mean cos of random pairs of all tokens):",
              ", ".join(f"L{k}: {v:.3f}" for k, v in base.items()))
    print(table_lines(df))
    return 0
