"""Probe building blocks shared by the reference and batched paths: settings, input validation,
grouped splits, per-fold scores, per-item out-of-fold contributions, the inner-CV score and the
choice of C, and control-task labels (Hewitt & Liang 2019).

Protocol and table columns: :mod:`analyses.probes`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from scipy.stats import rankdata
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

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


_CHECK_ROWS = 4096


def _check_X(X: Any, name: str = "X") -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be (n_items, dim); got {name}.shape={X.shape}")
    if not np.issubdtype(X.dtype, np.number):
        raise ValueError(f"{name} must be numeric; got {name}.dtype={X.dtype}")
    # checked a block of rows at a time: no boolean copy of the whole of X
    if not all(np.isfinite(X[r:r + _CHECK_ROWS]).all() for r in range(0, X.shape[0], _CHECK_ROWS)):
        finite = np.isfinite(X)
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
            raise ValueError(f"{what} has a single class {classes.tolist()} over all {len(y)} items (one class "
                             "only); a probe needs at least two classes")
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


# Splits and scores shared by both paths


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

def _micro_f1(Y: np.ndarray, pred: np.ndarray) -> float:
    """Micro-F1 = 2 TP / (2 TP + FP + FN) pooled over items and labels (0 when there are no positives)."""
    tp = float((pred & (Y == 1)).sum())
    fp = float((pred & (Y == 0)).sum())
    fn = float((~pred & (Y == 1)).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0


def _macro_auc(Y: np.ndarray, P: np.ndarray) -> float:
    """Mean ROC AUC over the labels that have both 0 and 1 among ``Y``'s rows (NaN if none has).

    Each label's AUC is the Mann-Whitney statistic, ``(sum of the positives' ranks - n_pos (n_pos + 1)
    / 2) / (n_pos n_neg)`` with tied scores given their average rank: the area under the ROC curve
    that ``sklearn.metrics.roc_auc_score`` integrates (ties counting one half), for all labels in one
    ranking (``roc_auc_score`` builds a curve per label: 1 ms each, most of a bag-of-words probe's time)."""
    ok = (Y.min(axis=0) != Y.max(axis=0))
    if not ok.any():
        return math.nan
    Y, P = Y[:, ok] == 1, np.asarray(P)[:, ok]
    ranks = rankdata(P, method="average", axis=0)
    n_pos = Y.sum(axis=0)
    n_neg = len(Y) - n_pos
    auc = ((ranks * Y).sum(axis=0) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return float(auc.mean())


#: Elements of one block of :func:`fold_macro_auc`'s arrays (float64: 16 MiB), so that its memory does not
#: grow with the corpus; and the largest ``groups² × labels`` of a fold for which it takes the
#: group-level path (the quadratic form below) rather than the item-level one.
_AUC_BLOCK = 1 << 21
_AUC_GROUP_ELEMENTS = 1 << 21


def fold_macro_auc(Y: np.ndarray, P: np.ndarray, folds: np.ndarray, groups: np.ndarray,
                   times: np.ndarray) -> np.ndarray:
    """The mean over outer folds of each fold's macro ROC AUC, with every item counted as often as its
    group is drawn: ``(R,)``, one value per row of ``times``.

    Y: (n, n_labels) 0/1; P: (n, n_labels) out-of-fold scores; folds: (n,) the outer fold that scored
    each item; groups: (n,) integer group codes in ``[0, G)`` (documents: a cluster bootstrap draws
    whole documents); times: (R, G) how often each group is drawn in each resample (all ones: the
    sample itself). In each fold a label's AUC is the weighted Mann-Whitney statistic over the items
    that count, ``Σ_pos w_i (W_neg below s_i + ½ W_neg tied with s_i) / (W_pos W_neg)``, over the labels
    with positive weight on both values there; the fold's value is their mean, and folds without such a
    label are left out of the mean over folds. With ``times`` all ones this is the mean over folds of
    :func:`_macro_auc` (the ``macro_auc`` of :func:`_evaluate_fold`).

    Two exact ways, chosen per fold, both in blocks of at most :data:`_AUC_BLOCK` elements: with few
    groups the statistic is a quadratic form in the group counts, ``m^T A m``, ``A[g, h]`` summing the
    comparisons of group g's positives with group h's negatives (:func:`_auc_sums_by_groups`); with many
    (every item its own group) each resample's item weights are cumulated along each label's scores
    (:func:`_auc_sums_by_items`).
    """
    Y = np.asarray(Y) == 1
    P = np.asarray(P, dtype=np.float64)
    times = np.asarray(times, dtype=np.float64)
    per_fold = []
    for f in np.unique(folds):
        idx = np.flatnonzero(folds == f)
        local, g = np.unique(np.asarray(groups)[idx], return_inverse=True)
        g = g.reshape(-1)
        m = times[:, local]  # (R, G): the draws of this fold's groups
        sums = _auc_sums_by_groups if len(local) ** 2 * Y.shape[1] <= _AUC_GROUP_ELEMENTS else _auc_sums_by_items
        num, w_pos, w_neg = sums(Y[idx], P[idx], g, m)
        ok = (w_pos > 0) & (w_neg > 0)
        auc = np.where(ok, num / np.where(ok, w_pos * w_neg, 1.0), 0.0)
        counted = ok.sum(axis=1)
        per_fold.append(np.where(counted > 0, auc.sum(axis=1) / np.maximum(counted, 1), np.nan))
    per_fold = np.stack(per_fold)  # (folds, R)
    counted = np.isfinite(per_fold).sum(axis=0)
    return np.where(counted > 0, np.nansum(per_fold, axis=0) / np.maximum(counted, 1), np.nan)


def _auc_sums_by_groups(Y: np.ndarray, P: np.ndarray, g: np.ndarray,
                        m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(numerator, W_pos, W_neg)``, each ``(R, n_labels)``, of one fold's weighted AUCs from the group
    counts ``m: (R, G)`` (``g: (n,)`` each item's group): the numerator is ``m^T A_l m`` per label."""
    n, L = Y.shape
    G = m.shape[1]
    A = np.zeros((G, L, G))
    for l in range(L):
        pos = Y[:, l]
        sp, gp = P[pos, l], g[pos]
        neg_order = np.argsort(g[~pos], kind="stable")  # negatives by group: one reduceat sums each group
        sn, gn = P[~pos, l][neg_order], g[~pos][neg_order]
        if sp.size == 0 or sn.size == 0:
            continue
        starts = np.flatnonzero(np.r_[True, gn[1:] != gn[:-1]])
        step = max(1, _AUC_BLOCK // sn.size)
        for b in range(0, sp.size, step):
            s = sp[b:b + step, None]
            cmp = (sn[None, :] < s) + 0.5 * (sn[None, :] == s)  # (block, n_neg)
            by_group = np.add.reduceat(cmp, starts, axis=1)  # (block, groups with negatives)
            np.add.at(A[:, l, :], (gp[b:b + step, None], gn[starts][None, :]), by_group)
    n_pos = np.stack([np.bincount(g[Y[:, l]], minlength=G) for l in range(L)])  # (L, G)
    n_neg = np.stack([np.bincount(g[~Y[:, l]], minlength=G) for l in range(L)])
    num = np.empty((len(m), L))
    step = max(1, _AUC_BLOCK // (L * G))
    A = A.reshape(G, L * G)
    for r in range(0, len(m), step):
        mr = m[r:r + step]
        num[r:r + step] = ((mr @ A).reshape(len(mr), L, G) * mr[:, None, :]).sum(axis=2)
    return num, m @ n_pos.T, m @ n_neg.T


def _auc_sums_by_items(Y: np.ndarray, P: np.ndarray, g: np.ndarray,
                       m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As :func:`_auc_sums_by_groups`, from each resample's item weights ``m[:, g]``, cumulated along each
    label's sorted scores (ties: the tied negatives' weight counts one half)."""
    n, L = Y.shape
    order = np.argsort(P, axis=0, kind="stable")  # (n, L): each label's items by score
    Ps = np.take_along_axis(P, order, axis=0)
    Ys = np.take_along_axis(Y, order, axis=0)
    at = np.arange(n)[:, None]
    new = np.ones((n, L), dtype=bool)
    new[1:] = Ps[1:] != Ps[:-1]
    start = np.maximum.accumulate(np.where(new, at, 0), axis=0)  # first position of each tie group
    last = np.ones((n, L), dtype=bool)
    last[:-1] = new[1:]
    end = np.minimum.accumulate(np.where(last, at, n - 1)[::-1], axis=0)[::-1]  # its last position
    num, w_pos, w_neg = (np.empty((len(m), L)) for _ in range(3))
    step = max(1, _AUC_BLOCK // max(1, n * L))
    for r in range(0, len(m), step):
        w = m[r:r + step][:, g][:, order]  # (r, n, L): each item's weight, in each label's order
        cum = np.cumsum(np.where(Ys, 0.0, w), axis=1)
        below = np.where(start > 0, np.take_along_axis(cum, np.broadcast_to(np.maximum(start - 1, 0), w.shape),
                                                       axis=1), 0.0)
        tied = np.take_along_axis(cum, np.broadcast_to(end, w.shape), axis=1) - below
        pos = np.where(Ys, w, 0.0)
        num[r:r + step] = (pos * (below + 0.5 * tied)).sum(axis=1)
        w_pos[r:r + step], w_neg[r:r + step] = pos.sum(axis=1), cum[:, -1]
    return num, w_pos, w_neg


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
    majority baseline of :func:`_evaluate_fold`. Single-label also ``y_pred`` (the predicted label);
    multi-label also ``scores`` and ``truth``, ``(n_test, n_labels)``: the out-of-fold probabilities and
    the 0/1 labels, from which :func:`fold_macro_auc` resamples the macro AUC.
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
    return {"num": num, "den": den, "correct": correct, "baseline_num": b_num, "baseline_den": b_den,
            "scores": np.asarray(P_test, dtype=np.float32), "truth": np.asarray(y_test == 1)}


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
        raise ValueError(f"types must be (n_items,) = ({y.shape[0]},); "
                         f"got types.shape={types.shape}, y.shape={y.shape}")
    _, inverse = np.unique(types, return_inverse=True)
    donors = np.random.default_rng(seed).integers(0, y.shape[0], size=inverse.max() + 1)
    return y[donors][inverse.ravel()]


