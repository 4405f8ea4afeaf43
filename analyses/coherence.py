"""What a token's state tells about coherence beyond what the text tells without a model (Q4: "what does the
output at [SEP] capture?").

A probe that tells coherent sentence pairs (``is_next = 1``) from pairs whose second sentence was replaced
(``is_next = 0``) credits the probed state with "coherence" only beyond what needs no model: negatives differ
from positives in how many words the two sentences share and in their lengths, and a sentence encoder
compares two sentences without ever seeing them together. So every representation is scored beside those
baselines, by logistic-regression probes on the **same folds** (one outer split per corpus, grouped by
document, stratified by the label), and compared **paired per item**:

======================  =============================================================================
feature set             what it is
======================  =============================================================================
``overlap``             content-word Jaccard of the two sentences, shared content words, shared words
``lengths``             words in sentence 1, words in sentence 2
``text``                ``overlap`` + ``lengths``: everything here that needs no model
``apart``               cosine of the two sentences encoded apart (mean-pooled words of ``single`` and
                        ``single2`` at the last layer): a sentence encoder's own similarity
``baselines``           ``text`` + ``apart``
``sep1``                the middle [SEP] of ``pair`` at a layer
``lit1``                the ordinary token at the same place (``pair_word``: ``[CLS] {1} ',' <1> {2} [SEP]``,
                        same position and segment as the middle [SEP])
``cls``                 [CLS] of ``pair`` at a layer
======================  =============================================================================

What [SEP] holds **beyond** the baselines is a nested comparison on the same folds (:func:`stacked_increment`):
a logistic regression on the baselines and the [SEP] probe's score (the logit of the [SEP] probe, cross-fitted
inside each training fold, so the score of a training item never comes from a probe that saw it) against the
same regression on the baselines alone. Both sides are one model family and differ by one feature, so an [SEP]
that adds nothing costs nothing; a single probe on [SEP]'s 384 dimensions and the baselines' 6 together would
shrink the baselines with the penalty [SEP] needs, and read worse than the baselines alone even when [SEP] adds
something.

Pure functions of arrays (:func:`content_words`, :func:`text_features`, :func:`row_cosine`,
:func:`probe_items`, :func:`stacked_increment`, :func:`paired_rows`) and one thin runner that reads the four caches
of a corpus (:func:`run_coherence`). Tables (``docs/TABLES.md``): ``coherence_probes`` (accuracy of each feature
set, cluster-bootstrap CI over documents, majority baseline, chosen C and the share of folds that chose an edge
of the C grid) and ``coherence_paired`` (:data:`COMPARISONS`: accuracy differences on the same out-of-fold items,
cluster-bootstrap CI and SE over documents, sign-flip p).
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.probes import STOP_WORDS, edge_share, probe_many_results, words_of
from analyses.results import cache_identity, keep_table, make_table, model_label, stored_table
from analyses.stats import DEFAULT_RESAMPLES, cache_groups, check_resamples, paired_difference

#: The token choices read per layer: the middle [SEP], [CLS] (both of ``pair``), the ordinary token at [SEP]'s place.
TOKENS: tuple[str, ...] = ("sep1", "cls", "lit1")
#: The baselines' feature sets, each a union of the parts of :func:`text_features` and the cosine apart.
BASELINES: dict[str, tuple[str, ...]] = {
    "overlap": ("overlap",), "lengths": ("lengths",), "text": ("overlap", "lengths"), "apart": ("apart",),
    "baselines": ("overlap", "lengths", "apart"),
}
#: The paired comparisons, per layer: name -> (feature set a, feature set b, what the difference a − b asks).
#: ``None`` as a layer marks a feature set that has none (a baseline).
COMPARISONS: dict[str, tuple[str, str, str]] = {
    "sep_vs_text": ("sep1", "text", "the middle [SEP] − the text alone (word overlap and lengths)"),
    "sep_vs_apart": ("sep1", "apart", "the middle [SEP] − the cosine of the sentences encoded apart"),
    "sep_vs_word": ("sep1", "lit1", "the middle [SEP] − an ordinary token (',') at the same position"),
    "sep_vs_cls": ("sep1", "cls", "the middle [SEP] − [CLS]"),
    "sep_beyond_baselines": ("baselines+sep1 (stacked)", "baselines (stacked)",
                             "the baselines with the middle [SEP]'s score − the baselines alone"),
}
#: The C of the stacked regressions of :func:`stacked_increment` (standardised features, at most 8 of them on
#: hundreds of items: a mild penalty that only keeps the fit finite).
STACK_C = 1.0


# ---------------------------------------------------------------------------------------------------
# Pure functions


def content_words(text: str) -> set[str]:
    """The content words of ``text``: its words as every bag-of-words target sees them
    (:func:`analyses.probes._vocabulary.words_of`), function words (:data:`analyses.probes.STOP_WORDS`) left out.

    >>> sorted(content_words("The cat sat on the mat."))
    ['cat', 'mat', 'sat']
    """
    return {w for w in words_of(text) if w not in STOP_WORDS}


def text_features(first: Sequence[str], second: Sequence[str]) -> dict[str, np.ndarray]:
    """What the two sentences of each pair give without a model: ``overlap`` ``(n, 3)``: the Jaccard index of
    their content words (0 when neither has one), the number of content words they share and the number of
    words (function words too) they share; ``lengths`` ``(n, 2)``: whitespace words of each.

    >>> f = text_features(["The cat sat."], ["A cat ran."])
    >>> f["overlap"].tolist(), f["lengths"].tolist()
    ([[0.3333333333333333, 1.0, 1.0]], [[3.0, 3.0]])
    """
    if len(first) != len(second):
        raise ValueError(f"text_features: {len(first)} first sentences but {len(second)} second ones")
    overlap = np.zeros((len(first), 3))
    lengths = np.zeros((len(first), 2))
    for i, (a, b) in enumerate(zip(first, second)):
        ca, cb = content_words(a), content_words(b)
        union = ca | cb
        shared = len(set(words_of(a)) & set(words_of(b)))
        overlap[i] = (len(ca & cb) / len(union) if union else 0.0, len(ca & cb), shared)
        lengths[i] = (len(a.split()), len(b.split()))
    return {"overlap": overlap, "lengths": lengths}


def row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (float64); 0 where a row is all zeros.

    >>> row_cosine(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[2.0, 0.0], [-2.0, 0.0]])).round(4).tolist()
    [1.0, -0.7071]
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"row_cosine needs two (n, d) arrays of one shape; got {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def baseline_sets(parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feature sets of :data:`BASELINES` from their parts (``overlap``, ``lengths`` and ``apart``, each
    ``(n, k)``): each part side by side."""
    return {name: np.hstack([np.asarray(parts[p], dtype=np.float64).reshape(len(parts[p]), -1) for p in use])
            for name, use in BASELINES.items() if all(p in parts for p in use)}


