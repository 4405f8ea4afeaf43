"""Paired comparisons, power and interval formatting (analyses.stats) on data with a known answer."""

import numpy as np
import pytest

from analyses.stats import (accuracy_mde, bootstrap_ci, cluster_se, format_interval, groups_needed, holm,
                            minimum_detectable_effect, paired_difference, ratio_bootstrap_ci, sign_flip_p_value)


def _clustered(seed: int, delta: float, n_groups: int = 80, per_group: int = 5):
    """Per-item paired scores a, b with a shared document effect; true mean difference ``delta``.
    Differences d = delta + u_g + e (u, e ~ N(0, 1)): the cluster SE of their mean is
    sqrt(G (m² + m)) / (G m) for G groups of m items."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_groups), per_group)
    doc = rng.normal(size=n_groups)[groups]
    b = doc + rng.normal(size=groups.size)
    a = b + delta + rng.normal(size=n_groups)[groups] + rng.normal(size=groups.size)
    return a, b, groups


def _true_se(n_groups=80, per_group=5):
    return np.sqrt(n_groups * (per_group ** 2 + per_group)) / (n_groups * per_group)


def test_planted_difference_found_and_null_at_nominal_rate():
    """Over 100 seeds: a null difference is declared (p < 0.05) at about 5%, and the CI covers 0 at
    about 95%; a difference equal to the minimum detectable effect is found at about 80% (the power)."""
    mde = minimum_detectable_effect(_true_se())
    null_p, null_cover, planted_p = [], [], []
    for seed in range(100):
        a, b, g = _clustered(seed, 0.0)
        r = paired_difference(a, b, g, n_resamples=500, seed=seed)
        null_p.append(r["p_value"])
        null_cover.append(r["ci_low"] <= 0 <= r["ci_high"])
        a, b, g = _clustered(1000 + seed, mde)
        planted_p.append(paired_difference(a, b, g, n_resamples=500, seed=seed)["p_value"])
    assert abs(np.mean(np.asarray(null_p) < 0.05) - 0.05) <= 0.05
    assert abs(np.mean(null_cover) - 0.95) <= 0.06
    assert abs(np.mean(np.asarray(planted_p) < 0.05) - 0.8) <= 0.12


def test_large_planted_difference_is_clear():
    a, b, g = _clustered(0, 1.0)
    r = paired_difference(a, b, g, n_resamples=1000)
    assert r["p_value"] < 0.01 and r["ci_low"] > 0.5 and r["ci_high"] < 1.5
    assert r["n"] == 400 and r["n_groups"] == 80
    assert r["value"] == pytest.approx(np.mean(a - b))
    assert r["mde"] == pytest.approx(minimum_detectable_effect(r["se"]))


def test_cluster_se_matches_theory_and_bootstrap():
    a, b, g = _clustered(3, 0.0, n_groups=400)
    d = a - b
    assert cluster_se(d, g) == pytest.approx(_true_se(400), rel=0.1)
    # slow, obvious reference: the standard deviation of the cluster bootstrap's means
    rng = np.random.default_rng(0)
    sums, counts = np.bincount(g, weights=d), np.bincount(g)
    draws = rng.integers(0, 400, size=(4000, 400))
    boot = sums[draws].sum(1) / counts[draws].sum(1)
    assert cluster_se(d, g) == pytest.approx(boot.std(), rel=0.08)
    # independent items: the cluster SE is the usual SE of a mean
    x = np.random.default_rng(1).normal(size=500)
    assert cluster_se(x, np.arange(500)) == pytest.approx(x.std(ddof=1) / np.sqrt(500), rel=1e-9)


def test_sign_flip_p_value_exact_small_case():
    # 3 groups with sums 1, 2, 3: of the 8 sign patterns only +/-(1+2+3) reach |6|: p = 2/8
    assert sign_flip_p_value([1.0, 2.0, 3.0], [0, 1, 2], n_resamples=1000) == pytest.approx(0.25)
    assert sign_flip_p_value([0.0, 0.0], [0, 1]) == 1.0


def test_power_helpers_known_answers():
    z = 1.959963984540054 + 0.8416212335729143
    assert minimum_detectable_effect(0.01) == pytest.approx(z * 0.01)
    assert minimum_detectable_effect(0.01, alpha=0.05, power=0.5) == pytest.approx(1.959963984540054 * 0.01)
    # se 0.015 with 100 groups detects 0.042; 0.03 needs (0.042 / 0.03)^2 = 1.96x the groups
    assert groups_needed(0.03, 0.015, 100) == int(np.ceil(100 * (z * 0.015 / 0.03) ** 2))
    assert groups_needed(0.1, 0.015, 100) <= 100
    assert accuracy_mde(600) == pytest.approx(z * np.sqrt(0.25 / 600))
    assert accuracy_mde(100, items_per_group=6, icc=0.2) == pytest.approx(z * np.sqrt(0.25 / 600 * 2.0))
    with pytest.raises(ValueError, match="effect must be positive"):
        groups_needed(0.0, 0.01, 10)


def test_holm_matches_definition():
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.5])
    got = holm(p)
    # sorted finite: 0.01, 0.03, 0.04, 0.5 (m = 4): 0.04, 0.09, 0.09 (monotone), 0.5
    np.testing.assert_allclose(got, [0.04, 0.09, 0.09, np.nan, 0.5])


def test_ratio_bootstrap_equals_mean_bootstrap_for_unit_denominators():
    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(50), 4)
    x = (rng.random(200) < 0.7).astype(float)
    point, lo, hi = ratio_bootstrap_ci(x, np.ones(200), g, n_resamples=2000)
    ref = bootstrap_ci(x, g, n_resamples=2000)
    assert point == pytest.approx(ref[0])
    assert lo == pytest.approx(ref[1], abs=0.02) and hi == pytest.approx(ref[2], abs=0.02)
    with pytest.raises(ValueError, match="differ in shape"):
        ratio_bootstrap_ci([1.0], [1.0, 2.0], [0])


@pytest.mark.parametrize("seed", range(5))
def test_format_interval_never_collapses(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        scale = 10.0 ** rng.integers(-6, 1)
        v = rng.normal() * scale
        lo, hi = v - abs(rng.normal()) * scale * 0.1, v + abs(rng.normal()) * scale * 0.1
        text = format_interval(v, lo, hi)
        shown_v, rest = text.split(" (")
        shown_lo, shown_hi = rest.rstrip(")").removeprefix("95% CI ").split(" to ")
        assert shown_lo != shown_hi and shown_lo != shown_v != shown_hi, text
        assert float(shown_lo) <= float(shown_v) <= float(shown_hi)


def test_format_interval_examples():
    assert format_interval(0.002, 0.002, 0.002) == "0.002 (95% CI 0.002 to 0.002)"  # a point is a point
    assert format_interval(0.0021, 0.0018, 0.0024) == "0.0021 (95% CI 0.0018 to 0.0024)"
    assert format_interval(0.5, 0.45, 0.55, label="") == "0.500 (0.450 to 0.550)"
    assert format_interval(-0.0071, -0.008, -0.006) == "-0.007 (95% CI -0.008 to -0.006)"
    assert format_interval(0.00712, 0.0069, 0.0073, signed=True) == "+0.0071 (95% CI +0.0069 to +0.0073)"
    assert format_interval(0.7, float("nan"), float("nan")) == "0.700 (CI n/a)"
    assert format_interval(0.0004, 0.0001, 0.0009) == "0.0004 (95% CI 0.0001 to 0.0009)"  # never prints 0.000
    assert format_interval(0.031, 0.028, 0.034, distinct_from=[0.03]) == "0.031 (95% CI 0.028 to 0.034)"
    assert format_interval(0.0301, 0.02, 0.04, distinct_from=[0.03]) == "0.0301 (95% CI 0.0200 to 0.0400)"


def test_scale_difference_equals_resampling_the_scaled_values():
    """Dividing both conditions by one constant (a group's spread) scales the mean, the CI, the SE and the MDE
    and leaves the sign-flip p-value and counts alone: scale_difference gives what paired_difference of the
    scaled values gives, without resampling again."""
    from analyses.stats import paired_difference, scale_difference

    rng = np.random.default_rng(3)
    a, b = rng.normal(0.02, 0.01, 300) * 1e-5, rng.normal(0.015, 0.01, 300) * 1e-5  # [CLS]-sized drifts
    groups = np.repeat(np.arange(60), 5)
    spread = 1.2e-5
    raw = paired_difference(a, b, groups, n_resamples=500, seed=1)
    again = paired_difference(a / spread, b / spread, groups, n_resamples=500, seed=1)
    got = scale_difference(raw, spread)
    assert set(got) == set(raw) and got["p_value"] == raw["p_value"] == again["p_value"]
    for k in ("value", "ci_low", "ci_high", "se", "mde", "value_a", "value_b"):
        assert got[k] == pytest.approx(again[k], rel=1e-9), k
    assert (got["n"], got["n_groups"]) == (raw["n"], raw["n_groups"])
    with pytest.raises(ValueError, match="positive"):
        scale_difference(raw, 0.0)
