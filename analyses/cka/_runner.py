"""CKA runners: read caches, call the metric functions of :mod:`analyses.cka`, write tidy tables.

Three shapes of comparison (``python -m analyses.cka --help``, or ``probing cka``):

* ``formats``: per layer, the same token choice under two formats (e.g. ``[CLS]`` in ``pair`` vs in
  ``concat``), one vector per example; or a word group (``s1 words``) token by token, aligned by key.
* ``matrix``: layer x layer CKA of one token choice, within one cache or across two (extra column
  ``layer_b``).
* ``roles``: within one cache, per layer, two token choices (``sep1`` vs ``cls``, ``sep1`` vs
  ``mean_s1``).

Every CKA is computed in float64; a representation with no variance (``[CLS]`` at the embedding
layer, identical for every example) gives NaN with a warning, recorded in the ``note`` column.

Two caches are combined only if :func:`probing.cache.check_comparable` allows it: the same corpus
(examples are paired by index and key), another model allowed. Every table names both sides:
``model``/``model_b`` and ``format``/``format_b``. Fewer than :data:`analyses.cka.MIN_ITEMS` (4)
paired items is refused.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.cka._metrics import MIN_ITEMS, linear_cka, rbf_cka
from analyses.cka._streaming import StreamingCKAMatrix, StreamingLinearCKA
from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, cache_identity, cli_error, keep_table,
                              make_table, model_label, one_value, split_list, stored_table, table_lines)
from analyses.selection import (POOL_CHUNK_ROWS, ItemRows, is_role, item_chunks, item_rows, parse_choice, pool,
                                pool_chunked, pooled)
from probing.cache import Cache, align, check_comparable
from probing.cli import ArgumentParser
from probing.heap import hand_back_freed
from probing.layers import cache_layers, shared_layers

#: CKA variants, declared once: name -> function of (X, Y).
METRICS = {
    "linear_cka": lambda X, Y: linear_cka(X, Y),
    "linear_cka_debiased": lambda X, Y: linear_cka(X, Y, debiased=True),
    "rbf_cka": lambda X, Y: rbf_cka(X, Y, sigma=0.5),
}
DEFAULT_METRICS = ("linear_cka", "linear_cka_debiased")
#: Above this many items the RBF Gram matrices (n x n float64) get too large: it is skipped.
RBF_MAX_ITEMS = 5000


def _measure(X: np.ndarray, Y: np.ndarray, metrics: Sequence[str]) -> list[tuple[str, float, str]]:
    out = []
    for m in metrics:
        if m == "rbf_cka" and len(X) > RBF_MAX_ITEMS:
            out.append((m, float("nan"), f"skipped: n={len(X)} > {RBF_MAX_ITEMS} for the n x n RBF Gram"))
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = METRICS[m](X, Y)
        note = "; ".join(str(w.message) for w in caught) if np.isnan(value) else ""
        out.append((m, float(value), note))
    return out


#: The linear CKA variants, accumulated over chunks of items: name -> debiased.
_LINEAR = {"linear_cka": False, "linear_cka_debiased": True}
_STREAMED_PREFIX = re.compile(r"^layer 0 of ")  # the accumulator names the layer; the whole-array CKA does not


def _measure_items(a: Cache, b: Cache, items_a: ItemRows, items_b: ItemRows, layer: int,
                   metrics: Sequence[str]) -> list[tuple[str, float, str]]:
    """:func:`_measure` of the paired items at ``layer``. The linear variants are accumulated over chunks of items
    (:class:`analyses.cka.StreamingLinearCKA`; equal to :func:`analyses.cka.linear_cka` on the whole
    arrays to rounding, and the same note where undefined), so memory does not grow with the items; the RBF
    variant needs the n x n Gram matrices and reads the whole arrays (up to :data:`RBF_MAX_ITEMS` items)."""
    linear = [m for m in metrics if m in _LINEAR]
    found: dict[str, tuple[float, str]] = {}
    if linear:
        acc = StreamingLinearCKA(debiased=any(_LINEAR[m] for m in linear))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each result's own warnings are recorded below
            for part in item_chunks(POOL_CHUNK_ROWS, items_a, items_b):
                acc.update(pool(a, layer, items_a.take(part)), pool(b, layer, items_b.take(part)))
        for m in linear:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = acc.result(debiased=_LINEAR[m])
            first = [_STREAMED_PREFIX.sub("", str(w.message)) for w in caught][:1]  # the whole-array CKA stops at one
            found[m] = (float(value), "; ".join(first) if np.isnan(value) else "")
    rest = [m for m in metrics if m not in _LINEAR]
    if rest:
        X = pool_chunked(a, layer, items_a) if len(items_a) <= RBF_MAX_ITEMS else np.zeros((len(items_a), 0))
        Y = pool_chunked(b, layer, items_b) if len(items_b) <= RBF_MAX_ITEMS else np.zeros((len(items_b), 0))
        found.update({m: (v, note) for m, v, note in _measure(X, Y, rest)})
    return [(m, *found[m]) for m in metrics]


#: The stored role a token choice reads (``pos<k>`` reads whatever is at position k: no one role).
_ROLE_OF = {"cls": "cls", "sep<i>": "sep", "sep<i>_<j>": "sep", "sep_last": "sep", "mean": "word", "max": "word",
            "first_word": "word", "mean_s<i>": "word"}


def roles_needed(choices: Sequence[str]) -> list[str]:
    """The roles both caches must store for ``choices`` (token choices or ``s<i> words``)."""
    kinds = ["word" if c.endswith(" words") else _ROLE_OF.get(parse_choice(c)[0]) for c in choices]
    return sorted({k for k in kinds if k is not None})


def _enough(n: int, a: Cache, b: Cache, what: str) -> None:
    """Refuse a comparison on fewer items than CKA needs (:data:`analyses.cka.MIN_ITEMS`)."""
    if n < MIN_ITEMS:
        where = a.path.name if a is b else f"both {a.path.name} and {b.path.name}"
        raise ValueError(f"{what}: only {n} items in {where}; CKA needs at least {MIN_ITEMS} "
                         f"(with 2 it is 1 whatever the representations)")


def _paired_items(a: Cache, b: Cache, choice: str) -> tuple[ItemRows, ItemRows]:
    """The items of ``choice`` present in both caches, in the same order: one per example for token choices,
    one per aligned token for word groups ``s<i> words``."""
    if choice.endswith(" words"):
        s = int(choice.split()[0][1:])
        tok = a.tokens
        rows = np.flatnonzero(is_role(tok, "word") & (tok["sentence"].to_numpy() == s))
        ra, rb = align(a, b, rows_a=rows)
        _enough(len(ra), a, b, repr(choice))
        ex, one = tok["example"].to_numpy()[ra], np.arange(len(ra) + 1)
        return ItemRows(ex, ra, one), ItemRows(ex, rb, one)
    ia, ib = item_rows(a, choice), item_rows(b, choice)
    common, pa, pb = np.intersect1d(ia.examples, ib.examples, return_indices=True)
    _enough(len(common), a, b, repr(choice))
    return ia.take(pa), ib.take(pb)


def _paired(a: Cache, b: Cache, choice: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Paired (n, d) arrays of ``choice`` in both caches at ``layer`` (:func:`_paired_items`)."""
    items_a, items_b = _paired_items(a, b, choice)
    return pool_chunked(a, layer, items_a), pool_chunked(b, layer, items_b)


