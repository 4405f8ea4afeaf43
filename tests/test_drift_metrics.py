"""Known-answer tests for analyses.drift._metrics, analyses.stats._intervals and analyses.stats."""

from __future__ import annotations

import doctest
import time

import warnings

import numpy as np
import pytest
from scipy import stats as sps

import analyses.drift._metrics as dm
import analyses.stats._intervals as iv
import analyses.stats._stats as st
from analyses.drift import (DRIFT_METRICS, anisotropy_baseline, anisotropy_baseline_ci, drift_summary,
                            fit_standardization, normalised_drift, random_pair_indices, relative_l2, rowwise_cosine,
                            standardize, subword_pool)
from analyses.stats import bootstrap_ci, t_interval
from analyses.results import RESULT_COLUMNS, make_table


# ---------------------------------------------------------------- helpers

def planted_pair(n, dim, cos, rng):
    """A (n, dim) and B with cos(a_i, b_i) == cos[i] exactly (in exact arithmetic), random norms."""
    cos = np.broadcast_to(np.asarray(cos, dtype=np.float64), (n,))
    A = rng.normal(size=(n, dim)) * rng.uniform(0.5, 5.0, size=(n, 1))
    a_hat = A / np.linalg.norm(A, axis=1, keepdims=True)
    g = rng.normal(size=(n, dim))
    u = g - np.einsum("ij,ij->i", g, a_hat)[:, None] * a_hat
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    B = (cos[:, None] * a_hat + np.sqrt(1.0 - cos[:, None] ** 2) * u) * rng.uniform(0.1, 10.0, size=(n, 1))
    return A, B


def clustered_values(n_groups, per_group, rng, mu=0.7, group_sd=0.1, token_sd=0.02):
    """Values with a shared per-group effect (tokens within a group correlated)."""
    g = np.repeat(np.arange(n_groups), per_group)
    v = mu + rng.normal(scale=group_sd, size=n_groups)[g] + rng.normal(scale=token_sd, size=g.size)
    return v, g


def slow_cosine(A, B):
    out = []
    for a, b in zip(np.asarray(A, float), np.asarray(B, float)):
        out.append(float(a @ b) / (np.sqrt(float(a @ a)) * np.sqrt(float(b @ b))))
    return np.array(out)


# ---------------------------------------------------------------- doctests

@pytest.mark.parametrize("module", [dm, iv, st])
def test_doctests(module):
    res = doctest.testmod(module)
    assert res.attempted > 0 and res.failed == 0


# ---------------------------------------------------------------- rowwise cosine, relative L2

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("c", [0.99, 0.5, 0.0, -0.3, -1.0, 1.0])
def test_planted_cosine_recovered(seed, c):
    rng = np.random.default_rng(seed)
    A, B = planted_pair(200, 48, c, rng)
    np.testing.assert_allclose(rowwise_cosine(A, B), c, rtol=0, atol=1e-10)


def test_planted_varying_cosines_and_slow_reference():
    rng = np.random.default_rng(5)
    c = rng.uniform(-1, 1, size=300)
    A, B = planted_pair(300, 32, c, rng)
    got = rowwise_cosine(A, B)
    np.testing.assert_allclose(got, c, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got, slow_cosine(A, B), rtol=0, atol=1e-12)
    assert got.dtype == np.float64


def test_cosine_blocks_and_float32_and_extreme_scales():
    rng = np.random.default_rng(0)
    n = dm._BLOCK_ROWS + 17  # crosses a block boundary
    A = rng.normal(size=(n, 8)).astype(np.float32)
    B = (A + 0.3 * rng.normal(size=(n, 8))).astype(np.float32)
    np.testing.assert_allclose(rowwise_cosine(A, B), slow_cosine(A, B), atol=1e-12)
    # scale-free: 1e-200 and 1e200 neither underflow nor overflow
    a = rng.normal(size=(5, 16))
    b = rng.normal(size=(5, 16))
    ref = slow_cosine(a, b)
    np.testing.assert_allclose(rowwise_cosine(a * 1e-200, b * 1e200), ref, atol=1e-12)
    np.testing.assert_allclose(rowwise_cosine(a * 1e-160, b * 1e-160), ref, atol=1e-12)
    rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
    for scale in (1e-200, 1e-160, 1e180):
        np.testing.assert_allclose(relative_l2(a * scale, b * scale), rel, rtol=1e-12)
    assert np.all(rowwise_cosine(a * 1e180, a * 1e180) == 1.0)
    assert np.all(relative_l2(a * 1e-180, a * 1e-180) == 0.0)


