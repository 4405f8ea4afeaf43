"""Effects of interventions (:mod:`probing.interventions`) as tidy result tables.

An intervened cache shares its token keys with the clean cache of the same format, so an effect is
measured item by item:

- **drift** of a role group between the clean and the intervened run: per example, the mean over
  the group's tokens of ``1 − cos(h_clean, h_intervened)`` at each layer;
- **probe accuracy**: per item, whether an out-of-fold logistic-regression probe is right, on the
  clean and on the intervened states, with the same document-grouped folds
  (:class:`sklearn.model_selection.StratifiedGroupKFold`, grouped by the ``doc`` label when there
  is one, else by example). ``mode="transfer"`` fits the probe on the clean states of the training
  folds and scores it on the intervened states of the held-out fold (does the model still put the
  information where the clean model reads it?); ``mode="retrain"`` fits and scores on the intervened
  states (is the information still decodable?).

A **control** intervention of the same size (``control=1``: as many random word keys per query as
the knockout takes) makes "knocking out [SEP] changes [CLS] more than the control does" a paired
comparison: the per-item difference of the two effects, with a cluster-bootstrap CI over documents
(:func:`analyses.stats.bootstrap_ci`). Every CI here is a 95% percentile interval; no correction for
multiple comparisons is applied (each layer and target is reported on its own).

Study functions: :func:`q4_sep_knockout` (does the model use [SEP]?) and :func:`q1_patching` (how
much of [CLS]'s pair → concat change comes through [CLS]'s own state at layer l, and through the
middle [SEP]), with the interventions they need from :func:`sep_knockouts`, :func:`cls_patches` and
:func:`middle_sep_knockouts`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.results import cache_identity, keep_table, make_table, model_label, stored_table, table_lines
from analyses.drift import MIN_SPREAD, pair_spread, rowwise_cosine
from analyses.stats import (bootstrap_ci, cache_groups, check_resamples, paired_difference, ratio_bootstrap_ci,
                            scale_difference)
from analyses.probes import DEFAULT_CS
from probing.cli import ArgumentParser
from probing.cache import Cache, align, check_comparable
from probing.layers import cache_layer, shared_layers
from probing.interventions import (Intervention, Knockout, Patch, check_group, check_intervention, describe,
                                   table_mask)

PROBE_MODES = ("transfer", "retrain")
#: Labels asked only of examples whose sentences share one topic (every ``topic_s<i>`` equal to ``topic``),
#: as :mod:`analyses.probes._runner` asks them: with same-topic ``is_next`` negatives that is every example.
SINGLE_TOPIC = ("topic",)


def middle_layers(n_layers: int) -> tuple[int, ...]:
    """The middle third of the encoder layers, ``floor(L/3)+1 .. ceil(2L/3)``: 3-4 of 6, 5-8 of 12."""
    return tuple(range(n_layers // 3 + 1, -(-2 * n_layers // 3) + 1))


def sep_knockouts(n_layers: int, layers: Sequence[int] | None = None,
                  seed: int = 0) -> tuple[Intervention, Intervention]:
    """The Q4 pair: every token may not attend to any [SEP] at ``layers`` (default
    :func:`middle_layers`), and its control of the same size on random word tokens."""
    layers = tuple(layers) if layers is not None else middle_layers(n_layers)
    return (Intervention((Knockout("all", "sep", layers),)),
            Intervention((Knockout("all", "sep", layers, control=True, seed=seed),)))


def middle_sep_knockouts(n_layers: int) -> tuple[Intervention, Intervention]:
    """The Q1 route through the middle [SEP] of ``pair`` (the [SEP] after sentence 1, which ``concat``
    lacks): [CLS] may not attend to it, and no token may, at every layer."""
    layers = tuple(range(1, n_layers + 1))
    return Intervention((Knockout("cls", "sep1", layers),)), Intervention((Knockout("all", "sep1", layers),))


def cls_patches(source: str | Path, n_layers: int, group: str = "cls") -> dict[int, Intervention]:
    """The Q1 patches: ``group``'s state from cache ``source`` (e.g. ``concat``) at each layer 1..L-1."""
    return {l: Intervention(patches=(Patch(group, l, str(source)),)) for l in range(1, n_layers)}


# ---------------------------------------------------------------------------------------------------
# Per-item measurements


