"""What a vector holds of each sentence of a k-sentence input: content readout and the interchange test.

Two measurements of a multi-sentence input (``[CLS] s1 [SEP] s2 [SEP] … sk [SEP]`` and its alternatives):

* **Content readout** (:func:`run_sentence_content`): for each sentence position i, a multi-label probe reads the
  bag of content words of sentence i (:func:`analyses.probes.content_vocabulary`) from one vector per input
  ([CLS], mean pooling, or bertsum's own [CLS] before sentence i), scored by the macro ROC AUC of its
  out-of-fold scores, beside a probe on the sentences' word counts alone (a longer sentence holds more of any
  word, so length alone ranks above 0.5). Every format of one k is probed on the same items, folds and
  document resamples, so a difference between formats (``multi − concat``) is paired
  (:meth:`analyses.probes.ProbeResult.auc_difference`).
* **Interchange** (:func:`run_interchange`): the readout is causal only if it follows the sentence. Each item
  has one sentence (position p, balanced over positions) replaced by a same-topic sentence of another document
  (:func:`probing.corpus_replace.replace_sentences`); the probes of each position, fitted on the clean inputs'
  training folds (cross-fitted), read the test items' replaced inputs. Position i's readout on items whose
  sentence i was replaced should rank the *new* sentence's words above the old one's (``interchange_follow``:
  AUC against the new bag − AUC against the old bag, same scores); on items where another sentence was replaced
  it should read sentence i as well as on the clean input (``interchange_stay``: AUC on the replaced input −
  AUC on the clean input, same items and words). Both are paired on the same document resamples
  (:func:`auc_draws`).

Metrics are pure functions of arrays (:func:`auc_draws`, :func:`paired_auc_difference`, :func:`cross_fit_scores`,
:func:`interchange_rows`); the runners read caches and return tidy tables (columns: docs/TABLES.md,
``sentence_content`` and ``interchange``).
"""

from __future__ import annotations

import math
import warnings
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.probes import (LinearProbe, content_vocabulary, example_target, fold_macro_auc, make_splits, presence,
                             probe_many_results)
from analyses.results import cache_identity, keep_table, make_table, model_label, stored_table
from analyses.drift import rowwise_cosine
from analyses.selection import choice_rows, pooled
from analyses.stats import check_resamples, minimum_detectable_effect, table_groups, wald_p_value
from probing.cache import Cache
from probing.layers import cache_layers

#: The formats of k-sentence inputs the readouts compare, by kind (the format of a kind for k sentences:
#: :func:`segment_format`). ``control`` differs from ``multi`` in one property: an ordinary token where each
#: inner [SEP] stood (same length, same alternating segments, the closing [SEP] kept).
SEGMENT_FORMATS: dict[str, str] = {
    "multi": "[CLS] s1 [SEP] s2 [SEP] … sk [SEP], alternating segments",
    "concat": "[CLS] s1 s2 … sk [SEP], one segment",
    "control": "[CLS] s1 , s2 , … sk [SEP]: multi with a comma where each inner [SEP] was, alternating segments",
    "bertsum": "[CLS] s1 [SEP] [CLS] s2 [SEP] …: a [CLS] per sentence, alternating segments (Liu & Lapata 2019)",
}