def _base(a: Cache, b: Cache, seed: int = 0) -> dict:
    """The columns naming what is compared: both models (``model``, ``model_b``) and both formats."""
    return {"analysis": "cka", "model": model_label(a), "model_b": model_label(b),
            "corpus": a.manifest["corpus"]["name"], "format": a.format_name, "format_b": b.format_name,
            "seed": seed}


def run_cka_formats(a: Cache, b: Cache, choices: Sequence[str] = ("cls", "mean"), *,
                    layers: Sequence[int] | str | None = None, metrics: Sequence[str] = DEFAULT_METRICS,
                    out: str | Path | None = None, force: bool = False, progress: bool = False) -> pd.DataFrame:
    """Per layer, CKA of each token choice between format A and format B (``choice`` = ``choice_b``).
    ``layers``: a layer spec (:mod:`probing.layers`; -1 = last) among the layers both caches store."""
    # another model is allowed (model_b names it); not another corpus
    check_comparable(a, b, same_model=False, roles=roles_needed(choices))
    layers = shared_layers(layers, a, b)
    config = {"kind": "formats", "a": cache_identity(a), "b": cache_identity(b), "choices": list(choices),
              "layers": layers, "metrics": list(metrics)}
    path, done = stored_table(out, "cka", config, force)
    if done is not None:
        return done
    rows = []
    cells = [(choice, layer) for choice in choices for layer in layers]
    paired = None
    for choice, layer in tqdm(cells, desc=f"CKA {a.format_name} vs {b.format_name}", disable=not progress, delay=1,
                              file=sys.stderr):
        if paired != choice:  # cells go choice by choice: the same items at every layer
            paired, (items_a, items_b) = choice, _paired_items(a, b, choice)
            hand_back_freed()  # the pairing's per-token scratch, before the chunks are pooled
        for m, v, note in _measure_items(a, b, items_a, items_b, layer, metrics):
            rows.append({**_base(a, b), "layer": layer, "choice": choice, "choice_b": choice, "metric": m,
                         "value": v, "n": len(items_a), "note": note})
    df = make_table(rows)
    return keep_table(df, path)


