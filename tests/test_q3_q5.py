"""Q3 and Q5 as question modules: the intruder task's accuracy table from the shared protocol's predictions (a
planted format difference is found, identical formats give none), the comparison rows decided by the modules'
rules, the plain answers (<= 60 words, in the asker's terms) for planted and null tables, the refusal of a
groups corpus too short for the configured k, and both questions registered for the runner."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from probing.study.answers import MAX_WORDS
from probing.study.config import StudyError, config_path, load_config
from probing.study.questions import QUESTIONS, q3, q5
from probing.study.questions import segments as seg
from probing.study.rules import decide


@pytest.fixture(scope="module")
def cfg():
    return load_config(config_path("seed_questions"), overrides={"study.bootstrap_resamples": 200})


def test_q3_and_q5_are_registered_for_the_runner():
    assert QUESTIONS["Q3"] is q3.QUESTION and QUESTIONS["Q5"] is q5.QUESTION
    assert q3.QUESTION.asked == "Does `[CLS] s1 [SEP] s2 [SEP] s3 [SEP]` work?"
    assert set(q3.QUESTION.rules) == {"finetuned", "content"} and "follow" in q5.QUESTION.rules


# ---------------------------------------------------------------------------------------------------
# The intruder task's table


def _predictions(cfg, accuracies: dict[str, float], n_items: int = 120, n_docs: int = 24) -> pd.DataFrame:
    """Predictions of the intruder runs: per format, every seed of the preset and a frozen probe; item i is
    correct when its rank among the items is below the format's accuracy (so formats differ on the same items)."""
    k = cfg.segments.finetune_k
    rng = np.random.default_rng(0)
    order = rng.permutation(n_items)
    rows = []
    for kind, acc in accuracies.items():
        name = seg.segment_format(kind, k).split("=", 1)[0]
        for seed, frozen in [(s, False) for s in seg.protocol_seeds(cfg)] + [(0, True)]:
            for item in range(n_items):
                correct = order[item] < acc * n_items if not frozen else order[item] < 0.5 * n_items
                rows.append({"task": seg.INTRUDER, "format": name, "pooling": "cls", "n_train": -1, "seed": seed,
                             "frozen": frozen, "condition": "clean", "item": item, "doc": item % n_docs,
                             "label": item % 2, "pred": item % 2 if correct else 1 - item % 2,
                             "correct": int(correct)})
    return pd.DataFrame(rows)


def _intruder(cfg, accuracies, n_items: int = 120):
    ctx = SimpleNamespace(cfg=cfg, tables={"finetune_predictions": _predictions(cfg, accuracies, n_items)})
    return seg.intruder_table(ctx)


def test_intruder_table_finds_a_planted_format_difference(cfg):
    t = _intruder(cfg, {"multi": 0.9, "concat": 0.6, "control": 0.9})
    acc = t[(t["metric"] == "accuracy") & ~t["frozen"].astype(bool)].set_index("format")["value"]
    assert acc["multi"] == pytest.approx(0.9, abs=0.01) and acc["concat"] == pytest.approx(0.6, abs=0.01)
    d = t[t["metric"] == "accuracy_diff"].set_index("format_b")
    assert d.loc["concat", "value"] == pytest.approx(0.3, abs=0.01) and d.loc["concat", "ci_low"] > 0.15
    # the same items, the same answers: no difference and no spread
    assert d.loc["control", "value"] == pytest.approx(0.0) and d.loc["control", "se"] == pytest.approx(0.0)
    assert set(t["n_groups"]) == {24} and (t["grouping"] == "document").all()


def test_intruder_table_is_empty_without_predictions(cfg):
    assert seg.intruder_table(SimpleNamespace(cfg=cfg, tables={})).empty


# ---------------------------------------------------------------------------------------------------
# Q3's rows and answer


def _content(k_values=(2, 3), diff=0.0, se=0.005, auc=0.75) -> pd.DataFrame:
    """A sentence_content table: macro AUC per (k, position, format, choice) and multi − concat / control."""
    rows = []
    for k in k_values:
        for p in range(1, k + 1):
            for fmt in ("multi", "concat", "control"):
                for choice in ("cls", "mean"):
                    rows.append({"k": k, "position": p, "format": fmt, "choice": choice, "metric": "macro_auc",
                                 "value": auc + (diff if fmt == "multi" else 0.0)})
            rows.append({"k": k, "position": p, "format": "length", "choice": "length_only", "metric": "macro_auc",
                         "value": 0.52})
            for other in ("concat", "control"):
                for choice in ("cls", "mean"):
                    rows.append({"k": k, "position": p, "format": "multi", "choice": choice, "format_b": other,
                                 "choice_b": choice, "metric": "macro_auc_diff", "value": diff, "se": se,
                                 "n_groups": 40, "grouping": "document", "n_resamples": 200})
    return pd.DataFrame(rows)


def _q3_answer(cfg, T):
    decided = decide(q3.rows(T), q3.RULES)
    return q3.answer(T, decided, cfg), decided