def control_template(k: int, literal: str = ",") -> str:
    """The control of ``multi`` for ``k`` sentences: ``literal`` (an ordinary token) where each inner [SEP] stood,
    the segments alternating as in ``multi`` (the token after sentence i in sentence i's segment).

    >>> control_template(3)
    "[CLS] <0> {1} ',' <1> {2} ',' <0> {3} [SEP]"
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"the control format needs k >= 2 sentences, got {k!r}")
    parts = ["[CLS]"]
    for i in range(1, k + 1):
        parts += [f"<{(i - 1) % 2}>", f"{{{i}}}", f"'{literal}'" if i < k else "[SEP]"]
    return " ".join(parts)


def segment_format(kind: str, k: int) -> str:
    """The format spec of a kind of :data:`SEGMENT_FORMATS` for ``k`` sentences: a built-in name, or for
    ``control`` the named template ``control<k>=...`` (:func:`control_template`)."""
    if kind not in SEGMENT_FORMATS:
        raise ValueError(f"unknown format kind {kind!r}; valid: {', '.join(SEGMENT_FORMATS)}")
    return f"control{k}={control_template(k)}" if kind == "control" else kind


#: The choice name of bertsum's own classification token: the [CLS] right before sentence i (for i = 1 the
#: first token), read for sentence i's content.
OWN_CLS = "own_cls"
#: The choice name of the probe on the sentences' word counts alone (no layer, no format).
LENGTH_ONLY = "length_only"

# ---------------------------------------------------------------------------------------------------
# Metrics (pure functions of arrays)


def group_draws(groups: np.ndarray, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(codes (n,), times (R, G))``: each item's group code and how often each group is drawn in each of
    ``n_resamples`` cluster-bootstrap resamples (seeded): the same draws for every score of the same items."""
    _, codes = np.unique(np.asarray(groups), return_inverse=True)
    codes = codes.reshape(-1)
    G = int(codes.max()) + 1 if len(codes) else 0
    draws = np.random.default_rng(seed).integers(0, G, size=(n_resamples, G))
    times = np.zeros((n_resamples, G))
    np.add.at(times, (np.arange(n_resamples)[:, None], draws), 1.0)
    return codes, times


def auc_draws(Y: np.ndarray, S: np.ndarray, codes: np.ndarray, times: np.ndarray) -> tuple[float, np.ndarray]:
    """``(macro AUC, its value on each resample (R,))`` of scores ``S: (n, L)`` against 0/1 ``Y: (n, L)``, pooled
    over the items (the mean over the labels with both values present of each label's ROC AUC; Mann-Whitney),
    each item counted as often as its group is drawn (``codes``, ``times`` from :func:`group_draws`). NaN where no
    label has both values."""
    folds = np.zeros(len(Y), dtype=int)
    point = fold_macro_auc(Y, S, folds, codes, np.ones((1, times.shape[1])))[0]
    return float(point), fold_macro_auc(Y, S, folds, codes, times)


def paired_auc_difference(a: tuple[float, np.ndarray], b: tuple[float, np.ndarray],
                          confidence: float = 0.95) -> dict[str, float]:
    """``a − b`` for two :func:`auc_draws` results on the same resamples: value, percentile CI, bootstrap SE,
    two-sided Wald p (``2 Φ(−|value| / se)``), the minimum detectable effect, and ``value_a`` / ``value_b``."""
    d = a[1] - b[1]
    d = d[np.isfinite(d)]
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(d, [alpha, 1 - alpha]) if d.size else (math.nan, math.nan)
    se = float(d.std(ddof=1)) if d.size > 1 else math.nan
    value = a[0] - b[0]
    return {"value": value, "ci_low": float(lo), "ci_high": float(hi), "se": se,
            "p_value": wald_p_value(value, se) if math.isfinite(se) else math.nan,
            "mde": minimum_detectable_effect(se) if math.isfinite(se) else math.nan,
            "value_a": a[0], "value_b": b[0]}