def clusters(cache: Cache, examples: np.ndarray) -> np.ndarray:
    """The resampling unit of each example, as text: its ``doc`` label when the corpus has one, else itself
    (:func:`analyses.stats.cache_groups`, which refuses a ``doc`` label some examples lack)."""
    return cache_groups(cache, np.asarray(examples))[0].astype(str)


def per_example_drift(clean: Cache, treated: Cache, layer: int, group: str) -> tuple[np.ndarray, np.ndarray]:
    """``(examples, drift)``: per example, the mean over the tokens of ``group`` of
    ``1 − cos(h_clean, h_treated)`` at ``layer`` (tokens paired by key)."""
    check_group(group)
    rows = np.flatnonzero(table_mask(clean.tokens, group))
    ra, rb = align(clean, treated, rows_a=rows)
    if ra.size == 0:
        raise ValueError(f"{clean.path.name} and {treated.path.name} share no token of group {group!r}")
    d = 1.0 - rowwise_cosine(clean.states(layer, ra), treated.states(layer, rb))
    s = pd.Series(d).groupby(clean.tokens["example"].to_numpy()[ra]).mean()
    return s.index.to_numpy(), s.to_numpy()


def _folds(y: np.ndarray, groups: np.ndarray, n_splits: int):
    from sklearn.model_selection import StratifiedGroupKFold

    n = min(n_splits, len(np.unique(groups)), int(pd.Series(y).value_counts().max()))
    if n < 2:
        raise ValueError(f"a probe needs at least 2 folds: {len(np.unique(groups))} groups, label counts "
                         f"{pd.Series(y).value_counts().to_dict()}")
    return list(StratifiedGroupKFold(n_splits=n).split(np.zeros(len(y)), y, groups))


def _probe(C: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))


def probe_correctness(X_clean: np.ndarray, X_treated: Mapping[str, np.ndarray], y: np.ndarray, groups: np.ndarray,
                      *, mode: str = "transfer", n_splits: int = 5, Cs: Sequence[float] = (1.0,),
                      inner_splits: int = 2, chosen: list | None = None) -> dict[str, np.ndarray]:
    """Out-of-fold correctness per item, on the same folds for every condition.

    X_clean: (n, dim) clean states; X_treated: name -> (n, dim) states of the same items under an
    intervention; y: (n,) labels; groups: (n,) folds never split a group. Returns ``{"clean": (n,)
    bool, name: (n,) bool, ...}``: the clean probe's held-out predictions, and for each treated set
    the predictions of a probe fitted on the clean training folds (``mode="transfer"``) or on the
    treated training folds (``"retrain"``). With more than one value in ``Cs`` the clean probe of each
    fold chooses its L2 strength by an inner cross-validation of ``inner_splits`` folds grouped like the
    outer ones (on the training folds only, as :mod:`analyses.probes` does), and a retrained probe takes
    the same C, so that only the states differ; ``chosen``, when given, collects the C of each fold."""
    return probe_correctness_modes(X_clean, X_treated, y, groups, modes=(mode,), n_splits=n_splits, Cs=Cs,
                                   inner_splits=inner_splits, chosen=chosen)[mode]


def probe_correctness_modes(X_clean: np.ndarray, X_treated: Mapping[str, np.ndarray], y: np.ndarray,
                            groups: np.ndarray, *, modes: Sequence[str] = PROBE_MODES, n_splits: int = 5,
                            Cs: Sequence[float] = (1.0,), inner_splits: int = 2,
                            chosen: list | None = None) -> dict[str, dict[str, np.ndarray]]:
    """:func:`probe_correctness` for several ``modes`` at once, ``{mode: {...}}``: each fold's clean probe
    (with its inner cross-validation, the costly part) is fitted once and serves every mode, so each
    mode's result equals its own :func:`probe_correctness` call."""
    bad = [m for m in modes if m not in PROBE_MODES]
    if bad or not modes:
        raise ValueError(f"mode must be one of {PROBE_MODES}, got {bad[0] if bad else modes!r}")
    from threadpoolctl import threadpool_limits

    y = np.asarray(y)
    groups = np.asarray(groups)
    outs = {m: {"clean": np.zeros(len(y), dtype=bool), **{k: np.zeros(len(y), dtype=bool) for k in X_treated}}
            for m in modes}
    with threadpool_limits(limits=1, user_api="blas"):  # small fits: BLAS threads cost ~10x here (2 cores)
        _fit_folds(X_clean, X_treated, y, groups, outs, n_splits, Cs, inner_splits, chosen)
    return outs