def test_identical_rows_give_exactly_one_and_zero_drift():
    rng = np.random.default_rng(3)
    A = (rng.normal(size=(500, 64)) * rng.uniform(1e-3, 1e3, size=(500, 1))).astype(np.float32)
    cos = rowwise_cosine(A, A.copy())
    assert np.all(cos == 1.0)
    assert np.all(1.0 - cos == 0.0)
    assert np.all(relative_l2(A, A.copy()) == 0.0)


def test_zero_norm_row_is_nan_not_silent():
    A = np.array([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]])
    B = np.array([[1.0, 2.0], [1.0, 1.0], [0.0, 0.0]])
    cos = rowwise_cosine(A, B)
    assert cos[0] == 1.0 and np.isnan(cos[1]) and np.isnan(cos[2])
    rel = relative_l2(A, B)
    assert rel[0] == 0.0 and np.isnan(rel[1]) and rel[2] == 1.0


def test_relative_l2_known_values():
    A = np.array([[3.0, 4.0], [1.0, 0.0]])
    B = np.array([[0.0, 0.0], [1.0, 2.0]])
    np.testing.assert_allclose(relative_l2(A, B), [1.0, 2.0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("fn", [rowwise_cosine, relative_l2])
def test_pair_shape_errors_name_shapes(fn):
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(3, 5\)"):
        fn(np.ones((3, 4)), np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"A.shape=\(4,\)"):
        fn(np.ones(4), np.ones(4))


# ---------------------------------------------------------------- bootstrap

def test_bootstrap_point_and_ci_contain_planted_value():
    rng = np.random.default_rng(0)
    v, g = clustered_values(200, 10, rng, mu=0.7)
    for statistic in ("mean", "median"):
        for method in ("percentile", "BCa"):
            point, lo, hi = bootstrap_ci(v, g, statistic, n_resamples=500, method=method)
            assert lo < 0.7 < hi
            assert hi - lo > 0.005
            assert lo <= point <= hi
    assert bootstrap_ci(v, g)[0] == pytest.approx(v.mean(), abs=1e-15)
    assert bootstrap_ci(v, g, "median")[0] == np.median(v)


def test_bootstrap_narrows_with_more_groups():
    rng = np.random.default_rng(1)
    widths = []
    for n_groups in (20, 80, 320, 1280):
        v, g = clustered_values(n_groups, 5, rng)
        _, lo, hi = bootstrap_ci(v, g, n_resamples=2000)
        widths.append(hi - lo)
        # the width follows the standard error of the group means, 2 · 1.96 · s_groups / sqrt(n_groups)
        group_means = np.bincount(g, v) / np.bincount(g)
        expect = 2 * 1.959964 * group_means.std(ddof=1) / np.sqrt(n_groups)
        assert widths[-1] == pytest.approx(expect, rel=0.15)
    assert all(w1 > w2 for w1, w2 in zip(widths, widths[1:])), widths
    assert widths[0] / widths[-1] > 4


def test_cluster_bootstrap_wider_than_naive_when_tokens_correlated():
    rng = np.random.default_rng(2)
    v, g = clustered_values(100, 20, rng, group_sd=0.1, token_sd=0.02)
    _, lo_c, hi_c = bootstrap_ci(v, g, n_resamples=1000)
    _, lo_n, hi_n = bootstrap_ci(v, np.arange(v.size), n_resamples=1000)
    assert (hi_c - lo_c) > 3 * (hi_n - lo_n)
    # with independent tokens the two agree
    v2 = 0.7 + rng.normal(scale=0.1, size=2000)
    g2 = np.repeat(np.arange(100), 20)
    w_c = np.subtract(*bootstrap_ci(v2, g2, n_resamples=2000)[2:0:-1])
    w_n = np.subtract(*bootstrap_ci(v2, np.arange(2000), n_resamples=2000)[2:0:-1])
    assert 0.7 < w_c / w_n < 1.4


def test_cluster_bootstrap_coverage_near_nominal():
    """Over repeated planted data sets the 95% CI covers the true mean about 95% of the time,
    while the naive token bootstrap under-covers badly."""
    rng = np.random.default_rng(7)
    cover_cluster = cover_naive = 0
    reps = 200
    for r in range(reps):
        v, g = clustered_values(40, 10, rng, mu=0.5, group_sd=0.1, token_sd=0.05)
        _, lo, hi = bootstrap_ci(v, g, n_resamples=400, seed=r)
        cover_cluster += lo <= 0.5 <= hi
        _, lo, hi = bootstrap_ci(v, np.arange(v.size), n_resamples=400, seed=r)
        cover_naive += lo <= 0.5 <= hi
    assert 0.88 <= cover_cluster / reps <= 0.99
    assert cover_naive / reps < 0.6


@pytest.mark.parametrize("statistic, window", [("mean", None), ("median", None), ("median", 2)])
@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_bootstrap_matches_slow_reference(statistic, window, method, monkeypatch):
    """Same resampled group indices (same seed) through an obvious per-resample statistic.
    A tiny median scan window (window=2) makes most resamples take the exact fallback path."""
    if window is not None:
        monkeypatch.setattr(iv, "_median_window_half", lambda sd_rank, max_group: window)
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 7, size=25)
    g = np.repeat(np.arange(25), sizes)
    g = np.concatenate([g, np.full(150, 25)])  # one big group: a rank far from the window
    v = np.round(rng.normal(size=g.size), 1)  # ties exercise the weighted median
    perm = rng.permutation(g.size)
    v, g = v[perm], g[perm]
    members = [v[g == k] for k in range(26)]
    fn = np.mean if statistic == "mean" else np.median

    def slow(idx):
        return fn(np.concatenate([members[int(k)] for k in idx]))

    ref = sps.bootstrap((np.arange(26),), slow, n_resamples=300, vectorized=False, method=method,
                        confidence_level=0.9, rng=np.random.default_rng(4))
    point, lo, hi = bootstrap_ci(v, g, statistic, n_resamples=300, confidence=0.9, seed=4, method=method)
    assert point == pytest.approx(fn(v), abs=1e-14)
    assert lo == pytest.approx(ref.confidence_interval.low, abs=1e-12)
    assert hi == pytest.approx(ref.confidence_interval.high, abs=1e-12)


@pytest.mark.parametrize("multi_output", [True, False])
@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_bootstrap_cis_equals_separate_calls(multi_output, method, monkeypatch):
    """One pass over shared resamples gives what separate calls give (also on old scipy's path)."""
    monkeypatch.setattr(iv, "_MULTI_OUTPUT", multi_output)
    rng = np.random.default_rng(9)
    v, g = clustered_values(40, 6, rng)
    cols = {"a": v, "b": 1.0 - v ** 2, "const": np.full(v.size, 0.25)}
    got = iv.bootstrap_cis(cols, g, ("mean", "median"), n_resamples=300, seed=5, method=method)
    assert set(got) == {(c, s) for c in cols for s in ("mean", "median")}
    for (c, s), triple in got.items():
        alone = bootstrap_ci(cols[c], g, s, n_resamples=300, seed=5, method=method)
        np.testing.assert_allclose(triple, alone, rtol=0, atol=1e-14)
    assert got["const", "median"] == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError, match=r"'b' has shape \(5,\), expected \(240,\)"):
        iv.bootstrap_cis({"a": v, "b": v[:5]}, g)


