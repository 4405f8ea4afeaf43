"""Probe runner: read caches, build targets, fit every (layer x token choice) probe, write tidy tables.

    python -m analyses.probes CACHE --choices cls,mean,sep1 --targets topic,length,bow_s1 \
        [--layers 0,3,-1 | 2-4 | all] [--folds 5] [--inner-folds 2] [--Cs 0.003,0.01,0.1] [--bow-Cs 0.1] \
        [--max-iter 300] [--seed 0] [--resamples 1000] [--threads 1] [--device cpu] [--no-progress] \
        [--random-cache CACHE_OF_RANDOM_INIT_MODEL] [--length-baseline] [--versus mean] [--items] \
        --out results [--force]

(``python -m analyses.probes._runner`` is the same command.) The flags carry the study's ``[probes]``
settings one to one: ``folds``, ``inner_splits`` (``--inner-folds``), ``Cs``, ``bow_Cs``,
``max_iter``, ``vocab``, ``max_tokens``, ``device``.

Targets, declared once in :data:`TARGETS`:

* ``<label>``: any example label stored with the corpus (``is_next``, ``swapped``, ``topic_s2``, ...)
* ``topic``: the topic of the example, asked only where it is defined: if the corpus records
  ``topic_s2`` (the topic of sentence 2) and it differs from ``topic`` on any example (a next-sentence
  negative from another topic), the runner refuses with an error naming ``topic_s1`` / ``topic_s2``;
  ``topic_s1`` is sentence 1's topic (the ``topic`` label), ``topic_s2`` sentence 2's
* ``length``: length of sentence 1 in words, in 3 equal-count bins (short / medium / long)
* ``bow_s<i>``: the content of sentence i, a multi-label bag of words over the ``--vocab`` content
  words in most sentences of that position across the corpus: stop words and the top frequency band
  left out (:mod:`analyses.probes._vocabulary`, declared once); scored by micro-F1 and macro AUC
* ``fw_s<i>``: control for ``bow_s<i>``: presence of the ``--vocab`` most frequent function words
  (stop words) of sentence i, which mostly tracks its length
* ``segment``: token-level: which sentence a word token belongs to (first subwords; control task: a
  random sentence per word type, Hewitt & Liang 2019)

Every probe uses the protocol of :mod:`analyses.probes` (standardised features, C by grouped inner CV,
grouped outer CV, pooled out-of-fold score with a cluster-bootstrap interval, majority baseline and
the minimum detectable difference from it, control task and selectivity). Grouping
(:func:`analyses.stats.table_groups`): by document when the corpus has a ``doc`` label, else by
example; the table records it (``grouping``, ``n_groups``). With ``random_cache`` (the same format
extracted with ``--random-init``) the same probes are fit on the randomly initialised model
(``model_kind = random_init``); it must be the baseline of ``cache``: random weights, the same
architecture, corpus, format and layers (:func:`probing.cache.check_comparable` with
``random_baseline=True``), or the run is refused. With ``length_baseline`` every example-level target is also probed
from the word counts of the example's sentences alone (``choice = length_only``, no layer, same splits):
how much of a score length explains; on a multi-label target each probe's macro AUC minus the length-only
probe's comes as ``macro_auc_diff`` rows (on the same document resamples), and with ``versus`` (a token
choice) minus that choice's at the same layer. With ``random_versus`` (token choices, and ``random_cache``) each
of those choices' macro AUC on a multi-label target minus the same choice's on the random-init model, on
the same resamples of the same items (``model_kind = trained``, ``model_kind_b = random_init``): is what a
token holds learned, or what any encoder of this architecture would give? With ``items=True`` the
per-item out-of-fold predictions come back as a second table (stored beside the result with ``out``):
:data:`ITEM_KEYS` + ``example``, ``token``, ``group``, ``fold``, ``y_true``, ``y_pred``, ``correct``,
``num``, ``den``, ...; file ``probe_items-<key>``, the result's key);
:func:`compare_probes` turns two sets of its rows into paired differences.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, add_probe_options, cache_identity,
                              cli_error, keep_table, make_table, model_label, split_list, stored_table, table_lines)
from analyses.stats import check_resamples, table_groups
from analyses.probes._batched import MAX_BATCH_ELEMENTS, probe_many_results
from analyses.probes._metrics import DEFAULT_CS
from analyses.probes._results import PROBE_RESAMPLES, cross_validate_probe, probe_rows
from analyses.selection import parse_choice, pooled
from analyses.stored import PooledStore
from analyses.probes._vocabulary import content_vocabulary, function_vocabulary, presence
from probing.layers import cache_layers
from probing.cache import Cache, check_comparable
from probing.cli import ArgumentParser, int_at_least, positive_float, positive_floats

TARGETS: dict[str, str] = {
    "<label>": "an example label stored with the corpus (is_next, swapped, topic_s2, ...)",
    "topic": "the example's topic; refused where a sentence has another topic (ask topic_s1 / topic_s2)",
    "topic_s<i>": "topic of sentence i (topic_s1 = topic; topic_s2 needs the corpus's topic_s2 label)",
    "length": "words in sentence 1, 3 equal-count bins",
    "length<k>": "words in sentence 1, k equal-count bins (length6: SentEval's SentLen has 6 classes)",
    "bow_s<i>": "content words of sentence i (multi-label; top --vocab words, stop words and top band out)",
    "fw_s<i>": "control: presence of the --vocab most frequent function words of sentence i",
    "segment": "token level: the sentence a word token belongs to",
}


def _sentence_column(table: pd.DataFrame, target: str, i: str) -> str:
    col = f"sentence_{i}"
    if col not in table.columns:
        raise ValueError(f"target {target!r}: the corpus has no sentence {i}")
    return col


def topic_mismatch(cache: Cache, examples: np.ndarray) -> np.ndarray:
    """``(n,)`` bool: the examples among ``examples`` some sentence of which (label ``topic_s<i>``) has a
    topic other than the example's ``topic``, for which ``topic`` is undefined. The one rule both the
    probes (which refuse such examples) and :mod:`analyses.interventions` (which leaves them out) apply."""
    y = cache.labels("topic", examples)
    bad = np.zeros(len(y), dtype=bool)
    for col in sorted(c for c in cache.examples.columns if re.fullmatch(r"label_topic_s\d+", c)):
        bad |= cache.labels(col[len("label_"):], examples) != y
    return bad


def _topic(cache: Cache, target: str, examples: np.ndarray) -> np.ndarray:
    """``topic`` where every example's sentences share one topic; ``topic_s1`` / ``topic_s<i>``."""
    if target == "topic_s1":
        return cache.labels("topic", examples)
    if target != "topic":
        return cache.labels(target, examples)
    mixed = int(topic_mismatch(cache, examples).sum())
    if mixed:
        raise ValueError(f"target 'topic' is undefined for {mixed} of {len(examples)} examples whose sentences do not "
                         "all share one topic (labels topic_s<i>); ask topic_s1 or topic_s2, or extract a corpus "
                         "with same-topic negatives")
    return cache.labels("topic", examples)


