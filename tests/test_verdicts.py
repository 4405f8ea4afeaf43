"""The verdict rules on constructed comparison rows with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from probing.study.verdicts import (PRACTICAL_THRESHOLD, Claim, add_holm, decide, difference_rows, format_interval,
                              mde_from_ci, ranges, summarise)

CLAIM = Claim(more="B is higher than A", less="B is lower than A", none="A and B score alike",
              quantity="B − A")


def _row(value, half, **kw):
    return {"value": value, "ci_low": value - half, "ci_high": value + half, **kw}


def _planted(effect: float, n: int, seed: int) -> dict:
    """A paired comparison of n items with a planted mean difference: mean and 95% t-interval."""
    from scipy import stats

    d = np.random.default_rng(seed).normal(effect, 0.1, size=n)
    se = d.std(ddof=1) / np.sqrt(n)
    t = stats.t.ppf(0.975, n - 1)
    return {"value": d.mean(), "ci_low": d.mean() - t * se, "ci_high": d.mean() + t * se,
            "p_value": 2 * stats.t.sf(abs(d.mean()) / se, n - 1)}


def test_planted_effect_is_yes_and_null_depends_on_power():
    assert decide(_planted(0.06, 400, 0)) == "yes"
    assert decide(_planted(0.01, 2000, 0)) == "yes_small"
    assert decide(_planted(0.0, 2000, 0)) == "no_difference"  # SE 0.002: could detect ~0.006
    assert decide(_planted(0.0, 20, 0)) == "inconclusive"  # SE 0.022: could detect only ~0.06


def test_rules_on_constructed_rows_and_their_sentences():
    yes = _row(0.05, 0.01, p_holm=1e-4)
    assert decide(yes) == "yes"
    s = summarise(pd.DataFrame([yes]), CLAIM).sentence
    assert s.startswith("Yes: B is higher than A") and "+0.050 (95% CI +0.040 to +0.060)" in s
    neg = _row(-0.05, 0.01)
    assert summarise(pd.DataFrame([neg]), CLAIM).sentence.startswith("Yes: B is lower than A")
    small = _row(0.007, 0.001)
    v = summarise(pd.DataFrame([small]), CLAIM)
    assert v.decision == "yes_small" and v.sentence.startswith("Yes, but small:")
    null = _row(0.001, 0.005, mde=0.012)
    v = summarise(pd.DataFrame([null]), CLAIM)
    assert v.decision == "no_difference" and "could detect >= 0.012" in v.sentence
    weak = _row(0.02, 0.05, mde=0.07)
    v = summarise(pd.DataFrame([weak]), CLAIM)
    assert v.decision == "inconclusive"
    assert v.sentence.startswith("Inconclusive: this sample could only detect >= 0.070")
    # the CI excludes 0 but Holm says no: not significant; it reaches 0.09, so a relevant difference is open
    assert decide(_row(0.05, 0.04, p_holm=0.2, mde=0.01)) == "inconclusive"
    v = summarise(pd.DataFrame([_row(0.01, 0.009, p_holm=0.2, mde=0.01)]), CLAIM)
    assert v.decision == "no_difference" and "the CI excludes 0, but not after Holm's correction" in v.sentence
    assert "its CI stays within ±0.03" in v.sentence
    # a row without mde gets one from its CI
    assert decide(_row(0.0, 0.05)) == "inconclusive" and decide(_row(0.0, 0.005)) == "no_difference"


def test_layers_subset_gives_only_in_layers():
    rows = pd.DataFrame([{"layer": L, **_row(v, 0.005)} for L, v in enumerate([0.0, 0.001, 0.05, 0.06, 0.04, 0.0])])
    v = summarise(rows, CLAIM)
    assert v.decision == "yes"
    assert v.sentence.startswith("Only in layers 2–4 (no measurable difference at layers 0–1, 5): B is higher than A")
    assert "at layer 3: +0.060" in v.sentence
    mixed = rows.assign(value=[0.0, -0.05, 0.05, 0.06, 0.04, 0.0])
    mixed = mixed.assign(ci_low=mixed["value"] - 0.005, ci_high=mixed["value"] + 0.005)
    assert summarise(mixed, CLAIM).sentence.startswith(
        "Only in layers 2–4 (the opposite at layer 1; no measurable difference at layers 0, 5): B is higher")
    every = rows.assign(value=0.05, ci_low=0.045, ci_high=0.055)
    assert summarise(every, CLAIM).sentence.startswith("Yes, in every layer:")
    none = rows.assign(value=0.0, ci_low=-0.005, ci_high=0.005)
    assert summarise(none, CLAIM).sentence.startswith("No measurable difference at any layer:")


def test_layers_below_the_practical_threshold_are_named():
    """The strongest layer sets the wording; a layer where the same difference is significant but under the
    practical threshold (0.03) is named, in "every layer" and in "Only in" alike; the opposite direction's
    small layers are not (they are "the opposite")."""
    def rows(vals):
        return pd.DataFrame([{"layer": L + 1, **_row(v, 0.001)} for L, v in enumerate(vals)])

    v = summarise(rows([0.45, 0.2, 0.3, 0.1, 0.004]), CLAIM)
    assert v.decision == "yes"
    assert v.sentence.startswith("Yes, in every layer (below the practical threshold at layer 5): B is higher")
    assert summarise(rows([0.45, 0.2, 0.01, 0.1, 0.004]), CLAIM).sentence.startswith(
        "Yes, in every layer (below the practical threshold at layers 3, 5):")
    assert summarise(rows([0.0, 0.2, 0.3, 0.004, -0.002]), CLAIM).sentence.startswith(
        "Only in layers 2–4 (below the practical threshold at layer 4; the opposite at layer 5; no measurable "
        "difference at layer 1):")
    # every significant layer small: "and small", as before, with no list
    s = summarise(rows([0.004, 0.005, 0.006, 0.004, 0.004]), CLAIM).sentence
    assert s.startswith("Yes, but small, in every layer:") and "below the practical threshold at" not in s.split(":")[0]


def test_sentence_is_computed_from_the_table():
    rows = pd.DataFrame([_row(0.05, 0.01)])
    a = summarise(rows, CLAIM).sentence
    b = summarise(rows.assign(value=0.08, ci_low=0.07, ci_high=0.09), CLAIM).sentence
    assert a != b and "+0.080" in b and "+0.050" in a
    assert summarise(rows.assign(value=0.0, ci_low=-0.01, ci_high=0.01), CLAIM).decision == "no_difference"
    threshold = Claim(**{**CLAIM.__dict__, "threshold": 0.1})
    assert summarise(rows, threshold).decision == "yes_small"


def test_holm_and_mde_match_references():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.01, 0.04, 0.03, 0.2])
    got = add_holm(pd.DataFrame({"p_value": p}))["p_holm"].to_numpy()
    np.testing.assert_allclose(got, multipletests(p, method="holm")[1])
    # Holm by hand: sorted p 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1, then cumulative max
    np.testing.assert_allclose(got, [0.04, 0.09, 0.09, 0.2])
    assert mde_from_ci(-0.01, 0.01) == pytest.approx(2.8016 * 0.01 / 1.95996, rel=1e-4)


def test_difference_rows_from_marginal_intervals():
    a = pd.DataFrame({"layer": [0, 1], "value": [0.5, 0.6], "ci_low": [0.48, 0.58], "ci_high": [0.52, 0.62]})
    b = a.assign(value=[0.5, 0.55], ci_low=[0.48, 0.53], ci_high=[0.52, 0.57])
    d = difference_rows(a, b)
    np.testing.assert_allclose(d["value"], [0.0, 0.05])
    se = np.sqrt(2) * 0.02 / 1.959964
    np.testing.assert_allclose(d["ci_high"] - d["value"], 1.959964 * se, rtol=1e-5)
    assert d["provisional"].all() and list(d["layer"]) == [0, 1]
    assert "unpaired (provisional)" in summarise(d, CLAIM).sentence
    one = difference_rows(a)  # against 0: a one-sample test, not an unpaired comparison
    np.testing.assert_allclose(one["value"], [0.5, 0.6])
    assert not one["provisional"].any() and "provisional" not in summarise(one, CLAIM).sentence
    # a one-sample row keeps the clusters its CI resampled, and the sentence counts them
    grouped = a.assign(n_groups=[40, 40], grouping="document")
    one = difference_rows(grouped, grouped.assign(value=0.1, ci_low=np.nan, ci_high=np.nan))
    assert list(one["n_groups"]) == [40, 40] and "40 documents" in summarise(one, CLAIM).sentence
    assert "n_groups" not in difference_rows(grouped, b.assign(n_groups=[40, 40])).columns  # unpaired: whose?


def test_intervals_never_collapse():
    assert format_interval(0.0021, 0.0018, 0.0024) == "0.0021 (95% CI 0.0018 to 0.0024)"
    assert format_interval(0.002, 0.002, 0.002) == "0.002 (95% CI 0.002 to 0.002)"  # truly equal numbers
    s = format_interval(0.12345, 0.12341, 0.12349)
    assert s == "0.12345 (95% CI 0.12341 to 0.12349)"
    assert format_interval(float("nan"), 0, 1) == "undefined"
    assert ranges([1, 2, 3, 5, 7, 8]) == "1–3, 5, 7–8"
    assert PRACTICAL_THRESHOLD == 0.03


def test_verdict_table_prints_each_row_and_its_decision():
    from probing.study.verdicts import verdict_table

    rows = pd.DataFrame([{"layer": 1, **_row(0.05, 0.01)}, {"layer": 2, **_row(0.0021, 0.0003)},
                         {"layer": 3, **_row(0.0, 0.05)}])
    t = verdict_table(rows, CLAIM)
    assert list(t["layer"]) == [1, 2, 3]
    assert list(t["decision"]) == ["Yes", "Yes, but small", "Inconclusive"]
    assert t["difference (95% CI)"].iloc[1] == "+0.0021 (95% CI +0.0018 to +0.0024)"
    # a one-sided question ("is B higher?"): a significant row the other way is a No in the table, as in the
    # verdict's sentence; a two-sided one keeps "Yes" for either direction
    down = pd.DataFrame([{"layer": 1, **_row(-0.05, 0.01)}, {"layer": 2, **_row(-0.0021, 0.0003)},
                         {"layer": 3, **_row(0.05, 0.01)}])
    one_sided = Claim(**{**CLAIM.__dict__, "direction": 1})
    assert list(verdict_table(down, one_sided)["decision"]) == ["No (the opposite)", "No (the opposite, small)", "Yes"]
    assert list(verdict_table(down, Claim(**{**CLAIM.__dict__, "direction": 0}))["decision"]) == [
        "Yes", "Yes, but small", "Yes"]


def test_false_positive_rate_and_power_over_seeds():
    """Over repeated null samples the verdict says 'Yes' at about α; a planted 0.03 is found nearly always."""
    null = [decide(_planted(0.0, 200, s)) in ("yes", "yes_small") for s in range(400)]
    assert 0.02 <= np.mean(null) <= 0.09
    planted = [decide(_planted(0.03, 400, s)) in ("yes", "yes_small") for s in range(100)]
    assert np.mean(planted) >= 0.95


def test_one_sided_question_answered_the_other_way_is_no():
    """Clark's "does more than half of the attention go to [SEP]?" measured far below one half is a
    "No", not a "Yes: less than …"."""
    up = Claim(more="more than half goes to [SEP]", less="less than half goes to [SEP]",
               none="about half goes to [SEP]", quantity="mass − 0.5", direction=1)
    below = pd.DataFrame([{"layer": l, **_row(-0.45, 0.01, p_holm=0.001)} for l in range(1, 4)])
    v = summarise(below, up)
    assert v.sentence.startswith("No, in any layer: less than half goes to [SEP]")
    mixed = pd.DataFrame([{"layer": 1, **_row(-0.45, 0.01, p_holm=0.001)}, {"layer": 2, **_row(0.0, 0.01)}])
    assert summarise(mixed, up).sentence.startswith("No (the opposite at layer 1; "
                                                    "no measurable difference at layer 2): less than half")
    above = pd.DataFrame([{"layer": l, **_row(0.2, 0.01, p_holm=0.001)} for l in range(1, 4)])
    assert summarise(above, up).sentence.startswith("Yes, in every layer: more than half goes to [SEP]")
    two_sided = Claim(**{**up.__dict__, "direction": 0})
    assert summarise(below, two_sided).sentence.startswith("Yes, in every layer: less than half")


def test_ci_excluding_zero_without_holm_is_said():
    row = pd.DataFrame([{"layer": 2, **_row(0.05, 0.04, p_holm=1.0, mde=0.06)}])
    s = summarise(row, CLAIM).sentence
    assert s.startswith("Inconclusive") and "the CI excludes 0, but not after Holm's correction" in s
    row = pd.DataFrame([{"layer": 2, **_row(0.01, 0.02, p_holm=1.0, mde=0.06)}])
    assert "excludes 0" not in summarise(row, CLAIM).sentence


def test_only_in_names_the_other_rows_as_absent_or_undecided():
    """An underpowered row is not an absent effect: the verdict says which rows could not tell."""
    rows = pd.DataFrame([{"sentence": i, **r} for i, r in enumerate(
        [_row(0.07, 0.02), _row(0.07, 0.02), _row(0.06, 0.02), _row(0.009, 0.015, mde=0.021),
         _row(0.047, 0.06, mde=0.084)], start=1)])
    claim = Claim("B is higher than A", "B is lower than A", "A and B alike", "B − A", ("sentence", "sentences"))
    v = summarise(rows, claim)
    assert v.sentence.startswith("Only in sentences 1–3 (no measurable difference at sentence 4; "
                                 "inconclusive at sentence 5): B is higher than A"), v.sentence
    both = rows.assign(value=[0.07, 0.07, 0.06, 0.02, 0.03], mde=[0.02, 0.02, 0.02, 0.09, 0.08])
    both = both.assign(ci_low=both.value - 0.06, ci_high=both.value + 0.06)
    both.loc[:2, ["ci_low", "ci_high"]] = [[0.05, 0.09], [0.05, 0.09], [0.04, 0.08]]
    assert summarise(both, claim).sentence.startswith("Only in sentences 1–3 (inconclusive at sentences 4–5): ")


def test_no_difference_needs_the_ci_inside_the_threshold_not_only_power():
    """Enough power is not enough: a row whose CI reaches past the practical threshold leaves a relevant
    difference open (equivalence by the CI). Report rows of this kind: +0.029 (+0.007 to +0.046), Holm p
    0.06, mde 0.028, which the power rule alone called 'No measurable difference'."""
    open_ = _row(0.0265, 0.0195, p_holm=0.06, mde=0.028)
    assert decide(open_) == "inconclusive"
    v = summarise(pd.DataFrame([open_]), CLAIM)
    assert v.sentence.startswith("Inconclusive: the 95% CI reaches +0.046, beyond the practical threshold of 0.03, "
                                 "though this sample could detect >= 0.028"), v.sentence
    # the same power, a CI inside ±0.03: a relevant difference is ruled out
    assert decide(_row(0.0, 0.0195, p_holm=1.0, mde=0.028)) == "no_difference"
    # the bound counts either way, and it is strict: a CI ending at -0.03 does not rule out -0.03
    assert decide(_row(-0.015, 0.015, p_holm=1.0, mde=0.02)) == "inconclusive"
    assert decide(_row(-0.0149, 0.015, p_holm=1.0, mde=0.02)) == "no_difference"
    # planted: a true difference at the threshold (0.03), 60 items, in a Holm family of 18 that often leaves
    # it unsignificant. Claiming "no difference" here is an error: the CI rule makes it at most about 2.5%
    # of the time (one side of the equivalence test); the power rule alone made it in about 30%.
    from scipy import stats

    rng = np.random.default_rng(3)
    new = old = 0
    for _ in range(400):
        d = rng.normal(0.03, 0.08, size=60)
        m, se = d.mean(), d.std(ddof=1) / np.sqrt(60)
        row = {"value": m, "ci_low": m - 1.96 * se, "ci_high": m + 1.96 * se,
               "p_holm": min(1.0, 18 * 2 * stats.norm.sf(abs(m) / se)), "mde": 2.8 * se}
        new += decide(row) == "no_difference"
        old += decide(row) in ("no_difference", "inconclusive") and row["mde"] <= PRACTICAL_THRESHOLD
    assert new / 400 <= 0.04 and old / 400 >= 0.2, (new, old)


def test_summary_without_significant_rows_quotes_an_inconclusive_row():
    rows = pd.DataFrame([{"layer": 1, **_row(0.0, 0.02, p_holm=1.0, mde=0.029)},  # powered, inside ±0.03
                         {"layer": 2, **_row(0.02, 0.015, p_holm=0.3, mde=0.021)}])  # powered, reaches 0.035
    v = summarise(rows, CLAIM)
    assert v.decision == "inconclusive" and "at layer 2" in v.sentence and "reaches +0.035" in v.sentence
    ok = rows.assign(value=[0.0, 0.005])
    ok = ok.assign(ci_low=ok["value"] - 0.015, ci_high=ok["value"] + 0.015)
    assert summarise(ok, CLAIM).sentence.startswith("No measurable difference at any layer:")


def test_summary_without_significant_rows_names_the_layers_that_rule_the_threshold_out():
    # layers 1-2 underpowered (mde 0.05), layers 3-4 powered and inside ±0.03: the verdict stays
    # inconclusive but must not hide that the later layers settle the question
    rows = pd.DataFrame([{"layer": 1, **_row(0.01, 0.035, p_holm=1.0, mde=0.05)},
                         {"layer": 2, **_row(0.02, 0.04, p_holm=1.0, mde=0.057)},
                         {"layer": 3, **_row(0.0, 0.01, p_holm=1.0, mde=0.014)},
                         {"layer": 4, **_row(0.002, 0.01, p_holm=1.0, mde=0.014)}])
    v = summarise(rows, CLAIM)
    assert v.decision == "inconclusive"
    assert v.sentence.startswith("Inconclusive at layers 1–2 (no measurable difference at layers 3–4): "
                                 "this sample could only detect >= 0.057"), v.sentence
    # a non-integer facet (poolings) reads as a list
    pool = Claim(more="m", less="l", none="n", quantity="q", facet=("pooling", "poolings"))
    by_pooling = rows.assign(pooling=["max", "first_word", "cls", "sep1"]).drop(columns="layer")
    assert summarise(by_pooling, pool).sentence.startswith(
        "Inconclusive at poolings max, first_word (no measurable difference at poolings cls, sep1): ")
    # every row inconclusive: no list of settled layers
    weak = rows.assign(mde=0.05)
    assert summarise(weak, CLAIM).sentence.startswith("Inconclusive: this sample could only detect >= 0.050")


def test_each_verdict_has_a_headline_without_its_numbers():
    """The short form the report's answers at a glance list: label and finding, no numbers; an undecided
    verdict names what was compared; not measured says so."""
    rows = pd.DataFrame([{"layer": L, **_row(v, 0.005)} for L, v in enumerate([0.0, 0.05, 0.06])])
    v = summarise(rows, CLAIM)
    assert v.short == "Only in layers 1–2 (no measurable difference at layer 0): B is higher than A"
    assert not any(ch.isdigit() for ch in v.short.split(":", 1)[1])
    none = summarise(rows.assign(value=0.0, ci_low=-0.005, ci_high=0.005), CLAIM)
    assert none.short == "No measurable difference at any layer: A and B score alike"
    wide = summarise(pd.DataFrame([_row(0.0, 0.2)]), CLAIM)
    assert wide.decision == "inconclusive" and wide.short == "Inconclusive, on B − A"
    assert summarise(None, CLAIM).short == "Not measured"
