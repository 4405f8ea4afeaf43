"""Linear probes: logistic regression on one layer's states of one token choice.

Protocol (DESIGN.md "Linear probes"), shared by the scikit-learn reference and the batched torch path:

* features standardised with the training rows' mean and (population) standard deviation;
* L2-penalised logistic regression with sklearn's objective
  ``sum_i log_loss_i + ||W||^2 / (2C)`` (intercept unpenalised), so a given ``C`` means the same
  thing in both paths; multinomial for more than two classes, a single sigmoid for two, one sigmoid
  per column (one-vs-rest, one shared ``C``) for multi-label targets;
* ``C`` chosen from a grid by an inner k-fold cross-validation on the outer training rows (grouped
  like the outer folds), then the probe is refit on all outer training rows;
* scored by an outer k-fold cross-validation grouped by ``groups`` (documents when the corpus has
  them, else examples: :func:`analyses.stats.table_groups`; a group never straddles train and test; stratified by
  label for single-label targets), pooled over the out-of-fold predictions (kept per item in
  ``ProbeResult.items``) with a 95% cluster-bootstrap interval over the groups, a majority
  baseline, the minimum detectable difference from it, and optionally a control task (Hewitt &
  Liang 2019, "Designing and Interpreting Probes with Control Tasks") with selectivity = task
  accuracy - control accuracy.

The family's modules (private; this package exports their public names, and ``python -m analyses.probes``
runs the command of :mod:`analyses.probes._runner`):

* :mod:`analyses.probes._metrics`: settings, validation, grouped splits, fold scores, control labels;
* :mod:`analyses.probes._estimator`: :class:`LinearProbe` (a scikit-learn classifier) and the MDL code;
* :mod:`analyses.probes._results`: :class:`ProbeResult`, tidy rows, :func:`cross_validate_probe`;
* :mod:`analyses.probes._solver`: the batched, preconditioned L-BFGS in torch;
* :mod:`analyses.probes._batched`: :func:`probe_many_results` / :func:`probe_many` over many feature sets;
* :mod:`analyses.probes._runner`: caches -> features and targets -> tables, and the command line;
* :mod:`analyses.probes._compare`: paired differences of probes on the same out-of-fold items;
* :mod:`analyses.probes._vocabulary`: which words the bag-of-words targets ask about.

``LinearProbe`` / ``cross_validate_probe`` are the scikit-learn reference (float64, one probe at a
time); ``probe_many`` / ``probe_many_results`` fit many feature sets (layers x token choices) x folds
x Cs as one batched L-BFGS problem in torch (float32 or float64, on the GPU when there is one) with
the same splits, grid, standardisation and objective, and agree with the reference to optimiser
tolerance (``tests/test_probes.py``; ``benchmarks/probe_speed.py`` times both).
``mdl_online_codelength`` gives the online code length of Voita & Titov (2020).

Result table (``probe-<key>``, one row per probe and metric; :func:`probe_rows`, the runner adds
the last two):

* ``analysis`` ("probe"), ``model``, ``corpus``, ``format``, ``format_b`` (empty), ``layer`` (model
  layer, 0 = embeddings; empty for ``choice = length_only``), ``role`` (empty: no stored token role),
  ``target``, ``choice`` (the token choice, or ``length_only``);
* ``metric``: ``accuracy`` or ``micro_f1`` (the primary metric), ``majority_baseline``, for
  multi-label targets ``macro_auc``, ``majority_baseline_macro_auc`` and ``chance_micro_f1``, with a
  control task ``control_accuracy`` / ``control_micro_f1`` and ``selectivity``;
* ``value``, ``ci_low``, ``ci_high`` (95% by default), ``ci_method`` (``cluster_bootstrap``: items
  pooled, groups resampled, the macro AUC too, from the items' out-of-fold scores; ``t_folds``: Student
  t over the outer folds, for the chance micro-F1 and the baseline's macro AUC);
* ``n`` (items), ``n_groups`` (documents or examples), ``n_folds`` (outer folds), ``seed`` (int: splits,
  control labels and bootstrap);
* ``mde``: on the primary metric's row, the smallest difference from the majority baseline this
  sample detects (80% power, two-sided 5%); NaN elsewhere;
* ``chosen_C``, ``chosen_C_min``, ``chosen_C_max``: median, smallest and largest C the inner CV chose
  over the outer folds (floats; with one C in the grid, that C);
* ``grouping`` (``document`` or ``example``), ``model_kind`` (``trained`` or ``random_init``).

:func:`probe_many` writes the same columns but the runner's two; a feature-set name that is not a
``(layer, role)`` pair goes into a ``feature`` column instead of ``layer`` / ``role``. The item table
(``probe_items-<key>``) is described in :mod:`analyses.probes._runner`.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> y = rng.integers(0, 3, 90); X = rng.normal(size=(90, 4)) + 3 * np.eye(4)[y]
>>> res = cross_validate_probe(X, y, groups=np.arange(90) // 3, Cs=(0.1, 1.0))
>>> res.mean > 0.9, res.scores.shape, round(res.majority_baseline, 2) < 0.5
(True, (5,), True)
"""

from __future__ import annotations

from analyses.probes._batched import probe_many, probe_many_results
from analyses.probes._compare import ITEM_KEYS, compare_probes
from analyses.probes._estimator import MDL_FRACTIONS, LinearProbe, mdl_online_codelength
from analyses.probes._metrics import (DEFAULT_CS, DTYPES, GROUPINGS, SELECT_BY, SelectBy, control_labels,
                                      fold_macro_auc, make_splits)
from analyses.probes._results import (ITEM_METRICS, PROBE_RESAMPLES, ProbeResult, cross_validate_probe, edge_share,
                                      probe_rows, probe_table)
from analyses.probes._runner import (batch_elements, example_target, is_multilabel, main, run_probes,
                                     topic_mismatch)
from analyses.probes._vocabulary import STOP_WORDS, content_vocabulary, function_vocabulary, presence, words_of
from analyses.stats import fold_t_interval

__all__ = ["DEFAULT_CS", "DTYPES", "GROUPINGS", "ITEM_KEYS", "ITEM_METRICS", "MDL_FRACTIONS", "PROBE_RESAMPLES",
           "SELECT_BY", "STOP_WORDS", "LinearProbe", "ProbeResult", "SelectBy", "batch_elements", "compare_probes",
           "content_vocabulary", "control_labels", "cross_validate_probe", "edge_share", "example_target",
           "fold_macro_auc", "fold_t_interval", "function_vocabulary", "is_multilabel", "make_splits", "main",
           "mdl_online_codelength", "presence", "probe_many", "probe_many_results", "probe_rows", "probe_table",
           "run_probes", "topic_mismatch", "words_of"]
