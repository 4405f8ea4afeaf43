"""Q6 (the classification token first, middle or last, fine-tuned) and Q8 (poolings fine-tuned, a learning curve)
on predictions with a known answer: a planted difference is found and answered, a null is answered as one; the
shared tasks and seeds come from the config; an end-to-end run on a tiny model."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import probing.study.questions as _questions
from probing.study.answers import MAX_WORDS
from probing.study.config import StudyConfig, StudyError, load_config
from probing.study.rules import decide

if not hasattr(_questions, "__path__"):  # the questions package while questions.py still holds the old sections
    _questions.__path__ = [str(Path(_questions.__file__).with_suffix(""))]

from probing.study.questions import _common, q1, q6, q8  # noqa: E402

CFG = StudyConfig().with_values(**{"study.bootstrap_resamples": 300, "finetune.seeds": (0, 1),
                                   "finetune.poolings": ("cls", "mean", "max", "sep1"),
                                   "finetune.learning_curve": (100, 300), "finetune.pooling_tasks": ("next", "topic"),
                                   "finetune.format_tasks": ("next",)})


def _predictions(specs, acc, n_items=1600, base_seed=0):
    """Predictions of ``specs``: ``acc(spec)`` is a run's accuracy. Runs share most of their correct items (a run
    flips a few of a common draw), as runs of one model on one split do, so paired differences are tight."""
    rng = np.random.default_rng(base_seed)
    common = rng.random(n_items)
    frames = []
    for spec in specs:
        u = np.where(rng.random(n_items) < 0.05, rng.random(n_items), common)  # 5% of items drawn anew
        n_train = spec.n_train if spec.n_train is not None else 700
        frames.append(pd.DataFrame({
            "run": spec.name, "task": spec.task, "format": spec.format, "pooling": spec.pooling, "n_train": n_train,
            "seed": -1 if spec.frozen else spec.seed, "frozen": spec.frozen, "condition": "clean",
            "item": [f"{spec.task}{i}" for i in range(n_items)], "doc": [f"u{i // 4}" for i in range(n_items)],
            "label": np.arange(n_items) % 2, "pred": 1,
            "correct": u < acc(spec), "epochs": 1 if not spec.frozen else np.nan,
            "steps": int(np.ceil(n_train / 16)) if not spec.frozen else np.nan}))
    return pd.concat(frames, ignore_index=True)


def _ctx(P, cfg=CFG):
    return SimpleNamespace(cfg=cfg, tables={"finetune_predictions": P}, lm=SimpleNamespace(name="tiny"), log=print)


def _decided(question, T):
    return decide(question.rows(T), dict(question.rules))


# ---------------------------------------------------------------------------------------------------
# Q6


def test_q6_finds_a_planted_cost_of_the_last_position():
    P = _predictions(q6.runs(CFG), lambda s: 0.55 if s.format == "cls_last" and not s.frozen else 0.75)
    T = q6.analyse(_ctx(P))
    d = _decided(q6.QUESTION, T)
    by = d.set_index(["cls_position", "condition"])
    assert set(by.index) == {(p, c) for p in ("middle", "last") for c in ("fine_tuned", "frozen")}
    assert by.loc[("last", "fine_tuned"), "decision"] == "yes" and by.loc[("last", "fine_tuned"), "m"] == 2
    assert by.loc[("last", "fine_tuned"), "value"] == pytest.approx(-0.2, abs=0.03)
    assert by.loc[("middle", "fine_tuned"), "decision"] == "no_difference"
    assert by.loc[("last", "frozen"), "decision"] == "no_difference"
    a = q6.answer(T, d, CFG)
    assert a.text.startswith("Position matters even after fine-tuning: [CLS] last loses") and a.words <= MAX_WORDS
    first = T["q6_position"].query("metric == 'accuracy' and format == 'pair' and condition == 'fine_tuned'")
    assert first["value"].iloc[0] == pytest.approx(0.75, abs=0.03)
    assert f"{100 * first['value'].iloc[0]:.0f}% with [CLS] first" in a.text and a.confidence == "high"
    ev = q6.evidence(T, d, CFG)
    assert "| last (`cls_last`) |" in ev and "700 training items, 1 epoch (44 steps of 16)" in ev and "2 seeds" in ev


def test_q6_says_when_only_the_first_position_learnt_the_task():
    """A moved [CLS] at chance is not "position matters once fine-tuned": that model did not learn the task."""
    P = _predictions(q6.runs(CFG), lambda s: 0.5 if s.format in ("cls_mid", "cls_last") and not s.frozen else 0.75)
    T = q6.analyse(_ctx(P))
    a = q6.answer(T, _decided(q6.QUESTION, T), CFG)
    assert a.text.startswith("At this budget only [CLS] first learnt the task")
    assert "with [CLS] middle and last no better than always guessing (50%)" in a.text and a.words <= MAX_WORDS


def test_q6_answers_a_null_as_no_difference():
    P = _predictions(q6.runs(CFG), lambda s: 0.7)
    T = q6.analyse(_ctx(P))
    d = _decided(q6.QUESTION, T)
    ft = d[d["condition"] == "fine_tuned"]
    assert set(ft["decision"]) == {"no_difference"}
    a = q6.answer(T, d, CFG)
    assert a.text.startswith("Once fine-tuned, position hardly matters") and "within ±2.0 accuracy points" in a.text


def test_q6_and_q8_say_so_when_fine_tuning_did_not_learn_the_task():
    P = _predictions(q6.runs(CFG), lambda s: 0.52)
    T = q6.analyse(_ctx(P))
    assert T["q6_position"].query("metric == 'majority'")["value"].tolist() == [0.5]
    a = q6.answer(T, _decided(q6.QUESTION, T), CFG)
    assert a.text.startswith("This run cannot tell: fine-tuned at this budget the model did not learn the task")
    assert "always guessing the commoner answer scores 50%" in a.text and a.confidence == "low"
    assert a.words <= MAX_WORDS
    P = _predictions(q8.runs(CFG), lambda s: 0.52)
    T = q8.analyse(_ctx(P))
    a = q8.answer(T, _decided(q8.QUESTION, T), CFG)
    assert a.text.startswith("This run cannot tell: after fine-tuning every weight on all 700 items (2 seeds, 1 epoch)")
    assert "nor mean pooling (5" in a.text and a.confidence == "low" and a.words <= MAX_WORDS


def test_q8_answers_from_the_task_fine_tuning_learnt():
    P = _predictions(q8.runs(CFG), lambda s: 0.52 if s.task == "next" else 0.8)
    T = q8.analyse(_ctx(P))
    a = q8.answer(T, _decided(q8.QUESTION, T), CFG)
    assert "[CLS] and mean pooling differ on topic pairs by" in a.text and a.words <= MAX_WORDS
    assert "On next-sentence pairs neither learnt the task (near chance)." in a.text


def test_q6_says_it_cannot_tell_from_a_small_sample():
    P = _predictions(q6.runs(CFG), lambda s: 0.7, n_items=60)
    T = q6.analyse(_ctx(P))
    a = q6.answer(T, _decided(q6.QUESTION, T), CFG)
    assert a.text.startswith("Cannot tell yet") and a.confidence == "low"


def test_q6_runs_every_position_with_every_seed_and_a_frozen_probe_each():
    specs = q6.runs(CFG.with_values(**{"finetune.seeds": (3, 4, 5)}))
    assert len(specs) == 9 + 3 and {s.format for s in specs} == {"pair", "cls_mid", "cls_last"}
    assert {s.seed for s in specs if not s.frozen} == {3, 4, 5} and all(s.pooling == "cls" for s in specs)
    assert "pretraining study" in q6.notes(CFG) and "position 0" in q6.QUESTION.background


def test_q6_runs_and_answers_the_positions_the_config_names():
    cfg = CFG.with_values(**{"finetune.positions": ("first", "last")})
    specs = q6.runs(cfg)
    assert {s.format for s in specs} == {"pair", "cls_last"} and len(specs) == 2 * 2 + 2
    P = _predictions(specs, lambda s: 0.5 if s.format == "cls_last" and not s.frozen else 0.75)
    T = q6.analyse(_ctx(P, cfg))
    d = _decided(q6.QUESTION, T)
    assert set(d["cls_position"]) == {"last"} and d["family"].str.endswith(": last − first").all()
    a = q6.answer(T, d, cfg)
    assert a.text.startswith("At this budget only [CLS] first learnt the task") and "middle" not in a.text
    assert re.search(r"7\d% with \[CLS\] first, \d\d% last,", a.text)
    assert "with [CLS] last no better than always guessing" in a.text
    ev = q6.evidence(T, d, cfg)
    assert "| last (`cls_last`) |" in ev and "cls_mid" not in ev and "last (`cls_last`)" in q6.notes(cfg)
    with pytest.raises(StudyError, match="finetune.positions = \\['last'\\]: expected 'first'"):
        load_config(None, overrides={"finetune.positions": ["last"]})
    with pytest.raises(StudyError, match="finetune.positions"):
        load_config(None, overrides={"finetune.positions": ["first", "end"]})


def test_q6_answers_from_the_first_task_first_learnt_and_keeps_a_family_per_task():
    cfg = CFG.with_values(**{"finetune.format_tasks": ("next", "topic"), "finetune.positions": ("first", "last")})
    specs = q6.runs(cfg)
    assert {s.task for s in specs} == {"next", "topic"} and len(specs) == 2 * (2 * 2 + 2)
    # next at chance everywhere; on topic the last position costs 20 points
    P = _predictions(specs, lambda s: 0.5 if s.task == "next" else (0.55 if s.format == "cls_last" and not s.frozen
                                                                    else 0.75))
    T = q6.analyse(_ctx(P, cfg))
    d = _decided(q6.QUESTION, T)
    assert set(d["family"]) == {f"Q6 {t}, {c}: last − first" for t in ("next", "topic")
                                for c in ("fine-tuned", "frozen")}
    by = d.set_index(["task", "condition"])
    assert by.loc[("topic", "fine_tuned"), "decision"] == "yes"
    assert by.loc[("topic", "frozen"), "decision"] == "no_difference"
    a = q6.answer(T, d, cfg)
    assert a.text.startswith("Position matters even after fine-tuning: [CLS] last loses 2")
    assert "topic accuracy is 7" in a.text and "(next-sentence pairs were not learnt)" in a.text
    assert a.words <= MAX_WORDS
    ev = q6.evidence(T, d, cfg)
    assert "**Next-sentence** (`next`" in ev and "**Topic** (`topic`" in ev and ev.count("| last (`cls_last`) |") == 2


def test_q6_without_its_table_is_not_measured():
    assert q6.answer({}, pd.DataFrame(), CFG).text.startswith("Not measured")
    assert q6.rows({}).empty


# ---------------------------------------------------------------------------------------------------
# Q8


def _q8_acc(spec):
    if spec.n_train == 100 and not spec.frozen:
        return 0.55 if spec.pooling == "cls" else 0.75
    if spec.task == "next" and spec.pooling == "max" and not spec.frozen:
        return 0.6
    return 0.75


def test_q8_finds_a_planted_pooling_gap_and_a_learning_curve_lead():
    P = _predictions(q8.runs(CFG), _q8_acc)
    T = q8.analyse(_ctx(P))
    d = _decided(q8.QUESTION, T)
    fams = d.groupby("family")["m"].first()
    assert fams["Q8 next, fine-tuned on all 700 items: each pooling − mean"] == 3
    assert fams["Q8 topic, fine-tuned on all 700 items: each pooling − mean"] == 3
    assert fams["Q8 next, fine-tuned: cls − mean per training size"] == 2
    by = d.set_index(["measure", "task", "pooling", "n_train"])
    assert by.loc[("pooling_finetuned", "next", "max", 700), "decision"] == "yes"
    assert by.loc[("pooling_finetuned", "next", "cls", 700), "decision"] == "no_difference"
    assert by.loc[("pooling_curve", "next", "cls", 100), "value"] == pytest.approx(-0.2, abs=0.03)
    assert by.loc[("pooling_curve", "next", "cls", 300), "decision"] == "no_difference"
    a = q8.answer(T, d, CFG)
    assert a.text.startswith("After fine-tuning every weight on all 700 items (2 seeds, 1 epoch)")
    assert re.search(r"Not any token: max trails mean by 1[3-7]\.\d points\.", a.text)
    assert re.search(r"With 100 items, mean pooling leads by (19|2[01])\.\d points \(beyond 2\.0\)\.", a.text)
    assert a.words <= MAX_WORDS
    ev = q8.evidence(T, d, CFG)
    assert "| max |" in ev and "Learning curve (next-sentence" in ev and "| 100 |" in ev
    assert "700 training items, 1 epoch (44 steps of 16), every weight trained, 2 seeds" in ev


def test_q8_null_reads_every_pooling_within_the_threshold():
    P = _predictions(q8.runs(CFG), lambda s: 0.75)
    T = q8.analyse(_ctx(P))
    a = q8.answer(T, _decided(q8.QUESTION, T), CFG)
    assert "[CLS] and mean pooling differ on next-sentence pairs by" in a.text and "; within ±2.0)" in a.text
    assert "Max and sep1 are also within 2.0 points of mean" in a.text and "With 100 items, they differ by" in a.text


def test_q8_leaves_out_curve_sizes_the_split_does_not_reach():
    cfg = CFG.with_values(**{"finetune.learning_curve": (100, 5000)})
    specs = q8.runs(cfg)
    P = _predictions([s for s in specs if s.n_train != 5000], lambda s: 0.7)
    big = [s for s in specs if s.n_train == 5000]
    P = pd.concat([P, _predictions(big, lambda s: 0.7).assign(n_train=700)], ignore_index=True)
    T = q8.analyse(_ctx(P, cfg))
    assert sorted(set(T["q8_pooling"]["n_train"].dropna())) == [100, 700]


def test_q8_reads_any_token_from_topic_when_next_runs_cls_and_mean_only():
    cfg = CFG.with_values(**{"finetune.poolings": ("cls", "mean", "sep1"), "finetune.next_poolings": ("cls", "mean"),
                             "finetune.learning_curve": ()})
    specs = q8.runs(cfg)
    assert {s.pooling for s in specs if s.task == "next"} == {"cls", "mean"}
    assert {s.pooling for s in specs if s.task == "topic"} == {"cls", "mean", "sep1"}
    assert q8.poolings(cfg, "next") == ("cls", "mean") and q8.poolings(cfg) == ("cls", "mean", "sep1")
    P = _predictions(specs, lambda s: 0.75)
    T = q8.analyse(_ctx(P, cfg))
    a = q8.answer(T, _decided(q8.QUESTION, T), cfg)
    assert "differ on next-sentence pairs by" in a.text and "Sep1 on topic is also within 2.0 points of mean" in a.text
    planted = _predictions(specs, lambda s: 0.6 if s.pooling == "sep1" and not s.frozen else 0.75)
    T = q8.analyse(_ctx(planted, cfg))
    a = q8.answer(T, _decided(q8.QUESTION, T), cfg)
    assert re.search(r"Not any token on topic: sep1 trails mean by 1[3-7]\.\d points\.", a.text)
    assert "cls, mean on `next`; cls, mean, sep1 on `topic`" in q8.notes(cfg)
    with pytest.raises(StudyError, match="finetune.next_poolings"):
        load_config(None, overrides={"finetune.next_poolings": ["cls", "nope"]})


def test_q8_shares_runs_with_q6_and_reads_the_config():
    cfg = CFG.with_values(**{"finetune.poolings": ("max", "first_word"), "finetune.learning_curve": ()})
    specs = q8.runs(cfg)
    assert q8.poolings(cfg) == ("cls", "mean", "max", "first_word")
    assert {(s.task, s.pooling) for s in specs} == {(t, p) for p in q8.poolings(cfg) for t in ("next", "topic")}
    assert set(q6.runs(CFG)) & set(q8.runs(CFG)) == {s for s in q6.runs(CFG) if s.format == "pair"}
    assert "the learning curve trains" not in q8.notes(cfg) and "100, 300" in q8.notes(CFG)
    assert "Left out of this run to keep the study's time: a learning curve" in q8.notes(cfg)
    lean = CFG.with_values(**{"finetune.pooling_tasks": ("next",)})
    assert {s.task for s in q8.runs(lean)} == {"next"} and set(q8.tasks(lean, _corpora())) == {"next"}
    assert "the `topic` task" in q8.notes(lean)


# ---------------------------------------------------------------------------------------------------
# The shared tasks and the config


def _corpora():
    from probing.corpora import load_corpus

    return {"pairs": load_corpus("generated:n=120,k=2")}


def test_shared_tasks_are_leak_free_and_the_same_for_every_question():
    from analyses.finetune import shared_sentences

    corpora = _corpora()
    cfg = load_config("seed_questions", quick=True).with_values(**{"finetune.format_tasks": ("next", "topic")})
    a, b = q6.tasks(cfg, corpora)["next"], q8.tasks(cfg, corpora)["next"]
    assert a == b and a.label == "is_next" and not shared_sentences(a.examples, a.test_ids)
    topic = q8.tasks(cfg, corpora)["topic"]
    assert topic.label == "topic" and all(e.labels["is_next"] == 1 for e in topic.examples)
    assert q6.tasks(cfg, corpora)["topic"] == topic == q1.tasks(cfg, corpora)["topic"]
    packaged = load_config("seed_questions", quick=True)  # its Q1 and Q6 on topic only (format_tasks)
    assert set(q6.tasks(packaged, corpora)) == set(q1.tasks(packaged, corpora)) == {"topic"}
    assert _common.protocol_seeds(cfg) == cfg.finetune.seeds and _common.protocol_preset(cfg) == "quick"


def test_finetune_config_keys_are_checked():
    with pytest.raises(StudyError, match=r"finetune.seeds = \[0, 0\]: expected distinct values"):
        load_config(None, overrides={"finetune.seeds": [0, 0]})
    with pytest.raises(StudyError, match="finetune.learning_curve = \\[1\\]: expected a list of integers >= 2"):
        load_config(None, overrides={"finetune.learning_curve": [1]})
    with pytest.raises(StudyError, match="finetune.preset = 'huge': expected one of 'quick', 'default', 'full'"):
        load_config(None, overrides={"finetune.preset": "huge"})
    assert load_config(None, overrides={"finetune.learning_curve": []}).finetune.learning_curve == ()
    with pytest.raises(StudyError, match="finetune.pooling_tasks = \\['next', 'words'\\]: expected a non-empty list"):
        load_config(None, overrides={"finetune.pooling_tasks": ["next", "words"]})
    assert load_config(None).finetune.negatives == "other_topic"
    with pytest.raises(StudyError, match="finetune.negatives = 'random': expected one of 'same_topic', 'other_topic'"):
        load_config(None, overrides={"finetune.negatives": "random"})


# ---------------------------------------------------------------------------------------------------
# End to end on a tiny model


@pytest.mark.slow
def test_q6_and_q8_end_to_end_on_a_tiny_model(tmp_path, tiny_bert):
    from analyses.finetune import run_protocol
    from probing.corpora import load_corpus
    from probing.study.answers import Answer

    cfg = load_config("seed_questions", quick=True, overrides={"study.bootstrap_resamples": 100,
                                                                "finetune.learning_curve": [20]})
    corpora = {"pairs": load_corpus("generated:n=120,k=2")}
    tasks = {**q6.tasks(cfg, corpora), **q8.tasks(cfg, corpora)}
    specs = q6.runs(cfg) + q8.runs(cfg)
    P = run_protocol(tasks, specs, model=tiny_bert, preset="quick", device="cpu", out=tmp_path, progress=False,
                     epochs=1)
    ctx = SimpleNamespace(cfg=cfg, tables={"finetune_predictions": P}, lm=tiny_bert, log=print)
    for question in (q6, q8):
        T = question.analyse(ctx)
        d = _decided(question.QUESTION, T)
        # a tiny random model may predict one class in two runs alike (a paired difference of exactly 0)
        assert len(d) and d["se"].ge(0).all() and d["se"].gt(0).any() and set(d["n_resamples"]) == {100}
        a = question.answer(T, d, cfg)
        assert isinstance(a, Answer) and a.words <= MAX_WORDS and a.preset == "quick"
        assert question.evidence(T, d, cfg).count("|") > 10
        pngs = question.figures(T, tmp_path, print)
        assert pngs and all(p.exists() for p in pngs)