def test_weighted_median_equals_median_of_expanded_multiset():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        v = np.sort(np.round(rng.normal(size=n), 1))
        w = rng.integers(0, 4, size=(3, n))
        w[:, rng.integers(n)] += 1  # at least one element per row
        got = iv._weighted_median_sorted(v, w)
        ref = [np.median(np.repeat(v, row)) for row in w]
        np.testing.assert_array_equal(got, ref)


def test_bootstrap_string_group_labels_and_determinism():
    rng = np.random.default_rng(0)
    v, g = clustered_values(30, 4, rng)
    labels = np.array([f"ex{k:03d}" for k in g])  # sorts like g
    a = bootstrap_ci(v, labels, "median", seed=3)
    assert a == bootstrap_ci(v, labels, "median", seed=3)
    assert a == bootstrap_ci(v, g, "median", seed=3)
    assert a != bootstrap_ci(v, g, "median", seed=4)


def test_bootstrap_edge_cases():
    point, lo, hi = bootstrap_ci([0.2, 0.4, 0.9], [7, 7, 7])
    assert point == pytest.approx(0.5) and np.isnan(lo) and np.isnan(hi)
    for method in ("percentile", "BCa"):
        assert bootstrap_ci([0.3] * 6, [0, 0, 1, 1, 2, 2], method=method) == (0.3, 0.3, 0.3)


