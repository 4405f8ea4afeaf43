"""Nearest-neighbour label agreement of pooled sentence vectors under cosine similarity.

A training-free test of an embedding's geometry, in the spirit of Reimers & Gurevych (2019), who
showed that cosine similarity between raw BERT sentence vectors ranks sentence pairs poorly ([CLS]
worse than mean pooling) even though a trained linear classifier reads both about equally well. No
gold similarity scores are shipped offline, so this module uses labels instead: for each example,
take its ``k`` nearest neighbours by cosine among the examples of *other* documents (``group``
label: same-document neighbours would share words and make the task trivial) and score whether
their majority label equals its own. The chance level is what a random neighbour gives,
``sum_c p_c * (n_c - 1) / (n - 1)`` for ``k = 1`` (computed from the label counts; reported as
``chance_knn_accuracy``). Choices are compared on the same examples: ``versus`` names the reference
choice, and each other choice gets a ``knn_accuracy_diff`` row (its per-example hit minus the
reference's, cluster bootstrap over documents, sign-flip p-value, Holm over layers).

    python -m analyses.neighbours CACHE --choices cls,mean,max --targets topic --versus cls --out results
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, cache_identity, cli_error,
                              keep_table, make_table, model_label, split_list, stored_table, table_lines)
from analyses.stats import add_holm, bootstrap_ci, cache_groups, check_resamples, paired_difference
from analyses.selection import parse_choice, pooled
from probing.cache import Cache
from probing.cli import ArgumentParser
from probing.layers import cache_layers

#: Rows scored per block of the similarity matrix (memory: block x n floats).
_BLOCK = 2048


def knn_predict(X: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None, k: int = 1) -> np.ndarray:
    """For each row of ``X`` the majority label among its ``k`` most cosine-similar rows, excluding
    itself and every row of the same ``groups`` value (ties: the label of the nearest among the tied).

    >>> X = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> knn_predict(X, np.array([0, 0, 1, 1])).tolist()
    [0, 0, 1, 1]
    """
    X = np.asarray(X, dtype=np.float64)
    labels = np.asarray(labels)
    n = len(X)
    if n < 2:
        raise ValueError("nearest neighbours need at least 2 examples")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    Xn = X / np.where(norms > 0, norms, 1.0)
    g = np.arange(n) if groups is None else pd.factorize(np.asarray(groups))[0]
    out = np.empty(n, dtype=labels.dtype)
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        S = Xn[start:stop] @ Xn.T
        S[g[start:stop, None] == g[None, :]] = -np.inf  # itself and its own document
        S[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        kk = min(k, n - 1)
        nearest = np.argpartition(-S, kk - 1, axis=1)[:, :kk]
        order = np.argsort(-np.take_along_axis(S, nearest, axis=1), axis=1, kind="stable")
        nearest = np.take_along_axis(nearest, order, axis=1)
        if kk == 1:  # the usual case: no vote to count
            if not np.isfinite(S[np.arange(stop - start), nearest[:, 0]]).all():
                raise ValueError("an example has no neighbour outside its own group")
            out[start:stop] = labels[nearest[:, 0]]
            continue
        for i, row in enumerate(nearest):
            row = row[np.isfinite(S[i, row])]
            if row.size == 0:
                raise ValueError("an example has no neighbour outside its own group")
            vals, first, counts = np.unique(labels[row], return_index=True, return_counts=True)
            best = np.flatnonzero(counts == counts.max())
            out[start + i] = vals[best[np.argmin(first[best])]]
    return out


def chance_agreement(labels: np.ndarray) -> float:
    """Probability that a uniformly random *other* example has the same label (``k = 1`` chance)."""
    _, counts = np.unique(np.asarray(labels), return_counts=True)
    n = counts.sum()
    return float((counts * (counts - 1)).sum() / (n * (n - 1)))


def run_knn(cache: Cache, choices: Sequence[str] = ("cls", "mean"), label: str = "topic", *,
            group: str | None = "doc", k: int = 1, layers: Sequence[int] | None = None, versus: str | None = None,
            n_resamples: int = 1000, seed: int = 0, out: str | Path | None = None, force: bool = False,
            progress: bool = False) -> pd.DataFrame:
    """Tidy table (``analysis="knn"``, metric ``knn_accuracy`` with a 95% cluster-bootstrap CI, and
    ``chance_knn_accuracy``) per layer and token choice. ``group``: a label whose equal values
    are never neighbours (``None``: only the example itself is excluded). The CI resamples documents
    when the corpus has a ``doc`` label, else examples (columns ``grouping``, ``n_groups``:
    :func:`analyses.stats.cache_groups`).

    ``versus``: one of ``choices``; each other choice is then compared with it on the examples both
    have (``analysis="knn_comparison"``, ``metric="knn_accuracy_diff"``, ``choice`` − ``choice_b``:
    :func:`analyses.stats.paired_difference` of the per-example hits, clustered as above; ``p_holm``
    over the layers of each choice)."""
    n_resamples = check_resamples(n_resamples)
    for c in choices:
        parse_choice(c)
    if versus is not None and versus not in choices:
        raise ValueError(f"versus={versus!r} is not one of the choices {list(choices)}")
    for name in (label, group):  # before any progress bar: a missing label is the first line printed
        if name is not None:
            cache.labels(name)
    layers = cache_layers(cache, layers)
    config = {"cache": cache_identity(cache), "choices": list(choices), "label": label, "group": group, "k": k,
              "layers": layers, "n_resamples": n_resamples, "seed": seed, "clusters": "doc label, else example"}
    if versus is not None:
        config["versus"] = versus
    path, done = stored_table(out, "knn", config, force)
    if done is not None:
        return done
    base = {"analysis": "knn", "model": model_label(cache), "corpus": cache.manifest["corpus"]["name"],
            "format": cache.format_name, "target": label, "seed": seed}
    rows = []
    hits: dict[tuple[str, int], pd.Series] = {}  # per-example hits, for the paired comparisons
    cells = [(choice, layer) for choice in choices for layer in layers]
    for choice, layer in tqdm(cells, desc=f"neighbours {label}", disable=not progress, file=sys.stderr, delay=1):
        ex, X = pooled(cache, layer, choice)
        y = cache.labels(label, ex)
        groups = cache.labels(group, ex) if group is not None else None
        hit = (knn_predict(X, y, groups, k) == y).astype(np.float64)
        if versus is not None:
            hits[choice, layer] = pd.Series(hit, index=ex)
        clusters, grouping = cache_groups(cache, ex)
        info = {"grouping": grouping, "n_groups": int(np.unique(clusters).size)}
        point, lo, hi = bootstrap_ci(hit, clusters, "mean", n_resamples=n_resamples, seed=seed)
        rows.append({**base, "layer": layer, "choice": choice, "metric": "knn_accuracy", "value": point,
                     "ci_low": lo, "ci_high": hi, "n": len(ex), **info, "n_resamples": n_resamples})
        rows.append({**base, "layer": layer, "choice": choice, "metric": "chance_knn_accuracy",
                     "value": chance_agreement(y), "ci_low": np.nan, "ci_high": np.nan, "n": len(ex), **info})
    diffs = []
    for choice in (c for c in choices if versus is not None and c != versus):
        for layer in layers:
            a, b = hits[choice, layer], hits[versus, layer]
            ex = a.index.intersection(b.index)
            clusters, grouping = cache_groups(cache, ex.to_numpy())
            r = paired_difference(a[ex].to_numpy(), b[ex].to_numpy(), clusters, n_resamples=n_resamples, seed=seed)
            diffs.append({**base, "analysis": "knn_comparison", "layer": layer, "choice": choice, "choice_b": versus,
                          "metric": "knn_accuracy_diff", **r, "grouping": grouping})
    df = make_table(rows)
    if diffs:
        df = pd.concat([df, add_holm(make_table(diffs), ["choice", "choice_b", "metric"])], ignore_index=True)
    return keep_table(df, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m analyses.neighbours",
        description="Training-free label agreement of nearest neighbours (cosine) of pooled sentence vectors, "
                    "per layer and token choice, with a 95% cluster-bootstrap CI over documents (examples without "
                    "a doc label) and the chance level. "
                    "Neighbours from the same document (--group) are excluded.",
    )
    p.add_argument("cache", help="cache directory (python -m probing.extract)")
    p.add_argument("--choices", default="cls,mean", help="comma list of token choices (default cls,mean)")
    p.add_argument("--targets", default="topic", help="comma list of example labels to agree on (default topic)")
    add_layers_option(p)
    p.add_argument("--group", default="doc", help="label whose equal values are never neighbours (default doc; "
                                                  "'none' excludes only the example itself)")
    p.add_argument("-k", type=int, default=1, help="neighbours voting (default 1)")
    p.add_argument("--versus", default=None,
                   help="a choice the others are compared with on the same examples (paired, e.g. cls)")
    add_output_options(p, resamples=True)
    args = p.parse_args(argv)
    try:
        cache = Cache.open(args.cache)
        tables = [run_knn(cache, split_list(args.choices), target, group=None if args.group == "none" else args.group,
                          k=args.k, layers=args.layers, versus=args.versus, n_resamples=args.resamples,
                          seed=args.seed, out=args.out, force=args.force, progress=not args.no_progress)
                  for target in split_list(args.targets)]
    except CLI_ERRORS as err:
        return cli_error(err)
    for df in tables:
        acc = df[df["metric"] == "knn_accuracy"]
        print(f"{df['target'].iloc[0]}:")
        with pd.option_context("display.width", 160, "display.precision", 3):
            print(acc.pivot_table(index="layer", columns="choice", values="value", sort=False).to_string())
        print(f"chance: {df.loc[df['metric'] == 'chance_knn_accuracy', 'value'].iloc[0]:.3f}")
        diff = df[df["metric"] == "knn_accuracy_diff"]
        if not diff.empty:
            with pd.option_context("display.width", 160, "display.precision", 4):
                cols = ["layer", "choice", "choice_b", "value", "ci_low", "ci_high", "p_holm"]
                print(diff[cols].to_string(index=False))
    print(table_lines(*tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
