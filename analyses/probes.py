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
  them, else examples: :func:`analyses.grouping.table_groups`; a group never straddles train and test; stratified by
  label for single-label targets), pooled over the out-of-fold predictions (kept per item in
  ``ProbeResult.items``) with a 95% cluster-bootstrap interval over the groups, a majority
  baseline, the minimum detectable difference from it, and optionally a control task (Hewitt &
  Liang 2019, "Designing and Interpreting Probes with Control Tasks") with selectivity = task
  accuracy - control accuracy.

``LinearProbe`` / ``cross_validate_probe`` are the scikit-learn reference (float64, one probe at a
time); ``probe_many`` / ``probe_many_results`` fit many feature sets (layers x token choices) x folds
x Cs as one batched L-BFGS problem in torch (float32 or float64, on the GPU when there is one) with
the same splits, grid, standardisation and objective, and agree with the reference to optimiser
tolerance (``tests/test_probes.py``; ``benchmarks/probe_speed.py`` times both).
``mdl_online_codelength`` gives the online code length of Voita & Titov (2020).

>>> rng = np.random.default_rng(0)
>>> y = rng.integers(0, 3, 90); X = rng.normal(size=(90, 4)) + 3 * np.eye(4)[y]
>>> res = cross_validate_probe(X, y, groups=np.arange(90) // 3, Cs=(0.1, 1.0))
>>> res.mean > 0.9, res.scores.shape, round(res.majority_baseline, 2) < 0.5
(True, (5,), True)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from analyses.results import make_table
from analyses.stats import cluster_se, minimum_detectable_effect

#: Default grid of inverse regularisation strengths (for standardised features).
DEFAULT_CS: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)

#: How the inner cross-validation ranks the Cs: held-out log-loss (a proper scoring rule, few ties on
#: small inner folds; the default sklearn's LogisticRegressionCV moves to in 1.11) or the primary
#: metric (accuracy; micro-F1 for multi-label targets).
SELECT_BY: tuple[str, ...] = ("log_loss", "metric")
SelectBy = Literal["log_loss", "metric"]

#: Floating-point types of the batched torch path.
DTYPES: tuple[str, ...] = ("float32", "float64")

# Logit margin for what the training rows leave no doubt about: a multi-label column constant on them
# (a word never or always present) or a class absent from them; sigmoid(30) ~ 1 - 1e-13.
_CONSTANT_LOGIT = 30.0
_PROB_FLOOR = 1e-15


# --------------------------------------------------------------------------------------------------
# Validation


def _check_X(X: Any, name: str = "X") -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be (n_items, dim); got {name}.shape={X.shape}")
    if not np.issubdtype(X.dtype, np.number):
        raise ValueError(f"{name} must be numeric; got {name}.dtype={X.dtype}")
    finite = np.isfinite(X)
    if not finite.all():
        i, j = np.argwhere(~finite)[0]
        raise ValueError(f"{name} contains {int((~finite).sum())} NaN/inf values (of {X.size}); "
                         f"first at {name}[{i}, {j}] = {X[i, j]} ({name}.shape={X.shape})")
    return X


def _check_y(y: Any, X_shape: tuple[int, ...], what: str = "y") -> tuple[np.ndarray, bool]:
    """Returns ``(y, multilabel)``. Single-label y: (n_items,); multi-label y: (n_items, n_labels) 0/1."""
    y = np.asarray(y)
    if y.ndim not in (1, 2):
        raise ValueError(f"{what} must be (n_items,) labels or (n_items, n_labels) 0/1; got {what}.shape={y.shape}")
    if y.shape[0] != X_shape[0]:
        raise ValueError(f"X and {what} differ in n_items: X.shape={X_shape}, {what}.shape={y.shape}")
    if y.ndim == 1:
        classes = np.unique(y)
        if len(classes) < 2:
            raise ValueError(f"{what} has a single class {classes.tolist()} over all {len(y)} items; "
                             "a probe needs at least two classes")
        return y, False
    values = np.unique(y)
    if not np.isin(values, (0, 1)).all():
        raise ValueError(f"multi-label {what} must hold only 0/1; found values {values[:10].tolist()}")
    varying = (y.min(axis=0) != y.max(axis=0)).sum()
    if varying == 0:
        raise ValueError(f"every column of multi-label {what} (shape {y.shape}) is constant over the "
                         "items; a probe needs at least one column with both 0 and 1")
    return y.astype(np.int64), True


def _check_groups(groups: Any, n: int) -> np.ndarray:
    if groups is None:
        return np.arange(n)
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must be (n_items,) = ({n},); got groups.shape={groups.shape}")
    return groups


def _check_n_groups(groups: np.ndarray, n_splits: int, what: str) -> int:
    if not isinstance(n_splits, (int, np.integer)) or n_splits < 2:
        raise ValueError(f"{what} must be an integer >= 2; got {what}={n_splits!r}")
    n_groups = len(np.unique(groups))
    if n_groups < n_splits:
        raise ValueError(f"only {n_groups} distinct groups (example ids) for {what}={n_splits}; "
                         "grouped cross-validation needs at least as many groups as folds")
    return n_groups


def _check_Cs(Cs: Any) -> np.ndarray:
    Cs = np.atleast_1d(np.asarray(Cs, dtype=np.float64))
    if Cs.ndim != 1 or Cs.size == 0 or not (np.isfinite(Cs) & (Cs > 0)).all():
        raise ValueError(f"Cs must be a non-empty list of positive finite numbers; got Cs={Cs.tolist()}")
    return np.unique(Cs)  # sorted ascending: ties in the inner CV go to the strongest penalty


def _check_select_by(select_by: str) -> str:
    if select_by not in SELECT_BY:
        raise ValueError(f"select_by must be one of {SELECT_BY}; got select_by={select_by!r}")
    return select_by


# --------------------------------------------------------------------------------------------------
# Splits, scores and intervals shared by both paths


