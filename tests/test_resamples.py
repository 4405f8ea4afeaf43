"""Resample counts that mean something: one declared minimum (analyses.stats.min_resamples, 100 at 95%),
refused by every function that resamples before it does any work, and the count recorded beside every
bootstrap interval (``n_resamples``). The command lines and the study config: tests/test_bad_input.py; every
table of a study: tests/test_tables.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses.stats._intervals import (MIN_RESAMPLES, bootstrap_ci, bootstrap_cis, check_resamples, min_resamples,
                                ratio_bootstrap_ci, too_few_resamples)


def test_the_minimum_is_declared_once_and_follows_the_confidence():
    assert MIN_RESAMPLES == min_resamples(0.95) == 100
    assert (min_resamples(0.9), min_resamples(0.99)) == (50, 500)
    assert too_few_resamples(100) is None and too_few_resamples(500, 0.99) is None
    assert too_few_resamples(99).startswith("a 95% interval needs at least 100 resamples")
    assert too_few_resamples(499, 0.99).startswith("a 99% interval needs at least 500 resamples")


def test_check_resamples_accepts_whole_counts_from_the_minimum():
    assert check_resamples(100) == 100 and check_resamples(np.int64(250)) == 250 and check_resamples(200.0) == 200
    assert isinstance(check_resamples(np.int64(250)), int)
    assert check_resamples(50, confidence=0.9) == 50


@pytest.mark.parametrize("bad, match", [(1, r"n_resamples=1: a 95% interval needs at least 100 resamples"),
                                        (99, r"n_resamples=99: a 95%"), (0, r"n_resamples=0: a 95%"),
                                        (-5, r"n_resamples=-5: a 95%"), (100.5, r"whole number.*100.5"),
                                        (True, r"whole number.*True"), ("200", r"whole number.*'200'"),
                                        (float("nan"), r"whole number.*nan")])
def test_check_resamples_refuses_and_names_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        check_resamples(bad)


def test_one_resample_no_longer_gives_a_zero_width_interval_that_excludes_its_estimate():
    """The issue: with one resample the "95% CI" was that one resample, of no width."""
    rng = np.random.default_rng(0)
    values, groups = rng.normal(size=40), np.repeat(np.arange(10), 4)
    with pytest.raises(ValueError, match="n_resamples=1"):
        bootstrap_ci(values, groups, n_resamples=1)
    point, lo, hi = bootstrap_ci(values, groups, n_resamples=MIN_RESAMPLES)
    assert lo < point < hi


# ---------------------------------------------------------------------------------------------------
# Every public function that resamples refuses too few, before any work


def _stats_calls():
    from analyses.drift._metrics import anisotropy_baseline_ci, drift_summary
    from analyses.interventions import fraction_closed
    from analyses.finetune._table import diff_rows, seed_document_ci, summary_rows
    from analyses.probes._batched import probe_many_results
    from analyses.probes._compare import compare_probes
    from analyses.probes._results import cross_validate_probe
    from analyses.stats import paired_difference, sign_flip_p_value

    v, g = np.arange(8.0), np.repeat(np.arange(4), 2)
    X = np.random.default_rng(0).normal(size=(8, 3))
    return {
        "bootstrap_ci": lambda n: bootstrap_ci(v, g, n_resamples=n),
        "bootstrap_cis": lambda n: bootstrap_cis({"a": v}, g, n_resamples=n),
        "ratio_bootstrap_ci": lambda n: ratio_bootstrap_ci(v, v + 1, g, n_resamples=n),
        "sign_flip_p_value": lambda n: sign_flip_p_value(v, g, n_resamples=n),
        "paired_difference": lambda n: paired_difference(v, v[::-1], g, n_resamples=n),
        "seed_document_ci": lambda n: seed_document_ci(np.ones((8, 2)), None, g, n_resamples=n),
        "summary_rows": lambda n: summary_rows({}, [], None, None, 0.5, print, n_resamples=n),
        "diff_rows": lambda n: diff_rows({}, [], None, "mean", n_resamples=n),
        "fraction_closed": lambda n: fraction_closed(v + 1, v, g, n_resamples=n),
        "anisotropy_baseline_ci": lambda n: anisotropy_baseline_ci(X, g, n_pairs=20, n_resamples=n),
        "drift_summary": lambda n: drift_summary(X, X + 1, g, np.array(["w"] * 8), n_resamples=n),
        "cross_validate_probe": lambda n: cross_validate_probe(X, g % 2, g, n_splits=2, n_resamples=n),
        "probe_many_results": lambda n: probe_many_results({"x": X}, g % 2, g, n_splits=2, n_resamples=n),
        "compare_probes": lambda n: compare_probes(pd.DataFrame({"choice": ["a"]}), {"choice": "a"},
                                                   {"choice": "b"}, n_resamples=n),
    }


def _runner_calls():
    """The runners check the count first: no cache is opened, nothing computed or written (so None
    stands for every cache)."""
    from analyses.attention import run_attention
    from analyses.contextuality import run_contextuality
    from analyses.drift import run_drift
    from analyses.interventions import drift_reproduced, knockout_drift, knockout_probes, q1_patching, q4_sep_knockout
    from analyses.neighbours import run_knn
    from analyses.paired import run_paired_attention, run_paired_drift, run_prefix_drift, run_role_contrast
    from analyses.finetune._experiment import run_pooling_experiment
    from analyses.probes._runner import run_probes
    from analyses.drift._streaming import stream_compare

    return {
        "run_drift": lambda n: run_drift(None, None, n_resamples=n),
        "run_attention": lambda n: run_attention(None, n_resamples=n),
        "run_knn": lambda n: run_knn(None, n_resamples=n),
        "run_contextuality": lambda n: run_contextuality(None, n_resamples=n),
        "run_paired_drift": lambda n: run_paired_drift(None, None, None, n_resamples=n),
        "run_role_contrast": lambda n: run_role_contrast(None, None, n_resamples=n),
        "run_prefix_drift": lambda n: run_prefix_drift(None, None, None, None, n_resamples=n),
        "run_paired_attention": lambda n: run_paired_attention(None, None, n_resamples=n),
        "knockout_drift": lambda n: knockout_drift(None, None, n_resamples=n),
        "knockout_probes": lambda n: knockout_probes(None, None, n_resamples=n),
        "drift_reproduced": lambda n: drift_reproduced(None, None, [], n_resamples=n),
        "q4_sep_knockout": lambda n: q4_sep_knockout(None, None, None, n_resamples=n),
        "q1_patching": lambda n: q1_patching(None, None, {}, n_resamples=n),
        "run_probes": lambda n: run_probes(None, n_resamples=n),
        "run_pooling_experiment": lambda n: run_pooling_experiment([], "topic", n_resamples=n),
        "stream_compare": lambda n: stream_compare([], "pair", "concat", n_resamples=n),
    }


@pytest.mark.parametrize("name", list(_stats_calls()))
def test_each_function_refuses_too_few_resamples(name):
    with pytest.raises(ValueError, match=r"n_resamples=1: a 95% interval needs at least 100 resamples"):
        _stats_calls()[name](1)


@pytest.mark.parametrize("name", list(_runner_calls()))
def test_each_runner_refuses_too_few_resamples_before_any_work(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"n_resamples=99: a 95% interval needs at least 100 resamples"):
        _runner_calls()[name](99)
    assert list(tmp_path.iterdir()) == []


def test_streaming_still_takes_zero_for_no_interval():
    """0 asks for no interval at all (point values only); any other count must give one."""
    from analyses.drift._streaming import stream_compare

    with pytest.raises(ValueError, match="the corpus is empty"):  # past the count check, to the next one
        stream_compare([], "pair", "concat", n_resamples=0)


def test_probe_result_refuses_too_few_resamples():
    from analyses.probes._results import ProbeResult

    with pytest.raises(ValueError, match="n_resamples=10"):
        ProbeResult(metric="accuracy", folds={"accuracy": np.ones(2)}, chosen_Cs=np.ones(2), n=4, n_groups=2,
                    n_resamples=10)


def test_study_config_refuses_too_few_at_load():
    from probing.study.runner import StudyError, load_config

    assert load_config(None, overrides={"study.bootstrap_resamples": 100}).study.bootstrap_resamples == 100
    for bad in (1, 99, 0):
        with pytest.raises(StudyError, match=rf"study.bootstrap_resamples = {bad}: a 95% interval needs at least 100"):
            load_config(None, overrides={"study.bootstrap_resamples": bad})
    with pytest.raises(StudyError, match="study.bootstrap_resamples = 'many': expected an integer >= 100"):
        load_config(None, overrides={"study.bootstrap_resamples": "many"})
    # every packaged config, quick or not, asks for enough
    from probing.study.runner import packaged_configs

    for name in packaged_configs():
        for quick in (False, True):
            assert load_config(name, quick=quick).study.bootstrap_resamples >= MIN_RESAMPLES


# ---------------------------------------------------------------------------------------------------
# The count is recorded beside the interval it produced


def test_paired_difference_records_its_resamples():
    from analyses.stats import paired_difference

    r = paired_difference(np.arange(8.0), np.zeros(8), np.repeat(np.arange(4), 2), n_resamples=150)
    assert r["n_resamples"] == 150


def test_probe_rows_record_resamples_on_bootstrap_rows_only():
    from analyses.probes._results import cross_validate_probe, probe_rows

    rng = np.random.default_rng(0)
    y = np.tile([0, 1], 20)
    X = rng.normal(size=(40, 3)) + y[:, None]
    Y = (rng.random(size=(40, 4)) < 0.5).astype(int)  # multi-label: its chance micro-F1 is a t-interval
    for target in (y, Y):
        rows = pd.DataFrame(probe_rows(cross_validate_probe(X, target, np.arange(40) // 2, n_splits=2, Cs=(1.0,),
                                                            n_resamples=150)))
        boot = rows["ci_method"] == "cluster_bootstrap"
        assert boot.any() and (rows.loc[boot, "n_resamples"] == 150).all()
        assert rows.loc[~boot, "n_resamples"].isna().all()
    assert (~boot).any()  # the multi-label run has t-interval rows


def test_pooling_rows_use_the_count_and_seed_given():
    """Q8's summary and difference rows resample as often as asked, from the seed given (they were
    hard-coded to 1,000 and seed 0)."""
    from analyses.finetune._table import diff_rows, summary_rows

    rng = np.random.default_rng(0)
    idx = pd.MultiIndex.from_product([["cls", "mean"], ["frozen", "fine_tuned"], [f"e{i}" for i in range(30)]],
                                     names=["pooling", "condition", "example"])
    item = pd.DataFrame({"correct": rng.random(len(idx)), "doc": [f"d{i % 10}" for i in range(len(idx))]},
                        index=idx).sort_index()
    runs = pd.DataFrame({"pooling": ["cls", "cls", "mean", "mean"], "condition": ["frozen", "fine_tuned"] * 2,
                         "value": 0.5, "converged": True})

    def table(n, seed):
        rows = summary_rows({}, ["cls", "mean"], item, runs, 0.0, lambda m: None, n_resamples=n, seed=seed)
        return pd.DataFrame(rows + diff_rows({}, ["cls", "mean"], item, "mean", n_resamples=n, seed=seed))

    a, b, c = table(150, 0), table(150, 1), table(300, 0)
    assert set(a["n_resamples"]) == {150} and set(c["n_resamples"]) == {300}
    assert not np.allclose(a["ci_low"], b["ci_low"])  # the seed reaches the intervals
    assert not np.allclose(a["ci_low"], c["ci_low"])  # so does the count
    assert np.allclose(a["value"], c["value"])
