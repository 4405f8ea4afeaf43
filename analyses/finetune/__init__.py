"""Fine-tuning with each pooling (DESIGN.md Q8): is [CLS] better than mean pooling, and after
fine-tuning would any token do? The command ``python -m analyses.finetune`` (``probing pooling``).

* :mod:`analyses.finetune._poolings`: the poolings, named by the token-choice grammar of
  :mod:`analyses.selection` and read from rendered token roles;
* :mod:`analyses.finetune._config`: :class:`TrainConfig` and the presets;
* :mod:`analyses.finetune._train`: data, the training loop and one run (:func:`finetune`);
* :mod:`analyses.finetune._table`: the table's baseline, summary and paired rows;
* :mod:`analyses.finetune._experiment`: the experiment over poolings, folds and seeds with a frozen
  probe on the same splits (:func:`run_pooling_experiment`), and the command line;
* :mod:`analyses.finetune._protocol`: the study's shared fine-tuning protocol: tasks with one leak-free
  split each, runs as data (:class:`RunSpec`) run once (:func:`run_protocol`), paired comparisons over
  seeds and documents (:func:`compare_runs`);
* :mod:`analyses.finetune._tasks`: the examples of the protocol's pair tasks (``next``: is a pair coherent;
  ``topic``), built so that a split keeps every sentence on one side;
* :mod:`analyses.finetune._protocol_tables`: the protocol's accuracies and paired differences as a tidy table
  (:func:`protocol_table`).
"""

from __future__ import annotations

from analyses.finetune._config import PRESETS, SCHEDULES, TrainConfig, preset_config, resolve_autocast
from analyses.finetune._experiment import cv_splits, experiment_config, main, run_pooling_experiment
from analyses.finetune._poolings import POOLINGS, Pooling, get_pooling, pool, pooling_mask
from analyses.finetune._protocol import (CONDITIONS, PROTOCOL_PRESETS, ProtocolTask, RunSpec, accuracy, compare_runs,
                                         grouped_split, leak_groups, make_task, merge_conditions, run_protocol,
                                         shared_sentences, training_order)
from analyses.finetune._protocol_tables import majority, protocol_table, run_where
from analyses.finetune._tasks import NEGATIVES, article_units, next_sentence_examples, pair_topic_examples
from analyses.finetune._table import BASELINE, RUN_METRICS, SUMMARY_METRICS, diff_label, seed_document_ci
from analyses.finetune._train import (PooledClassifier, Task, epoch_batches, finetune, render_examples,
                                      sorted_batches, split_unit, train_test_split, training_inputs)

__all__ = ["BASELINE", "CONDITIONS", "NEGATIVES", "POOLINGS", "PRESETS", "PROTOCOL_PRESETS", "ProtocolTask", "RunSpec",
           "accuracy", "article_units", "compare_runs", "grouped_split", "leak_groups", "majority", "make_task",
           "merge_conditions", "next_sentence_examples", "pair_topic_examples", "protocol_table", "run_protocol",
           "run_where", "shared_sentences", "training_order", "RUN_METRICS", "SCHEDULES", "SUMMARY_METRICS",
           "PooledClassifier", "Pooling", "Task", "TrainConfig", "cv_splits", "diff_label", "epoch_batches",
           "experiment_config", "finetune", "get_pooling", "main", "pool", "pooling_mask", "preset_config",
           "render_examples", "resolve_autocast", "run_pooling_experiment", "seed_document_ci", "sorted_batches",
           "split_unit", "train_test_split", "training_inputs"]