def cross_fit_scores(X: np.ndarray, Y: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]],
                     others: Sequence[np.ndarray] = (), *, Cs: Sequence[float] = (0.1,), max_iter: int = 300,
                     seed: int = 0) -> list[np.ndarray]:
    """Out-of-fold probe scores: for each ``(train, test)`` of ``splits`` a :class:`analyses.probes.LinearProbe`
    (multi-label, ``Cs``) fitted on ``X[train]``, ``Y[train]`` scores the test rows of ``X`` and of each array of
    ``others`` (the same items, another input: e.g. with a sentence replaced). Returns ``[S_X, S_other, ...]``,
    each ``(n, L)``. ``X``, ``others``: ``(n, dim)``; ``Y``: ``(n, L)`` 0/1."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y)
    for o in others:
        if np.shape(o) != X.shape:
            raise ValueError(f"an input to score has shape {np.shape(o)}, the fitted one {X.shape}")
    out = [np.zeros(Y.shape, dtype=np.float64) for _ in range(1 + len(others))]
    for tr, te in splits:
        probe = LinearProbe(Cs=tuple(Cs), max_iter=max_iter, seed=seed).fit(X[tr], Y[tr])
        for S, Z in zip(out, (X, *others)):
            S[te] = probe.predict_proba(np.asarray(Z, dtype=np.float64)[te])
    return out


def interchange_rows(clean: Mapping[int, np.ndarray], swapped: Mapping[int, np.ndarray],
                     old: Mapping[int, np.ndarray], new: Mapping[int, np.ndarray], replaced: np.ndarray,
                     groups: np.ndarray, n_resamples: int, seed: int = 0) -> list[dict]:
    """The interchange comparisons, per sentence position i (keys of the mappings):

    * ``interchange_follow``: on the items whose sentence i was replaced (``replaced == i``), the macro AUC of
      position i's readout of the replaced input (``swapped[i]``, ``(n, L)`` scores) against the new sentence's
      words (``new[i]``) − against the old sentence's words (``old[i]``): positive when the readout follows;
    * ``interchange_stay``: on the items where another sentence was replaced (``replaced`` not 0 or i), the macro
      AUC of ``swapped[i]`` − of ``clean[i]`` (the readout of the clean input), both against ``old[i]``: zero
      when replacing another sentence leaves what is read of sentence i as it was.

    Each on its own subset's document resamples (``groups``), shared by the two AUCs it compares. Then, per
    metric, ``<metric>_mean`` (no ``position``): the mean over the positions of the two AUCs and of their
    difference, every position's AUCs on one joint draw of the documents, so the mean's interval pools the
    items of every position (one replaced sentence per item leaves each position a k-th of the items)."""
    replaced = np.asarray(replaced)
    groups = np.asarray(groups)
    rows = []
    sides = {}
    for i in sorted(clean):
        for metric, take, a, b in (
                ("interchange_follow", replaced == i, (swapped[i], new[i]), (swapped[i], old[i])),
                ("interchange_stay", (replaced != i) & (replaced != 0), (swapped[i], old[i]), (clean[i], old[i]))):
            idx = np.flatnonzero(take)
            sides.setdefault(metric, []).append((idx, a, b))
            row = {"position": i, "metric": metric, "n": len(idx)}
            if len(idx) < 2:
                rows.append({**row, "value": math.nan})
                continue
            codes, times = group_draws(groups[idx], n_resamples, seed)
            da = auc_draws(a[1][idx], a[0][idx], codes, times)
            db = auc_draws(b[1][idx], b[0][idx], codes, times)
            rows.append({**row, **paired_auc_difference(da, db), "n_groups": int(codes.max()) + 1,
                         "n_resamples": n_resamples})
    codes, times = group_draws(groups, n_resamples, seed)
    for metric, parts in sides.items():
        parts = [(idx, a, b) for idx, a, b in parts if len(idx) >= 2]
        if not parts:
            continue
        da = [auc_draws(a[1][idx], a[0][idx], codes[idx], times) for idx, a, _ in parts]
        db = [auc_draws(b[1][idx], b[0][idx], codes[idx], times) for idx, _, b in parts]
        with warnings.catch_warnings():  # a resample where no position has an AUC stays NaN (dropped below)
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = [(float(np.nanmean([d[0] for d in ds])), np.nanmean(np.stack([d[1] for d in ds]), axis=0))
                    for ds in (da, db)]
        used = np.unique(np.concatenate([idx for idx, _, _ in parts]))
        rows.append({"metric": f"{metric}_mean", "n": len(used), **paired_auc_difference(*mean),
                     "n_groups": len(np.unique(codes[used])), "n_resamples": n_resamples})
    return rows


def content_rows(features: Mapping[tuple[str, str], np.ndarray], Y: np.ndarray, groups: np.ndarray,
                 comparisons: Sequence = (), *, n_splits: int = 5, seed: int = 0, Cs: Sequence[float] = (0.1,),
                 inner_splits: int = 3, max_iter: int = 300, n_resamples: int = 1000,
                 device: str | None = None) -> list[dict]:
    """Content readout of one sentence from several vectors of the same items: ``features``, ``(format, choice)
    -> (n, dim)``; ``Y: (n, L)`` 0/1, the sentence's bag of words; ``groups: (n,)`` documents. One multi-label
    probe per feature set (:func:`analyses.probes.probe_many_results`: the same folds; C from ``Cs`` by an inner
    cross-validation of ``inner_splits`` folds, none with one C), so every
    result has the same items, folds and document resamples. Rows: ``macro_auc`` per feature set (``format``,
    ``choice``, CI over documents), and ``macro_auc_diff`` per comparison ``((format, choice), (format,
    choice))`` whose two sides were fitted, a − b on the same resamples (``format_b``, ``choice_b``, ``se``,
    ``p_value``, ``mde``, ``value_a``, ``value_b``)."""
    results = probe_many_results(dict(features), Y, groups, n_splits=n_splits, seed=seed, Cs=tuple(Cs),
                                 inner_splits=inner_splits, max_iter=max_iter, device=device,
                                 n_resamples=n_resamples)
    rows = []
    for (f, ch), res in results.items():
        value, lo, hi = res.interval("macro_auc")
        rows.append({"format": f, "choice": ch, "metric": "macro_auc", "value": value, "ci_low": lo, "ci_high": hi,
                     "n": res.n, "n_groups": res.n_groups, "n_resamples": n_resamples})
    for a, b in comparisons:
        a, b = tuple(a), tuple(b)
        if a in results and b in results:
            rows.append({"format": a[0], "choice": a[1], "format_b": b[0], "choice_b": b[1],
                         "metric": "macro_auc_diff", **results[a].auc_difference(results[b])})
    return rows


# ---------------------------------------------------------------------------------------------------
# Features from caches


def own_cls_rows(cache: Cache, position: int) -> tuple[np.ndarray, np.ndarray]:
    """``(examples, rows)`` of the classification token right before sentence ``position`` (bertsum's
    ``[CLS] s_i [SEP]`` per sentence): the token of role ``cls`` whose key's sentence is ``position − 1``."""
    tok = cache.tokens
    mask = (tok["role"].to_numpy() == "cls") & (tok["sentence"].to_numpy() == position - 1) & \
        (tok["index"].to_numpy() == 0)
    sub = tok[mask].drop_duplicates("example", keep="first")
    if sub.empty:
        raise ValueError(f"{cache.path.name} ({cache.format_name}): no [CLS] before sentence {position}; "
                         f"choice {OWN_CLS!r} needs a format with a [CLS] per sentence (bertsum)")
    return sub["example"].to_numpy(), sub.index.to_numpy()