def _fit_folds(X_clean, X_treated, y, groups, outs, n_splits, Cs, inner_splits, chosen) -> None:
    for train, test in _folds(y, groups, n_splits):
        clean, C = _fit_probe(X_clean[train], y[train], groups[train], Cs, inner_splits)
        if chosen is not None:
            chosen.append(C)
        right = clean.predict(X_clean[test]) == y[test]
        for mode, out in outs.items():
            out["clean"][test] = right
            for name, X in X_treated.items():
                model = clean if mode == "transfer" else _probe(C).fit(X[train], y[train])
                out[name][test] = model.predict(X[test]) == y[test]


def majority_correctness(y: np.ndarray, groups: np.ndarray, n_splits: int = 5) -> np.ndarray:
    """Out-of-fold correctness per item of always predicting the training folds' most frequent label, on
    :func:`probe_correctness`'s folds: the ``majority_baseline`` of :mod:`analyses.probes`."""
    y = np.asarray(y)
    out = np.zeros(len(y), dtype=bool)
    for train, test in _folds(y, np.asarray(groups), n_splits):
        labels, counts = np.unique(y[train], return_counts=True)
        out[test] = y[test] == labels[np.argmax(counts)]
    return out


def _fit_probe(X: np.ndarray, y: np.ndarray, groups: np.ndarray, Cs: Sequence[float], inner_splits: int):
    """``(fitted probe, its C)``: one C as it is, several chosen by grouped inner cross-validation
    (accuracy; ties to the smaller C, the stronger penalty)."""
    Cs = sorted(float(c) for c in Cs)
    if not Cs:
        raise ValueError("Cs must hold at least one C")
    if len(Cs) == 1:
        return _probe(Cs[0]).fit(X, y), Cs[0]
    from sklearn.model_selection import GridSearchCV

    inner = _folds(y, groups, inner_splits)
    search = GridSearchCV(_probe(Cs[0]), {"logisticregression__C": Cs}, cv=inner, scoring="accuracy")
    search.fit(X, y)
    return search.best_estimator_, float(search.best_params_["logisticregression__C"])


def _states_by_example(cache: Cache, layer: int, choice: str, examples: np.ndarray) -> np.ndarray:
    from analyses.selection import pooled

    ex, X = pooled(cache, layer, choice)
    pos = pd.Index(ex).get_indexer(examples)
    if (pos < 0).any():
        raise ValueError(f"{cache.path.name}: example {examples[pos < 0][0]} has no {choice!r} token")
    return X[pos]


def _items(cache: Cache, target: str) -> tuple[np.ndarray, np.ndarray]:
    """Examples asked ``target`` (for :data:`SINGLE_TOPIC` labels those whose sentences share one topic,
    :func:`analyses.probes.topic_mismatch`) and the labels."""
    from analyses.probes import topic_mismatch

    ex = cache.examples["example"].to_numpy()
    if target in SINGLE_TOPIC:
        ex = ex[~topic_mismatch(cache, ex)]
    return ex, cache.labels(target, ex)


# ---------------------------------------------------------------------------------------------------
# Tables


def group_spread(cache: Cache, layer: int, group: str, n_pairs: int = 10000, seed: int = 0) -> float:
    """How far apart the tokens of ``group`` lie in different examples of ``cache`` at ``layer``: 1 − the
    mean cosine of ``n_pairs`` random pairs (:func:`analyses.drift.pair_spread`); NaN when the
    group spans fewer than two examples."""
    rows = np.flatnonzero(table_mask(cache.tokens, group))
    return pair_spread([cache.layer_rows(layer, rows)], cache.tokens["example"].to_numpy()[rows],
                       np.ones(rows.size, dtype=bool), n_pairs, seed)


def _base(clean: Cache, analysis: str, seed: int) -> dict:
    return {"analysis": analysis, "model": model_label(clean), "corpus": clean.manifest["corpus"]["name"],
            "format": clean.format_name, "seed": seed}


def _describe(cache: Cache) -> str:
    return describe(cache.manifest.get("intervention"))