def test_bootstrap_errors():
    with pytest.raises(ValueError, match=r"non-finite.*\[1\]"):
        bootstrap_ci([1.0, np.nan, 2.0], [0, 1, 2])
    with pytest.raises(ValueError, match=r"shape \(3,\).*groups.shape=\(2,\)"):
        bootstrap_ci([1.0, 2.0, 3.0], [0, 1])
    with pytest.raises(ValueError, match="statistic.*'mode'"):
        bootstrap_ci([1.0, 2.0], [0, 1], statistic="mode")
    with pytest.raises(ValueError, match="method.*'bca'"):
        bootstrap_ci([1.0, 2.0], [0, 1], method="bca")
    with pytest.raises(ValueError, match="confidence=1.5"):
        bootstrap_ci([1.0, 2.0], [0, 1], confidence=1.5)
    with pytest.raises(ValueError, match="n_resamples=0"):
        bootstrap_ci([1.0, 2.0], [0, 1], n_resamples=0)
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([], [])


def test_bootstrap_mean_is_fast():
    rng = np.random.default_rng(0)
    v, g = clustered_values(5000, 10, rng)
    bootstrap_ci(v[:100], g[:100])  # warm up imports
    t0 = time.perf_counter()
    bootstrap_ci(v, g, "mean", n_resamples=1000)
    assert time.perf_counter() - t0 < 1.0


def test_t_interval_known_value():
    m, lo, hi = t_interval([1.0, 2.0, 3.0], 0.95)
    half = 4.302652729749464 / np.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 1
    assert m == 2.0
    assert lo == pytest.approx(2.0 - half, abs=1e-12) and hi == pytest.approx(2.0 + half, abs=1e-12)
    m, lo, hi = t_interval([0.8])
    assert m == 0.8 and np.isnan(lo) and np.isnan(hi)
    with pytest.raises(ValueError, match="non-finite"):
        t_interval([0.8, np.inf])


# ---------------------------------------------------------------- anisotropy baseline

def test_anisotropy_isotropic_near_zero_and_common_mean_near_one():
    rng = np.random.default_rng(0)
    ex = np.repeat(np.arange(200), 10)
    X = rng.normal(size=(2000, 64))
    assert abs(anisotropy_baseline(X, ex)) < 0.01
    Y = X + 20.0 * np.ones(64)
    assert anisotropy_baseline(Y, ex) > 0.99
    point, lo, hi = anisotropy_baseline_ci(X, ex, n_resamples=300)
    assert point == anisotropy_baseline(X, ex) and lo < 0 < hi


def test_random_pairs_come_from_different_examples_uniformly():
    rng = np.random.default_rng(1)
    sizes = np.array([1, 2, 5, 40])
    ex = rng.permutation(np.repeat(np.array([10, 20, 30, 40]), sizes))
    i, j = random_pair_indices(ex, n_pairs=200_000, seed=0)
    assert np.all(ex[i] != ex[j])
    # uniform over valid ordered pairs: P(first row in example e) = s_e (n - s_e) / (n² - Σ s²)
    n = sizes.sum()
    expect = sizes * (n - sizes) / (n ** 2 - (sizes ** 2).sum())
    freq = np.array([(ex[i] == e).mean() for e in (10, 20, 30, 40)])
    np.testing.assert_allclose(freq, expect, atol=0.005)
    # and every row of an example equally likely: rows of example 40 as second element
    rows40 = np.flatnonzero(ex == 40)
    counts = np.array([(j == r).sum() for r in rows40])
    assert counts.min() > 0.7 * counts.mean()


def test_anisotropy_errors_and_determinism():
    X = np.random.default_rng(0).normal(size=(10, 4))
    with pytest.raises(ValueError, match="at least 2 examples, got 1"):
        anisotropy_baseline(X, np.zeros(10))
    with pytest.raises(ValueError, match=r"shape \(10,\).*\(9,\)"):
        anisotropy_baseline(X, np.zeros(9))
    ex = np.repeat([0, 1], 5)
    assert anisotropy_baseline(X, ex, seed=5) == anisotropy_baseline(X, ex, seed=5)
    assert anisotropy_baseline(X, ex, seed=5) != anisotropy_baseline(X, ex, seed=6)
    X[3] = 0.0
    with pytest.raises(ValueError, match="zero-norm.*3"):
        anisotropy_baseline(X, ex, n_pairs=2000)