def _vectors(cache: Cache, layer: int, choice: str, position: int) -> tuple[np.ndarray, np.ndarray]:
    if choice == OWN_CLS:
        ex, rows = own_cls_rows(cache, position)
        return ex, cache.states(layer, rows)
    if choice == "cls" or choice.startswith(("sep", "lit")):
        ex, rows = choice_rows(cache, choice)
        return ex, cache.states(layer, rows)
    return pooled(cache, layer, choice)


def _take(ex: np.ndarray, X: np.ndarray, ids: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(ex, ids)
    if not (pos < len(ex)).all() or not (ex[np.minimum(pos, len(ex) - 1)] == ids).all():
        raise ValueError("an example lacks the token the choice reads")
    return X[pos]


def word_counts(examples: pd.DataFrame) -> np.ndarray:
    """``(n, k)``: whitespace words of each sentence of each row of a cache's example table (the features of the
    length-only probe, as :func:`analyses.probes.run_probes` builds them)."""
    cols = sorted((c for c in examples.columns if c.startswith("sentence_")), key=lambda c: int(c[9:]))
    return np.asarray([[len(str(t).split()) for t in examples[c]] for c in cols], dtype=np.float64).T


def _check_same_corpus(caches: Sequence[Cache]) -> None:
    ids = [tuple(c.examples["example_id"]) for c in caches]
    if len(set(ids)) > 1:
        names = [c.path.name for c in caches]
        raise ValueError(f"caches {names} hold different examples; content readouts compare formats on the same "
                         "items")


# ---------------------------------------------------------------------------------------------------
# Runners


#: Comparisons of the content table, as ((format, choice), (format, choice)); ``length`` is the length-only probe.
DEFAULT_COMPARISONS: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = (
    (("multi", "cls"), ("concat", "cls")), (("multi", "cls"), ("control", "cls")),
    (("multi", "mean"), ("concat", "mean")), (("multi", "mean"), ("control", "mean")),
    (("multi", "cls"), ("length", LENGTH_ONLY)), (("bertsum", OWN_CLS), ("multi", "cls")),
)


def run_sentence_content(caches: Mapping[tuple[int, str], Cache], *, choices: Mapping[str, Sequence[str]],
                         comparisons: Sequence = DEFAULT_COMPARISONS, layer: int = -1, vocab: int = 30,
                         n_splits: int = 5, seed: int = 0, Cs: Sequence[float] = (0.1,), inner_splits: int = 3,
                         max_iter: int = 300, n_resamples: int = 1000, device: str | None = None, out=None,
                         force: bool = False, progress: bool = True) -> pd.DataFrame:
    """The content-readout table (module docstring). ``caches``: ``(k, format) -> cache``, the formats of one k
    extracted from the same examples (the first k sentences of the same groups); ``choices``: format -> token
    choices read from it (:mod:`analyses.selection`, or :data:`OWN_CLS`); ``comparisons``: pairs of
    ``(format, choice)`` compared per (k, position) by macro AUC on the same resamples (a pair whose side is
    missing is skipped). ``layer``: the model layer read (-1: the last). Rows: ``metric = macro_auc`` per (k,
    position, format, choice), the length-only probe's (``format = length``), ``macro_auc_diff`` per
    comparison (``format_b``, ``choice_b``; ``se``, ``p_value``, ``mde``), and for :data:`OWN_CLS` at positions
    i > 1 ``cosine``: the mean cosine of the own [CLS] with the first [CLS] of the same input (1: the same
    vector, so the own [CLS] reads nothing the first does not)."""
    n_resamples = check_resamples(n_resamples)
    if not caches:
        raise ValueError("run_sentence_content needs at least one cache")
    unknown = sorted({f for _, f in caches} - set(choices))
    if unknown:
        raise ValueError(f"no token choices given for format(s) {unknown}")
    any_cache = next(iter(caches.values()))
    [layer_] = cache_layers(any_cache, [layer])
    config = {"caches": {f"{k}/{f}": cache_identity(c) for (k, f), c in sorted(caches.items())},
              "choices": {f: list(v) for f, v in sorted(choices.items())},
              "comparisons": [list(map(list, c)) for c in comparisons], "layer": layer_, "vocab": vocab,
              "n_splits": n_splits, "seed": seed, "Cs": list(Cs), "inner_splits": inner_splits, "max_iter": max_iter,
              "n_resamples": n_resamples}
    path, done = stored_table(out, "sentence_content", config, force)
    if done is not None:
        return done
    from tqdm.auto import tqdm

    rows = []
    ks = sorted({k for k, _ in caches})
    bar = tqdm(total=sum(ks), desc="sentence content", disable=not progress, delay=1)
    for k in ks:
        here = {f: c for (kk, f), c in caches.items() if kk == k}
        _check_same_corpus(list(here.values()))
        ref = next(iter(here.values()))
        meta = {"analysis": "sentence_content", "model": model_label(ref), "corpus": ref.manifest["corpus"]["name"],
                "k": k}
        for i in range(1, k + 1):
            vectors = {(f, ch): _vectors(c, layer_, ch, i) for f, c in here.items() for ch in choices[f]}
            ids = None
            for ex, _ in vectors.values():
                ids = np.asarray(ex) if ids is None else np.intersect1d(ids, ex)
            features = {key: _take(ex, X, ids) for key, (ex, X) in vectors.items()}
            features[("length", LENGTH_ONLY)] = word_counts(ref.examples.loc[ids])
            Y, _ = example_target(ref, f"bow_s{i}", ids, vocab)
            groups, grouping = table_groups(ref.examples.loc[ids], str(ref.path))
            common = {**meta, "position": i, "target": f"bow_s{i}", "grouping": grouping, "seed": int(seed)}
            part = content_rows(features, Y, groups, comparisons, n_splits=n_splits, seed=seed, Cs=Cs,
                                inner_splits=inner_splits, max_iter=max_iter, n_resamples=n_resamples, device=device)
            rows += [{**common, "layer": pd.NA if r["choice"] == LENGTH_ONLY else layer_, **r} for r in part]
            for f, c in here.items():  # how far bertsum's own [CLS] of sentence i is from its first one
                if OWN_CLS in choices[f] and i > 1:
                    first = _take(*_vectors(c, layer_, "cls", 1), ids)
                    cos = rowwise_cosine(features[(f, OWN_CLS)], first)
                    rows.append({**common, "layer": layer_, "format": f, "choice": OWN_CLS, "format_b": f,
                                 "choice_b": "cls", "metric": "cosine", "value": float(np.mean(cos)), "n": len(cos)})
            bar.update(1)
    bar.close()
    return keep_table(make_table(rows), path)


def replaced_bags(clean: pd.DataFrame, swapped: pd.DataFrame, position: int,
                  vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``(old (n, L), new (n, L))``: the bag of content words of sentence ``position`` in the clean and in the
    replaced example tables (rows in the same order), over the clean corpus's vocabulary of that position
    (:func:`analyses.probes.content_vocabulary`), keeping the words that vary over the clean items."""
    col = f"sentence_{position}"
    words = content_vocabulary(clean[col].tolist(), vocab)
    old = presence(clean[col].tolist(), words)
    new = presence(swapped[col].tolist(), words)
    keep = (old.sum(0) > 0) & (old.sum(0) < len(old))
    return old[:, keep], new[:, keep]


def run_interchange(clean: Cache, swapped: Cache, *, choice: str = "cls", layer: int = -1, vocab: int = 30,
                    n_splits: int = 5, seed: int = 0, Cs: Sequence[float] = (0.1,), max_iter: int = 300,
                    n_resamples: int = 1000, out=None, force: bool = False) -> pd.DataFrame:
    """The interchange table (module docstring): ``clean``, a cache of k-sentence inputs; ``swapped``, the same
    examples (ids) in the same format with one sentence each replaced (its examples carry the label
    ``replaced``, the position, 0 for none: :func:`probing.corpus_replace.replace_sentences`). The probes read
    ``choice`` at ``layer``; folds are grouped by document, as every probe's."""
    n_resamples = check_resamples(n_resamples)
    if clean.format_name != swapped.format_name:
        raise ValueError(f"the interchange compares one format: {clean.format_name!r} and {swapped.format_name!r}")
    cid, sid = clean.examples["example_id"].tolist(), swapped.examples["example_id"].tolist()
    if cid != sid:
        raise ValueError(f"caches {clean.path.name} and {swapped.path.name} hold different examples; the replaced "
                         "corpus keeps the clean one's ids and order")
    if "label_replaced" not in swapped.examples.columns:
        raise ValueError(f"{swapped.path.name}: no 'replaced' label; make the corpus with "
                         "probing.corpus_replace.replace_sentences")
    [layer_] = cache_layers(clean, [layer])
    config = {"clean": cache_identity(clean), "swapped": cache_identity(swapped), "choice": choice, "layer": layer_,
              "vocab": vocab, "n_splits": n_splits, "seed": seed, "Cs": list(Cs), "max_iter": max_iter,
              "n_resamples": n_resamples}
    path, done = stored_table(out, "interchange", config, force)
    if done is not None:
        return done
    k = sum(c.startswith("sentence_") for c in clean.examples.columns)
    ex_c, Xc = _vectors(clean, layer_, choice, 1)
    ex_s, Xs = _vectors(swapped, layer_, choice, 1)
    ids = np.intersect1d(ex_c, ex_s)
    Xc, Xs = _take(ex_c, Xc, ids), _take(ex_s, Xs, ids)
    groups, grouping = table_groups(clean.examples.loc[ids], str(clean.path))
    replaced = swapped.labels("replaced", ids).astype(int)
    S_clean, S_swap, old, new = {}, {}, {}, {}
    for i in range(1, k + 1):
        old[i], new[i] = replaced_bags(clean.examples.loc[ids], swapped.examples.loc[ids], i, vocab)
        splits = make_splits(old[i], groups, n_splits, seed)
        S_clean[i], S_swap[i] = cross_fit_scores(Xc, old[i], splits, [Xs], Cs=Cs, max_iter=max_iter, seed=seed)
    meta = {"analysis": "interchange", "model": model_label(clean), "corpus": clean.manifest["corpus"]["name"],
            "format": clean.format_name, "choice": choice, "layer": layer_, "k": k, "grouping": grouping,
            "seed": int(seed)}
    rows = [{**meta, "target": f"bow_s{r['position']}" if "position" in r else "bow_every_sentence", **r}
            for r in interchange_rows(S_clean, S_swap, old, new, replaced, groups, n_resamples, seed)]
    return keep_table(make_table(rows), path)