def _ci_row(base: dict, values: np.ndarray, groups: np.ndarray, n_resamples: int, seed: int, **kw) -> dict:
    point, lo, hi = bootstrap_ci(values, groups, "mean", n_resamples=n_resamples, seed=seed)
    return {**base, **kw, "value": point, "ci_low": lo, "ci_high": hi, "n": int(len(values)),
            "n_clusters": int(len(np.unique(groups))), "n_resamples": n_resamples}


def _paired_row(base: dict, a: np.ndarray, b: np.ndarray, groups: np.ndarray, n_resamples: int, seed: int,
                **kw) -> dict:
    """A row of ``a − b`` paired per item (:func:`analyses.stats.paired_difference`): its mean, CI, sign-flip
    ``p_value``, ``se`` and ``mde``."""
    return _difference_row(base, paired_difference(a, b, groups, n_resamples=n_resamples, seed=seed), **kw)


def _difference_row(base: dict, r: dict, **kw) -> dict:
    """The row of one :func:`analyses.stats.paired_difference` result."""
    return {**base, **kw, **{k: r[k] for k in ("value", "ci_low", "ci_high", "p_value", "se", "mde", "n")},
            "n_clusters": r["n_groups"], "n_resamples": r["n_resamples"]}


def knockout_drift(clean: Cache, treated: Cache, control: Cache | None = None, *,
                   groups: Sequence[str] = ("cls", "sep", "word"), layers: Sequence[int] | None = None,
                   n_resamples: int = 1000, n_pairs: int = 10000, seed: int = 0, out: str | Path | None = None,
                   force: bool = False, progress: bool = False) -> pd.DataFrame:
    """Drift from the clean run per layer and group (metric ``drift_treated``), the control's
    (``drift_control``) and their paired difference per example (``drift_difference`` = treated −
    control), each a mean over examples with a cluster-bootstrap CI over documents; the difference also
    has :func:`analyses.stats.paired_difference`'s sign-flip ``p_value``, ``se`` and ``mde``, and
    ``p_holm`` over the layers of each group. With a control, also ``normalised_drift_difference``: the
    same difference with both drifts divided by the group's spread in the clean run (``spread``: 1 − the
    mean cosine of ``n_pairs`` random pairs of the group's tokens from different examples,
    :func:`analyses.drift.pair_spread`, held fixed in the bootstrap), so 1 = as far as
    another input; no such row where the spread is under :data:`analyses.drift.MIN_SPREAD`. A
    group that hardly varies between inputs ([CLS] in a sentence encoder's middle layers) has a tiny raw
    drift whatever the knockout does to it. Columns: the standard ones (role = group) plus
    ``intervention``, ``control``, ``n_clusters``, ``spread``."""
    n_resamples = check_resamples(n_resamples)
    layers = shared_layers(layers, clean, treated, *([control] if control is not None else []))
    check_intervention(clean, treated, control)
    config = {"clean": cache_identity(clean), "treated": cache_identity(treated),
              "control": control and cache_identity(control),
              "groups": list(groups), "layers": layers, "n_resamples": n_resamples, "n_pairs": n_pairs, "seed": seed}
    path, done = stored_table(out, "intervention_drift", config, force)
    if done is not None:
        return done
    base = {**_base(clean, "intervention_drift", seed), "format_b": treated.format_name,
            "intervention": _describe(treated), "control": _describe(control) if control is not None else "",
            "target": ""}
    rows = []
    for layer in tqdm(layers, desc=f"knockout drift {treated.format_name}", disable=not progress, file=sys.stderr,
                      delay=1):
        for g in groups:
            ex, d_t = per_example_drift(clean, treated, layer, g)
            cl = clusters(clean, ex)
            rows.append(_ci_row(base, d_t, cl, n_resamples, seed, layer=layer, role=g, metric="drift_treated"))
            if control is None:
                continue
            ex_c, d_c = per_example_drift(clean, control, layer, g)
            s_c = pd.Series(d_c, index=ex_c).reindex(ex).to_numpy()
            ok = np.isfinite(s_c)
            rows.append(_ci_row(base, s_c[ok], cl[ok], n_resamples, seed, layer=layer, role=g, metric="drift_control"))
            r = paired_difference(d_t[ok], s_c[ok], cl[ok], n_resamples=n_resamples, seed=seed)
            rows.append(_difference_row(base, r, layer=layer, role=g, metric="drift_difference"))
            spread = group_spread(clean, layer, g, n_pairs, seed)
            if spread >= MIN_SPREAD:  # one constant divides both sides: the raw row, rescaled
                rows.append(_difference_row(base, scale_difference(r, spread), layer=layer, role=g,
                                            metric="normalised_drift_difference", spread=spread))
    return keep_table(_holm_over_layers(make_table(rows), ["role", "metric"]), path)


