"""The decision rules: one correction for the interval and the p-value, thresholds in each measure's unit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from probing.study.rules import LABELS, Rule, adjust, confidence, decide

ACC = Rule("fine-tuned accuracy difference", "accuracy points", 0.02)


def rows(values, ses, family="f", measure="acc"):
    return pd.DataFrame({"measure": measure, "family": family, "value": values, "se": ses})


@pytest.mark.parametrize("seed", range(5))
def test_interval_and_p_agree_on_every_row(seed):
    rng = np.random.default_rng(seed)
    n = 400
    fam = rng.choice(["a", "b", "c"], n)
    value = rng.normal(0, 0.03, n)
    se = rng.uniform(0.002, 0.02, n)
    out = adjust(pd.DataFrame({"family": fam, "value": value, "se": se}))
    excludes = (out["ci_low"] > 0) | (out["ci_high"] < 0)
    assert (excludes == (out["p_adj"] < 0.05)).all()
    assert (out["significant"] == excludes).all()
    # both sides are found among these draws, so the check is not vacuous
    assert 0 < excludes.sum() < n


def test_the_interval_is_simultaneous_over_the_family():
    one = adjust(pd.DataFrame({"family": ["a"], "value": [0.0], "se": [1.0]}))
    six = adjust(pd.DataFrame({"family": ["b"] * 6, "value": [0.0] * 6, "se": [1.0] * 6}))
    assert one["ci_high"][0] == pytest.approx(1.959964, abs=1e-5)
    assert six["ci_high"][0] == pytest.approx(2.638257, abs=1e-5)  # z(1 - 0.05 / 12)
    assert (six["m"] == 6).all() and one["m"][0] == 1


def test_a_planted_difference_is_found_and_a_null_is_not():
    rng = np.random.default_rng(0)
    # paired per-item differences of 4 points (planted) and of 0 (null), 500 items each
    planted = rng.normal(0.04, 0.1, 500)
    null = rng.normal(0.0, 0.1, 500)
    r = decide(pd.DataFrame({"measure": "acc", "family": ["p", "n"],
                             "value": [planted.mean(), null.mean()],
                             "se": [planted.std(ddof=1) / np.sqrt(500), null.std(ddof=1) / np.sqrt(500)]}),
               {"acc": ACC})
    assert r["decision"].tolist()[0] == "yes"
    assert r["decision"].tolist()[1] in ("no_difference", "inconclusive")
    assert not r["significant"][1]


@pytest.mark.parametrize("value,se,decision,conf", [
    (0.10, 0.01, "yes", "high"),            # interval beyond the threshold
    (0.04, 0.012, "yes", "moderate"),       # significant, interval reaching below 2 points
    (0.01, 0.002, "yes_small", "high"),     # significant, interval inside ±2 points
    (0.0, 0.005, "no_difference", "high"),  # interval inside ±2 points
    (0.0, 0.05, "inconclusive", "low"),     # interval reaching ±2 points
])
def test_each_decision_and_its_confidence(value, se, decision, conf):
    r = decide(rows([value], [se]), {"acc": ACC})
    assert r["decision"][0] == decision
    assert r["verdict"][0] == LABELS[decision]
    assert r["confidence"][0] == conf
    assert confidence(r.iloc[0], ACC) == conf


def test_thresholds_are_in_each_measure_s_own_unit():
    rules = {"acc": ACC, "share": Rule("share of the distance to another input", "% of the way", 0.05)}
    r = decide(pd.DataFrame({"measure": ["acc", "share"], "family": ["x", "y"], "value": [0.03, 0.03],
                             "se": [0.001, 0.001]}), rules)
    assert r["decision"].tolist() == ["yes", "yes_small"]
    assert ACC.show(0.0234) == "2.3 accuracy points"
    assert rules["share"].interval(-0.012, 0.034) == "-1.2 to +3.4 % of the way"


def test_one_sided_rows_the_other_way_read_no():
    rule = Rule("advantage", "accuracy points", 0.02, direction=1)
    r = decide(rows([-0.08], [0.01]), {"acc": rule})
    assert r["decision"][0] == "yes" and r["verdict"][0] == "No (the opposite)"


def test_bad_rows_and_rules_are_refused():
    with pytest.raises(ValueError, match="without a rule"):
        decide(rows([0.1], [0.01], measure="auc"), {"acc": ACC})
    with pytest.raises(ValueError, match="lack the column"):
        adjust(pd.DataFrame({"value": [1.0]}))
    with pytest.raises(ValueError, match="threshold"):
        Rule("x", "points", 0.0)
    r = decide(rows([0.1], [0.0]), {"acc": ACC})  # no standard error: nothing to decide
    assert r["decision"][0] == "not_measured" and not r["significant"][0]


def test_the_display_prints_each_difference_in_its_own_unit():
    from probing.study.rules import display

    rules = {"acc": ACC}
    decided = decide(pd.DataFrame({"measure": "acc", "family": "f", "value": [0.05, 0.0], "se": [0.01, 0.01],
                                   "label": ["concat − pair", "mid − first"], "layer": [6, 6]}), rules)
    table = display(decided, rules)
    assert table.columns.tolist() == ["layer", "compared", "difference (simultaneous 95% CI)", "adjusted p",
                                      "decision", "family size"]
    # z(1 - 0.05/4) = 2.24
    assert table.loc[0, "difference (simultaneous 95% CI)"] == "+5.0 (+2.8 to +7.2 accuracy points)"
    assert table.loc[0, "decision"] == "Yes" and table.loc[1, "decision"] == LABELS["inconclusive"]
