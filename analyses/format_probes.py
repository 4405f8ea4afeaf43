"""One probe, the same items, several formats: is a label better decoded from a token choice in one format?

Q2 asks whether sentence 1 takes in more of sentence 2 without the middle [SEP]. Beside the interchange
test (:mod:`analyses.representation_change`), a decoder asks it of content: the bag of content words of
sentence 2 (``bow_s2``), read from sentence 1's mean-pooled words (``mean_s1``) in ``pair`` and in ``concat``.
Sentence 1 shares its document's vocabulary with sentence 2, so some of sentence 2's words are decodable
from sentence 1 alone; that part is the same in both formats and cancels in the paired difference.

Every format's probe is fitted on the same examples with the same targets, document groups, folds and seed
(:func:`analyses.probes.probe_many_results`), so their out-of-fold predictions are paired item by item:

* a multi-label target is compared by macro AUC on the same document resamples of the same items
  (:meth:`analyses.probes.ProbeResult.auc_difference`: ``macro_auc_diff`` rows, ``format_b`` − ``format``);
* a single-label target by accuracy, paired per item (:func:`analyses.stats.paired_difference` of the items'
  correctness: ``accuracy_diff`` rows).

:func:`run_format_probes` writes a ``probe`` table (docs/TABLES.md): each format's probe rows
(:func:`analyses.probes.probe_rows`) and the difference rows of every other format against the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.probes import batch_elements, example_target, probe_many_results, probe_rows
from analyses.results import cache_identity, keep_table, make_table, model_label, stored_table
from analyses.selection import parse_choice, pooled
from analyses.stats import add_holm, check_resamples, paired_difference, table_groups
from probing.cache import Cache, check_comparable
from probing.layers import cache_layers


def format_differences(results: Mapping[tuple[str, int], object], formats: Sequence[str], layers: Sequence[int],
                       multilabel: bool, n_resamples: int, seed: int) -> list[dict]:
    """Each format's probe (after the first) minus the first format's, per layer, on the same items:
    ``{"format": first, "format_b": other, "layer", "metric", **difference}`` with ``value`` = other − first.
    ``results``: ``(format, layer) -> ProbeResult`` fitted on the same items, folds and seed."""
    rows = []
    ref = formats[0]
    for other in formats[1:]:
        for layer in layers:
            a, b = results[ref, layer], results[other, layer]
            if multilabel:
                d = b.auc_difference(a)
                metric = "macro_auc_diff"
            else:
                ia, ib = a.items.sort_values("item"), b.items.sort_values("item")
                if not np.array_equal(ia["item"].to_numpy(), ib["item"].to_numpy()):
                    raise ValueError("the probes of two formats were not scored on the same items")
                d = paired_difference(ib["correct"].to_numpy(float), ia["correct"].to_numpy(float),
                                      ia["group"].to_numpy(), n_resamples=n_resamples, seed=seed)
                metric = "accuracy_diff"
            rows.append({"format": ref, "format_b": other, "layer": layer, "metric": metric, **d})
    return rows


def run_format_probes(caches: Mapping[str, Cache], choice: str, target: str, *,
                      layers: Sequence[int] | str | None = None,
                      n_splits: int = 5, seed: int = 0, vocab: int = 50, Cs: Sequence[float] | None = None,
                      bow_Cs: Sequence[float] | None = None, inner_splits: int = 3, max_iter: int = 1000,
                      device: str | None = None, num_threads: int | None = None, batch_mb: float | None = None,
                      n_resamples: int = 1000, out: str | Path | None = None, force: bool = False) -> pd.DataFrame:
    """Probe ``target`` from ``choice`` in each cache of ``caches`` (format name -> cache of one model and
    corpus), on the same examples, folds and seed, per layer (``layers``: model layers, -1 = the last;
    default: every stored layer); the difference rows compare each format with the first (module docstring;
    ``p_holm`` over the layers of each pair of formats). The probe settings are those of
    :func:`analyses.probes.run_probes` (``bow_Cs`` for a multi-label target). With ``out`` the table is
    stored and reused."""
    n_resamples = check_resamples(n_resamples)
    parse_choice(choice)
    if len(caches) < 2:
        raise ValueError(f"run_format_probes compares formats: give at least two caches, got {list(caches)}")
    names = list(caches)
    first = caches[names[0]]
    for name in names[1:]:
        check_comparable(first, caches[name])
    layers = cache_layers(first, layers)
    config = {"caches": {k: cache_identity(c) for k, c in caches.items()}, "choice": choice, "target": target,
              "layers": layers, "n_splits": n_splits, "seed": seed, "vocab": vocab,
              "Cs": None if Cs is None else list(Cs), "bow_Cs": None if bow_Cs is None else list(bow_Cs),
              "inner_splits": inner_splits, "max_iter": max_iter, "n_resamples": n_resamples}
    path, done = stored_table(out, "format_probes", config, force)
    if done is not None:
        return done
    features, ids = {}, None
    pooled_sets = {}
    for name, cache in caches.items():
        for layer in layers:
            ex, X = pooled(cache, layer, choice)
            pooled_sets[name, layer] = (ex, X)
            ids = ex if ids is None else np.intersect1d(ids, ex)
    for key, (ex, X) in pooled_sets.items():
        features[key] = X if len(ex) == len(ids) and (ex == ids).all() else X[np.searchsorted(ex, ids)]
    y, multilabel = example_target(first, target, ids, vocab)
    groups, grouping = table_groups(first.examples.loc[ids], str(first.path))
    grid = bow_Cs if multilabel and bow_Cs is not None else Cs
    extra = {"Cs": tuple(grid)} if grid is not None else {}
    results = probe_many_results(features, y, groups, n_splits=n_splits, seed=seed, inner_splits=inner_splits,
                                 max_iter=max_iter, device=device, num_threads=num_threads,
                                 max_batch_elements=batch_elements(batch_mb), n_resamples=n_resamples, **extra)
    meta = {"analysis": "probe", "model": model_label(first), "corpus": first.manifest["corpus"]["name"],
            "target": target, "grouping": grouping, "model_kind": "trained"}
    rows = []
    for (name, layer), res in results.items():
        rows += probe_rows(res, **meta, format=caches[name].format_name, layer=layer, choice=choice, seed=seed)
    diffs = format_differences(results, names, layers, multilabel, n_resamples, seed)
    for d in diffs:
        d.update(format=caches[d["format"]].format_name, format_b=caches[d["format_b"]].format_name)
        rows.append({**meta, "choice": choice, "choice_b": choice, "seed": seed, **d})
    df = make_table(rows)
    is_diff = df["metric"].isin(["macro_auc_diff", "accuracy_diff"])
    if is_diff.any():
        df = pd.concat([df[~is_diff], add_holm(df[is_diff], ["format", "format_b", "metric"])], ignore_index=True)
    return keep_table(df, path)