def _holm_over_layers(df: pd.DataFrame, family: Sequence[str]) -> pd.DataFrame:
    """``df`` with ``p_holm`` on its tested rows (those with a ``p_value``): Holm over the layers of each
    ``family`` (:func:`analyses.stats.add_holm`); the other rows keep NA."""
    from analyses.stats import add_holm

    if df.empty or "p_value" not in df.columns:
        return df
    tested = df["p_value"].notna()
    if not tested.any():
        return df
    return pd.concat([df[~tested], add_holm(df[tested], list(family))]).sort_index()


def knockout_probes(clean: Cache, treated: Cache, control: Cache | None = None, *,
                    targets: Sequence[str] = ("topic", "is_next"), choice: str = "cls",
                    layers: int | str | Sequence[int] | None = -1, mode: str | Sequence[str] = "transfer",
                    n_splits: int = 5, Cs: Sequence[float] = DEFAULT_CS, inner_splits: int = 3,
                    n_resamples: int = 1000, seed: int = 0, out: str | Path | None = None, force: bool = False,
                    progress: bool = False) -> pd.DataFrame:
    """Probe accuracy of ``choice`` at each of ``layers`` (as ``--layers`` takes them; None: every layer the
    caches share) for each target, clean and intervened, on the same items and folds
    (:func:`probe_correctness`; ``Cs`` and ``inner_splits`` as there). ``mode``: one of
    :data:`PROBE_MODES`, or several, whose rows then follow one another mode by mode, each as its own
    call would give them (the clean probes are fitted once for all: :func:`probe_correctness_modes`).

    Metrics per layer and target: ``accuracy_clean``, ``accuracy_treated``, ``accuracy_control`` (means
    with a cluster-bootstrap CI over documents), ``majority_baseline`` (:func:`majority_correctness`, the
    same way), and the paired per-item changes ``change_treated`` (treated − clean),
    ``change_control`` and ``change_difference`` (treated − control), each with
    :func:`analyses.stats.paired_difference`'s CI, sign-flip ``p_value``, ``se`` and ``mde``, and
    ``p_holm`` over the layers (per mode, target and metric). Extra columns: ``choice``, ``mode``,
    ``intervention``, ``control``, ``n_clusters``, ``chosen_C_min`` / ``chosen_C_max`` (over the clean
    fits' folds). A target the corpus lacks is skipped and listed in ``df.attrs["skipped"]``."""
    n_resamples = check_resamples(n_resamples)
    modes = [mode] if isinstance(mode, str) else list(mode)
    mode = modes[0] if len(modes) == 1 else modes  # one mode keys its table as a plain string
    layers = shared_layers(layers, clean, treated, *([control] if control is not None else []))
    check_intervention(clean, treated, control)
    config = {"clean": cache_identity(clean), "treated": cache_identity(treated),
              "control": control and cache_identity(control),
              "targets": list(targets), "choice": choice, "layers": layers, "mode": mode,
              "n_splits": n_splits, "Cs": sorted(float(c) for c in Cs), "inner_splits": inner_splits,
              "n_resamples": n_resamples, "seed": seed}
    path, done = stored_table(out, "intervention_probes", config, force)
    if done is not None:
        return done
    base = {m: {**_base(clean, "intervention_probes", seed), "format_b": treated.format_name, "choice": choice,
                "mode": m, "intervention": _describe(treated),
                "control": _describe(control) if control is not None else ""} for m in modes}
    rows: dict[str, list] = {m: [] for m in modes}
    present = [t for t in targets if f"label_{t}" in clean.examples.columns]
    skipped = [t for t in targets if t not in present]
    todo = [(t, layer) for t in present for layer in layers]
    for target, layer in tqdm(todo, desc="knockout probes", disable=not progress, file=sys.stderr, delay=1):
        ex, y = _items(clean, target)
        cl = clusters(clean, ex)
        X = _states_by_example(clean, layer, choice, ex)
        treated_X = {"treated": _states_by_example(treated, layer, choice, ex)}
        if control is not None:
            treated_X["control"] = _states_by_example(control, layer, choice, ex)
        chosen: list[float] = []
        by_mode = probe_correctness_modes(X, treated_X, y, cl, modes=modes, n_splits=n_splits, Cs=Cs,
                                          inner_splits=inner_splits, chosen=chosen)
        majority = majority_correctness(y, cl, n_splits).astype(np.float64)
        at = dict(target=target, layer=layer, chosen_C_min=min(chosen), chosen_C_max=max(chosen))
        for m, ok in by_mode.items():
            b = base[m]
            acc = {k: v.astype(np.float64) for k, v in ok.items()}
            for name, v in acc.items():
                rows[m].append(_ci_row(b, v, cl, n_resamples, seed, metric=f"accuracy_{name}", **at))
            rows[m].append(_ci_row(b, majority, cl, n_resamples, seed, metric="majority_baseline", **at))
            pairs = [(f"change_{k}", acc[k], acc["clean"]) for k in acc if k != "clean"]
            if control is not None:
                pairs.append(("change_difference", acc["treated"], acc["control"]))
            rows[m] += [_paired_row(b, a, b_, cl, n_resamples, seed, metric=metric, **at) for metric, a, b_ in pairs]
    df = keep_table(_holm_over_layers(make_table([r for m in modes for r in rows[m]]), ["mode", "target", "metric"]),
                    path)
    df.attrs["skipped"] = skipped
    return df