# ---------------------------------------------------------------- standardisation

def rogue_data(rng, n=2000, dim=32):
    X = rng.normal(size=(n, dim))
    X[:, 0] = 50.0 + 20.0 * rng.normal(size=n)  # rogue dimension: huge mean and variance
    return X


def test_standardisation_removes_rogue_dimension():
    rng = np.random.default_rng(0)
    X = rogue_data(rng)
    ex = np.repeat(np.arange(200), 10)
    assert anisotropy_baseline(X, ex) > 0.6
    Z = standardize(X)
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(Z.std(0), 1, atol=1e-12)
    assert abs(anisotropy_baseline(Z, ex)) < 0.02


def test_standardised_drift_sees_through_rogue_dimension():
    rng = np.random.default_rng(1)
    A = rogue_data(rng)
    B = A.copy()
    B[:, 1:] = rng.normal(size=(A.shape[0], A.shape[1] - 1))  # all information dims replaced
    ex = np.repeat(np.arange(200), 10)
    groups = np.full(A.shape[0], "w")
    raw = {r["metric"]: r["value"] for r in drift_summary(A, B, ex, groups, n_resamples=100,
                                                          overall_label=None)}
    std = {r["metric"]: r["value"] for r in drift_summary(A, B, ex, groups, n_resamples=100,
                                                          standardise=True, overall_label=None)}
    assert raw["cosine_mean"] > 0.6  # raw cosine says "barely changed"
    assert std["cosine_mean"] < 0.2  # standardised: the token moved
    assert 0.8 < std["normalised_drift"] < 1.2  # as far as random tokens are


def test_standardize_uses_reference_statistics_and_errors():
    rng = np.random.default_rng(2)
    R = rng.normal(loc=3.0, scale=2.0, size=(500, 6))
    R[:, 5] = 7.0  # constant dimension: std 1, centred to 0
    mean, std = fit_standardization(R)
    assert std[5] == 1.0 and mean[5] == 7.0
    X = rng.normal(size=(4, 6))
    np.testing.assert_allclose(standardize(X, mean, std), (X - R.mean(0)) / np.where(R.std(0) > 0, R.std(0), 1))
    with pytest.raises(ValueError, match="both mean and std"):
        standardize(X, mean=mean)
    with pytest.raises(ValueError, match=r"\(6,\).*mean.shape=\(5,\)"):
        standardize(X, mean[:5], std[:5])
    with pytest.raises(ValueError, match=r"dims \[2\]"):
        standardize(X, mean, np.where(np.arange(6) == 2, 0.0, 1.0))


# ---------------------------------------------------------------- normalised drift

def test_normalised_drift_values_and_errors():
    assert normalised_drift(1.0, 0.6) == 0.0
    assert normalised_drift(0.6, 0.6) == 1.0
    assert normalised_drift(0.8, 0.6) == pytest.approx(0.5, abs=1e-15)
    assert normalised_drift(0.2, 0.6) == pytest.approx(2.0, abs=1e-15)
    with pytest.raises(ValueError, match="baseline=1.0"):
        normalised_drift(0.9, 1.0)
    with pytest.raises(ValueError, match="cos_mean=1.5"):
        normalised_drift(1.5, 0.2)


# ---------------------------------------------------------------- drift summary

def test_drift_summary_identical_inputs_zero_exactly():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(300, 16)).astype(np.float32) + 3.0
    ex = np.repeat(np.arange(30), 10)
    groups = np.where(np.arange(300) % 10 == 0, "cls", "s1 words")
    for standardise in (False, True):
        rows = drift_summary(A, A.copy(), ex, groups, n_resamples=100, standardise=standardise)
        by = {(r["role"], r["metric"]): r for r in rows}
        for role in ("cls", "s1 words", "all"):
            for m in ("drift_mean", "drift_median", "relative_l2_mean", "relative_l2_median",
                      "normalised_drift", "normalised_drift_median"):
                r = by[role, m]
                assert (r["value"], r["ci_low"], r["ci_high"]) == (0.0, 0.0, 0.0), (role, m, r)
            assert by[role, "cosine_mean"]["value"] == 1.0


