"""Cross-validated probe results (:class:`ProbeResult`: per-fold scores, out-of-fold items, cluster
bootstrap intervals), their tidy rows, and the reference cross-validation :func:`cross_validate_probe`
(one :class:`analyses.probes.LinearProbe` per outer fold).

Columns of the tables: :mod:`analyses.probes`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.base import clone

from analyses.probes._estimator import LinearProbe
from analyses.probes._metrics import (DEFAULT_CS, SelectBy, _check_X, _check_groups, _check_n_groups, _check_y,
                                      _evaluate_fold, _fold_items, control_labels, fold_macro_auc, make_splits)
from analyses.results import make_table
from analyses.stats import (DEFAULT_RESAMPLES, check_resamples, cluster_se, fold_t_interval,
                            minimum_detectable_effect, wald_p_value)

# --------------------------------------------------------------------------------------------------
# Results


#: Metrics whose interval comes from the cluster bootstrap of out-of-fold items (the rest, the chance
#: micro-F1 and the baseline's macro AUC, are fold-level: mean and t-interval over folds). The macro AUC
#: is resampled from the items' scores (:func:`analyses.probes.fold_macro_auc`).
ITEM_METRICS: tuple[str, ...] = ("accuracy", "micro_f1", "majority_baseline", "control_accuracy",
                                 "control_micro_f1", "selectivity", "macro_auc")
#: Default number of bootstrap resamples of a probe's interval (every interval's default).
PROBE_RESAMPLES = DEFAULT_RESAMPLES


@dataclass(frozen=True)
class ProbeResult:
    """Cross-validated probe scores and the out-of-fold predictions behind them.

    ``metric`` is the primary metric: ``"accuracy"`` (single-label) or ``"micro_f1"`` (multi-label).
    ``folds`` maps each metric name to its ``(n_splits,)`` per-fold values: the primary metric,
    ``majority_baseline`` (same metric), for multi-label also ``macro_auc``,
    ``majority_baseline_macro_auc`` and ``chance_micro_f1``; with a control task
    ``control_<metric>`` and ``selectivity`` = ``<metric> - control_<metric>`` per fold.
    ``chosen_Cs: (n_splits,)`` is the C picked by the inner CV in each outer fold
    (``control_chosen_Cs`` for the control probe); ``grid``: the Cs it chose among (empty when unknown).

    ``items``: one row per item (every item is tested exactly once), columns ``item`` (position in
    the inputs), ``group``, ``fold``, ``y_true`` / ``y_pred`` (single-label), ``num`` / ``den``
    (contribution to the primary metric, which is ``Σ num / Σ den``), ``correct`` (0/1, or the
    item's F1 for multi-label), ``baseline_num`` / ``baseline_den`` (majority baseline) and, with a
    control task, ``control_num`` / ``control_den`` / ``control_correct``.

    Multi-label results also keep ``item_scores`` / ``item_truth``: ``(n, n_labels)``, each item's
    out-of-fold probabilities and 0/1 labels, in item order.

    Intervals (:meth:`interval`): the metrics of :data:`ITEM_METRICS` are pooled over all
    out-of-fold items (``Σ num / Σ den``) with a percentile cluster bootstrap over ``group``
    (documents or examples; ``n_resamples`` resamples, ``seed``); selectivity is the paired
    difference of the task and control scores on the same resamples. The macro AUC (the mean over
    folds of each fold's macro AUC, as reported before) is resampled on the same draws, each item
    counted as often as its group was drawn (:func:`analyses.probes.fold_macro_auc`). Other
    fold-level metrics (the chance micro-F1, the baseline's macro AUC of 0.5) keep the mean and
    t-interval over folds (:func:`fold_t_interval`).
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
    item_scores: np.ndarray | None = field(default=None, compare=False, repr=False)
    grid: tuple[float, ...] = ()
    item_truth: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "n_resamples", check_resamples(self.n_resamples, self.confidence))

    @functools.cached_property
    def _item_intervals(self) -> dict[str, tuple[float, float, float]]:
        it = self.items
        ctrl = f"control_{self.metric}"
        parts = {self.metric: ("num", "den"), "majority_baseline": ("baseline_num", "baseline_den")}
        if "control_num" in it.columns:
            parts[ctrl] = ("control_num", "control_den")
        codes, draws = self._draws()
        G = draws.shape[1]
        sums = {k: (np.bincount(codes, weights=it[a].to_numpy(float), minlength=G),
                    np.bincount(codes, weights=it[b].to_numpy(float), minlength=G)) for k, (a, b) in parts.items()}
        point = {k: float(sn.sum() / sd.sum()) if sd.sum() > 0 else math.nan for k, (sn, sd) in sums.items()}
        if ctrl in point:
            point["selectivity"] = point[self.metric] - point[ctrl]
        auc = self.item_scores is not None and "macro_auc" in self.folds
        if auc:
            point["macro_auc"] = float(np.mean(self.folds["macro_auc"]))
        if G < 2:
            return {k: (v, math.nan, math.nan) for k, v in point.items()}
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = {k: sn[draws].sum(1) / sd[draws].sum(1) for k, (sn, sd) in sums.items()}
        if ctrl in boot:
            boot["selectivity"] = boot[self.metric] - boot[ctrl]
        if auc:
            boot["macro_auc"] = self._auc_boot
        a = (1 - self.confidence) / 2
        out = {}
        for k, b in boot.items():
            b = b[np.isfinite(b)]
            lo, hi = np.quantile(b, [a, 1 - a]) if b.size else (math.nan, math.nan)
            out[k] = (point[k], float(lo), float(hi))
        return out

    def _draws(self) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, draws)``: each item's group code and the resamples of groups, ``(n_resamples, G)``,
        drawn from ``seed``: the same for every result on the same items, groups and seed."""
        _, codes = np.unique(self.items["group"].to_numpy(), return_inverse=True)
        codes = codes.reshape(-1)
        G = int(codes.max()) + 1
        return codes, np.random.default_rng(self.seed).integers(0, G, size=(self.n_resamples, G))

    @functools.cached_property
    def _auc_boot(self) -> np.ndarray:
        """The macro AUC of each resample of :meth:`_draws`, each item counted as often as its group was
        drawn (:func:`analyses.probes.fold_macro_auc`): ``(n_resamples,)``."""
        codes, draws = self._draws()
        times = np.zeros(draws.shape)
        np.add.at(times, (np.arange(len(draws))[:, None], draws), 1.0)
        return fold_macro_auc(self.item_truth, self.item_scores, self.items["fold"].to_numpy(), codes, times)

    def auc_difference(self, other: "ProbeResult") -> dict[str, float]:
        """This multi-label probe's macro AUC minus ``other``'s, fitted on the same items and folds (e.g.
        [CLS] against a length-only probe): the difference of the two on each resample of the same
        documents (:meth:`_draws`), a percentile CI, a two-sided p-value, its standard error and minimum detectable
        effect; ``value_a`` / ``value_b`` the two macro AUCs, ``n``, ``n_groups``, ``n_resamples``. The p-value is
        ``2 Φ(−|value| / se)`` with ``se`` the draws' standard deviation (a bootstrap-SE Wald test)."""
        for r in (self, other):
            if r.item_scores is None or r.items is None:
                raise ValueError("auc_difference needs multi-label results that kept their out-of-fold items")
        same = (len(self.items) == len(other.items) and self.seed == other.seed
                and self.n_resamples == other.n_resamples
                and all(np.array_equal(self.items[c].to_numpy(), other.items[c].to_numpy())
                        for c in ("item", "group", "fold")))
        if not same:
            raise ValueError("auc_difference compares probes on the same items, folds, groups, seed and resamples")
        a, b = self.interval("macro_auc")[0], other.interval("macro_auc")[0]
        d = self._auc_boot - other._auc_boot
        d = d[np.isfinite(d)]
        alpha = (1 - self.confidence) / 2
        lo, hi = np.quantile(d, [alpha, 1 - alpha]) if d.size else (math.nan, math.nan)
        se = float(d.std(ddof=1)) if d.size > 1 else math.nan
        # two-sided p from the bootstrap standard error (normal approximation), not from counting draws
        # beyond 0: a count bottoms out at 2 / (R + 1), and Holm over more than alpha (R + 1) / 2 rows (25 at
        # R = 1,000: Q5's 6 targets x 6 layers) could then never pass, however large the difference
        p = wald_p_value(a - b, se)
        return {"value": a - b, "ci_low": float(lo), "ci_high": float(hi), "p_value": p, "se": se,
                "mde": minimum_detectable_effect(se) if math.isfinite(se) else math.nan, "n": self.n,
                "n_groups": self.n_groups, "value_a": a, "value_b": b, "n_resamples": self.n_resamples}

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


#: Per-item outputs of :func:`_fold_items` that are rows of a matrix (one column per label), kept apart
#: from the items table (:func:`_item_matrices`).
MATRIX_ITEMS: tuple[str, ...] = ("scores", "truth")


def _item_matrices(outer, fold_items: list[dict[str, np.ndarray]], n: int) -> dict[str, np.ndarray]:
    """``{"scores": (n, n_labels), "truth": (n, n_labels)}`` in item order from each fold's
    :func:`_fold_items` (every item is tested once); empty for single-label results."""
    out: dict[str, np.ndarray] = {}
    for key in MATRIX_ITEMS:
        if key in fold_items[0]:
            first = fold_items[0][key]
            out[key] = np.empty((n, first.shape[1]), dtype=first.dtype)
            for (_, te), f in zip(outer, fold_items):
                out[key][te] = f[key]
    return out


def _items_table(outer, fold_items: list[dict[str, np.ndarray]], y: np.ndarray, groups: np.ndarray,
                 multilabel: bool, control_items: list[dict[str, np.ndarray]] | None) -> pd.DataFrame:
    """The per-item out-of-fold table of :class:`ProbeResult` from each fold's :func:`_fold_items`
    (the per-label matrices apart: :func:`_item_matrices`)."""
    parts = []
    for o, (_, te) in enumerate(outer):
        d = {"item": te, "group": groups[te], "fold": np.full(len(te), o)}
        if not multilabel:
            d["y_true"] = y[te]
        d.update({k: v for k, v in fold_items[o].items() if k not in MATRIX_ITEMS})
        if control_items is not None:
            c = control_items[o]
            d.update(control_num=c["num"], control_den=c["den"], control_correct=c["correct"])
        parts.append(pd.DataFrame(d))
    return pd.concat(parts, ignore_index=True).sort_values("item", kind="stable").reset_index(drop=True)


def _result(multilabel: bool, fold_dicts: list[dict[str, float]], chosen: list[float], n: int, n_groups: int,
            control: list[float] | None, control_Cs: list[float] | None, confidence: float,
            items: pd.DataFrame | None = None, n_resamples: int = PROBE_RESAMPLES, seed: int = 0,
            matrices: Mapping[str, np.ndarray] | None = None, grid: Sequence[float] = ()) -> ProbeResult:
    metric = "micro_f1" if multilabel else "accuracy"
    folds = {k: np.array([d[k] for d in fold_dicts]) for k in fold_dicts[0]}
    if control is not None:
        folds[f"control_{metric}"] = np.asarray(control, dtype=np.float64)
        folds["selectivity"] = folds[metric] - folds[f"control_{metric}"]
    return ProbeResult(metric=metric, folds=folds, chosen_Cs=np.asarray(chosen), n=n, n_groups=n_groups,
                       control_chosen_Cs=None if control_Cs is None else np.asarray(control_Cs),
                       confidence=confidence, items=items, n_resamples=n_resamples, seed=seed,
                       item_scores=(matrices or {}).get("scores"), item_truth=(matrices or {}).get("truth"),
                       grid=tuple(float(c) for c in grid))


def edge_share(chosen, grid: Sequence[float]) -> float:
    """The share of the C choices ``chosen`` at the smallest or the largest C of ``grid``: a grid that is too narrow
    shows itself by choices piled at an end (the best C may lie beyond it). NaN when ``grid`` has fewer than two Cs
    (nothing was chosen).

    >>> edge_share([0.1, 1.0, 1.0, 10.0], (0.1, 1.0, 10.0))
    0.5
    """
    if len(grid) < 2:
        return math.nan
    lo, hi = min(grid), max(grid)
    chosen = np.asarray(chosen, dtype=np.float64)
    return float(np.mean(np.isclose(chosen, lo) | np.isclose(chosen, hi)))


def probe_rows(result: ProbeResult, *, analysis: str = "probe", model: str | None = None,
               corpus: str | None = None, format: str | None = None, layer: int | None = None,
               choice: str | None = None, target: str | None = None, seed: int | None = None,
               **extra: Any) -> list[dict[str, Any]]:
    """One tidy row per metric of ``result`` (value, ci_low, ci_high from :meth:`ProbeResult.interval`,
    n = items), with extra columns ``ci_method`` (``cluster_bootstrap`` or ``t_folds``), ``n_resamples``
    (the bootstrap's resamples; None on a ``t_folds`` row), ``mde``
    (on the primary metric's row: :attr:`ProbeResult.mde`, the smallest difference from the majority
    baseline this sample detects; NaN on other rows), ``n_folds``, ``n_groups``, and the C the inner
    CV chose over the outer folds as numbers: ``chosen_C`` (median), ``chosen_C_min``,
    ``chosen_C_max``, and ``C_edge_share``: the share of those choices at either end of the grid (:func:`edge_share`;
    NaN without a grid of two or more Cs). ``seed`` is stored as an int. Feed to :func:`analyses.results.make_table`."""
    chosen = np.asarray(result.chosen_Cs, dtype=np.float64)
    picked = {"chosen_C": float(np.median(chosen)), "chosen_C_min": float(chosen.min()),
              "chosen_C_max": float(chosen.max()), "C_edge_share": edge_share(chosen, result.grid)}
    rows = []
    for name, (value, lo, hi) in result.summary().items():
        rows.append({"analysis": analysis, "model": model, "corpus": corpus, "format": format, "layer": layer,
                     "choice": choice, "target": target, "metric": name, "value": value, "ci_low": lo, "ci_high": hi,
                     "n": result.n, "seed": None if seed is None else int(seed), "n_folds": len(result.scores),
                     "n_groups": result.n_groups, "ci_method": result.ci_method(name),
                     "n_resamples": result.n_resamples if result.ci_method(name) == "cluster_bootstrap" else None,
                     "mde": result.mde if name == result.metric else math.nan, **picked, **extra})
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
    The per-item out-of-fold predictions are kept in ``result.items``. With ``control_types: (n_items,)``
    the same probe is also fit, on the same folds, to :func:`control_labels` ``(y, control_types, seed)``
    and ``control_<metric>`` and ``selectivity`` (Hewitt & Liang 2019) are added.
    """
    check_resamples(n_resamples, confidence)  # before any fit
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
                   items, n_resamples, seed, _item_matrices(splits, fold_items, X.shape[0]), grid=Cs)