def fraction_closed(d_clean: np.ndarray, d_patched: np.ndarray, groups: np.ndarray, *, n_resamples: int = 1000,
                    seed: int = 0) -> tuple[float, float, float]:
    """``1 − Σ d_patched / Σ d_clean``: the share of the clean drift that a patch closes, with a
    cluster-bootstrap percentile CI (the ratio of sums of :func:`analyses.stats.ratio_bootstrap_ci`)."""
    point, lo, hi = ratio_bootstrap_ci(d_patched, d_clean, groups, n_resamples=n_resamples, seed=seed)
    return 1.0 - point, 1.0 - hi, 1.0 - lo


def _patch_layer(cache: Cache):
    patches = (cache.manifest.get("intervention") or {}).get("patch", [])
    return patches[0]["layer"] if len(patches) == 1 and len(cache.manifest["intervention"]) == 1 else pd.NA


def drift_reproduced(source: Cache, target: Cache, treated: Sequence[Cache], *, group: str = "cls",
                     layer: int | str = -1, n_resamples: int = 1000, seed: int = 0, out: str | Path | None = None,
                     force: bool = False, progress: bool = False) -> pd.DataFrame:
    """How much of ``group``'s drift between ``target`` (e.g. ``pair``) and ``source`` (e.g. ``concat``)
    at ``layer`` each intervened run of ``target`` reproduces: e.g. ``target`` with ``group``'s state
    at layer l patched from ``source``, or ``target`` with attention to the middle [SEP] knocked out.
    Per treated cache: ``drift_clean`` (1 − cos(target, source)), ``drift_treated`` (1 − cos(treated,
    source)) and ``fraction_reproduced`` = 1 − Σ drift_treated / Σ drift_clean (1: the treated run
    gives the source's state; 0: no closer than without it), all at the measured ``layer``. Extra
    columns: ``patch_layer`` (the layer of a cache's single patch, else NA), ``intervention``,
    ``n_clusters``."""
    n_resamples = check_resamples(n_resamples)
    check_comparable(target, source)
    measured = cache_layer(target, layer)
    for cache in treated:
        check_intervention(target, cache, source=source)
    config = {"source": cache_identity(source), "target": cache_identity(target), "group": group, "layer": measured,
              "treated": [cache_identity(c) for c in treated], "n_resamples": n_resamples, "seed": seed}
    path, done = stored_table(out, "intervention_patching", config, force)
    if done is not None:
        return done
    ex, d_clean = per_example_drift(target, source, measured, group)
    if not d_clean.sum() > 0:
        raise ValueError(f"{group!r} does not drift between {target.path.name} and {source.path.name} at layer "
                         f"{measured}: there is no drift to reproduce")
    cl = clusters(target, ex)
    base = {**_base(target, "intervention_patching", seed), "format_b": source.format_name, "role": group,
            "target": "", "layer": measured}
    rows = []
    for cache in tqdm(treated, desc="patching", disable=not progress, file=sys.stderr, delay=1):
        ex_p, d_p = per_example_drift(cache, source, measured, group)
        d_p = pd.Series(d_p, index=ex_p).reindex(ex).to_numpy()
        this = {**base, "patch_layer": _patch_layer(cache), "intervention": _describe(cache)}
        rows.append(_ci_row(this, d_clean, cl, n_resamples, seed, metric="drift_clean"))
        rows.append(_ci_row(this, d_p, cl, n_resamples, seed, metric="drift_treated"))
        point, lo, hi = fraction_closed(d_clean, d_p, cl, n_resamples=n_resamples, seed=seed)
        rows.append({**this, "metric": "fraction_reproduced", "value": point, "ci_low": lo, "ci_high": hi,
                     "n": int(len(ex)), "n_clusters": int(len(np.unique(cl))), "n_resamples": n_resamples})
    return keep_table(make_table(rows), path)


