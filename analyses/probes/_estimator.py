"""The scikit-learn reference probe :class:`LinearProbe` (standardise + L2 logistic regression, C by
grouped inner CV) and the online code length of Voita & Titov (2020) built on it.

Protocol: :mod:`analyses.probes`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data
from threadpoolctl import threadpool_limits

from analyses.probes._metrics import (DEFAULT_CS, _CONSTANT_LOGIT, _PROB_FLOOR, SelectBy, _check_Cs, _check_X,
                                      _check_groups, _check_n_groups, _check_select_by, _check_y, _choose_C,
                                      _inner_score, _micro_f1, make_splits)

def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class LinearProbe(ClassifierMixin, BaseEstimator):
    """L2 logistic-regression probe on standardised features with C chosen by grouped inner CV.

    Objective (sklearn's): ``sum_i log_loss_i + ||W||^2 / (2C)``, intercept unpenalised; multinomial
    for more than two classes, one sigmoid for two, one sigmoid per column (one shared C) for a 0/1
    multi-label ``y: (n_items, n_labels)``.

    Parameters: ``Cs`` grid of C (sorted; ties go to the smallest), ``inner_splits`` folds of the
    inner grouped CV, ``select_by`` in ``SELECT_BY``, ``max_iter`` / ``tol`` of lbfgs, ``seed`` of
    the inner splits. With a single C no inner CV is run.

    Fitted attributes: ``C_``, ``Cs_`` (sorted grid), ``cv_scores_: (inner_splits, n_Cs)``
    (higher is better; NaN with one C), ``classes_`` (the labels; column indices for multi-label),
    ``multilabel_``, ``scaler_`` (``StandardScaler`` fit on the training rows), ``coef_:
    (n_outputs, dim)`` and ``intercept_: (n_outputs,)`` in standardised units (``n_outputs`` = 1
    for two classes), ``n_features_in_``.

    >>> rng = np.random.default_rng(0); X = rng.normal(size=(60, 3)); y = (X[:, 0] > 0).astype(int)
    >>> LinearProbe(Cs=[1.0]).fit(X, y).score(X, y) > 0.9
    True
    """

    def __init__(self, Cs: Sequence[float] = DEFAULT_CS, inner_splits: int = 3, select_by: SelectBy = "log_loss",
                 max_iter: int = 1000, tol: float = 1e-4, seed: int = 0):
        self.Cs = Cs
        self.inner_splits = inner_splits
        self.select_by = select_by
        self.max_iter = max_iter
        self.tol = tol
        self.seed = seed

    # One fit at a given C on standardised rows; ``warm`` carries LogisticRegression objects along the C path.
    def _fit_at(self, Xs: np.ndarray, y: np.ndarray, C: float, warm: dict) -> tuple[np.ndarray, np.ndarray]:
        def lr(key):
            if key not in warm:
                warm[key] = LogisticRegression(C=C, max_iter=self.max_iter, tol=self.tol, warm_start=True)
            return warm[key].set_params(C=C)

        if not self.multilabel_:
            present = np.unique(y)
            coef = np.zeros((1 if len(self.classes_) == 2 else len(self.classes_), Xs.shape[1]))
            intercept = np.zeros(coef.shape[0])
            if len(present) == 1:  # one class on these rows: predict it
                if len(self.classes_) == 2:
                    intercept[0] = _CONSTANT_LOGIT if present[0] == self.classes_[1] else -_CONSTANT_LOGIT
                else:
                    intercept[:] = -_CONSTANT_LOGIT
                    intercept[np.searchsorted(self.classes_, present[0])] = 0.0
                return coef, intercept
            model = lr("single").fit(Xs, y)
            if len(self.classes_) == 2:
                coef[0], intercept[0] = model.coef_[0], model.intercept_[0]
            elif len(present) == len(self.classes_):
                coef, intercept = model.coef_.copy(), model.intercept_.copy()
            else:  # a class absent from these rows: it gets the constant logit -30
                intercept[:] = -_CONSTANT_LOGIT
                rows = np.searchsorted(self.classes_, present)
                if len(present) == 2:
                    coef[rows[1]], intercept[rows[0]], intercept[rows[1]] = model.coef_[0], 0.0, model.intercept_[0]
                else:
                    coef[rows], intercept[rows] = model.coef_, model.intercept_
            return coef, intercept
        coef = np.zeros((y.shape[1], Xs.shape[1]))
        intercept = np.zeros(y.shape[1])
        for j in range(y.shape[1]):
            col = y[:, j]
            if col.min() == col.max():
                intercept[j] = _CONSTANT_LOGIT if col[0] == 1 else -_CONSTANT_LOGIT
                continue
            model = lr(j).fit(Xs, col)
            coef[j], intercept[j] = model.coef_[0], model.intercept_[0]
        return coef, intercept

    def _proba(self, Xs: np.ndarray, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
        z = Xs @ coef.T + intercept
        if self.multilabel_:
            return _sigmoid(z)
        if coef.shape[0] == 1:
            p = _sigmoid(z[:, 0])
            return np.stack([1 - p, p], axis=1)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def fit(self, X: Any, y: Any, groups: Any = None) -> "LinearProbe":
        """``X: (n_items, dim)``, ``y: (n_items,)`` or 0/1 ``(n_items, n_labels)``, ``groups: (n_items,)``
        example ids for the inner CV (None: every item its own group). Returns ``self``.

        BLAS runs on one thread inside ``fit``: each problem is small, and thread hand-offs in
        scipy's L-BFGS-B made fits 5-20x slower on a 2-core machine; parallelise over probes instead."""
        with threadpool_limits(limits=1, user_api="blas"):
            return self._fit(X, y, groups)

    def _validate_X(self, X: Any, reset: bool) -> np.ndarray:
        """scikit-learn's input checks (sparse refused, 1-D refused, ``n_features_in_``), then ours
        (every NaN/inf named by position)."""
        X = validate_data(self, X, reset=reset, dtype=np.float64, ensure_all_finite=False)
        return _check_X(X)

    def _fit(self, X: Any, y: Any, groups: Any) -> "LinearProbe":
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        X = self._validate_X(X, reset=True)
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:  # one 0/1 column is a binary target either way
            warnings.warn("A column-vector y was passed when a 1d array was expected; it is read as y.ravel(), "
                          "shape (n_items,)",
                          DataConversionWarning, stacklevel=3)
            y = y.ravel()
        type_of_target(y, input_name="y", raise_unknown=True)  # "Unknown label type" for e.g. objects
        y, self.multilabel_ = _check_y(y, X.shape)
        groups = _check_groups(groups, X.shape[0])
        _check_select_by(self.select_by)
        self.Cs_ = _check_Cs(self.Cs)
        self.classes_ = np.arange(y.shape[1]) if self.multilabel_ else np.unique(y)
        if len(self.Cs_) == 1:
            self.C_ = float(self.Cs_[0])
            self.cv_scores_ = np.full((self.inner_splits, 1), np.nan)
        else:
            _check_n_groups(groups, self.inner_splits, "inner_splits")
            splits = make_splits(y, groups, self.inner_splits, self.seed)
            self.cv_scores_ = np.empty((len(splits), len(self.Cs_)))
            for i, (tr, te) in enumerate(splits):
                scaler = StandardScaler().fit(X[tr])
                Xtr, Xte = scaler.transform(X[tr]), scaler.transform(X[te])
                warm: dict = {}
                for c, C in enumerate(self.Cs_):
                    coef, intercept = self._fit_at(Xtr, y[tr], C, warm)
                    P = self._proba(Xte, coef, intercept)
                    self.cv_scores_[i, c] = _inner_score(y[te], P, self.classes_, self.multilabel_, self.select_by)
            self.C_ = _choose_C(self.cv_scores_, self.Cs_)
        self.scaler_ = StandardScaler().fit(X)
        final: dict = {}
        self.coef_, self.intercept_ = self._fit_at(self.scaler_.transform(X), y, self.C_, final)
        self.n_iter_ = max(int(np.max(m.n_iter_)) for m in final.values())
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """``(n_items, n_classes)`` class probabilities (columns follow ``classes_``); per-label
        probabilities ``(n_items, n_labels)`` for multi-label."""
        check_is_fitted(self, "coef_")
        X = self._validate_X(X, reset=False)
        return self._proba(self.scaler_.transform(X), self.coef_, self.intercept_)

    def predict(self, X: Any) -> np.ndarray:
        """Most probable class ``(n_items,)``; 0/1 ``(n_items, n_labels)`` at threshold 0.5 for multi-label."""
        P = self.predict_proba(X)
        if self.multilabel_:
            return (P > 0.5).astype(np.int64)
        return self.classes_[np.argmax(P, axis=1)]

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy (micro-F1 for multi-label) on ``(X, y)``."""
        if sample_weight is not None:
            raise ValueError("LinearProbe.score does not take sample_weight")
        y = np.asarray(y)
        pred = self.predict(X)
        if self.multilabel_:
            return _micro_f1(y, pred.astype(bool))
        return float(np.mean(pred == y))


# --------------------------------------------------------------------------------------------------
# Minimum description length


#: Block boundaries of the online code as fractions of the items (Voita & Titov 2020, section 3.2).
MDL_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)


def mdl_online_codelength(X: Any, y: Any, groups: Any = None, *, fractions: Sequence[float] = MDL_FRACTIONS,
                          C: float = 1.0, seed: int = 0, max_iter: int = 1000) -> dict[str, float]:
    """Online code length of single-label ``y: (n_items,)`` given ``X: (n_items, dim)``, in bits.

    Voita & Titov 2020 ("Information-Theoretic Probing with Minimum Description Length", eq. 3):
    items are sent in a random order of whole groups (``groups: (n_items,)`` example ids; None: each
    item its own), in blocks ending at ``t_i ~ fractions[i] * n`` (moved forward to the next group
    boundary, so an example's tokens never straddle a block); the first block costs the uniform
    code ``t_1 log2 K`` and every later block ``-sum_j log2 p_i(y_j | x_j)`` under a
    :class:`LinearProbe` (fixed ``C``) trained on everything sent before it (a class it has not seen
    gets probability 1e-15). A block whose predecessors hold a single class is also sent with the
    uniform code.

    Returns ``codelength_bits``, ``uniform_bits`` (= n log2 K) and ``compression`` (= uniform /
    online; 1 means the probe learned nothing usable, larger is more easily extractable).
    """
    X = _check_X(X).astype(np.float64, copy=False)
    y, multilabel = _check_y(y, X.shape)
    if multilabel:
        raise ValueError(f"mdl_online_codelength takes single-label y; got y.shape={y.shape}")
    groups = _check_groups(groups, X.shape[0])
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.ndim != 1 or fr.size < 2 or not (np.all(np.diff(fr) > 0) and fr[0] > 0 and fr[-1] == 1.0):
        raise ValueError(f"fractions must increase from above 0 to exactly 1; got fractions={fr.tolist()}")
    n, classes = len(y), np.unique(y)
    rng = np.random.default_rng(seed)
    uniq, inverse = np.unique(groups, return_inverse=True)
    rank = rng.permutation(len(uniq))[inverse.ravel()]
    order = np.lexsort((rng.permutation(n), rank))  # whole groups in random order
    Xo, yo, go = X[order], y[order], rank[order]
    boundaries = np.flatnonzero(np.diff(go)) + 1  # first index of each new group
    cuts = []
    for f in fr:
        t = max(1, int(math.ceil(f * n)))
        after = boundaries[boundaries >= t]
        cuts.append(int(after[0]) if t < n and len(after) else n)
    cuts = sorted(set(cuts))
    bits = cuts[0] * math.log2(len(classes))
    for start, stop in zip(cuts[:-1], cuts[1:]):
        if len(np.unique(yo[:start])) < 2:
            bits += (stop - start) * math.log2(len(classes))
            continue
        probe = LinearProbe(Cs=(C,), max_iter=max_iter).fit(Xo[:start], yo[:start])
        P = probe.predict_proba(Xo[start:stop])
        column = {c: i for i, c in enumerate(probe.classes_.tolist())}  # a class not seen yet gets p = 0
        p = np.array([P[j, column[v]] if v in column else 0.0 for j, v in enumerate(yo[start:stop].tolist())])
        bits += float(-np.log2(np.clip(p, _PROB_FLOOR, None)).sum())
    uniform = n * math.log2(len(classes))
    return {"codelength_bits": bits, "uniform_bits": uniform, "compression": uniform / bits}