def test_q3_answer_works_as_well_as_concat(cfg):
    # concat gets one more item of 400 right, control one fewer: differences with a small, non-zero spread
    T = {"q3_intruder": _intruder(cfg, {"multi": 0.85, "concat": 0.8525, "control": 0.8475}, n_items=400),
         "sentence_content": _content()}
    a, decided = _q3_answer(cfg, T)
    assert set(decided["measure"]) == {"finetuned", "content"}
    assert decided[decided["measure"] == "finetuned"]["decision"].eq("no_difference").all()
    assert a.text.startswith("Yes, it works as well as one long segment") and "85%" in a.text
    assert "as well as concat's at k = 2 to 3" in a.text and a.words <= MAX_WORDS
    assert "drift" not in q3.evidence(T, decided, cfg)


def test_q3_answer_says_worse_when_concat_wins(cfg):
    T = {"q3_intruder": _intruder(cfg, {"multi": 0.65, "concat": 0.9, "control": 0.65}),
         "sentence_content": _content(diff=-0.05)}
    a, _ = _q3_answer(cfg, T)
    assert a.text.startswith("It works, but worse than one long segment") and "scores 65%" in a.text
    assert "90% (-25.0 points, CI -" in a.text
    assert "less well than concat's (5 of 5 positions" in a.text and a.words <= MAX_WORDS


def test_q3_answer_at_chance_does_not_say_it_works(cfg):
    T = {"q3_intruder": _intruder(cfg, {"multi": 0.5, "concat": 0.5, "control": 0.5}), "sentence_content": _content()}
    a, _ = _q3_answer(cfg, T)
    assert a.text.startswith("Cannot tell") and "did not learn the task" in a.text and a.confidence == "low"


def test_q3_without_tables_is_not_measured(cfg):
    a = q3.answer({}, decide(q3.rows({}), q3.RULES), cfg)
    assert a.text.startswith("Not measured in this run")


# ---------------------------------------------------------------------------------------------------
# Q5's rows and answer


def _q5_tables(held: float, follow: float, stay: float, K: int = 3, se: float = 0.005,
               mean_se: float | None = None) -> dict:
    """Q5's tables with [CLS] − length-only ``held``, interchange follow ``follow`` and stay ``stay`` at every
    position (standard errors small enough to decide)."""
    rows = []
    for p in range(1, K + 1):
        rows += [{"k": K, "position": p, "format": "multi", "choice": "cls", "metric": "macro_auc",
                  "value": 0.5 + held},
                 {"k": K, "position": p, "format": "length", "choice": "length_only", "metric": "macro_auc",
                  "value": 0.5},
                 {"k": K, "position": p, "format": "multi", "choice": "cls", "choice_b": "length_only",
                  "metric": "macro_auc_diff", "value": held, "se": 0.01, "n_groups": 40, "grouping": "document",
                  "n_resamples": 200},
                 {"k": K, "position": p, "format": "bertsum", "choice": "own_cls", "format_b": "multi",
                  "choice_b": "cls", "metric": "macro_auc_diff", "value": 0.0, "se": 0.005, "n_groups": 40,
                  "grouping": "document", "n_resamples": 200}]
    ic = [{"metric": m, "position": p, "value": v, "se": se, "ci_low": v - 0.02, "ci_high": v + 0.02,
           "value_a": 0.6 + v, "value_b": 0.6, "n": 30, "n_groups": 40, "grouping": "document", "n_resamples": 200}
          for p in range(1, K + 1) for m, v in (("interchange_follow", follow), ("interchange_stay", stay))]
    if mean_se is not None:  # the mean over sentences, its interval pooling every sentence's items
        ic += [{"metric": f"{m}_mean", "value": v, "se": mean_se, "ci_low": v - 2 * mean_se,
                "ci_high": v + 2 * mean_se, "value_a": 0.6 + v, "value_b": 0.6, "n": 90, "n_groups": 40,
                "grouping": "document", "n_resamples": 200}
               for m, v in (("interchange_follow", follow), ("interchange_stay", stay))]
    return {"sentence_content": pd.DataFrame(rows), "interchange": pd.DataFrame(ic)}


def test_q5_answer_planted_every_sentence_held_and_only_its_readout_follows(cfg):
    T = _q5_tables(held=0.2, follow=0.15, stay=0.0)
    decided = decide(q5.rows(T), q5.RULES)
    assert set(decided["measure"]) == {"beyond_length", "own_cls", "follow", "stay"}
    a = q5.answer(T, decided, cfg)
    assert a.text.startswith("Yes: [CLS] of a 3-sentence input holds every sentence's content words")
    assert "macro AUC 0.70 by sentence, where lengths alone give 0.50" in a.text
    assert "Replacing sentence i moves only sentence i's readout" in a.text and a.words <= MAX_WORDS
    ev = q5.evidence(T, decided, cfg)
    assert "| follows | 1 | 0.750 (new words) vs 0.600 (old) | +0.150 (+0.130 to +0.170) | 30 |" in ev