def probe_items(features: Mapping[Hashable, Any], y: np.ndarray, groups: np.ndarray, *, n_splits: int = 5,
                seed: int = 0, Cs: Sequence[float] = (0.01, 0.1, 1.0), inner_splits: int = 3, max_iter: int = 1000,
                n_resamples: int = DEFAULT_RESAMPLES,
                device: str | None = "cpu") -> tuple[pd.DataFrame, pd.DataFrame, dict[Hashable, np.ndarray]]:
    """A logistic-regression probe per feature set (:func:`analyses.probes.probe_many_results`: every set on the
    same outer folds, :func:`analyses.probes.make_splits` of ``(y, groups, n_splits, seed)``, C chosen by inner CV),
    returning ``(items, scores, chosen)``: ``items`` one row per (feature set, item): ``features``, ``item``,
    ``group``, ``fold``, ``correct``; ``scores`` one row per feature set: ``features``, ``value`` (accuracy pooled
    over the out-of-fold items), ``ci_low``/``ci_high`` (cluster bootstrap over ``groups``), ``majority_baseline``,
    ``n``, ``n_groups``, ``chosen_C`` (median over the outer folds) and ``C_edge_share`` (the share of outer folds
    whose inner CV chose the smallest or largest C of the grid; NaN with a one-value grid); ``chosen``: each feature
    set's C per outer fold."""
    results = probe_many_results(features, y, groups, n_splits=n_splits, seed=seed, Cs=Cs, inner_splits=inner_splits,
                                 max_iter=max_iter, n_resamples=n_resamples, device=device)
    frames, rows, chosen = [], [], {}
    for name, res in results.items():
        it = res.items
        frames.append(pd.DataFrame({"features": [name] * len(it), "item": it["item"].to_numpy(),
                                    "group": it["group"].to_numpy(), "fold": it["fold"].to_numpy(),
                                    "correct": it["correct"].to_numpy(float)}))
        value, lo, hi = res.interval()
        chosen[name] = np.asarray(res.chosen_Cs, dtype=float)
        rows.append({"features": name, "value": value, "ci_low": lo, "ci_high": hi,
                     "majority_baseline": res.interval("majority_baseline")[0], "n": res.n, "n_groups": res.n_groups,
                     "chosen_C": float(np.median(chosen[name])), "C_edge_share": edge_share(chosen[name], Cs)})
    return pd.concat(frames, ignore_index=True), pd.DataFrame(rows), chosen


