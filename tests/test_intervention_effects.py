"""Effects of interventions as tables (analyses.interventions) and their figures, on tiny random BERTs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses.interventions import (cls_patches, fraction_closed, group_spread, knockout_drift, knockout_probes,
                                    middle_layers, middle_sep_knockouts,
                                    per_example_drift, PROBE_MODES, probe_correctness, probe_correctness_modes,
                                    q1_patching,
                                    q4_sep_knockout, sep_knockouts)
from probing.cache import Cache, IncomparableCaches
from probing.examples import Example
from probing.extract import extract
from probing.interventions import Intervention, Knockout, Patch

QUIET = dict(progress=False, log=lambda *a: None)


def _corpus(n=24):
    from tests.conftest import sample_examples

    return [Example(e.id, e.sentences, {**e.labels, "doc": f"d{i // 2}"}) for i, e in enumerate(sample_examples(n))]


def _cache(examples, fmt, lm, out, intervention=None):
    (path,) = extract(examples, [fmt], model=lm, out=out, roles="all", intervention=intervention, **QUIET)
    return Cache.open(path)


@pytest.fixture()
def sharp_bert(bert_tokenizer):
    """A tiny random BERT with larger weights, so that attention is peaked and a knockout shows."""
    from probing.models import prepare_model
    from tests.conftest import make_tiny_bert

    return prepare_model(make_tiny_bert(bert_tokenizer, initializer_range=0.3), bert_tokenizer, name="sharp-bert")


@pytest.fixture()
def runs(tmp_path, sharp_bert):
    tiny_bert = sharp_bert
    ex = _corpus()
    ko, control = sep_knockouts(tiny_bert.n_layers)
    return {"clean": _cache(ex, "pair", tiny_bert, tmp_path), "ko": _cache(ex, "pair", tiny_bert, tmp_path, ko),
            "control": _cache(ex, "pair", tiny_bert, tmp_path, control),
            "nothing": _cache(ex, "pair", tiny_bert, tmp_path, Intervention((Knockout("all", "sep3", (1,)),))),
            "lm": tiny_bert, "examples": ex, "tmp": tmp_path}


def test_middle_layers_and_the_q4_interventions():
    assert middle_layers(6) == (3, 4) and middle_layers(12) == (5, 6, 7, 8) and middle_layers(2) == (1, 2)
    ko, control = sep_knockouts(6)
    assert ko.knockouts == (Knockout("all", "sep", (3, 4)),)
    assert control.knockouts == (Knockout("all", "sep", (3, 4), control=True, seed=0),)


def test_per_example_drift_is_a_mean_of_one_minus_cosine(runs):
    clean, ko = runs["clean"], runs["ko"]
    ex, d = per_example_drift(clean, ko, 2, "cls")
    rows_a, rows_b = clean.rows(role="cls"), ko.rows(role="cls")
    a, b = clean.states(2, rows_a).astype(np.float64), ko.states(2, rows_b).astype(np.float64)
    want = 1 - (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    np.testing.assert_allclose(d, want, atol=1e-6)
    assert list(ex) == list(range(len(runs["examples"])))
    _, zero = per_example_drift(clean, runs["nothing"], 2, "word")
    assert np.abs(zero).max() < 1e-6


def test_knockout_drift_pairs_the_control_item_by_item(runs):
    df = knockout_drift(runs["clean"], runs["ko"], runs["control"], groups=("cls",), layers=[0, 2], n_resamples=100)
    assert set(df["metric"]) == {"drift_treated", "drift_control", "drift_difference", "normalised_drift_difference"}
    at2 = df[df["layer"] == 2].set_index("metric")
    assert at2.loc["drift_difference", "value"] == pytest.approx(
        at2.loc["drift_treated", "value"] - at2.loc["drift_control", "value"], abs=1e-9)
    # normalised: the same difference over [CLS]'s spread between the clean run's examples; none at layer 0,
    # where [CLS] is one vector for every input
    spread = at2.loc["normalised_drift_difference", "spread"]
    assert spread == pytest.approx(group_spread(runs["clean"], 2, "cls"), rel=1e-12) and 0 < spread < 2
    assert at2.loc["normalised_drift_difference", "value"] == pytest.approx(
        at2.loc["drift_difference", "value"] / spread, rel=1e-9)
    assert not ((df["layer"] == 0) & (df["metric"] == "normalised_drift_difference")).any()
    rows = runs["clean"].rows(role="cls")
    X = runs["clean"].states(2, rows).astype(np.float64)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    off = ~np.eye(len(X), dtype=bool)  # every pair of different examples, against the 10,000 drawn
    assert spread == pytest.approx(1 - (X @ X.T)[off].mean(), abs=0.02)
    assert at2.loc["drift_treated", "value"] > 1e-4
    assert at2.loc["drift_treated", "n_clusters"] == 12  # the doc label, not the example
    assert df[df["layer"] == 0]["value"].abs().max() < 1e-6  # embeddings come before any knockout
    assert at2.loc["drift_treated", "intervention"] == "knockout all->sep@1-2"
    with pytest.raises(IncomparableCaches, match="is not a control"):  # the knockout is not its own control
        knockout_drift(runs["clean"], runs["ko"], runs["ko"], groups=("cls",), layers=[2], n_resamples=100)


def test_probe_correctness_matches_cross_val_predict_on_the_same_folds():
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 20)
    X = rng.normal(size=(60, 5)) + y[:, None] * 0.7
    groups = np.arange(60) // 3
    got = probe_correctness(X, {"same": X, "noise": rng.normal(size=X.shape)}, y, groups, mode="retrain")
    folds = list(StratifiedGroupKFold(n_splits=5).split(X, y, groups))
    ref = cross_val_predict(make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)), X, y, cv=folds)
    np.testing.assert_array_equal(got["clean"], ref == y)
    np.testing.assert_array_equal(got["same"], got["clean"])
    assert got["clean"].mean() > got["noise"].mean()


def test_knockout_probes_change_is_zero_for_an_empty_knockout(runs):
    empty_control = _cache(runs["examples"], "pair", runs["lm"], runs["tmp"],
                           Intervention((Knockout("all", "sep3", (1,), control=True),)))
    df = knockout_probes(runs["clean"], runs["nothing"], empty_control, targets=("topic", "absent"), layers=-1,
                         Cs=(1.0,), n_resamples=100)
    d = df.set_index("metric")
    assert d.loc["change_treated", "value"] == 0.0 and d.loc["change_treated", "p_value"] == 1.0
    assert d.loc["accuracy_treated", "value"] == d.loc["accuracy_clean", "value"]
    assert d.loc["change_difference", "value"] == pytest.approx(-d.loc["change_control", "value"])
    assert 0 < d.loc["majority_baseline", "value"] < 1 and d.loc["majority_baseline", "ci_low"] <= \
        d.loc["majority_baseline", "value"]
    assert np.isnan(d.loc["accuracy_clean", "p_value"])  # accuracies are levels, not tested differences
    assert df.attrs["skipped"] == ["absent"]
    assert (df["mode"] == "transfer").all() and (df["layer"] == 2).all()


def test_knockout_probes_per_layer_holm_over_layers_and_chosen_C(runs):
    df = knockout_probes(runs["clean"], runs["ko"], runs["control"], targets=("topic",), layers="1-2",
                         Cs=(0.01, 1.0), inner_splits=2, n_resamples=100)
    assert sorted(df["layer"].unique()) == [1, 2]
    for metric in ("change_treated", "change_control", "change_difference"):
        rows = df[df["metric"] == metric].sort_values("layer")
        assert len(rows) == 2
        from analyses.stats import holm

        np.testing.assert_allclose(rows["p_holm"], holm(rows["p_value"].to_numpy(float)))
        assert (rows["mde"] >= 0).all() and rows["se"].notna().all() and rows["n_clusters"].eq(12).all()
    assert set(df["chosen_C_min"]) <= {0.01, 1.0} and set(df["chosen_C_max"]) <= {0.01, 1.0}
    d2 = df[df["layer"] == 2].set_index("metric")
    assert d2.loc["change_difference", "value"] == pytest.approx(
        d2.loc["accuracy_treated", "value"] - d2.loc["accuracy_control", "value"])


def test_both_modes_at_once_equal_each_mode_alone(runs):
    """One clean fit per fold serves both modes: the rows are those of two single-mode calls, Holm per mode."""
    kw = dict(targets=("topic",), layers="1-2", Cs=(0.01, 1.0), inner_splits=2, n_resamples=100)
    both = knockout_probes(runs["clean"], runs["ko"], runs["control"], mode=PROBE_MODES, **kw)
    alone = pd.concat([knockout_probes(runs["clean"], runs["ko"], runs["control"], mode=m, **kw) for m in PROBE_MODES],
                      ignore_index=True)
    pd.testing.assert_frame_equal(both.reset_index(drop=True), alone)
    rng = np.random.default_rng(1)
    y = np.repeat([0, 1], 30)
    X = rng.normal(size=(60, 4)) + y[:, None]
    treated = {"t": X + rng.normal(scale=2.0, size=X.shape)}
    groups = np.arange(60) // 2
    chosen: list = []
    modes = probe_correctness_modes(X, treated, y, groups, Cs=(0.01, 1.0), chosen=chosen)
    assert len(chosen) == 5  # one clean fit (and C) per fold, not one per mode
    for m in PROBE_MODES:
        one = probe_correctness(X, treated, y, groups, mode=m, Cs=(0.01, 1.0))
        for k in one:
            np.testing.assert_array_equal(modes[m][k], one[k])
    with pytest.raises(ValueError, match="mode must be one of"):
        probe_correctness_modes(X, treated, y, groups, modes=("transfer", "sideways"))


def test_probe_correctness_finds_a_planted_loss_and_not_a_null_one():
    rng = np.random.default_rng(1)
    y = np.repeat([0, 1], 60)
    signal = rng.normal(size=(120, 8))
    signal[:, 0] += 2.0 * y
    erased = signal.copy()
    erased[:, 0] = rng.normal(size=120)  # the knockout removes the label's direction
    resampled = signal + rng.normal(scale=0.01, size=signal.shape)  # a control that changes nothing of it
    groups = np.arange(120) // 2
    chosen = []
    ok = probe_correctness(signal, {"treated": erased, "control": resampled}, y, groups, Cs=(0.01, 0.1, 1.0),
                           inner_splits=2, chosen=chosen)
    assert len(chosen) == 5 and set(chosen) <= {0.01, 0.1, 1.0}
    from analyses.stats import paired_difference

    lost = paired_difference(ok["treated"].astype(float), ok["control"].astype(float), groups, n_resamples=500)
    assert lost["value"] < -0.2 and lost["ci_high"] < 0 and lost["p_value"] < 0.01
    same = paired_difference(ok["control"].astype(float), ok["clean"].astype(float), groups, n_resamples=500)
    assert abs(same["value"]) <= 0.02 and same["ci_low"] <= 0 <= same["ci_high"]


def test_majority_baseline_is_the_training_folds_majority_out_of_fold():
    from analyses.interventions import majority_correctness

    y = np.array([0] * 70 + [1] * 30)
    got = majority_correctness(y, np.arange(100), 5)
    np.testing.assert_array_equal(got, y == 0)  # every stratified training fold is 70% class 0
    tie = majority_correctness(np.array([0, 1] * 10), np.arange(20), 2)
    assert tie.mean() == 0.5


def test_fixed_C_is_one_fit_and_a_grid_refits_on_the_best():
    from analyses.interventions import _fit_probe

    rng = np.random.default_rng(2)
    y = np.repeat([0, 1, 2], 30)
    X = rng.normal(size=(90, 6)) + y[:, None]
    groups = np.arange(90) // 3
    model, C = _fit_probe(X, y, groups, (0.5,), 2)
    assert C == 0.5 and model[-1].C == 0.5
    model, C = _fit_probe(X, y, groups, (10.0, 1e-4), 2)
    assert C == 10.0 and model[-1].C == 10.0  # 1e-4 squeezes every weight to ~0: chance accuracy inside
    with pytest.raises(ValueError, match="at least one C"):
        _fit_probe(X, y, groups, (), 2)


def test_topic_items_are_those_whose_sentences_share_it():
    from analyses.interventions import _items

    class _Stub:
        examples = pd.DataFrame({"example": [0, 1, 2, 3], "label_topic": [0, 1, 1, 2],
                                 "label_topic_s2": [0, 2, 1, 2], "label_is_next": [1, 0, 0, 1]})

        def labels(self, name, ex):
            return self.examples.set_index("example").loc[ex, f"label_{name}"].to_numpy()

    ex, y = _items(_Stub(), "topic")
    assert list(ex) == [0, 2, 3] and list(y) == [0, 1, 2]  # a same-topic negative (2) stays, a mixed one (1) goes
    ex, y = _items(_Stub(), "is_next")
    assert list(ex) == [0, 1, 2, 3]


def test_after_knockout_starts_at_the_first_knocked_out_layer(runs):
    from analyses.interventions import after_knockout

    assert after_knockout(runs["ko"]) == [1, 2]  # sep_knockouts(2): layers 1-2
    assert after_knockout(runs["clean"]) == [0, 1, 2]


def test_fraction_closed_known_answers():
    d = np.array([0.2, 0.4, 0.1, 0.3])
    g = np.array(["a", "a", "b", "c"])
    assert fraction_closed(d, np.zeros(4), g, n_resamples=100)[0] == 1.0
    assert fraction_closed(d, d, g, n_resamples=100)[0] == 0.0
    point, lo, hi = fraction_closed(d, d / 2, g, n_resamples=100)
    assert point == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)


def test_patching_at_the_measured_layer_reproduces_all_of_the_drift(runs):
    lm, ex, tmp = runs["lm"], runs["examples"], runs["tmp"]
    concat = _cache(ex, "concat", lm, tmp)
    patches = cls_patches(concat.path, lm.n_layers)
    assert list(patches) == [1]
    patched = {l: _cache(ex, "pair", lm, tmp, iv) for l, iv in patches.items()}
    patched[2] = _cache(ex, "pair", lm, tmp, Intervention(patches=(Patch("cls", 2, str(concat.path)),)))
    cls_route, all_route = middle_sep_knockouts(lm.n_layers)
    assert all_route.knockouts == (Knockout("all", "sep1", (1, 2)),)
    routes = [_cache(ex, "pair", lm, tmp, cls_route)]
    df = q1_patching(runs["clean"], concat, patched, routes, n_resamples=100)["q1_cls_patching"]
    frac = df[df["metric"] == "fraction_reproduced"].set_index("intervention")["value"]
    assert frac["patch cls@2 from concat"] == pytest.approx(1.0, abs=1e-6)
    assert -1.0 < frac["patch cls@1 from concat"] < 1.0
    assert frac["knockout cls->sep1@1-2"] != 0.0
    assert (df["layer"] == 2).all()
    assert df.drop_duplicates("intervention")["patch_layer"].tolist()[:2] == [1, 2]
    assert df.drop_duplicates("intervention")["patch_layer"].isna().tolist() == [False, False, True]
    clean = df[(df["metric"] == "drift_clean")]["value"]
    assert clean.nunique() == 1 and clean.iloc[0] > 0
    from figures.interventions import main as figure_main

    df.to_csv(tmp / "patching.csv", index=False)
    assert figure_main([str(tmp / "patching.csv"), "--out", str(tmp / "fig" / "patching")]) == 0
    assert (tmp / "fig" / "patching.png").stat().st_size > 1000


def test_q4_tables_and_figures(runs, tmp_path):
    from figures.interventions import plot_knockout_drift, plot_knockout_probes

    tables = q4_sep_knockout(runs["clean"], runs["ko"], runs["control"], targets=("topic",), n_resamples=100,
                             out=tmp_path / "results")
    assert set(tables) == {"q4_knockout_drift", "q4_knockout_probes"}
    assert set(tables["q4_knockout_probes"]["mode"]) == {"transfer", "retrain"}
    again = q4_sep_knockout(runs["clean"], runs["ko"], runs["control"], targets=("topic",), n_resamples=100,
                            out=tmp_path / "results")
    for name in tables:  # the second call reads the stored tables
        pd.testing.assert_frame_equal(again[name][["metric", "value", "ci_low", "ci_high"]],
                                      tables[name][["metric", "value", "ci_low", "ci_high"]])
    for paths in (plot_knockout_drift(tables["q4_knockout_drift"], tmp_path / "fig" / "drift"),
                  plot_knockout_probes(tables["q4_knockout_probes"], tmp_path / "fig" / "probes")):
        assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in paths)


def test_command_line(runs, tmp_path, capsys):
    from analyses.interventions import main

    out = str(tmp_path / "results")
    assert main(["knockout", str(runs["clean"].path), str(runs["ko"].path), str(runs["control"].path),
                 "--groups", "cls", "--targets", "topic", "--resamples", "100", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "drift_difference" in printed and "change_difference" in printed
    first = set((tmp_path / "results").glob("intervention_probes-*.csv"))
    assert main(["knockout", str(runs["clean"].path), str(runs["ko"].path), str(runs["control"].path),
                 "--groups", "cls", "--targets", "topic", "--probe-layers", "1-2", "--Cs", "0.1,1",
                 "--inner-folds", "2", "--resamples", "100", "--out", out]) == 0
    # the second call's table only (the first one's default grid reaches C = 10)
    (second,) = set((tmp_path / "results").glob("intervention_probes-*.csv")) - first
    stored = pd.read_csv(second)
    assert sorted(stored["layer"].unique()) == [1, 2] and set(stored["chosen_C_max"].dropna()) <= {0.1, 1.0}
    capsys.readouterr()
    both = str(tmp_path / "both")
    assert main(["knockout", str(runs["clean"].path), str(runs["ko"].path), str(runs["control"].path),
                 "--groups", "cls", "--targets", "topic", "--probe-layers", "2", "--mode", "transfer,retrain",
                 "--resamples", "100", "--out", both]) == 0
    printed = capsys.readouterr().out
    assert "transfer" in printed and "retrain" in printed
    stored = pd.read_csv(next((tmp_path / "both").glob("intervention_probes-*.csv")))
    assert list(dict.fromkeys(stored["mode"])) == ["transfer", "retrain"]
    assert main(["knockout", str(runs["clean"].path), str(runs["ko"].path), "--mode", "sideways",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--mode 'sideways': give one or both of transfer, retrain" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main(["patching", str(runs["control"].path), str(runs["clean"].path), str(runs["ko"].path),
                 "--resamples", "100", "--out", out]) == 0
    assert "knockout all->sep@1-2" in capsys.readouterr().out
    assert main(["patching", str(runs["clean"].path), str(runs["clean"].path), str(tmp_path / "nowhere"),
                 "--out", out]) == 2
    assert "nowhere is not a complete cache" in capsys.readouterr().err
    assert main(["patching", str(runs["clean"].path), str(runs["clean"].path), str(runs["ko"].path),
                 "--out", out]) == 2
    assert "does not drift between" in capsys.readouterr().err