def run_cka_matrix(a: Cache, b: Cache | None = None, choice: str = "cls", *,
                   debiased: bool = False, out: str | Path | None = None, force: bool = False) -> pd.DataFrame:
    """Layer x layer linear CKA of one token choice, within ``a`` or between ``a`` and ``b``."""
    b = a if b is None else b
    check_comparable(a, b, same_model=False, roles=roles_needed([choice]))
    config = {"kind": "matrix", "a": cache_identity(a), "b": cache_identity(b), "choice": choice, "debiased": debiased}
    path, done = stored_table(out, "cka", config, force)
    if done is not None:
        return done
    items_a, items_b = _paired_items(a, b, choice)
    hand_back_freed()  # the pairing's per-token scratch, before the chunks are pooled
    # accumulated over chunks of items (every layer of a chunk read at once): memory does not grow with the items
    acc = StreamingCKAMatrix(debiased=debiased)
    max_rows = max(1, POOL_CHUNK_ROWS // max(len(a.layers), len(b.layers)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN cells are explained in the note column
        for part in item_chunks(max_rows, items_a, items_b):
            X = pool(a, None, items_a.take(part))
            Y = None if b is a else pool(b, None, items_b.take(part))
            acc.update([X[:, i] for i in range(X.shape[1])],
                       None if Y is None else [Y[:, j] for j in range(Y.shape[1])])
        M = acc.result()
    n = acc.n_items
    metric = "linear_cka_debiased" if debiased else "linear_cka"
    rows = []
    for i, la in enumerate(a.layers):
        for j, lb in enumerate(b.layers):
            v = float(M[i, j])
            rows.append({**_base(a, b), "layer": la, "layer_b": lb, "choice": choice, "choice_b": choice,
                         "metric": metric, "value": v, "n": n,
                         "note": "" if np.isfinite(v) else "undefined: a representation has zero variance"})
    df = make_table(rows)
    return keep_table(df, path)


def run_cka_roles(cache: Cache, pairs: Sequence[tuple[str, str]] = (("sep1", "cls"), ("sep1", "mean_s1"),
                                                                      ("sep1", "mean_s2")), *,
                  layers: Sequence[int] | str | None = None, metrics: Sequence[str] = DEFAULT_METRICS,
                  out: str | Path | None = None, force: bool = False, progress: bool = False) -> pd.DataFrame:
    """Per layer, CKA between two token choices of the same examples in one cache."""
    layers = cache_layers(cache, layers)
    config = {"kind": "roles", "cache": cache_identity(cache), "pairs": [list(p) for p in pairs], "layers": layers,
              "metrics": list(metrics)}
    path, done = stored_table(out, "cka", config, force)
    if done is not None:
        return done
    rows = []
    cells = [(ca, cb, layer) for ca, cb in pairs for layer in layers]
    for ca, cb, layer in tqdm(cells, desc=f"CKA {cache.format_name}", disable=not progress, file=sys.stderr, delay=1):
        ex_a, X = pooled(cache, layer, ca)
        ex_b, Y = pooled(cache, layer, cb)
        common, ia, ib = np.intersect1d(ex_a, ex_b, return_indices=True)
        _enough(len(common), cache, cache, f"{ca!r} vs {cb!r}")
        for m, v, note in _measure(X[ia], Y[ib], metrics):
            rows.append({**_base(cache, cache), "layer": layer, "choice": ca, "choice_b": cb, "metric": m,
                         "value": v, "n": len(common), "note": note})
    df = make_table(rows)
    return keep_table(df, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m analyses.cka",
        description="CKA (Kornblith et al. 2019) between caches: per layer across two formats, layer x layer, "
                    "or between token choices within one cache. Writes a tidy table (CSV + Parquet).",
        epilog="token choices: cls, sep<i>, sep_last, mean, max, first_word, mean_s<i>, pos<k>; for 'formats' also "
               "'s<i> words' (every word token of sentence i, aligned by key)",
    )
    p.add_argument("mode", choices=["formats", "matrix", "roles"],
                   help="formats: A vs B per layer; matrix: layer x layer; roles: two choices in one cache")
    p.add_argument("cache_a", help="cache directory")
    p.add_argument("cache_b", nargs="?", default=None, help="second cache (formats; optional for matrix)")
    p.add_argument("--choices", default=None,
                   help="token choices: comma list for 'formats' (default cls,mean); the one choice for 'matrix' "
                        "(default cls)")
    p.add_argument("--pairs", default="sep1:cls,sep1:mean_s1,sep1:mean_s2",
                   help="choice pairs for 'roles' (default sep1:cls,sep1:mean_s1,sep1:mean_s2)")
    p.add_argument("--metrics", default=None,
                   help=f"comma list of {', '.join(METRICS)} (default {','.join(DEFAULT_METRICS)}; rbf_cka is "
                        f"skipped above {RBF_MAX_ITEMS} items); 'matrix': linear_cka (default) or linear_cka_debiased")
    add_layers_option(p, "every layer stored in both; 'matrix' uses every stored layer")
    add_output_options(p, seed=False)
    args = p.parse_args(argv)
    matrix_metrics = ("linear_cka", "linear_cka_debiased")
    metrics = split_list(args.metrics) or (list(matrix_metrics[:1]) if args.mode == "matrix" else list(DEFAULT_METRICS))
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        p.error(f"--metrics: unknown metric(s) {bad}; choose from {list(METRICS)}")
    if args.mode == "matrix" and (len(metrics) != 1 or metrics[0] not in matrix_metrics):
        p.error(f"--metrics {args.metrics!r}: 'matrix' takes exactly one of {list(matrix_metrics)}")
    if args.mode == "matrix" and args.layers is not None:
        p.error("--layers: 'matrix' uses every stored layer of both caches")
    progress = not args.no_progress
    try:
        a = Cache.open(args.cache_a)
        b = Cache.open(args.cache_b) if args.cache_b else None
        if args.mode == "formats":
            if b is None:
                p.error("mode 'formats' needs two caches")
            df = run_cka_formats(a, b, split_list(args.choices or "cls,mean"), layers=args.layers, metrics=metrics,
                                 out=args.out, force=args.force, progress=progress)
            show = df.pivot_table(index="layer", columns=["choice", "metric"], values="value", sort=False)
        elif args.mode == "matrix":
            df = run_cka_matrix(a, b, one_value(args.choices or "cls", "--choices"),
                                debiased=metrics[0] == "linear_cka_debiased", out=args.out, force=args.force)
            show = df.pivot_table(index="layer", columns="layer_b", values="value", sort=False, dropna=False)
        else:
            pairs = [tuple(c.strip() for c in x.split(":")) for x in split_list(args.pairs)]
            bad = [":".join(x) for x in pairs if len(x) != 2 or not all(x)]
            if bad or not pairs:
                raise ValueError(f"--pairs {args.pairs!r}: give comma-separated CHOICE:CHOICE pairs such as "
                                 f"sep1:cls,sep1:mean_s1" + (f" (not {bad[0]!r})" if bad else ""))
            df = run_cka_roles(a, pairs, layers=args.layers, metrics=metrics, out=args.out, force=args.force,
                               progress=progress)
            show = df.pivot_table(index="layer", columns=["choice", "choice_b", "metric"], values="value", sort=False)
    except CLI_ERRORS as err:
        return cli_error(err)
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(show.to_string())
    print(table_lines(df))
    return 0