def _logit(probe, X: np.ndarray) -> np.ndarray:
    p = np.clip(probe.predict_proba(X)[:, 1], 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def stacked_increment(X: np.ndarray, base: np.ndarray, y: np.ndarray, groups: np.ndarray,
                      folds: Sequence[tuple[np.ndarray, np.ndarray]], Cs_by_fold: Sequence[float], *,
                      inner_splits: int = 3, seed: int = 0, max_iter: int = 1000) -> dict[str, np.ndarray]:
    """Per item, out-of-fold correctness ``(n,)`` of two regressions on the same ``folds`` (``(train, test)`` index
    pairs, e.g. :func:`analyses.probes.make_splits`): ``"with"``: the baselines ``base`` ``(n, k)`` and the score
    of a probe on ``X`` ``(n, d)``; ``"without"``: the baselines alone. In outer fold f the probe on ``X`` has C
    ``Cs_by_fold[f]`` (the C its own inner CV chose there); its score for a test item is the logit of the probe
    fitted on the whole training fold, and for a training item the logit of a probe fitted on the other inner folds
    (``inner_splits``, grouped by ``groups``), so no score comes from a probe that saw its item. Both regressions
    have C = :data:`STACK_C` on standardised features (:class:`analyses.probes.LinearProbe`)."""
    from analyses.probes import LinearProbe, make_splits

    X, base, y, groups = np.asarray(X), np.asarray(base, dtype=np.float64), np.asarray(y), np.asarray(groups)
    base = base.reshape(len(base), -1)
    out = {"with": np.full(len(y), np.nan), "without": np.full(len(y), np.nan)}
    for (train, test), C in zip(folds, Cs_by_fold):
        score = np.empty(len(y))
        for tr, va in make_splits(y[train], groups[train], inner_splits, seed):
            probe = LinearProbe(Cs=(float(C),), max_iter=max_iter).fit(X[train[tr]], y[train[tr]])
            score[train[va]] = _logit(probe, X[train[va]])
        score[test] = _logit(LinearProbe(Cs=(float(C),), max_iter=max_iter).fit(X[train], y[train]), X[test])
        for key, Z in (("with", np.hstack([base, score[:, None]])), ("without", base)):
            stack = LinearProbe(Cs=(STACK_C,), max_iter=max_iter).fit(Z[train], y[train])
            out[key][test] = stack.predict(Z[test]) == y[test]
    if np.isnan(out["with"]).any():
        raise ValueError("stacked_increment: the folds do not cover every item once")
    return out


def paired_rows(items: pd.DataFrame, pairs: Mapping[str, tuple[Hashable, Hashable]], *,
                n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """For each ``name -> (a, b)`` of ``pairs`` (feature-set names of ``items``, :func:`probe_items`): the
    accuracy of ``a`` − that of ``b`` (``value`` = ``value_a`` − ``value_b``) on the same out-of-fold items
    (:func:`analyses.stats.paired_difference`:
    cluster-bootstrap CI, cluster SE and sign-flip p over ``group``). A comparison whose two sides did not predict
    the same items in the same folds is a ValueError: it would not be paired."""
    n_resamples = check_resamples(n_resamples)
    by = {name: g.sort_values("item") for name, g in items.groupby("features", sort=False)}
    rows = []
    for comparison, (a, b) in pairs.items():
        missing = [x for x in (a, b) if x not in by]
        if missing:
            raise ValueError(f"comparison {comparison!r}: no probe of {missing}; probes: {list(by)}")
        A, B = by[a], by[b]
        if not (np.array_equal(A["item"].to_numpy(), B["item"].to_numpy())
                and np.array_equal(A["fold"].to_numpy(), B["fold"].to_numpy())):
            raise ValueError(f"comparison {comparison!r}: {a!r} and {b!r} did not predict the same items in the same "
                             f"folds")
        res = paired_difference(A["correct"].to_numpy(float), B["correct"].to_numpy(float),
                                A["group"].astype(str).to_numpy(), n_resamples=n_resamples, seed=seed)
        rows.append({"comparison": comparison, "features_a": a, "features_b": b, **res})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# Runner


def _by_example(examples: np.ndarray, X: np.ndarray, wanted: np.ndarray, what: str) -> np.ndarray:
    pos = {int(e): i for i, e in enumerate(examples)}
    missing = [int(e) for e in wanted if int(e) not in pos]
    if missing:
        raise ValueError(f"{what} has no state for {len(missing)} example(s) the others have, e.g. corpus index "
                         f"{missing[:5]}")
    return X[[pos[int(e)] for e in wanted]]


def coherence_features(pair, pair_word, single, single2, layers: Sequence[int]) -> dict[str, Any]:
    """The inputs of the probes from the four caches of one corpus (the same examples, the same model):
    ``examples`` (corpus indices every cache holds, in order), ``y`` (``is_next``), ``groups``/``grouping``
    (:func:`analyses.stats.cache_groups`) and ``features``: the baselines (:func:`baseline_sets`) by name and
    ``(token, layer)`` -> states for each of :data:`TOKENS`. An example a cache skipped (longer than the model
    takes) is left out of every set."""
    from analyses.selection import pooled
    from probing.cache import check_comparable

    for other in (pair_word, single, single2):
        check_comparable(pair, other)
    if "lit" not in pair_word.manifest.get("roles", ()):
        raise ValueError(f"{pair_word.path}: the literal token (role 'lit') is not stored; extract "
                         f"{pair_word.format_name} with roles cls,sep,word,lit")
    last = max(pair.layers)
    ex_pair, _ = pooled(pair, layers[0], "sep1")
    ex_word, _ = pooled(pair_word, layers[0], "lit1")
    ex1, m1 = pooled(single, last, "mean")
    ex2, m2 = pooled(single2, last, "mean")
    examples = np.asarray(sorted(set(map(int, ex_pair)) & set(map(int, ex_word)) & set(map(int, ex1))
                                 & set(map(int, ex2))))
    table = pair.examples.loc[examples]
    if "label_is_next" not in table.columns:
        raise ValueError(f"{pair.path}: the corpus has no is_next label; Q4 needs sentence pairs with next-sentence "
                         f"negatives (pairing=nsp)")
    y = table["label_is_next"].to_numpy().astype(int)
    groups, grouping = cache_groups(pair, examples)
    parts = text_features(table["sentence_1"].tolist(), table["sentence_2"].tolist())
    parts["apart"] = row_cosine(_by_example(ex1, m1, examples, "single"),
                                _by_example(ex2, m2, examples, "single2"))[:, None]
    base = baseline_sets(parts)
    features: dict[Hashable, Any] = dict(base)
    for layer in layers:
        for cache, token in ((pair, "sep1"), (pair, "cls"), (pair_word, "lit1")):
            ex, X = pooled(cache, layer, token)
            features[(token, layer)] = _by_example(ex, X, examples, f"{cache.format_name} {token}")
    return {"examples": examples, "y": y, "groups": groups, "grouping": grouping, "features": features}


def _name(key: Hashable) -> tuple[str, Any]:
    return (key[0], int(key[1])) if isinstance(key, tuple) else (str(key), pd.NA)


def run_coherence(pair, pair_word, single, single2, *, layers: Sequence[int] | None = None, n_splits: int = 5,
                  seed: int = 0, Cs: Sequence[float] = (0.01, 0.1, 1.0), inner_splits: int = 3, max_iter: int = 1000,
                  n_resamples: int = DEFAULT_RESAMPLES, device: str | None = "cpu", out=None,
                  force: bool = False) -> dict[str, pd.DataFrame]:
    """The probes of the module docstring on one corpus's caches (``pair``, ``pair_word`` with its literal stored:
    extract with roles ``cls,sep,word,lit``; ``single``, ``single2`` with words), at ``layers`` (default: every
    stored layer but the embeddings): ``{"coherence_probes": ..., "coherence_paired": ...}``, each stored under
    ``out`` (:func:`analyses.results.stored_table`) and reused by a second run with the same caches and options."""
    from analyses.probes import make_splits
    from analyses.stats import bootstrap_ci

    n_resamples = check_resamples(n_resamples)
    layers = [int(x) for x in (layers if layers is not None else [x for x in pair.layers if x > 0])]
    config = {"caches": [cache_identity(c) for c in (pair, pair_word, single, single2)], "layers": layers,
              "n_splits": n_splits, "seed": seed, "Cs": [float(c) for c in Cs], "inner_splits": inner_splits,
              "max_iter": max_iter, "n_resamples": n_resamples, "stack_C": STACK_C}
    p_path, probes = stored_table(out, "coherence_probes", config, force)
    c_path, paired = stored_table(out, "coherence_paired", config, force)
    if probes is not None and paired is not None:
        return {"coherence_probes": probes, "coherence_paired": paired}
    data = coherence_features(pair, pair_word, single, single2, layers)
    y, groups, features = data["y"], data["groups"], data["features"]
    items, scores, chosen = probe_items(features, y, groups, n_splits=n_splits, seed=seed, Cs=Cs,
                                        inner_splits=inner_splits, max_iter=max_iter, n_resamples=n_resamples,
                                        device=device)
    folds = make_splits(y, groups, n_splits, seed)
    fold_of = np.empty(len(y), dtype=int)
    for f, (_, test) in enumerate(folds):
        fold_of[test] = f
    stacked, stack_rows = [], []
    for layer in layers:
        inc = stacked_increment(features[("sep1", layer)], features["baselines"], y, groups, folds,
                                chosen[("sep1", layer)], inner_splits=inner_splits, seed=seed, max_iter=max_iter)
        for side, name in (("without", "baselines (stacked)"), ("with", "baselines+sep1 (stacked)")):
            stacked.append(pd.DataFrame({"features": [(name, layer)] * len(y), "item": np.arange(len(y)),
                                         "group": groups, "fold": fold_of, "correct": inc[side]}))
            value, lo, hi = bootstrap_ci(inc[side], groups, "mean", n_resamples=n_resamples, seed=seed)
            stack_rows.append({"features": (name, layer), "value": value, "ci_low": lo, "ci_high": hi,
                               "majority_baseline": scores["majority_baseline"].iloc[0], "n": len(y),
                               "n_groups": len(np.unique(groups)), "chosen_C": STACK_C, "C_edge_share": np.nan})
    items = pd.concat([items, *stacked], ignore_index=True)
    scores = pd.concat([scores, pd.DataFrame(stack_rows)], ignore_index=True)
    common = {"model": model_label(pair), "corpus": pair.manifest["corpus"]["name"], "target": "is_next",
              "seed": seed, "grouping": data["grouping"], "n_resamples": n_resamples, "n_folds": n_splits}
    probe_rows = []
    for _, r in scores.iterrows():
        features_name, layer = _name(r["features"])
        probe_rows.append({"analysis": "coherence_probe", **common, "format": _format_of(features_name),
                           "layer": layer, "features": features_name, "metric": "accuracy",
                           **{k: r[k] for k in ("value", "ci_low", "ci_high", "majority_baseline", "n", "n_groups",
                                                "chosen_C", "C_edge_share")}})
    per_layer = set(TOKENS) | {"baselines (stacked)", "baselines+sep1 (stacked)"}
    pairs = {(comparison, layer): tuple((f, layer) if f in per_layer else f for f in (a, b))
             for comparison, (a, b, _) in COMPARISONS.items() for layer in layers}
    diff = paired_rows(items, pairs, n_resamples=n_resamples, seed=seed)
    paired_out = []
    for _, r in diff.iterrows():
        comparison, layer = r["comparison"]
        paired_out.append({"analysis": "coherence_comparison", **common, "format": "pair", "layer": layer,
                           "metric": "accuracy_difference", "comparison": comparison,
                           "features_a": _name(r["features_a"])[0], "features_b": _name(r["features_b"])[0],
                           **{k: r[k] for k in ("value", "ci_low", "ci_high", "se", "p_value", "mde", "n", "n_groups",
                                                "value_a", "value_b")}})
    return {"coherence_probes": keep_table(make_table(probe_rows), p_path),
            "coherence_paired": keep_table(make_table(paired_out), c_path)}


def _format_of(features: str) -> str:
    if features == "lit1":
        return "pair_word"
    if features in ("sep1", "cls", "baselines+sep1 (stacked)"):
        return "pair"
    return "single+single2" if features in ("apart", "baselines", "baselines (stacked)") else "text"