def test_drift_summary_recovers_planted_group_cosines():
    rng = np.random.default_rng(3)
    n_ex, per = 60, 12
    ex = np.repeat(np.arange(n_ex), per)
    groups = np.where(np.arange(ex.size) % per == 0, "cls", "s1 words")
    c_true = np.where(groups == "cls", 0.5, 0.9)
    c = np.clip(c_true + rng.normal(scale=0.03, size=n_ex)[ex] + rng.normal(scale=0.01, size=ex.size), -1, 1)
    A, B = planted_pair(ex.size, 32, c, rng)
    rows = drift_summary(A, B, ex, groups, n_resamples=500, seed=1)
    assert {r["metric"] for r in rows} == set(DRIFT_METRICS)
    assert all(set(r) <= set(RESULT_COLUMNS) | {"n_examples", "n_groups", "n_resamples"} for r in rows)
    assert {r["n_resamples"] for r in rows} == {500}
    by = {(r["role"], r["metric"]): r for r in rows}
    for role, truth in (("cls", 0.5), ("s1 words", 0.9)):
        r = by[role, "cosine_mean"]
        assert r["ci_low"] < truth < r["ci_high"] and r["ci_high"] - r["ci_low"] > 0
        d = by[role, "drift_mean"]
        assert d["value"] == pytest.approx(1 - r["value"], abs=1e-12)
        assert d["ci_low"] < 1 - truth < d["ci_high"]
    assert by["cls", "cosine_mean"]["n"] == n_ex and by["cls", "cosine_mean"]["n_examples"] == n_ex
    assert by["s1 words", "drift_mean"]["n"] == n_ex * (per - 1)
    assert by["all", "drift_median"]["n"] == ex.size
    base = by["all", "anisotropy_baseline"]
    assert abs(base["value"]) < 0.05 and base["n"] == 10000
    for role in ("cls", "s1 words"):  # each group against its own random-pair baseline
        own = by[role, "anisotropy_baseline"]
        assert abs(own["value"]) < 0.05 and own["n"] == 10000 and own["ci_low"] < own["value"] < own["ci_high"]
        nd = by[role, "normalised_drift"]
        assert nd["value"] == pytest.approx(normalised_drift(by[role, "cosine_mean"]["value"], own["value"]))
        assert nd["ci_low"] < nd["value"] < nd["ci_high"]
    assert by["all", "normalised_drift"]["value"] == pytest.approx(
        normalised_drift(by["all", "cosine_mean"]["value"], base["value"]))
    # tidy: opens as a standard table
    df = make_table(rows)
    assert list(df.columns[:len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert len(df) == 3 * (len(DRIFT_METRICS) - 1) + 2 + 1  # two groups' baselines and the overall one


def test_drift_summary_normalises_each_group_by_its_own_spread():
    """A [CLS]-like group is one large vector for every input plus a small per-input part (as in a sentence
    encoder's middle layers); format B replaces that part with a fresh draw, so [CLS] moves as far as it
    would in another input, while the words (isotropic) move a little. Raw drift ranks [CLS] far below the
    words; normalised by each group's own random-pair baseline, [CLS] is at 1 (as far as another input)
    and the words near their planted share. Against the baseline of all tokens [CLS] would be about 1e-4."""
    rng = np.random.default_rng(11)
    n_ex, per, dim = 200, 8, 64
    ex = np.repeat(np.arange(n_ex), per)
    groups = np.where(np.arange(ex.size) % per == 0, "cls", "s1 words")
    is_cls = groups == "cls"
    A = rng.normal(size=(ex.size, dim))
    B = A + 0.3 * rng.normal(size=A.shape)  # words: 1 − cos about 0.04, random pairs about 1
    common = 100.0 * rng.normal(size=dim)
    A[is_cls] = common + rng.normal(size=(n_ex, dim))
    B[is_cls] = common + rng.normal(size=(n_ex, dim))  # a fresh draw: as far as another input
    by = {(r["role"], r["metric"]): r for r in drift_summary(A, B, ex, groups, n_resamples=200, seed=0)}
    raw_cls, raw_words = by["cls", "drift_mean"]["value"], by["s1 words", "drift_mean"]["value"]
    assert raw_cls < 0.01 * raw_words  # raw drift: [CLS] looks unmoved
    nd = by["cls", "normalised_drift"]
    assert nd["ci_low"] < 1.0 < nd["ci_high"] and 0.9 < nd["value"] < 1.1
    words = by["s1 words", "normalised_drift"]
    assert 0.02 < words["value"] < 0.08
    assert raw_cls / (1 - by["all", "anisotropy_baseline"]["value"]) < 1e-3  # what the all-token baseline gives


def test_drift_summary_group_without_spread_has_no_normalised_drift():
    """A group that is the same vector in every input (the embedding layer's [CLS]) has no spread to
    normalise by: its normalised drift is NaN, its raw drift still 0, and no warning is raised."""
    rng = np.random.default_rng(2)
    ex = np.repeat(np.arange(30), 4)
    groups = np.where(np.arange(ex.size) % 4 == 0, "cls", "w")
    A = rng.normal(size=(ex.size, 16))
    A[groups == "cls"] = np.arange(16.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by = {(r["role"], r["metric"]): r for r in drift_summary(A, A.copy(), ex, groups, n_resamples=100)}
    assert by["cls", "anisotropy_baseline"]["value"] == pytest.approx(1.0, abs=1e-12)
    assert by["cls", "drift_mean"]["value"] == 0.0
    assert np.isnan(by["cls", "normalised_drift"]["value"]) and np.isnan(by["cls", "normalised_drift"]["ci_low"])
    assert by["w", "normalised_drift"]["value"] == 0.0


def test_drift_summary_default_baseline_is_union_of_formats():
    rng = np.random.default_rng(8)
    A = rng.normal(size=(120, 6)) + 1.0
    B = rng.normal(size=(120, 6)) - 0.5
    ex = np.repeat(np.arange(24), 5)
    g = np.where(np.arange(120) % 5 == 0, "cls", "w").astype("<U8")
    g[:5] = "solo"  # a group of one example: point estimates, NaN intervals, no crash
    U, U_ex = np.concatenate([A, B]), np.concatenate([ex, ex])
    for standardise in (False, True):
        rows = drift_summary(A, B, ex, g, n_resamples=200, seed=3, standardise=standardise)
        by = {(r["role"], r["metric"]): r for r in rows}
        X = standardize(U) if standardise else U
        base = anisotropy_baseline_ci(X, U_ex, seed=3, n_resamples=200)
        got = by["all", "anisotropy_baseline"]
        np.testing.assert_allclose((got["value"], got["ci_low"], got["ci_high"]), base, atol=1e-14)
        assert by["all", "anisotropy_baseline"]["n_examples"] == 24
        solo = by["solo", "cosine_mean"]
        assert solo["n_examples"] == 1 and np.isfinite(solo["value"]) and np.isnan(solo["ci_low"])
        assert np.isnan(by["solo", "normalised_drift"]["ci_high"])
    np.testing.assert_allclose(np.concatenate(fit_standardization([A, B])),
                               np.concatenate(fit_standardization(U)), atol=1e-14)


def test_drift_summary_with_baseline_set_and_determinism():
    rng = np.random.default_rng(4)
    A = rng.normal(size=(100, 8)) + 5.0
    B = A + 0.1 * rng.normal(size=A.shape)
    ex = np.repeat(np.arange(20), 5)
    groups = np.array(["w"] * 100)
    base = rng.normal(size=(400, 8))  # isotropic baseline set, unlike A
    base_ex = np.repeat(np.arange(40), 10)
    rows = drift_summary(A, B, ex, groups, base, base_ex, n_resamples=100, seed=2)
    by = {(r["role"], r["metric"]): r for r in rows}
    assert abs(by["all", "anisotropy_baseline"]["value"]) < 0.05
    assert by["all", "anisotropy_baseline"]["n_examples"] == 40
    assert rows == drift_summary(A, B, ex, groups, base, base_ex, n_resamples=100, seed=2)
    assert rows != drift_summary(A, B, ex, groups, base, base_ex, n_resamples=100, seed=3)


def test_drift_summary_errors():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(10, 4))
    ex = np.repeat([0, 1], 5)
    g = np.array(["w"] * 10)
    with pytest.raises(ValueError, match=r"example_ids must have shape \(10,\).*\(9,\)"):
        drift_summary(A, A, ex[:9], g)
    with pytest.raises(ValueError, match=r"groups must have shape \(10,\)"):
        drift_summary(A, A, ex, g[:3])
    with pytest.raises(ValueError, match=r"\(10, 4\) vs B.shape=\(10, 3\)"):
        drift_summary(A, A[:, :3], ex, g)
    with pytest.raises(ValueError, match="at least 2 examples"):
        drift_summary(A, A, np.zeros(10), g)
    with pytest.raises(ValueError, match="baseline_example_ids"):
        drift_summary(A, A, ex, g, baseline_X=A)
    with pytest.raises(ValueError, match="overall_label"):
        drift_summary(A, A, ex, np.array(["all"] * 10))
    Z = A.copy()
    Z[7] = 0.0
    with pytest.raises(ValueError, match=r"zero norm.*\[7\]"):
        drift_summary(A, Z, ex, g)


# ---------------------------------------------------------------- subword pooling

def slow_pool(states, word_ids, sub, mode):
    words = sorted(set(word_ids.tolist()))
    out = []
    for w in words:
        rows = [k for k in range(len(word_ids)) if word_ids[k] == w]
        if mode == "first":
            out.append(states[[k for k in rows if sub[k] == 0][0]])
        else:
            out.append(np.mean(np.asarray(states[rows], dtype=np.float64), axis=0))
    return np.array(out), np.array(words)


@pytest.mark.parametrize("mode", ["first", "mean"])
@pytest.mark.parametrize("seed, block_rows", [(0, None), (1, None), (2, 5), (3, 1)])
def test_subword_pool_matches_slow_loop(mode, seed, block_rows, monkeypatch):
    if block_rows is not None:  # many row blocks, words straddling their ends
        monkeypatch.setattr(dm, "_BLOCK_ROWS", block_rows)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=60)
    word_ids = np.repeat(rng.permutation(1000)[:60], lengths)
    sub = np.concatenate([np.arange(k) for k in lengths])
    states = rng.normal(size=(word_ids.size, 7)).astype(np.float32)
    perm = rng.permutation(word_ids.size)  # rows in any order
    states, word_ids, sub = states[perm], word_ids[perm], sub[perm]
    pooled, words = subword_pool(states, word_ids, sub, mode=mode)
    ref, ref_words = slow_pool(states, word_ids, sub, mode)
    np.testing.assert_array_equal(words, ref_words)
    if mode == "first":
        assert pooled.dtype == np.float32
        np.testing.assert_array_equal(pooled, ref)
    else:
        assert pooled.dtype == np.float64
        np.testing.assert_allclose(pooled, ref, rtol=0, atol=1e-12)


def test_subword_pool_errors():
    S = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"\(5, 0\)"):
        subword_pool(S, np.array([5, 5, 6]), np.array([0, 0, 0]))
    with pytest.raises(ValueError, match=r"word_ids \[6\] start at subword \[1\]"):
        subword_pool(S, np.array([5, 5, 6]), np.array([0, 1, 1]))
    assert subword_pool(S, np.array([5, 5, 6]), np.array([0, 1, 1]), mode="mean")[0].shape == (2, 2)
    with pytest.raises(ValueError, match="mode must be one of"):
        subword_pool(S, np.array([5, 5, 6]), np.array([0, 1, 0]), mode="last")
    with pytest.raises(ValueError, match=r"word_ids must have shape \(3,\)"):
        subword_pool(S, np.array([5, 6]), np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="integer"):
        subword_pool(S, np.array([5.0, 5.0, 6.0]), np.array([0, 1, 0]))


