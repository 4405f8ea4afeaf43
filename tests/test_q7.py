"""Q7's question module: the swapped copy it derives, its config keys, and the answer it gives for a planted
recovery and for a null one (never "no": a decoder is a lower bound)."""

from __future__ import annotations

import pandas as pd
import pytest

from probing.examples import Example
from probing.study.config import StudyConfig
from probing.study.questions import q7
from probing.study.rules import decide


def test_swapped_copy_swaps_two_adjacent_words_of_every_eligible_sentence():
    ex = [Example("a", ("the cat sat",), {"doc": "d1"}), Example("b", ("word",), {"doc": "d2"}),
          Example("c", ("go go",), {"doc": "d3"}), Example("d", ("one two",), {"doc": "d4"})]
    out = q7.swapped_copy(ex)
    assert [e.id for e in out] == ["a", "d"]
    assert out[1].sentences == ("two one",) and out[0].sentences[0] in ("cat the sat", "the sat cat")
    assert all(e.labels["swapped"] == 1 for e in out) and out[0].labels["doc"] == "d1"
    assert q7.swapped_copy([Example("b", ("word",))]) == []


def test_recovery_config_keys_and_their_ranges(tmp_path):
    from probing.study.config import StudyError, load_config

    assert StudyConfig().recovery.vocab == 200 and StudyConfig().recovery.pairs_per_sentence == 5
    cfg = tmp_path / "c.toml"
    cfg.write_text('[recovery]\nvocab = 0\n')
    with pytest.raises(StudyError, match="recovery.vocab"):
        load_config(cfg)


def _rows(content, minimal, se=0.01):
    """Decided-ready rows: value_a the decoder's score, value_b its baseline."""
    out = []
    for measure, (a, b) in (("content", content), ("minimal", minimal), ("order", (0.6, 0.6)),
                            ("training", (content[0], content[0]))):
        for pooling in ("cls", "mean"):
            out.append({"measure": measure, "family": q7.FAMILIES[measure], "layer": 6, "pooling": pooling,
                        "label": f"{measure} {pooling}", "value": a - b, "se": se, "value_a": a, "value_b": b,
                        "n": 500, "n_groups": 100, "grouping": "document", "n_resamples": 1000})
    return decide(pd.DataFrame(out), q7.RULES)


def test_answer_says_at_least_for_a_planted_recovery():
    ans = q7.answer({}, _rows(content=(0.38, 0.09), minimal=(0.71, 0.5)), StudyConfig())
    assert ans.text.startswith("Partly, at least: a decoder reads back at least 38% of a sentence's content words")
    assert "word frequency alone: 9%" in ans.text and "71% of the time (chance 50%)" in ans.text
    assert ans.confidence == "high" and ans.words <= 60


def test_answer_never_says_no_for_a_null():
    ans = q7.answer({}, _rows(content=(0.09, 0.09), minimal=(0.5, 0.5)), StudyConfig())
    assert ans.text.startswith("This decoder could not show it, which does not mean no")
    assert "word order was not shown" in ans.text and ans.words <= 60
    assert not ans.text.lower().startswith("no")


def test_answer_without_rows_says_not_measured():
    assert q7.answer({}, pd.DataFrame(), StudyConfig()).text.startswith("Not measured in this run")