def make_splits(y: np.ndarray, groups: np.ndarray, n_splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Grouped k-fold splits ``[(train_idx, test_idx), ...]`` (sorted index arrays).

    Single-label ``y: (n_items,)``: ``StratifiedGroupKFold`` (keeps label proportions per fold);
    multi-label ``y: (n_items, n_labels)``: ``GroupKFold``. Both shuffled with ``seed``. A group
    (example id) is always wholly in train or wholly in test.
    """
    y = np.asarray(y)
    groups = np.asarray(groups)
    _check_n_groups(groups, n_splits, "n_splits")
    if y.ndim == 1:
        splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
        splits = list(splitter.split(np.zeros((len(y), 1)), y, groups))
    else:
        splitter = GroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
        splits = list(splitter.split(np.zeros((len(y), 1)), y, groups))
    sizes = [len(te) for _, te in splits]
    if min(sizes) == 0:
        raise ValueError(f"a fold came out empty (test sizes {sizes}); use fewer folds than {n_splits}")
    return [(np.sort(tr), np.sort(te)) for tr, te in splits]


#: How items are grouped for splits, inner CV and bootstraps: by the document they come from (the corpus
#: has a ``doc`` label), or each example on its own.
GROUPINGS: tuple[str, ...] = ("document", "example")


def fold_t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval over folds: ``mean -/+ t_{(1+conf)/2, k-1} * s / sqrt(k)``.

    ``s`` is the sample standard deviation (ddof=1) of the k fold values; ``scipy.stats.t.ppf``
    gives the quantile. Folds share training rows, so the interval is approximate (it tends to be
    too narrow; Nadeau & Bengio 2003). NaN bounds for fewer than two finite values.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if v.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + confidence / 2, df=v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


def _micro_f1(Y: np.ndarray, pred: np.ndarray) -> float:
    """Micro-F1 = 2 TP / (2 TP + FP + FN) pooled over items and labels (0 when there are no positives)."""
    tp = float((pred & (Y == 1)).sum())
    fp = float((pred & (Y == 0)).sum())
    fn = float((~pred & (Y == 1)).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0


def _macro_auc(Y: np.ndarray, P: np.ndarray) -> float:
    """Mean ROC AUC over the labels that have both 0 and 1 among ``Y``'s rows (NaN if none has)."""
    ok = (Y.min(axis=0) != Y.max(axis=0))
    if not ok.any():
        return math.nan
    return float(roc_auc_score(Y[:, ok], P[:, ok], average="macro"))


def _evaluate_fold(y_train: np.ndarray, y_test: np.ndarray, P_test: np.ndarray, classes: np.ndarray,
                   multilabel: bool) -> dict[str, float]:
    """Scores of one outer fold.

    Single-label: ``accuracy`` of ``classes[argmax P]``; ``majority_baseline`` = accuracy of always
    predicting the training fold's most frequent label. Multi-label (``P_test: (n_test, n_labels)``):
    ``micro_f1`` at threshold 0.5 and ``macro_auc``; ``majority_baseline`` = micro-F1 of predicting
    each label's training majority value (prevalence > 0.5), ``majority_baseline_macro_auc`` = AUC of
    scoring every item with the training prevalence (constant scores, so 0.5), and
    ``chance_micro_f1`` = expected micro-F1 of guessing label j with probability p_j (training
    prevalence), ``2 sum_j p_j q_j / (sum_j p_j + sum_j q_j)`` with q_j the test prevalence (ratio of
    expectations).
    """
    if not multilabel:
        pred = classes[np.argmax(P_test, axis=1)]
        labels, counts = np.unique(y_train, return_counts=True)
        majority = labels[np.argmax(counts)]
        return {"accuracy": float(np.mean(pred == y_test)),
                "majority_baseline": float(np.mean(y_test == majority))}
    p = y_train.mean(axis=0)
    q = y_test.mean(axis=0)
    const = np.broadcast_to(p, y_test.shape)
    return {
        "micro_f1": _micro_f1(y_test, P_test > 0.5),
        "macro_auc": _macro_auc(y_test, P_test),
        "majority_baseline": _micro_f1(y_test, np.broadcast_to(p > 0.5, y_test.shape)),
        "majority_baseline_macro_auc": _macro_auc(y_test, const),
        "chance_micro_f1": float(2 * (p * q).sum() / (p.sum() + q.sum())) if p.sum() + q.sum() > 0 else 0.0,
    }


def _fold_items(y_train: np.ndarray, y_test: np.ndarray, P_test: np.ndarray, classes: np.ndarray,
                multilabel: bool) -> dict[str, np.ndarray]:
    """Per-item out-of-fold outputs of one outer fold, each ``(n_test,)``.

    ``num`` / ``den``: the item's contribution to the primary metric, which is ``Σ num / Σ den`` over
    any set of items: single-label ``num`` = 1 if correct, ``den`` = 1 (accuracy); multi-label
    ``num = 2 TP_i``, ``den = 2 TP_i + FP_i + FN_i`` (micro-F1). ``correct``: single-label 0/1;
    multi-label the item's own F1 ``num / den`` (1 when it has no true and no predicted label), the
    per-item score paired comparisons use. ``baseline_num`` / ``baseline_den``: the same for the
    majority baseline of :func:`_evaluate_fold`. Single-label also ``y_pred`` (the predicted label).
    """
    if not multilabel:
        pred = classes[np.argmax(P_test, axis=1)]
        labels, counts = np.unique(y_train, return_counts=True)
        correct = (pred == y_test).astype(np.float64)
        ones = np.ones(len(y_test))
        return {"y_pred": pred, "num": correct, "den": ones, "correct": correct,
                "baseline_num": (y_test == labels[np.argmax(counts)]).astype(np.float64), "baseline_den": ones}

    def contributions(pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        truth = y_test == 1
        tp, fp, fn = (pred & truth).sum(1), (pred & ~truth).sum(1), (~pred & truth).sum(1)
        return 2.0 * tp, 2.0 * tp + fp + fn

    num, den = contributions(P_test > 0.5)
    b_num, b_den = contributions(np.broadcast_to(y_train.mean(axis=0) > 0.5, y_test.shape))
    correct = np.divide(num, den, out=np.ones_like(num), where=den > 0)
    return {"num": num, "den": den, "correct": correct, "baseline_num": b_num, "baseline_den": b_den}


def _inner_score(y_test: np.ndarray, P_test: np.ndarray, classes: np.ndarray, multilabel: bool,
                 select_by: str) -> float:
    """Higher-is-better inner-CV score: minus mean log-loss (per item; per item and label for
    multi-label), or accuracy / micro-F1."""
    if multilabel:
        if select_by == "metric":
            return _micro_f1(y_test, P_test > 0.5)
        P = np.clip(P_test, _PROB_FLOOR, 1 - _PROB_FLOOR)
        return float(np.mean(y_test * np.log(P) + (1 - y_test) * np.log1p(-P)))
    idx = np.searchsorted(classes, y_test)
    if select_by == "metric":
        return float(np.mean(np.argmax(P_test, axis=1) == idx))
    return float(np.mean(np.log(np.clip(P_test[np.arange(len(idx)), idx], _PROB_FLOOR, None))))


def _choose_C(scores: np.ndarray, Cs: np.ndarray) -> float:
    """``scores: (n_inner, n_Cs)`` higher-is-better; best mean, ties to the smallest C."""
    mean = scores.mean(axis=0)
    return float(Cs[np.flatnonzero(mean >= mean.max() - 1e-12)[0]])


def control_labels(y: Any, types: Any, seed: int = 0) -> np.ndarray:
    """Control task of Hewitt & Liang (2019, section 2): each distinct type gets one fixed random label.

    ``y: (n_items,)`` (or ``(n_items, n_labels)``), ``types: (n_items,)`` (word type, example id, ...).
    For every distinct type one item is drawn uniformly at random and its label (row) becomes the
    type's control label, so control labels follow the empirical distribution of ``y`` and every
    item of a type shares one label. Returns an array shaped like ``y``.

    >>> control_labels(np.array([0, 1, 1, 1]), ["a", "b", "a", "c"], seed=0).shape
    (4,)
    """
    y = np.asarray(y)
    types = np.asarray(types)
    if types.shape != (y.shape[0],):
        raise ValueError(f"types must be (n_items,) = ({y.shape[0]},); got types.shape={types.shape}, y.shape={y.shape}")
    _, inverse = np.unique(types, return_inverse=True)
    donors = np.random.default_rng(seed).integers(0, y.shape[0], size=inverse.max() + 1)
    return y[donors][inverse.ravel()]


# --------------------------------------------------------------------------------------------------
# scikit-learn reference


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

    def _fit(self, X: Any, y: Any, groups: Any) -> "LinearProbe":
        X = _check_X(X).astype(np.float64, copy=False)
        y, self.multilabel_ = _check_y(y, X.shape)
        groups = _check_groups(groups, X.shape[0])
        _check_select_by(self.select_by)
        self.Cs_ = _check_Cs(self.Cs)
        self.classes_ = np.arange(y.shape[1]) if self.multilabel_ else np.unique(y)
        self.n_features_in_ = X.shape[1]
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
        self.coef_, self.intercept_ = self._fit_at(self.scaler_.transform(X), y, self.C_, {})
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """``(n_items, n_classes)`` class probabilities (columns follow ``classes_``); per-label
        probabilities ``(n_items, n_labels)`` for multi-label."""
        check_is_fitted(self, "coef_")
        X = _check_X(X).astype(np.float64, copy=False)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features but the probe was fit on {self.n_features_in_} (X.shape={X.shape})")
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
# Results


#: Metrics whose interval comes from the cluster bootstrap of out-of-fold items (the rest, macro AUC
#: and the chance micro-F1, are fold-level: mean and t-interval over folds).
ITEM_METRICS: tuple[str, ...] = ("accuracy", "micro_f1", "majority_baseline", "control_accuracy",
                                 "control_micro_f1", "selectivity")
#: Default number of bootstrap resamples of a probe's interval.
PROBE_RESAMPLES = 1000


@dataclass(frozen=True)
class ProbeResult:
    """Cross-validated probe scores and the out-of-fold predictions behind them.

    ``metric`` is the primary metric: ``"accuracy"`` (single-label) or ``"micro_f1"`` (multi-label).
    ``folds`` maps each metric name to its ``(n_splits,)`` per-fold values: the primary metric,
    ``majority_baseline`` (same metric), for multi-label also ``macro_auc``,
    ``majority_baseline_macro_auc`` and ``chance_micro_f1``; with a control task
    ``control_<metric>`` and ``selectivity`` = ``<metric> - control_<metric>`` per fold.
    ``chosen_Cs: (n_splits,)`` is the C picked by the inner CV in each outer fold
    (``control_chosen_Cs`` for the control probe).

    ``items``: one row per item (every item is tested exactly once), columns ``item`` (position in
    the inputs), ``group``, ``fold``, ``y_true`` / ``y_pred`` (single-label), ``num`` / ``den``
    (contribution to the primary metric, which is ``Σ num / Σ den``), ``correct`` (0/1, or the
    item's F1 for multi-label), ``baseline_num`` / ``baseline_den`` (majority baseline) and, with a
    control task, ``control_num`` / ``control_den`` / ``control_correct``.

    Intervals (:meth:`interval`): the metrics of :data:`ITEM_METRICS` are pooled over all
    out-of-fold items (``Σ num / Σ den``) with a percentile cluster bootstrap over ``group``
    (documents or examples; ``n_resamples`` resamples, ``seed``); selectivity is the paired
    difference of the task and control scores on the same resamples. Fold-level metrics (macro AUC,
    chance micro-F1) keep the mean and t-interval over folds (:func:`fold_t_interval`).
    """

    metric: str
    folds: Mapping[str, np.ndarray]
    chosen_Cs: np.ndarray
    n: int
    n_groups: int
    control_chosen_Cs: np.ndarray | None = None
    confidence: float = 0.95
    items: pd.DataFrame | None = field(default=None, compare=False, repr=False)
    n_resamples: int = PROBE_RESAMPLES
    seed: int = 0

    @functools.cached_property
    def _item_intervals(self) -> dict[str, tuple[float, float, float]]:
        it = self.items
        ctrl = f"control_{self.metric}"
        parts = {self.metric: ("num", "den"), "majority_baseline": ("baseline_num", "baseline_den")}
        if "control_num" in it.columns:
            parts[ctrl] = ("control_num", "control_den")
        _, codes = np.unique(it["group"].to_numpy(), return_inverse=True)
        codes = codes.reshape(-1)
        G = int(codes.max()) + 1
        sums = {k: (np.bincount(codes, weights=it[a].to_numpy(float), minlength=G),
                    np.bincount(codes, weights=it[b].to_numpy(float), minlength=G)) for k, (a, b) in parts.items()}
        point = {k: float(sn.sum() / sd.sum()) if sd.sum() > 0 else math.nan for k, (sn, sd) in sums.items()}
        if ctrl in point:
            point["selectivity"] = point[self.metric] - point[ctrl]
        if G < 2:
            return {k: (v, math.nan, math.nan) for k, v in point.items()}
        draws = np.random.default_rng(self.seed).integers(0, G, size=(self.n_resamples, G))
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = {k: sn[draws].sum(1) / sd[draws].sum(1) for k, (sn, sd) in sums.items()}
        if ctrl in boot:
            boot["selectivity"] = boot[self.metric] - boot[ctrl]
        a = (1 - self.confidence) / 2
        out = {}
        for k, b in boot.items():
            b = b[np.isfinite(b)]
            lo, hi = np.quantile(b, [a, 1 - a]) if b.size else (math.nan, math.nan)
            out[k] = (point[k], float(lo), float(hi))
        return out

    def ci_method(self, name: str | None = None) -> str:
        """``"cluster_bootstrap"`` (items pooled, groups resampled) or ``"t_folds"`` (t over folds)."""
        name = name if name is not None else self.metric
        return "cluster_bootstrap" if self.items is not None and name in self._item_intervals else "t_folds"

    def interval(self, name: str | None = None) -> tuple[float, float, float]:
        """``(value, ci_low, ci_high)`` of one metric (the primary metric by default); see the class."""
        name = name if name is not None else self.metric
        if self.ci_method(name) == "cluster_bootstrap":
            return self._item_intervals[name]
        return fold_t_interval(self.folds[name], self.confidence)

    @property
    def scores(self) -> np.ndarray:
        """Per-fold values of the primary metric, ``(n_splits,)``."""
        return self.folds[self.metric]

    @property
    def mean(self) -> float:
        """The primary metric (pooled over out-of-fold items when they are kept)."""
        return self.interval()[0]

    @property
    def ci(self) -> tuple[float, float]:
        return self.interval()[1:]

    @property
    def majority_baseline(self) -> float:
        return self.interval("majority_baseline")[0]

    @property
    def control_score(self) -> float | None:
        key = f"control_{self.metric}"
        return self.interval(key)[0] if key in self.folds else None

    @property
    def selectivity(self) -> float | None:
        return self.interval("selectivity")[0] if "selectivity" in self.folds else None

    @property
    def mde(self) -> float:
        """Minimum detectable difference from the majority baseline at this sample
        (:func:`analyses.stats.minimum_detectable_effect` of the cluster-robust SE of the per-item
        score minus the baseline's per-item score); NaN without items."""
        if self.items is None:
            return math.nan
        it = self.items
        base = np.divide(it["baseline_num"].to_numpy(float), it["baseline_den"].to_numpy(float),
                         out=np.ones(len(it)), where=it["baseline_den"].to_numpy(float) > 0)
        se = cluster_se(it["correct"].to_numpy(float) - base, it["group"].to_numpy())
        return minimum_detectable_effect(se) if np.isfinite(se) else math.nan

    def summary(self) -> dict[str, tuple[float, float, float]]:
        """Every metric -> ``(value, ci_low, ci_high)``."""
        return {name: self.interval(name) for name in self.folds}


def _items_table(outer, fold_items: list[dict[str, np.ndarray]], y: np.ndarray, groups: np.ndarray,
                 multilabel: bool, control_items: list[dict[str, np.ndarray]] | None) -> pd.DataFrame:
    """The per-item out-of-fold table of :class:`ProbeResult` from each fold's :func:`_fold_items`."""
    parts = []
    for o, (_, te) in enumerate(outer):
        d = {"item": te, "group": groups[te], "fold": np.full(len(te), o)}
        if not multilabel:
            d["y_true"] = y[te]
        d.update(fold_items[o])
        if control_items is not None:
            c = control_items[o]
            d.update(control_num=c["num"], control_den=c["den"], control_correct=c["correct"])
        parts.append(pd.DataFrame(d))
    return pd.concat(parts, ignore_index=True).sort_values("item", kind="stable").reset_index(drop=True)


def _result(multilabel: bool, fold_dicts: list[dict[str, float]], chosen: list[float], n: int, n_groups: int,
            control: list[float] | None, control_Cs: list[float] | None, confidence: float,
            items: pd.DataFrame | None = None, n_resamples: int = PROBE_RESAMPLES, seed: int = 0) -> ProbeResult:
    metric = "micro_f1" if multilabel else "accuracy"
    folds = {k: np.array([d[k] for d in fold_dicts]) for k in fold_dicts[0]}
    if control is not None:
        folds[f"control_{metric}"] = np.asarray(control, dtype=np.float64)
        folds["selectivity"] = folds[metric] - folds[f"control_{metric}"]
    return ProbeResult(metric=metric, folds=folds, chosen_Cs=np.asarray(chosen), n=n, n_groups=n_groups,
                       control_chosen_Cs=None if control_Cs is None else np.asarray(control_Cs),
                       confidence=confidence, items=items, n_resamples=n_resamples, seed=seed)


def probe_rows(result: ProbeResult, *, analysis: str = "probe", model: str | None = None,
               corpus: str | None = None, format: str | None = None, layer: int | None = None,
               role: str | None = None, target: str | None = None, seed: int | None = None,
               **extra: Any) -> list[dict[str, Any]]:
    """One tidy row per metric of ``result`` (value, ci_low, ci_high from :meth:`ProbeResult.interval`,
    n = items), with extra columns ``ci_method`` (``cluster_bootstrap`` or ``t_folds``), ``mde``
    (on the primary metric's row: :attr:`ProbeResult.mde`, the smallest difference from the majority
    baseline this sample detects; NaN on other rows), ``n_folds``, ``n_groups`` and ``chosen_C``
    (per-fold Cs joined by ';'). Feed to :func:`analyses.results.make_table`."""
    chosen = ";".join(f"{c:g}" for c in result.chosen_Cs)
    rows = []
    for name, (value, lo, hi) in result.summary().items():
        rows.append({"analysis": analysis, "model": model, "corpus": corpus, "format": format, "layer": layer,
                     "role": role, "target": target, "metric": name, "value": value, "ci_low": lo, "ci_high": hi,
                     "n": result.n, "seed": seed, "n_folds": len(result.scores), "n_groups": result.n_groups,
                     "ci_method": result.ci_method(name), "mde": result.mde if name == result.metric else math.nan,
                     "chosen_C": chosen, **extra})
    return rows


def probe_table(result: ProbeResult, **meta: Any) -> pd.DataFrame:
    """:func:`probe_rows` as a tidy DataFrame (``make_table``)."""
    return make_table(probe_rows(result, **meta))


# --------------------------------------------------------------------------------------------------
# Cross-validation with the reference probe


def cross_validate_probe(X: Any, y: Any, groups: Any = None, n_splits: int = 5, seed: int = 0, *,
                         Cs: Sequence[float] = DEFAULT_CS, inner_splits: int = 3, select_by: SelectBy = "log_loss",
                         max_iter: int = 1000, tol: float = 1e-4, control_types: Any = None,
                         confidence: float = 0.95, n_resamples: int = PROBE_RESAMPLES) -> ProbeResult:
    """Grouped outer k-fold CV of :class:`LinearProbe` (scikit-learn reference path).

    ``X: (n_items, dim)``; ``y: (n_items,)`` labels, or ``(n_items, n_labels)`` 0/1 for a
    multi-label (bag-of-words) target; ``groups: (n_items,)`` example ids (None: each item its own).
    Outer splits: :func:`make_splits` with ``seed``; in each outer fold the probe standardises on
    the training rows, picks C by grouped inner CV (``inner_splits``, same ``seed``) and refits.

    Reported (see :class:`ProbeResult`): single-label -> accuracy pooled over the out-of-fold
    predictions with a 95% cluster-bootstrap interval over ``groups`` (``n_resamples``), the
    majority baseline (most frequent training-fold label scored on the test fold); multi-label ->
    micro-F1 (threshold 0.5, pooled the same way) and macro ROC AUC (over labels with both values in
    the test fold; mean and t-interval over folds), with the baselines of :func:`_evaluate_fold`.
    The per-item out-of-fold predictions are kept in ``result.items``. With ``control_types: (n_items,)`` the same probe is also fit, on the
    same folds, to :func:`control_labels` ``(y, control_types, seed)`` and ``control_<metric>`` and
    ``selectivity`` (Hewitt & Liang 2019) are added.
    """
    X = _check_X(X).astype(np.float64, copy=False)
    y, multilabel = _check_y(y, X.shape)
    groups = _check_groups(groups, X.shape[0])
    n_groups = _check_n_groups(groups, n_splits, "n_splits")
    probe = LinearProbe(Cs=Cs, inner_splits=inner_splits, select_by=select_by, max_iter=max_iter, tol=tol, seed=seed)
    splits = make_splits(y, groups, n_splits, seed)
    classes = np.arange(y.shape[1]) if multilabel else np.unique(y)

    def run(labels: np.ndarray):
        out, items, chosen = [], [], []
        for tr, te in splits:
            fitted = clone(probe).fit(X[tr], labels[tr], groups[tr])
            P = fitted.predict_proba(X[te])
            if not multilabel:  # align columns to the classes of the whole y
                full = np.zeros((len(te), len(classes)))
                full[:, np.searchsorted(classes, fitted.classes_)] = P
                P = full
            out.append(_evaluate_fold(labels[tr], labels[te], P, classes, multilabel))
            items.append(_fold_items(labels[tr], labels[te], P, classes, multilabel))
            chosen.append(fitted.C_)
        return out, items, chosen

    fold_dicts, fold_items, chosen = run(y)
    control = control_Cs = control_items = None
    if control_types is not None:
        yc, _ = _check_y(control_labels(y, control_types, seed), X.shape, what="control labels")
        control_dicts, control_items, control_Cs = run(yc)
        control = [d["micro_f1" if multilabel else "accuracy"] for d in control_dicts]
    items = _items_table(splits, fold_items, y, groups, multilabel, control_items)
    return _result(multilabel, fold_dicts, chosen, X.shape[0], n_groups, control, control_Cs, confidence,
                   items, n_resamples, seed)


# --------------------------------------------------------------------------------------------------
# Batched torch path


def _torch():
    import torch  # deferred: the reference path does not need torch

    return torch


class _Problems:
    """Many independent L2 logistic regressions sharing feature matrices.

    ``X1: (B, n, d + 1)`` feature sets with a trailing column of ones; problem ``(b, g)`` uses
    feature set b, training weights ``masks[:, g]`` (0/1, ``(n, G)``), 0/1 targets
    ``targets[:, :, g]`` (``(n, K, G)``: one-hot classes for "softmax", labels for "sigmoid") and
    ``inv_C[b, g]``. Standardisation with the training rows' mean ``mu`` and std ``sd``
    (``(B, G, d)``) is folded into the weights, so X is never copied per problem: logits
    ``Z = X @ (W / sd) + (b - (mu / sd) . W)``, one matmul with the intercept as the ones column's
    weight, laid out ``(B, n, K, G)``. Parameters ``theta: (B, G, (d + 1) * K)``, a view of
    ``(B, G, d + 1, K)``: rows ``:d`` weights in standardised units, row ``d`` the unpenalised
    intercept; each problem's parameters are contiguous so the optimiser's dot products are cheap.
    Objective per problem (sklearn's scaling, so ``tol`` means the same):
    ``f = sum_i m_i loss_i / n_g + ||W||^2 / (2 C n_g)``.
    """

    def __init__(self, X1, masks, targets, inv_C, kind: str):
        torch = _torch()
        self.X1, self.kind, self.K = X1, kind, targets.shape[1]
        n_g = masks.sum(0)  # (G,)
        mu = torch.einsum("bnd,ng->bgd", X1, masks) / n_g[:, None]
        ex2 = torch.einsum("bnd,ng->bgd", X1 * X1, masks) / n_g[:, None]
        var = (ex2 - mu * mu).clamp_min(0)
        # Features (globally standardised beforehand) that are constant on the training rows get scale 1,
        # like sklearn's StandardScaler; their weights stay ~0 since the training rows carry no gradient.
        tiny = 1e3 * torch.finfo(X1.dtype).eps
        self.sd = torch.where(var > tiny, var.sqrt(), torch.ones_like(var))
        self.sd[..., -1] = 1.0  # the ones column carries the intercept: not standardised
        self.mu_sd = mu / self.sd
        self.mu_sd[..., -1] = 0.0
        self._set(masks, targets, inv_C, n_g)

    def _set(self, masks, targets, inv_C, n_g):
        self.masks, self.targets, self.n_g = masks, targets, n_g
        self.w = masks / n_g  # (n, G) per-row weight in the mean loss
        self.wT = self.w[:, None, :] * targets  # (n, K, G)
        self.with_inv_C(inv_C, inplace=True)

    def with_inv_C(self, inv_C, inplace: bool = False) -> "_Problems":
        """The same problems with penalties ``inv_C: (B, G)`` (shares every other tensor)."""
        new = self if inplace else object.__new__(_Problems)
        if not inplace:
            new.__dict__.update(self.__dict__)
        new.inv_C, new.pen = inv_C, inv_C / self.n_g  # pen: (B, G)
        return new

    def select(self, rows, cols):
        """The sub-problem made of feature sets ``rows`` (indices into B) and columns ``cols`` (into G)."""
        new = object.__new__(_Problems)
        new.X1 = self.X1 if len(rows) == self.X1.shape[0] else self.X1[rows]
        new.kind, new.K = self.kind, self.K
        new.sd, new.mu_sd = self.sd[rows][:, cols], self.mu_sd[rows][:, cols]
        new._set(self.masks[:, cols], self.targets[..., cols], self.inv_C[rows][:, cols], self.n_g[cols])
        return new

    def logits(self, theta):
        """``Z: (B, n, K, G)`` for ``theta: (B, G, (d + 1) * K)``."""
        B, G, K, d1 = theta.shape[0], theta.shape[1], self.K, self.X1.shape[2]
        Wb = theta.view(B, G, d1, K)
        A = Wb / self.sd[..., None]
        A[:, :, -1] -= (self.mu_sd[:, :, None, :] @ Wb).squeeze(2)
        return (self.X1 @ A.permute(0, 2, 3, 1).reshape(B, d1, K * G)).view(B, -1, K, G)

    def item_loss_and_prob(self, Z):
        """Per-item loss ``(B, n, G)`` (cross-entropy; summed binary cross-entropy for "sigmoid")
        and probabilities ``(B, n, K, G)``."""
        torch = _torch()
        if self.kind == "softmax":
            m = Z.amax(2, keepdim=True)
            E = (Z - m).exp_()
            S = E.sum(2, keepdim=True)
            lse = (S.log() + m).squeeze(2)
            return lse - (Z * self.targets).sum(2), E.div_(S)
        loss = torch.nn.functional.softplus(Z).sub_(Z * self.targets).sum(2)
        return loss, torch.sigmoid(Z)

    def value_grad(self, theta):
        """Objective ``(B, G)`` and its gradient ``(B, G, (d + 1) * K)``."""
        torch = _torch()
        B, G, K, d1 = theta.shape[0], theta.shape[1], self.K, self.X1.shape[2]
        Wb = theta.view(B, G, d1, K)
        W = Wb[:, :, :-1]
        Z = self.logits(theta)
        fit = -(Z * self.wT).sum((1, 2))  # - sum_i w_i sum_k t_ik z_ik
        if self.kind == "softmax":
            m = Z.amax(2, keepdim=True)
            R = Z.sub_(m).exp_()  # Z is not needed any more
            S = R.sum(2, keepdim=True)
            fit += ((S.log() + m).squeeze(2) * self.w).sum(1)
            R.mul_(self.w[:, None, :] / S)
        else:
            fit += (torch.nn.functional.softplus(Z).sum(2) * self.w).sum(1)
            R = Z.sigmoid_().mul_(self.w[:, None, :])
        R.sub_(self.wT)  # d f / d Z
        f = fit + 0.5 * self.pen * (W * W).sum((2, 3))
        g = (self.X1.transpose(1, 2) @ R.view(B, -1, K * G)).view(B, d1, K, G).permute(0, 3, 1, 2)
        gc = g[:, :, -1:]  # (B, G, 1, K): d f / d intercept
        g = g / self.sd[..., None] - self.mu_sd[..., None] * gc
        g[:, :, :-1] += self.pen[..., None, None] * W
        return f, g.reshape(B, G, -1)


def _lbfgs(problems: _Problems, theta0, *, max_iter: int, tol: float, history: int = 10, max_ls: int = 40):
    """Batched L-BFGS, one independent run per problem (own history, step and stopping).

    Two-loop recursion (Nocedal & Wright 2006, alg. 7.4) on ``theta: (B, G, D)``; backtracking
    Armijo line search (c1 = 1e-4) from step 1. A problem stops when ``max|grad| <= tol`` (lbfgs'
    ``gtol`` in sklearn), when its objective stops moving (relative change below 4 machine
    epsilons) or when no step decreases it. Feature sets (rows) and columns whose problems have all
    stopped leave the batch as the run goes. Returns ``theta`` and the number of iterations per
    problem ``(B, G)``.
    """
    torch = _torch()
    theta = theta0.clone()
    B, G = theta.shape[:2]
    eps = torch.finfo(theta.dtype).eps
    out = theta.clone()
    iters = torch.zeros(B, G, dtype=torch.long, device=theta.device)
    rows, cols = torch.arange(B, device=theta.device), torch.arange(G, device=theta.device)

    def dot(u, v):
        return (u * v).sum(-1)

    f, g = problems.value_grad(theta)
    S = torch.zeros((history,) + theta.shape, dtype=theta.dtype, device=theta.device)
    Yh = torch.zeros_like(S)
    rho = torch.zeros(history, B, G, dtype=theta.dtype, device=theta.device)
    gamma = torch.clamp(1.0 / dot(g, g).sqrt().clamp_min(1e-30), max=1.0)  # first step: at most unit length
    done = g.abs().amax(-1) <= tol
    pos = 0
    for it in range(max_iter):
        if bool(done.all()):
            break
        # Drop the feature sets / columns whose problems have all stopped once they are a third of the batch.
        row_keep, col_keep = ~done.all(1), ~done.all(0)
        if int((~row_keep).sum()) * 3 >= len(row_keep) or int((~col_keep).sum()) * 3 >= len(col_keep):
            out[rows[:, None], cols[None, :]] = theta
            kr, kc = row_keep.nonzero().squeeze(1), col_keep.nonzero().squeeze(1)
            rows, cols, problems = rows[kr], cols[kc], problems.select(kr, kc)

            def sub(t, lead=0):
                t = t[(slice(None),) * lead + (kr,)]
                return t[(slice(None),) * (lead + 1) + (kc,)]

            theta, f, g, gamma, done = sub(theta), sub(f), sub(g), sub(gamma), sub(done)
            S, Yh, rho = sub(S, 1), sub(Yh, 1), sub(rho, 1)
        iters[rows[:, None], cols[None, :]] += (~done).long()
        # Two-loop recursion: r ~ H^{-1} g.
        q = g.clone()
        alpha = torch.zeros_like(rho)
        order = [(pos - 1 - j) % history for j in range(history)]
        for j in order:
            alpha[j] = rho[j] * dot(S[j], q)
            q.addcmul_(alpha[j][..., None], Yh[j], value=-1)
        r = q.mul_(gamma[..., None])
        for j in reversed(order):
            beta = rho[j] * dot(Yh[j], r)
            r.addcmul_(S[j], (alpha[j] - beta)[..., None])
        direction = r.neg_()
        gd = dot(g, direction)
        bad = ~(gd < 0) & ~done  # not a descent direction (not expected for convex f): restart on -g
        if bool(bad.any()):
            direction = torch.where(bad[..., None], -g, direction)
            gd = torch.where(bad, -dot(g, g), gd)
            rho = torch.where(bad[None], torch.zeros_like(rho), rho)
        direction = torch.where(done[..., None], torch.zeros_like(direction), direction)
        gd = torch.where(done, torch.zeros_like(gd), gd)
        # Backtracking Armijo line search, per problem.
        step = torch.ones_like(f)
        accepted = done.clone()
        new_theta, new_f, new_g = theta, f, g
        for _ in range(max_ls):
            trial = torch.addcmul(theta, step[..., None], direction)
            ft, gt = problems.value_grad(trial)
            ok = ~accepted & torch.isfinite(ft) & (ft <= f + 1e-4 * step * gd)
            if bool((ok | done).all()):  # the usual case (stopped problems have direction 0, trial = theta)
                new_theta, new_f, new_g = trial, torch.where(done, f, ft), gt
                accepted |= ok
                break
            new_theta = torch.where(ok[..., None], trial, new_theta)
            new_f = torch.where(ok, ft, new_f)
            new_g = torch.where(ok[..., None], gt, new_g)
            accepted |= ok
            if bool(accepted.all()):
                break
            step = torch.where(accepted, step, 0.5 * step)
        s, yv = new_theta - theta, new_g - g
        sy, yy = dot(s, yv), dot(yv, yv)
        valid = (sy > eps * yy) & (yy > 0)
        S[pos], Yh[pos] = s, yv
        rho[pos] = torch.where(valid, 1.0 / torch.where(valid, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        gamma = torch.where(valid, sy / torch.where(valid, yy, torch.ones_like(yy)), gamma)
        pos = (pos + 1) % history
        flat = (f - new_f).abs() <= 4 * eps * torch.maximum(f.abs(), new_f.abs()).clamp_min(1.0)
        theta, f, g = new_theta, new_f, new_g
        done = done | ~accepted | (flat & (it > 0)) | (g.abs().amax(-1) <= tol)
    out[rows[:, None], cols[None, :]] = theta
    return out, iters


def _device_inner_scores(problems: _Problems, theta, eval_masks, select_by: str, multilabel: bool):
    """Higher-is-better inner-CV score ``(B, G)`` on rows ``eval_masks: (n, G)``, with the
    definitions of :func:`_inner_score`."""
    torch = _torch()
    Z = problems.logits(theta)
    n_eval = eval_masks.sum(0)
    T = problems.targets  # (n, K, G)
    if select_by == "log_loss":
        loss, _ = problems.item_loss_and_prob(Z)
        if multilabel:
            loss = loss / T.shape[1]  # mean over labels
        return -(loss * eval_masks).sum(1) / n_eval
    if problems.kind == "softmax":
        correct = (Z.argmax(2) == T.argmax(1)[None]).to(Z.dtype)
        return (correct * eval_masks).sum(1) / n_eval
    pred, truth = Z > 0, (T > 0.5)[None]
    if not multilabel:  # binary: one sigmoid column
        return (((pred == truth)[:, :, 0]).to(Z.dtype) * eval_masks).sum(1) / n_eval
    m = eval_masks[None, :, None, :]
    tp, fp, fn = ((pred & truth) * m).sum((1, 2)), ((pred & ~truth) * m).sum((1, 2)), ((~pred & truth) * m).sum((1, 2))
    den = 2 * tp + fp + fn
    return torch.where(den > 0, 2 * tp / den.clamp_min(1), torch.zeros_like(den))


def probe_many_results(features: Mapping[Hashable, Any], y: Any, groups: Any = None, *, n_splits: int = 5,
                       seed: int = 0, Cs: Sequence[float] = DEFAULT_CS, inner_splits: int = 3,
                       select_by: SelectBy = "log_loss", max_iter: int = 1000, tol: float = 1e-4,
                       control_types: Any = None, device: str | None = None, dtype: str = "float32",
                       max_batch_elements: int = 2 ** 27, num_threads: int | None = None,
                       confidence: float = 0.95, n_resamples: int = PROBE_RESAMPLES) -> dict[Hashable, ProbeResult]:
    """The protocol of :func:`cross_validate_probe` for many feature sets at once, in torch.

    ``features``: name -> ``(n_items, dim)`` array (e.g. ``(layer, role)`` -> states), all with the
    same items in the same order as ``y`` and ``groups``. Every feature set uses the same outer and
    inner splits, C grid, standardisation, objective and scoring as the reference, so results agree
    with :func:`cross_validate_probe` up to optimiser tolerance. All (feature set x outer fold x
    inner fold x C [x task/control]) problems of a chunk are solved together by :func:`_lbfgs`
    (stage 1, choosing C), then all (feature set x outer fold) refits (stage 2). ``device``: None ->
    CUDA if available; ``dtype`` in ``DTYPES``. ``max_batch_elements`` bounds the elements of the
    largest tensors of one batched solve, ``B * G * K * (n + 20 (d + 1))`` (memory). ``num_threads``: torch CPU threads during the call, restored afterwards
    (None: leave torch's setting; 1 is fastest on small CPU machines, where thread hand-offs cost
    more than the work of each operation). Returns name -> :class:`ProbeResult`.
    """
    torch = _torch()
    if num_threads is None:
        return _probe_many_results(features, y, groups, n_splits=n_splits, seed=seed, Cs=Cs, inner_splits=inner_splits,
                                   select_by=select_by, max_iter=max_iter, tol=tol, control_types=control_types,
                                   device=device, dtype=dtype, max_batch_elements=max_batch_elements,
                                   confidence=confidence, n_resamples=n_resamples)
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return _probe_many_results(features, y, groups, n_splits=n_splits, seed=seed, Cs=Cs, inner_splits=inner_splits,
                                   select_by=select_by, max_iter=max_iter, tol=tol, control_types=control_types,
                                   device=device, dtype=dtype, max_batch_elements=max_batch_elements,
                                   confidence=confidence, n_resamples=n_resamples)
    finally:
        torch.set_num_threads(before)


def _probe_many_results(features, y, groups, *, n_splits, seed, Cs, inner_splits, select_by, max_iter, tol,
                        control_types, device, dtype, max_batch_elements, confidence, n_resamples):
    torch = _torch()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}; got dtype={dtype!r}")
    tdtype = getattr(torch, dtype)
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if len(features) == 0:
        raise ValueError("features is empty; pass at least one name -> (n_items, dim) array")
    names = list(features)
    arrays = {k: _check_X(features[k], name=f"features[{k!r}]") for k in names}
    n = arrays[names[0]].shape[0]
    y, multilabel = _check_y(y, arrays[names[0]].shape)
    for k, a in arrays.items():
        if a.shape[0] != n:
            raise ValueError(f"features[{k!r}] and y differ in n_items: features[{k!r}].shape={a.shape}, y.shape={y.shape}")
    groups = _check_groups(groups, n)
    n_groups = _check_n_groups(groups, n_splits, "n_splits")
    Cs_arr = _check_Cs(Cs)
    _check_select_by(select_by)

    classes = np.arange(y.shape[1]) if multilabel else np.unique(y)
    binary = not multilabel and len(classes) == 2
    kind = "softmax" if not multilabel and not binary else "sigmoid"
    label_sets = [y]
    if control_types is not None:
        label_sets.append(_check_y(control_labels(y, control_types, seed), (n,), what="control labels")[0])
    L = len(label_sets)

    def encode(lab: np.ndarray) -> np.ndarray:  # 0/1 targets (n, K): one-hot classes or labels
        if multilabel:
            return lab.astype(np.float64)
        idx = np.searchsorted(classes, lab)
        if binary:
            return (idx == 1).astype(np.float64)[:, None]
        return np.eye(len(classes))[idx]

    encoded = [encode(lab) for lab in label_sets]
    K = encoded[0].shape[1]
    outer = make_splits(y, groups, n_splits, seed)
    inner = []
    if len(Cs_arr) > 1:
        for tr, _ in outer:  # the same call LinearProbe.fit makes on the outer training rows
            _check_n_groups(groups[tr], inner_splits, "inner_splits")
            inner.append([(tr[a], tr[b]) for a, b in make_splits(y[tr], groups[tr], inner_splits, seed)])

    def columns(specs):
        """specs: [(label_set, train_idx, eval_idx)] -> train masks, eval masks (n, G), targets (n, K, G)."""
        masks, evals = np.zeros((n, len(specs))), np.zeros((n, len(specs)))
        for g, (_, tr, te) in enumerate(specs):
            masks[tr, g] = 1.0
            evals[te, g] = 1.0
        targets = np.stack([encoded[l] for l, _, _ in specs], axis=2)
        return tuple(torch.as_tensor(a, dtype=tdtype, device=dev) for a in (masks, evals, targets))

    # Stage 1 columns: label set x outer fold x inner fold, solved for each C in turn (ascending, each
    # started from the previous C's solution, as LogisticRegressionCV does); stage 2: label set x outer fold.
    stage1 = [(l, tr_in, te_in) for l in range(L) for folds in inner for tr_in, te_in in folds]
    stage2 = [(l, tr, te) for l in range(L) for tr, te in outer]
    by_dim: dict[int, list[Hashable]] = {}
    for k in names:
        by_dim.setdefault(arrays[k].shape[1], []).append(k)
    batches = []
    for dim, ks in by_dim.items():
        # logits (n rows) and the optimiser's 2 x 10 history vectors (dim + 1 rows) per feature set
        per_set = K * max(len(stage1), len(stage2)) * (n + 20 * (dim + 1))
        chunk = max(1, max_batch_elements // per_set)
        batches += [ks[i:i + chunk] for i in range(0, len(ks), chunk)]
    results: dict[Hashable, ProbeResult] = {}
    for keys in batches:
        B, d = len(keys), arrays[keys[0]].shape[1]
        Xnp = np.stack([arrays[k] for k in keys]).astype(np.float64)
        # A fixed global standardisation first: exact for the per-fold standardisation that follows
        # (affine per feature) and keeps float32 from cancelling large means.
        mean, std = Xnp.mean(1, keepdims=True), Xnp.std(1, keepdims=True)
        Xnp = np.concatenate([(Xnp - mean) / np.where(std > 0, std, 1.0), np.ones((B, n, 1))], axis=2)
        X = torch.as_tensor(Xnp, dtype=tdtype, device=dev)  # (B, n, d + 1): ones column for the intercept
        del Xnp
        chosen = np.full((B, L, n_splits), float(Cs_arr[0]))
        if stage1:
            masks, evals, targets = columns(stage1)
            problems = _Problems(X, masks, targets, torch.ones(B, len(stage1), dtype=tdtype, device=dev), kind)
            theta = torch.zeros(B, len(stage1), (d + 1) * K, dtype=tdtype, device=dev)
            sc = np.empty((B, len(stage1), len(Cs_arr)))
            for c, C in enumerate(Cs_arr):
                at_C = problems.with_inv_C(torch.full((B, len(stage1)), 1.0 / C, dtype=tdtype, device=dev))
                theta, _ = _lbfgs(at_C, theta, max_iter=max_iter, tol=tol)
                sc[:, :, c] = _device_inner_scores(at_C, theta, evals, select_by, multilabel).double().cpu().numpy()
            sc = sc.reshape(B, L, n_splits, inner_splits, len(Cs_arr))
            for b, l, o in np.ndindex(B, L, n_splits):
                chosen[b, l, o] = _choose_C(sc[b, l, o], Cs_arr)
            del problems, at_C, theta, masks, evals, targets
        masks, _, targets = columns(stage2)
        inv_C = torch.as_tensor(1.0 / chosen.reshape(B, L * n_splits), dtype=tdtype, device=dev)
        problems = _Problems(X, masks, targets, inv_C, kind)
        theta0 = torch.zeros(B, len(stage2), (d + 1) * K, dtype=tdtype, device=dev)
        theta, _ = _lbfgs(problems, theta0, max_iter=max_iter, tol=tol)
        P = problems.item_loss_and_prob(problems.logits(theta))[1].double().cpu().numpy()  # (B, n, K, G)
        if binary:
            P = np.concatenate([1 - P, P], axis=2)
        for b, key in enumerate(keys):
            per_label, per_items = [], []
            for l, lab in enumerate(label_sets):
                per_label.append([_evaluate_fold(lab[tr], lab[te], P[b, te, :, l * n_splits + o], classes, multilabel)
                                  for o, (tr, te) in enumerate(outer)])
                per_items.append([_fold_items(lab[tr], lab[te], P[b, te, :, l * n_splits + o], classes, multilabel)
                                  for o, (tr, te) in enumerate(outer)])
            control = [d_["micro_f1" if multilabel else "accuracy"] for d_ in per_label[1]] if L > 1 else None
            items = _items_table(outer, per_items[0], y, groups, multilabel, per_items[1] if L > 1 else None)
            results[key] = _result(multilabel, per_label[0], list(chosen[b, 0]), n, n_groups, control,
                                   list(chosen[b, 1]) if L > 1 else None, confidence, items, n_resamples, seed)
        del problems, theta, X
    return {k: results[k] for k in names}


def probe_many(features: Mapping[Hashable, Any], y: Any, groups: Any = None, *, meta: Mapping[str, Any] | None = None,
               **kwargs: Any) -> pd.DataFrame:
    """:func:`probe_many_results` as one tidy table (``make_table``): rows of :func:`probe_rows` for
    every feature set, with a ``feature`` column holding its name; a ``(layer, role)`` tuple name
    also fills the ``layer`` and ``role`` columns. ``meta`` (model, corpus, format, target, seed,
    analysis) goes on every row; ``kwargs`` go to :func:`probe_many_results`."""
    results = probe_many_results(features, y, groups, **kwargs)
    meta = dict(meta or {})
    meta.setdefault("seed", kwargs.get("seed", 0))
    rows = []
    for key, res in results.items():
        where = {"layer": key[0], "role": key[1]} if isinstance(key, tuple) and len(key) == 2 else {}
        rows.extend(probe_rows(res, **{**meta, **where}, feature=str(key)))
    return make_table(rows)


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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m analyses.probes``: the cache runner of :mod:`analyses.probe_runner`."""
    from analyses.probe_runner import main as run

    return run(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