# ---------------------------------------------------------------------------------------------------
# Study sections


def q4_sep_knockout(clean: Cache, knockout: Cache, control: Cache, *, targets: Sequence[str] = ("topic", "is_next"),
                    choice: str = "cls", probe_layers: int | str | Sequence[int] | None = None,
                    Cs: Sequence[float] = DEFAULT_CS, inner_splits: int = 3, n_resamples: int = 1000, seed: int = 0,
                    out: str | Path | None = None, force: bool = False) -> dict[str, pd.DataFrame]:
    """Q4, "does the model use [SEP]?": ``knockout`` and ``control`` are ``clean``'s format extracted
    with :func:`sep_knockouts`. Returns ``{"q4_knockout_drift": ..., "q4_knockout_probes": ...}``
    (:func:`knockout_drift` for cls, sep and word; :func:`knockout_probes` in transfer and retrain
    modes, at ``probe_layers``: None means every stored layer from the first knocked-out one to the
    last, where a knockout can show; ``Cs`` and ``inner_splits`` as :func:`probe_correctness` takes them)."""
    n_resamples = check_resamples(n_resamples)
    if probe_layers is None:
        probe_layers = after_knockout(knockout)
    drift = knockout_drift(clean, knockout, control, n_resamples=n_resamples, seed=seed, out=out, force=force)
    probes = knockout_probes(clean, knockout, control, targets=targets, choice=choice, layers=probe_layers,
                             mode=PROBE_MODES, Cs=Cs, inner_splits=inner_splits, n_resamples=n_resamples, seed=seed,
                             out=out, force=force)
    return {"q4_knockout_drift": drift, "q4_knockout_probes": probes}


def after_knockout(cache: Cache) -> list[int]:
    """The layers of ``cache`` from its first knocked-out layer to the last stored one (every stored
    layer for a cache without knockouts): a knockout at layer l first changes layer l's output."""
    knockouts = (cache.manifest.get("intervention") or {}).get("knockout", [])
    first = min((min(k["layers"]) for k in knockouts if k.get("layers")), default=0)
    return [l for l in cache.layers if l >= first]


def q1_patching(pair: Cache, concat: Cache, patched: Mapping[int, Cache], sep_routes: Sequence[Cache] = (), *,
                n_resamples: int = 1000, seed: int = 0, out: str | Path | None = None,
                force: bool = False) -> dict[str, pd.DataFrame]:
    """Q1, "how much of [CLS]'s pair → concat change comes through [CLS]'s own state, and how much
    through the middle [SEP]": ``patched[l]`` is ``pair`` extracted with :func:`cls_patches`
    (``concat``'s [CLS] at layer l); ``sep_routes`` are ``pair`` extracted with
    :func:`middle_sep_knockouts` (no attention to the middle [SEP]). Returns
    ``{"q1_cls_patching": ...}`` (:func:`drift_reproduced` of [CLS] at the last layer, one block of rows
    per treated cache)."""
    n_resamples = check_resamples(n_resamples)
    treated = [patched[l] for l in sorted(patched)] + list(sep_routes)
    return {"q1_cls_patching": drift_reproduced(concat, pair, treated, group="cls", layer=-1,
                                                n_resamples=n_resamples, seed=seed, out=out, force=force)}