#: The multi-label targets: a bag of words (``bow_s<i>``) or of function words (``fw_s<i>``) of sentence i.
MULTILABEL_TARGET = re.compile(r"(bow|fw)_s(\d+)")


def is_multilabel(target: str) -> bool:
    """Whether ``target`` is a multi-label (bag-of-words) target, scored by micro-F1 and macro AUC.

    >>> is_multilabel("bow_s2"), is_multilabel("fw_s1"), is_multilabel("is_next")
    (True, True, False)
    """
    return MULTILABEL_TARGET.fullmatch(str(target)) is not None


def example_target(cache: Cache, target: str, examples: np.ndarray, vocab: int = 50) -> tuple[np.ndarray, bool]:
    """Target values for corpus indices ``examples``: ``(y, multilabel)``; see :data:`TARGETS`."""
    table = cache.examples.loc[examples]
    m = re.fullmatch(r"length(\d*)", target)
    if m:
        bins = int(m.group(1) or 3)
        if bins < 2:
            raise ValueError(f"target {target!r}: need at least 2 length bins")
        n = np.asarray([len(s.split()) for s in table["sentence_1"]])
        edges = np.unique(np.quantile(n, np.arange(1, bins) / bins))
        return np.searchsorted(edges, n, side="right"), False
    m = MULTILABEL_TARGET.fullmatch(target)
    if m:
        col = _sentence_column(table, target, m.group(2))
        pick = content_vocabulary if m.group(1) == "bow" else function_vocabulary
        words = pick(cache.examples[col].tolist(), vocab)
        Y = presence(table[col].tolist(), words) if words else np.zeros((len(table), 0), dtype=np.int64)
        Y = Y[:, (Y.sum(0) > 0) & (Y.sum(0) < len(Y))]  # a word present everywhere or nowhere says nothing
        if Y.shape[1] == 0:
            raise ValueError(f"target {target!r}: no word of its vocabulary varies across examples")
        return Y, True
    y = _topic(cache, target, examples) if re.fullmatch(r"topic(_s\d+)?", target) else cache.labels(target, examples)
    if y.dtype.kind == "f":
        raise ValueError(f"label {target!r} is continuous; probes need classes")
    return y, False


