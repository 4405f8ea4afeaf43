"""Statistics shared by every analysis: one home each for intervals, paired differences, Holm and power.

* :mod:`analyses.stats._intervals`: the cluster bootstrap (:func:`bootstrap_ci`, :func:`bootstrap_cis`,
  :func:`ratio_bootstrap_ci`), the one floor on resamples (:func:`check_resamples`, :data:`MIN_RESAMPLES`) and
  Student t intervals (:func:`t_interval`, :func:`fold_t_interval`);
* :mod:`analyses.stats._stats`: paired differences (:func:`paired_difference`, :func:`sign_flip_p_value`),
  Holm's adjustment (:func:`holm`, and :func:`add_holm` for a table's families of rows), power
  (:func:`cluster_se`, :func:`minimum_detectable_effect`, :func:`groups_needed`, :func:`accuracy_mde`)
  and :func:`format_interval`;
* :mod:`analyses.stats._grouping`: the unit every split and bootstrap groups by (documents when the
  corpus has them, else examples: :func:`table_groups`, :func:`example_groups`, :func:`cache_groups`).
"""

from __future__ import annotations

from analyses.stats._grouping import DOC_LABEL, GROUPINGS, cache_groups, example_groups, group_info, table_groups
from analyses.stats._intervals import (CI_METHODS, DEFAULT_RESAMPLES, MIN_RESAMPLES, RNG_KW, CIMethod, bootstrap_ci,
                                       bootstrap_cis, check_confidence, check_resamples, check_values,
                                       fold_t_interval, group_codes, min_resamples, ratio_bootstrap_ci, t_interval,
                                       too_few_resamples)
from analyses.stats._stats import (DETECTABLE_EFFECT, accuracy_mde, add_holm, cluster_se, digits_for, format_interval,
                                   groups_needed, holm, minimum_detectable_effect, paired_difference, scale_difference,
                                   sign_flip_p_value, wald_p_value)

__all__ = ["CI_METHODS", "DEFAULT_RESAMPLES", "DETECTABLE_EFFECT", "DOC_LABEL", "GROUPINGS", "MIN_RESAMPLES", "RNG_KW",
           "CIMethod", "accuracy_mde", "add_holm", "bootstrap_ci", "bootstrap_cis", "cache_groups", "check_confidence",
           "check_resamples", "check_values", "min_resamples", "too_few_resamples",
           "cluster_se", "digits_for", "example_groups", "fold_t_interval", "format_interval", "group_codes",
           "group_info", "groups_needed", "holm", "minimum_detectable_effect", "paired_difference",
           "ratio_bootstrap_ci", "scale_difference", "sign_flip_p_value", "t_interval", "table_groups",
           "wald_p_value"]
