"""Contextuality (Ethayarajh 2019): self-similarity, intra-sentence similarity and maximum explainable
variance of a cache's words against their random-word baselines (the command
``python -m analyses.contextuality``, ``probing contextuality``).

* :mod:`analyses.contextuality._metrics`: the pure metrics and the choice of words, types and
  occurrences they are computed over;
* :mod:`analyses.contextuality._runner`: a cache -> the table, and the command line.
"""

from __future__ import annotations

from analyses.contextuality._metrics import (choose_contexts, group_sums, intra_similarity, join_subwords,
                                             max_explainable_variance, random_word_sets, self_similarity,
                                             word_table)
from analyses.contextuality._runner import METRICS, contextuality_path, main, run_contextuality, summary_table

__all__ = ["METRICS", "choose_contexts", "contextuality_path", "group_sums", "intra_similarity", "join_subwords",
           "main", "max_explainable_variance", "random_word_sets", "run_contextuality", "self_similarity",
           "summary_table", "word_table"]