def length_features(cache: Cache, examples: np.ndarray) -> np.ndarray:
    """``(n_examples, k)``: whitespace words in each sentence of each example (the count of the
    ``length`` target and the ``n_words`` label), the features of the ``length_only`` baseline probe."""
    table = cache.examples.loc[examples]
    cols = sorted((c for c in table.columns if re.fullmatch(r"sentence_\d+", c)), key=lambda c: int(c[9:]))
    return np.asarray([[len(t.split()) for t in table[c]] for c in cols], dtype=np.float64).T


def _token_features(cache: Cache, layers: Sequence[int], max_tokens: int, seed: int):
    """Word tokens (first subwords) for ``segment``: features, sentence labels, example ids, word types
    (control task) and token rows."""
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
    return features, y, groups, types, rows


BACKENDS = ("auto", "torch", "sklearn")


def fit_probes(features: dict, y: np.ndarray, groups: np.ndarray, *, meta: dict, n_splits: int, seed: int,
               control_types, backend: str, device: str | None, Cs=None, inner_splits: int = 3,
               max_iter: int = 1000, num_threads: int | None = None, batch_mb: float | None = None,
               n_resamples: int = PROBE_RESAMPLES) -> tuple[pd.DataFrame, dict]:
    """All feature sets' probes: batched in torch (``probe_many_results``, the default; on the CPU in
    ``num_threads`` single-threaded workers, default one per core: see :mod:`probing.workers` and
    benchmarks/RESULTS.md), or one
    scikit-learn cross-validation per feature set (the reference path). Returns the tidy table and
    ``{(layer, choice): ProbeResult}`` (whose ``items`` are the out-of-fold predictions). ``batch_mb``:
    the batched path's memory bound per worker (:func:`batch_elements`)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    extra = {"inner_splits": inner_splits, "max_iter": max_iter, "n_resamples": n_resamples}
    if Cs is not None:
        extra["Cs"] = tuple(Cs)
    if backend in ("auto", "torch"):
        results = probe_many_results(features, y, groups, n_splits=n_splits, seed=seed, control_types=control_types,
                                     device=device, num_threads=num_threads,
                                     max_batch_elements=batch_elements(batch_mb), **extra)
    else:
        results = {key: cross_validate_probe(X, y, groups, n_splits=n_splits, seed=seed, control_types=control_types,
                                             **extra) for key, X in features.items()}
    rows = []
    for (layer, choice), res in results.items():
        rows.extend(probe_rows(res, **meta, layer=layer, choice=choice, seed=seed))
    return make_table(rows), results


def batch_elements(batch_mb: float | None) -> int:
    """``max_batch_elements`` of :func:`analyses.probes.probe_many_results` for a bound of
    ``batch_mb`` MiB per worker on one batch's largest tensors, in float32 (None: the default,
    :data:`analyses.probes._batched.MAX_BATCH_ELEMENTS`). A smaller bound solves fewer feature sets at a
    time: a lower peak once the corpus is large enough for the bound to bind, and more time. Results
    agree up to the optimiser's tolerance (float rounding differs with the batch's size, so a C on a
    near-tie can flip)."""
    if batch_mb is None:
        return MAX_BATCH_ELEMENTS
    if not (np.isfinite(batch_mb) and batch_mb > 0):
        raise ValueError(f"batch_mb must be a positive number of MiB, got {batch_mb!r}")
    return max(1, int(batch_mb * 2 ** 20 / 4))


#: The length-only baseline probe's key in a run's results (no layer).
LENGTH_ONLY = "length_only"


def auc_differences(results: dict, meta: dict, seed: int, versus: str | None = None,
                    length_versus: Sequence[str] | None = None) -> pd.DataFrame:
    """Each multi-label probe's macro AUC minus a reference probe's, on the same resamples of the same
    out-of-fold items (:meth:`analyses.probes.ProbeResult.auc_difference`): rows with
    ``metric="macro_auc_diff"``, ``choice_b`` the reference, CI, ``p_value`` (bootstrap-SE Wald) and ``p_holm``
    over the layers of each (choice, reference). References: the length-only probe, where it was fitted
    (is there more of a sentence's content than its length tells?), and the token choice ``versus`` at
    the same layer (is [CLS] ahead of mean pooling?). ``length_versus``: the choices compared with the
    length-only probe (None: every one)."""
    from analyses.stats import add_holm

    rows = []
    base = next((r for (layer, choice), r in results.items() if choice == LENGTH_ONLY), None)
    for (layer, choice), res in results.items():
        compared = choice != LENGTH_ONLY and (length_versus is None or choice in length_versus)
        refs = [(LENGTH_ONLY, base)] if base is not None and compared else []
        if versus is not None and choice not in (versus, LENGTH_ONLY) and (layer, versus) in results:
            refs.append((versus, results[layer, versus]))
        rows += [{"analysis": "probe", **meta, "layer": layer, "choice": choice, "choice_b": name,
                  "metric": "macro_auc_diff", "seed": int(seed), **res.auc_difference(ref)} for name, ref in refs]
    return add_holm(make_table(rows), ["choice", "choice_b", "metric"]) if rows else make_table([])


def random_init_differences(trained: dict, random: dict, meta: dict, seed: int, choices: Sequence[str]) -> pd.DataFrame:
    """Each multi-label probe of ``choices`` on the trained model (``trained``: ``(layer, choice) ->``
    :class:`~analyses.probes.ProbeResult`) minus the same probe on the random-init model (``random``),
    fitted on the same items, folds and resamples: rows with ``metric="macro_auc_diff"``, ``choice_b`` =
    ``choice``, ``model_kind_b="random_init"`` (``model_kind`` is set by the caller), ``p_holm`` over the
    layers of each choice. :meth:`~analyses.probes.ProbeResult.auc_difference` refuses results that
    do not share their items."""
    from analyses.stats import add_holm

    rows = [{"analysis": "probe", **meta, "layer": layer, "choice": choice, "choice_b": choice,
             "model_kind_b": "random_init", "metric": "macro_auc_diff", "seed": int(seed),
             **res.auc_difference(random[layer, choice])}
            for (layer, choice), res in trained.items() if choice in choices and (layer, choice) in random]
    return add_holm(make_table(rows), ["choice", "choice_b", "metric"]) if rows else make_table([])


def _item_rows(results: dict, meta: dict, kind: str, examples: np.ndarray, tokens: np.ndarray | None) -> pd.DataFrame:
    """The out-of-fold items of ``results`` keyed like the result table (:data:`ITEM_KEYS`); ``examples``
    (and ``tokens`` for token-level targets) map each item position to its example id (token row)."""
    frames = []
    for (layer, choice), res in results.items():
        it = res.items.copy()
        pos = it.pop("item").to_numpy()
        for col in ("y_true", "y_pred"):
            if col in it.columns:  # labels of different targets differ in type: stored as text
                it[col] = it[col].astype(str)
        it.insert(0, "example", examples[pos])
        it.insert(1, "token", tokens[pos] if tokens is not None else pd.NA)
        keys = {"model_kind": kind, "model": meta["model"], "corpus": meta["corpus"], "format": meta["format"],
                "target": meta["target"], "layer": layer, "choice": choice}
        for i, (k, v) in enumerate(keys.items()):
            it.insert(i, k, v)
        it.insert(len(keys), "grouping", meta["grouping"])
        frames.append(it)
    return pd.concat(frames, ignore_index=True)


def run_probes(cache: Cache, choices: Sequence[str] = ("cls", "mean"), targets: Sequence[str] = ("topic",), *,
               layers: Sequence[int] | None = None, random_cache: Cache | None = None, n_splits: int = 5,
               seed: int = 0, control: bool = True, vocab: int = 50, max_tokens: int = 6000,
               device: str | None = None, backend: str = "auto", Cs: Sequence[float] | None = None,
               inner_splits: int = 3, max_iter: int = 1000, bow_Cs: Sequence[float] | None = None,
               length_baseline: bool = False, length_versus: Sequence[str] | None = None,
               versus: str | None = None, random_versus: Sequence[str] | None = None, items: bool = False,
               num_threads: int | None = None, batch_mb: float | None = None, n_resamples: int = PROBE_RESAMPLES,
               out: str | Path | None = None, force: bool = False, progress: bool = True):
    """Probes for every layer x token choice x target, on ``cache`` and optionally ``random_cache``.

    ``Cs`` is the grid the inner CV chooses C from; ``bow_Cs``, if given, replaces it for the
    multi-label bag-of-words targets (one value = a fixed C, no inner CV: many labels make those
    probes the slowest, and the study uses this to stay within its time budget).

    Splits, inner CV and bootstrap group by document when the corpus has a ``doc`` label, else by
    example (:func:`analyses.stats.table_groups`); every row records ``grouping`` and ``n_groups``.
    ``length_baseline``: also a ``choice = "length_only"`` probe per example-level target (features:
    words per sentence; layer empty), on the same splits; ``length_versus``: the choices whose macro AUC is
    compared with it (None: every one; a study question owns its own comparisons, whose Holm family covers
    its targets). ``versus``: one of ``choices``; each other
    choice's macro AUC on a multi-label target is then compared with its at the same layer, on the same
    resamples of the same items (``macro_auc_diff`` rows, :func:`auc_differences`; the length-only probe
    is compared the same way). Returns the result table, or
    ``(table, items)`` with ``items=True`` (per-item out-of-fold predictions, see the module
    docstring; one row per item and probe, so ask for them where a comparison needs them); with
    ``out`` both are stored (``probe-<key>`` and ``probe_items-<key>``). ``layers``: model layers, a
    negative one counting from the last (-1 = the model's last layer; :func:`probing.layers.cache_layers`).
    ``num_threads``: CPU workers of the batched probes (None: one per core); ``batch_mb``: their memory
    bound per worker, MiB (:func:`batch_elements`; None: 256); ``n_resamples``: bootstrap
    resamples of each interval; ``progress``: a tqdm bar over (model x target) on stderr.
    ``device``: where the batched probes run (:func:`probing.models.pick_device`; None or 'auto': CUDA if
    available)."""
    from probing.models import pick_device

    n_resamples = check_resamples(n_resamples)
    for c in choices:
        parse_choice(c)
    if versus is not None and versus not in choices:
        raise ValueError(f"versus={versus!r} is not one of the choices {list(choices)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if random_cache is not None:
        # the baseline must be this model's architecture with random weights, same corpus and format
        check_comparable(cache, random_cache, random_baseline=True)
    layers = cache_layers(cache, layers)
    run_device = None if backend == "sklearn" else str(pick_device(device))
    config = {"cache": cache_identity(cache), "random": cache_identity(random_cache) if random_cache else None,
              "backend": "sklearn" if backend == "sklearn" else "torch", "device": run_device,
              "choices": list(choices), "targets": list(targets), "layers": layers, "n_splits": n_splits,
              "seed": seed, "control": control, "vocab": vocab, "max_tokens": max_tokens,
              "Cs": None if Cs is None else list(Cs), "inner_splits": inner_splits, "max_iter": max_iter,
              "bow_Cs": None if bow_Cs is None else list(bow_Cs), "length_baseline": length_baseline,
              "n_resamples": n_resamples}
    if versus is not None:  # the key of a run without it stays what it was
        config["versus"] = versus
    if length_versus is not None:
        unknown = [c for c in length_versus if c not in choices]
        if unknown:
            raise ValueError(f"length_versus {unknown} are not among the choices {list(choices)}")
        config["length_versus"] = list(length_versus)
    if random_versus is not None:
        unknown = [c for c in random_versus if c not in choices]
        if unknown:
            raise ValueError(f"random_versus {unknown} are not among the choices {list(choices)}")
        if random_cache is None:
            raise ValueError("random_versus compares with the random-init model: give random_cache")
        config["random_versus"] = list(random_versus)
    path, done = stored_table(out, "probe", config, force)
    items_path, items_done = stored_table(out if items else None, "probe_items", config, force)
    if done is not None and (not items or items_done is not None):
        return (done, items_done) if items else done
    frames, item_frames = [], []
    pairs = [(cache, "trained")] + ([(random_cache, "random_init")] if random_cache is not None else [])
    for c, _ in pairs:  # an unknown label, or a doc label some examples lack, fails before any probe is fitted
        table_groups(c.examples, str(c.path))
        for target in targets:
            if target != "segment" and not re.fullmatch(r"length\d*|(bow|fw)_s\d+|topic_s\d+", target):
                c.labels(target)
    from tqdm.auto import tqdm

    kept: dict[str, tuple[dict, dict]] = {}  # target -> the trained run's results and meta, for random_versus
    bar = tqdm(total=len(pairs) * len(targets), desc=f"probes {cache.format_name}", disable=not progress,
               file=sys.stderr)
    for c, kind in pairs:
        # each (layer, choice) pooled once for all targets, kept on disk and read a batch at a time by
        # the probes, so that the feature sets not being solved are not in memory (analyses.stored)
        with PooledStore(lambda key, c=c: pooled(c, *key)) as store:
            for target in targets:
                meta = {"analysis": "probe", "model": model_label(c), "corpus": c.manifest["corpus"]["name"],
                        "format": c.format_name, "target": target}
                tokens = None
                if target == "segment":
                    features, y, ids, types, tokens = _token_features(c, layers, max_tokens, seed)
                    groups, grouping = table_groups(c.examples.loc[ids], str(c.path))
                    fit_kw = dict(control_types=types if control else None, Cs=Cs)
                    multilabel = False
                else:
                    features, ids = {}, None
                    for choice in choices:
                        for layer in layers:
                            ex, _ = store((layer, choice))
                            ids = ex if ids is None else np.intersect1d(ids, ex)
                    for choice in choices:
                        for layer in layers:
                            ex, X = store((layer, choice))
                            same = len(ex) == len(ids) and (ex == ids).all()  # the usual case: every row
                            features[(layer, choice)] = X if same else X.take(np.searchsorted(ex, ids))
                    y, multilabel = example_target(c, target, ids, vocab)
                    groups, grouping = table_groups(c.examples.loc[ids], str(c.path))
                    if length_baseline and kind == "trained":
                        features[(pd.NA, LENGTH_ONLY)] = length_features(c, ids)
                    fit_kw = dict(control_types=ids if control and not multilabel else None,
                                  Cs=bow_Cs if multilabel and bow_Cs is not None else Cs)
                meta["grouping"] = grouping
                df, results = fit_probes(features, y, groups, meta=meta, n_splits=n_splits, seed=seed, backend=backend,
                                         device=device, inner_splits=inner_splits, max_iter=max_iter,
                                         num_threads=num_threads, batch_mb=batch_mb, n_resamples=n_resamples,
                                         **fit_kw)
                if multilabel and ((length_baseline and kind == "trained") or versus is not None):
                    df = pd.concat([df, auc_differences(results, meta, seed, versus, length_versus)],
                                   ignore_index=True)
                df["model_kind"] = kind
                if multilabel and random_versus:
                    if kind == "trained":
                        kept[target] = ({k: r for k, r in results.items() if k[1] in random_versus}, meta)
                    else:  # rows of the trained model against this one
                        df = pd.concat([df, random_init_differences(kept[target][0], results, kept[target][1], seed,
                                                                    random_versus).assign(model_kind="trained")],
                                       ignore_index=True)
                frames.append(df)
                if items:
                    item_frames.append(_item_rows(results, meta, kind, ids, tokens))
                bar.update(1)
    bar.close()
    df = pd.concat(frames, ignore_index=True) if frames else make_table([])
    df.attrs.update(keep_table(df, path).attrs)  # where it went; the table returned as it was
    if not items:
        return df
    item_df = pd.concat(item_frames, ignore_index=True)
    item_df.attrs.update(keep_table(item_df, items_path).attrs)
    return df, item_df


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m analyses.probes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Linear probes (logistic regression, standardised features, C by grouped inner CV) on "
                    "cached states, scored by cross-validation grouped by document (by example when the "
                    "corpus has no documents), pooled out-of-fold scores with cluster-bootstrap CIs, the "
                    "majority baseline and the minimum detectable difference from it, a control task "
                    "(Hewitt & Liang 2019) and selectivity; optionally the same probes on a randomly "
                    "initialised model's cache. With --items the per-item out-of-fold predictions are "
                    "stored beside the table (probe_items-<key>).",
        epilog="targets:\n" + "\n".join(f"  {k:<11} {v}" for k, v in TARGETS.items())
               + "\ntoken choices: cls, sep<i>, sep_last, mean, max, first_word, mean_s<i>, pos<k>",
    )
    p.add_argument("cache", help="cache directory")
    p.add_argument("--choices", default="cls,mean", help="comma list of token choices (default cls,mean)")
    p.add_argument("--targets", default="topic", help="comma list of targets (default topic)")
    add_layers_option(p, "every layer stored")
    p.add_argument("--random-cache", default=None, help="cache of the same format from --random-init")
    add_probe_options(p, default_Cs=DEFAULT_CS)
    p.add_argument("--bow-Cs", type=positive_floats, nargs="+", default=None,
                   help="the C grid of bag-of-words targets (default: --Cs)")
    p.add_argument("--max-iter", type=int_at_least(1), default=1000, help="L-BFGS iterations per fit (default 1000)")
    p.add_argument("--vocab", type=int_at_least(1), default=50, help="words in bag-of-words targets (default 50)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=6000,
                   help="token-level targets: at most this many tokens (default 6000)")
    p.add_argument("--no-control", action="store_true", help="skip the control task")
    p.add_argument("--length-baseline", action="store_true",
                   help="also probe each example-level target from the sentences' word counts (choice length_only)")
    p.add_argument("--versus", default=None,
                   help="one of --choices: each other choice's macro AUC on a bag-of-words target minus this "
                        "one's, per layer, on the same resamples of the same out-of-fold items (metric macro_auc_diff)")
    p.add_argument("--random-versus", default=None,
                   help="comma list of --choices (needs --random-cache): each one's macro AUC on a bag-of-words target "
                        "minus the same choice's on the random-init model, per layer, on the same resamples of the "
                        "same out-of-fold items (metric macro_auc_diff, model_kind_b random_init)")
    p.add_argument("--device", default=None, help="torch device for the batched probes (default: CUDA if available)")
    p.add_argument("--threads", type=int_at_least(1), default=None,
                   help="CPU: the batched probes' feature sets are solved in this many single-threaded workers "
                        "(default: torch's thread count, the machine's cores)")
    p.add_argument("--batch-mb", type=positive_float, default=None,
                   help="memory bound of one batch of feature sets per worker, MiB: the features and the solver's "
                        "largest tensors (default 256); smaller holds fewer feature sets at once, which lowers the "
                        "peak on a large corpus and costs time; results agree up to the optimiser's tolerance")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="torch (default): all probes batched, on the GPU when present; "
                        "sklearn: one CV per probe (reference)")
    p.add_argument("--items", action="store_true",
                   help="also store the per-item out-of-fold predictions (probe_items-<key>, for compare_probes)")
    add_output_options(p, resamples=True)
    args = p.parse_args(argv)

    def flat(lists):
        return None if lists is None else [c for part in lists for c in part]

    try:
        cache = Cache.open(args.cache)
        rnd = Cache.open(args.random_cache) if args.random_cache else None
        layers = cache_layers(cache, args.layers)
        df = run_probes(cache, split_list(args.choices), split_list(args.targets), layers=layers, random_cache=rnd,
                        n_splits=args.folds, seed=args.seed, control=not args.no_control, vocab=args.vocab,
                        max_tokens=args.max_tokens, device=args.device, backend=args.backend, Cs=flat(args.Cs),
                        inner_splits=args.inner_folds, max_iter=args.max_iter, bow_Cs=flat(args.bow_Cs),
                        length_baseline=args.length_baseline, versus=args.versus,
                        random_versus=split_list(args.random_versus) if args.random_versus else None,
                        items=args.items, num_threads=args.threads,
                        batch_mb=args.batch_mb, n_resamples=args.resamples, out=args.out, force=args.force,
                        progress=not args.no_progress)
        written = list(df) if args.items else [df]
        df = written[0]
    except CLI_ERRORS as err:
        return cli_error(err)
    main_metric = df["metric"].isin(["accuracy", "micro_f1"])
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(df[main_metric].pivot_table(index="layer", columns=["model_kind", "target", "choice"], values="value",
                                          sort=False).to_string())
    print(table_lines(*written))
    return 0