def test_q5_answer_does_not_claim_others_move_when_it_cannot_tell(cfg):
    T = _q5_tables(held=0.2, follow=0.15, stay=0.0, se=0.02)
    a = q5.answer(T, decide(q5.rows(T), q5.RULES), cfg)
    assert "whether the other sentences' readouts stay could not be told" in a.text and "also changes" not in a.text


def test_q5_answer_reads_the_mean_over_sentences_where_the_positions_alone_cannot_tell(cfg):
    T = _q5_tables(held=0.2, follow=0.1, stay=0.0, se=0.08, mean_se=0.004)
    decided = decide(q5.rows(T), q5.RULES)
    assert (decided["pooled"] == True).sum() == 2  # noqa: E712
    a = q5.answer(T, decided, cfg)
    assert "Replacing sentence i moves only sentence i's readout" in a.text
    T = _q5_tables(held=0.2, follow=0.1, stay=0.0, se=0.08, mean_se=0.06)
    a = q5.answer(T, decide(q5.rows(T), q5.RULES), cfg)
    assert "Whether that readout follows a replaced sentence could not be told (90 items with a sentence " \
        "replaced)" in a.text
    T["interchange"].loc[T["interchange"]["metric"] == "interchange_stay_mean", "se"] = 0.004
    decided = decide(q5.rows(T), q5.RULES)
    a = q5.answer(T, decided, cfg)
    assert "Replacing one sentence leaves what is read of the others as it was; whether the replaced one's " \
        "readout follows could not be told (90 items" in a.text and a.words <= MAX_WORDS
    from probing.study.rules import display
    assert "–" in set(display(decided, q5.RULES)["position"])
    assert "| follows | mean of all | 0.700 (new words) vs 0.600 (old) |" in q5.evidence(T, None, cfg)


def test_q5_answer_null_reads_nothing_beyond_length(cfg):
    T = _q5_tables(held=0.0, follow=0.0, stay=0.0)
    a = q5.answer(T, decide(q5.rows(T), q5.RULES), cfg)
    assert a.text.startswith("Not measurably") and "does not follow when that sentence is replaced" in a.text


def test_q5_answer_an_underpowered_interchange_is_not_a_no(cfg):
    T = _q5_tables(held=0.2, follow=0.1, stay=0.0, se=0.08)
    a = q5.answer(T, decide(q5.rows(T), q5.RULES), cfg)
    assert "Whether that readout follows a replaced sentence could not be told (30 replaced items per sentence)" \
        in a.text and "does not follow" not in a.text


def test_q5_answer_names_the_one_sentence_held():
    assert q5._positions([1]) == "sentence 1" and q5._positions([3, 1]) == "sentences 1 and 3"


# ---------------------------------------------------------------------------------------------------
# Errors


def test_groups_corpus_shorter_than_the_largest_k_is_refused(cfg):
    from probing.examples import Example

    groups = [Example(f"d{i}:0", ("a b c.", "d e f."), {"topic": i % 2}) for i in range(20)]
    with pytest.raises(StudyError, match=r"^config: segments.ks = \[2, 3, 5\] and segments.finetune_k = 4 need "
                                         r"examples of 5 sentences; corpus.groups .* has examples of 2"):
        seg.derive(cfg, {"groups": groups})


# ---------------------------------------------------------------------------------------------------
# End to end


@pytest.mark.slow
def test_q3_and_q5_run_end_to_end_in_a_quick_study(tmp_path, bert_tokenizer):
    import re

    from probing.study.answers import word_count
    from probing.study.runner import run_study

    from .conftest import make_tiny_bert, quick_study_config

    model_dir = tmp_path / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    report = run_study(quick_study_config(tmp_path, model_dir), quick=True,
                       overrides={"study.questions": ["Q3", "Q5"]}, log=lambda *a: None)
    md = report.read_text(encoding="utf-8")
    tables = report.parent / "tables"
    for key, asked in (("Q3", q3.QUESTION.asked), ("Q5", q5.QUESTION.asked)):
        line = re.search(rf"\*\*{key}\. {re.escape(asked)}\*\* \[evidence\]\(#{key.lower()}\)  \n(.*)\n", md)
        assert line and "*(" in line.group(1) and word_count(line.group(1).rsplit(" *(", 1)[0]) <= MAX_WORDS
        assert (tables / f"{key.lower()}_decisions.csv").is_file()
    P = pd.read_csv(tables / "finetune_predictions.csv")
    assert set(P["task"]) == {"intruder"} and set(P["format"]) == {"multi", "concat", "control3"}
    content = pd.read_csv(tables / "sentence_content.csv")
    assert set(content["k"]) == {2, 3} and {"multi", "concat", "control", "bertsum"} <= set(content["format"])
    assert set(pd.read_csv(tables / "interchange.csv")["metric"]) == {
        "interchange_follow", "interchange_stay", "interchange_follow_mean", "interchange_stay_mean"}
    assert "drift" not in md[md.index("## Q3."):md.index("## Q5.")]
