"""Centred kernel alignment (Kornblith et al. 2019): the metrics, their streaming accumulators, and the
runners that compare caches (the command ``python -m analyses.cka``, ``probing cka``).

* :mod:`analyses.cka._metrics`: linear, debiased, RBF and Gram-form CKA, and the layer x layer matrix;
* :mod:`analyses.cka._streaming`: mergeable batch accumulators (:class:`StreamingCKAMatrix`,
  :class:`StreamingLinearCKA`);
* :mod:`analyses.cka._numerics`: what both stand on (one code path for numpy and torch, input checks,
  exact power-of-two scaling, the shared HSIC algebra, :data:`MIN_ITEMS`);
* :mod:`analyses.cka._runner`: formats per layer, layer x layer, token choices within a cache, and
  the command line.
"""

from __future__ import annotations

from analyses.cka._metrics import gram_cka, linear_cka, linear_cka_matrix, rbf_cka
from analyses.cka._numerics import MIN_ITEMS, CKAUndefinedWarning
from analyses.cka._runner import (DEFAULT_METRICS, METRICS, RBF_MAX_ITEMS, main, roles_needed, run_cka_formats,
                                  run_cka_matrix, run_cka_roles)
from analyses.cka._streaming import StreamingCKAMatrix, StreamingLinearCKA

__all__ = ["DEFAULT_METRICS", "METRICS", "MIN_ITEMS", "RBF_MAX_ITEMS", "CKAUndefinedWarning", "StreamingCKAMatrix",
           "StreamingLinearCKA", "gram_cka", "linear_cka", "linear_cka_matrix", "main", "rbf_cka", "roles_needed",
           "run_cka_formats", "run_cka_matrix", "run_cka_roles"]