@pytest.mark.parametrize("block_table, window", [(250_000, None), (40, None), (250_000, 1)])
def test_median_from_counts_is_the_median_of_the_expanded_resample(block_table, window, monkeypatch):
    """The blocked search over the median's window is exact: default blocks, blocks stretched by a small
    table bound, and a window so narrow that most resamples take the full-scan path."""
    monkeypatch.setattr(iv, "_BLOCK_TABLE_ELEMENTS", block_table)
    if window is not None:
        monkeypatch.setattr(iv, "_median_window_half", lambda sd, mx: window)
    rng = np.random.default_rng(7)
    for trial in range(60):
        n_groups = int(rng.integers(2, 40))
        codes = np.repeat(np.arange(n_groups), rng.integers(1, 25, size=n_groups))
        v = rng.normal(size=codes.size) + rng.normal(size=n_groups)[codes]
        if trial % 2:
            v = np.round(v, 1)  # ties
        counts = np.bincount(codes).astype(np.float64)
        median = iv._MedianFromCounts(v, codes, counts)
        mult = np.stack([np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups) for _ in range(30)])
        total = (mult @ counts).astype(np.int64)
        got = median(mult, mult.astype(np.float64), total)
        np.testing.assert_array_equal(got, [np.median(np.repeat(v, m[codes])) for m in mult])
