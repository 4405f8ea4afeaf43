"""Analyses: pure metric functions of arrays, and thin runners that read caches and write tidy tables.

The notebook API: one function per analysis that takes :class:`probing.cache.Cache` objects and
returns its tidy table as a ``pandas.DataFrame`` (nothing written unless ``out=`` is given). Each
imports its runner when called, so ``import analyses`` stays light. They are named ``*_table``: a
package attribute named like a submodule (``analyses.drift``) would be replaced by that submodule as
soon as anything imports it. Layers are specs of :mod:`probing.layers` (``"-1"`` is the last layer);
token choices follow :mod:`analyses.selection` (``cls``, ``sep1``, ``mean``, ``mean_s1``, ...).
"""

from __future__ import annotations

from typing import Sequence
import sys as _sys

if getattr(_sys, "argv", [None])[:1] == ["-m"]:  # Python is locating a module to run: refuse a library module
    from probing.module_guard import refuse_library_run

    refuse_library_run()
del _sys

#: The notebook functions, declared once (tests check each against the submodule names).
API: tuple[str, ...] = ("drift_table", "cka_table", "probe_table", "attention_table", "contextuality_table",
                        "neighbours_table", "paired_drift_table", "calibration_table")
__all__ = list(API)


def drift_table(a, b, *, layers=None, **options):
    """1 − cos of the same tokens in caches ``a`` and ``b`` per layer and role group, with CIs and the
    anisotropy baseline (:func:`analyses.drift.run_drift`; options: ``subword``, ``standardise``,
    ``words_only``, ``n_resamples``, ``seed``, ``out``, ...)."""
    from analyses.drift import run_drift

    return run_drift(a, b, layers=layers, **{"progress": False, **options})


def cka_table(a, b=None, *, choices: Sequence[str] = ("cls", "mean"), layers=None, **options):
    """CKA per layer of each token choice between caches ``a`` and ``b`` (two formats, or two models
    on one corpus); with ``b=None``, between the pairs of choices ``choices`` = ``[("sep1", "cls"),
    ...]`` within ``a`` (:mod:`analyses.cka`; options: ``metrics``, ``out``, ``force``)."""
    from analyses.cka import run_cka_formats, run_cka_roles

    if b is None:
        return run_cka_roles(a, [tuple(p) for p in choices], layers=layers, **options)
    return run_cka_formats(a, b, list(choices), layers=layers, **options)


def probe_table(cache, *, choices: Sequence[str] = ("cls", "mean"), targets: Sequence[str] = ("topic",),
                layers=None, folds: int = 5, **options):
    """Linear-probe scores per layer, token choice and target, with CIs and baselines
    (:func:`analyses.probes.run_probes`; options: ``random_cache``, ``seed``, ``control``, ``items``,
    ``out``, ...). ``folds``: outer cross-validation folds."""
    from probing.layers import cache_layers
    from analyses.probes import run_probes

    return run_probes(cache, list(choices), list(targets), layers=cache_layers(cache, layers),
                      n_splits=folds, **{"progress": False, **options})


def attention_table(cache, **options):
    """Attention mass from each token group to cls, each sep<i>, its own and other sentences, per
    layer and head (:func:`analyses.attention.run_attention`; the cache needs ``attention=True``)."""
    from analyses.attention import run_attention

    return run_attention(cache, **options)


def contextuality_table(cache, *, layers=None, **options):
    """Anisotropy, self-similarity, intra-sentence similarity and MEV of the cache's words
    (:func:`analyses.contextuality.run_contextuality`)."""
    from analyses.contextuality import run_contextuality

    return run_contextuality(cache, layers=layers, **options)


def neighbours_table(cache, *, choices: Sequence[str] = ("cls", "mean"), targets: Sequence[str] = ("topic",),
                     layers=None, **options):
    """Nearest-neighbour label agreement per layer, token choice and target, against chance
    (:func:`analyses.neighbours.run_knn`, one call per target)."""
    import pandas as pd

    from analyses.neighbours import run_knn

    return pd.concat([run_knn(cache, list(choices), t, layers=layers, **options) for t in targets], ignore_index=True)


def paired_drift_table(ref, a, b, *, layers=None, **options):
    """drift(ref → b) − drift(ref → a) on the same token keys, with cluster-bootstrap CIs, sign-flip
    p-values and Holm across layers (:func:`analyses.paired.run_paired_drift`)."""
    from analyses.paired import run_paired_drift

    return run_paired_drift(ref, a, b, layers=layers, **{"progress": False, **options})


def calibration_table(path, **options):
    """Held-out MLM and pair accuracy, attention to [SEP] and anisotropy by layer of the models pretrained by
    :mod:`probing.pretrain` (a run's directory, or a run set's: every run under it), with the two BERT
    signatures (:func:`analyses.calibration.calibrate`; options: ``caches``, ``quick``, ``n_resamples``,
    ``seed``, ``device``, ``corpora``, ``out``). Writes ``calibration.csv`` into ``path`` unless ``out`` says
    where."""
    from analyses.calibration import calibrate

    return calibrate(path, **{"progress": False, **options})