# ---------------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, add_probe_options, cli_error,
                                  one_value, split_list)
    from analyses.selection import item_rows

    p = ArgumentParser(prog="python -m analyses.interventions",
                       description="Effects of an intervention against the clean run (and a control).")
    sub = p.add_subparsers(dest="kind", required=True)
    k = sub.add_parser("knockout", help="drift and probe change of TREATED (and CONTROL) against CLEAN")
    k.add_argument("clean", help="the clean run (no intervention)")
    k.add_argument("treated", help="an intervened run of CLEAN: the same model, format and corpus")
    k.add_argument("control", nargs="?", default=None,
                   help="the control of TREATED's knockout (control=1, the same queries, keys and layers)")
    k.add_argument("--groups", default="cls,sep,word", help="role groups for drift (default cls,sep,word)")
    add_layers_option(k, "every layer stored in all caches")
    k.add_argument("--targets", default="topic,is_next", help="probe targets (default topic,is_next)")
    k.add_argument("--choices", default="cls", help="the one token choice probed (default cls)")
    k.add_argument("--probe-layers", "--probe-layer", dest="probe_layers", default="-1",
                   help="layers probed, as --layers takes them (e.g. 3-6); -1 is the last (default -1)")
    add_probe_options(k, default_Cs=DEFAULT_CS, what=" of the probe")
    k.add_argument("--mode", default="transfer",
                   help="transfer: probe fitted on clean states; retrain: fitted on the intervened states; "
                        "transfer,retrain: both, sharing each fold's clean probe (default transfer)")
    add_output_options(k, resamples=True)
    q = sub.add_parser("patching", help="share of SOURCE vs TARGET drift reproduced by each intervened TARGET")
    q.add_argument("source", help="the format the states came from (e.g. concat)")
    q.add_argument("target", help="the clean cache that was patched (e.g. pair)")
    q.add_argument("treated", nargs="+", help="intervened caches of TARGET's format (patches, knockouts)")
    q.add_argument("--group", default="cls", help="role group whose drift is measured (default cls)")
    q.add_argument("--layers", default="-1",
                   help="the one layer where the drift is measured; -1 is the last (default -1)")
    add_output_options(q, resamples=True)
    args = p.parse_args(argv)
    try:
        if args.kind == "knockout":
            caches = [Cache.open(c) for c in (args.clean, args.treated)]
            control = Cache.open(args.control) if args.control else None
            # every option checked before the first table is written: nothing half-written on bad input
            probe_layers = shared_layers(args.probe_layers, *caches, *([control] if control else []),
                                         option="--probe-layers")
            choice = one_value(args.choices, "--choices")
            modes = split_list(args.mode)
            if not modes or any(m not in PROBE_MODES for m in modes):
                raise ValueError(f"--mode {args.mode!r}: give one or both of {', '.join(PROBE_MODES)}")
            for c in caches + ([control] if control else []):
                item_rows(c, choice)  # an unknown choice, or one a cache lacks: a ValueError naming it
            drift = knockout_drift(*caches, control, groups=split_list(args.groups), layers=args.layers,
                                   n_resamples=args.resamples, seed=args.seed, out=args.out, force=args.force,
                                   progress=not args.no_progress)
            probes = knockout_probes(*caches, control, targets=split_list(args.targets),
                                     choice=choice,
                                     layers=probe_layers, mode=modes, n_splits=args.folds,
                                     Cs=DEFAULT_CS if args.Cs is None else [c for cs in args.Cs for c in cs],
                                     inner_splits=args.inner_folds, n_resamples=args.resamples, seed=args.seed,
                                     out=args.out, force=args.force, progress=not args.no_progress)
            written = [drift, probes]
            shown = [drift.pivot_table(index=["role", "layer"], columns="metric", values="value"),
                     probes.pivot_table(index=["mode", "target", "layer"] if len(modes) > 1 else ["target", "layer"],
                                        columns="metric", values="value", sort=False)]
        else:
            df = drift_reproduced(Cache.open(args.source), Cache.open(args.target),
                                  [Cache.open(c) for c in args.treated], group=args.group, layer=args.layers,
                                  n_resamples=args.resamples, seed=args.seed, out=args.out, force=args.force,
                                  progress=not args.no_progress)
            written = [df]
            shown = [df.pivot_table(index="intervention", columns="metric", values="value", sort=False)]
    except CLI_ERRORS as err:
        return cli_error(err)
    with pd.option_context("display.width", 160, "display.float_format", "{:.3g}".format):
        for t in shown:
            print(t.to_string())
    print(table_lines(*written))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
