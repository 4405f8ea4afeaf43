"""Cosine drift between two formats of the same tokens (the command ``python -m analyses.drift``,
``probing drift``), from caches or computed during the forward pass with no cache.

* :mod:`analyses.drift._metrics`: the pure metrics (1 − cos, relative L2, standardisation, subword
  pooling, the anisotropy baseline, bootstrap summaries);
* :mod:`analyses.drift._runner`: two caches -> the drift table, and the command line;
* :mod:`analyses.drift._streaming`: :func:`stream_compare`, drift and linear CKA during the forward
  pass, built on :mod:`analyses.drift._stream_drift` (running sums and their Poisson bootstrap) and
  :mod:`analyses.drift._stream_index` (the positions each measurement needs, per batch).
"""

from __future__ import annotations

from analyses.drift._metrics import (DRIFT_METRICS, MIN_SPREAD, POOL_MODES, PoolMode, anisotropy_baseline,
                                     anisotropy_baseline_ci, drift_summary, fit_standardization, group_baseline,
                                     group_pair_cosines, normalised_drift, pair_spread, random_pair_cosines,
                                     random_pair_indices, relative_l2, rowwise_cosine, standardize, subword_pool)
from analyses.drift._runner import group_labels, main, paired_rows, run_drift, summary_table
from analyses.drift._streaming import STREAM_DRIFT_METRICS, STREAM_METRICS, SUBWORD_MODES, stream_compare

__all__ = ["DRIFT_METRICS", "MIN_SPREAD", "POOL_MODES", "STREAM_DRIFT_METRICS", "STREAM_METRICS", "SUBWORD_MODES",
           "PoolMode", "anisotropy_baseline", "anisotropy_baseline_ci", "drift_summary", "fit_standardization",
           "group_baseline", "group_labels", "group_pair_cosines", "main", "normalised_drift", "pair_spread",
           "paired_rows", "random_pair_cosines", "random_pair_indices", "relative_l2", "rowwise_cosine",
           "run_drift", "standardize", "stream_compare", "subword_pool", "summary_table"]
