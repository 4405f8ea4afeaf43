"""Q4's measurements (analyses.coherence) and its question module (probing.study.questions.q4), on constructed data
where the answer is known: a [SEP] that carries is_next beyond the baselines is found to add to them; one that
carries only what the baselines carry (or nothing) is not."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from analyses.coherence import (content_words, paired_rows, probe_items, row_cosine, stacked_increment,
                                text_features)
from analyses.probes import make_splits


def _planted(n_docs: int = 60, per_doc: int = 8, seed: int = 0, sep_signal: float = 1.5):
    """Items in documents: a label, a baseline feature that predicts it partly, and [SEP] states that carry the
    label through a signal of their own (independent of the baseline's noise) with strength ``sep_signal``."""
    rng = np.random.default_rng(seed)
    n = n_docs * per_doc
    groups = np.repeat(np.arange(n_docs), per_doc)
    y = rng.integers(0, 2, n)
    base = (y + rng.normal(0, 1.0, n))[:, None]
    X = rng.normal(0, 1, (n, 6))
    X[:, 0] += sep_signal * (2 * y - 1)
    return X, base, y, groups


def _increment(X, base, y, groups, seed=0):
    feats = {"sep": X, "base": base}
    items, scores, chosen = probe_items(feats, y, groups, n_splits=4, seed=seed, Cs=(0.1,), n_resamples=200)
    folds = make_splits(y, groups, 4, seed)
    inc = stacked_increment(X, base, y, groups, folds, chosen["sep"], inner_splits=2, seed=seed, max_iter=300)
    fold_of = np.empty(len(y), dtype=int)
    for f, (_, test) in enumerate(folds):
        fold_of[test] = f
    stacked = pd.concat([pd.DataFrame({"features": name, "item": np.arange(len(y)), "group": groups,
                                       "fold": fold_of, "correct": inc[side]})
                         for side, name in (("without", "alone"), ("with", "with_sep"))])
    return paired_rows(pd.concat([items, stacked]), {"beyond": ("with_sep", "alone"), "vs_base": ("sep", "base")},
                       n_resamples=200).set_index("comparison"), scores.set_index("features")


def test_text_features_and_cosine_are_what_the_words_say():
    assert content_words("The cat sat on the mat.") == {"cat", "sat", "mat"}
    f = text_features(["the cat sat", "dogs bark loudly"], ["a cat sat quietly", "birds sing"])
    assert f["overlap"][0].tolist() == [2 / 3, 2.0, 2.0]   # {cat, sat} of {cat, sat, quietly}
    assert f["overlap"][1].tolist() == [0.0, 0.0, 0.0]
    assert f["lengths"].tolist() == [[3.0, 4.0], [3.0, 2.0]]
    assert row_cosine(np.array([[3.0, 4.0], [0.0, 0.0]]), np.array([[3.0, 4.0], [1.0, 0.0]])).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="2 first sentences but 1 second"):
        text_features(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="one shape"):
        row_cosine(np.zeros((2, 3)), np.zeros((3, 3)))


def test_planted_sep_signal_adds_to_the_baselines():
    rows, scores = _increment(*_planted(sep_signal=1.5))
    beyond = rows.loc["beyond"]
    assert beyond["value"] > 0.05 and beyond["ci_low"] > 0, beyond
    assert beyond["value"] == pytest.approx(beyond["value_a"] - beyond["value_b"])
    assert scores.loc["sep", "value"] > scores.loc["base", "value"]
    assert rows.loc["vs_base", "value"] > 0


def test_null_sep_adds_nothing_to_the_baselines():
    rows, scores = _increment(*_planted(sep_signal=0.0, seed=1))
    beyond = rows.loc["beyond"]
    # not found to add: no gain that matters inside the interval (a noise score may cost a point or two)
    assert abs(beyond["value"]) < 0.03 and beyond["ci_high"] < 0.02, beyond
    assert beyond["value"] == pytest.approx(beyond["value_a"] - beyond["value_b"])
    assert scores.loc["sep", "value"] < 0.6        # noise: about chance
    assert rows.loc["vs_base", "value"] < -0.1     # the baseline alone does far better


def test_sep_that_only_copies_the_baseline_adds_nothing():
    X, base, y, groups = _planted(sep_signal=0.0, seed=2)
    X[:, 0] = base[:, 0] * 3 + 1                  # [SEP] holds exactly what the baseline holds
    rows, scores = _increment(X, base, y, groups)
    assert abs(rows.loc["beyond", "value"]) < 0.03
    assert rows.loc["beyond", "ci_low"] <= 0
    assert abs(scores.loc["sep", "value"] - scores.loc["base", "value"]) < 0.03


def test_paired_rows_refuses_unpaired_or_missing_probes():
    items = pd.DataFrame({"features": ["a"] * 4 + ["b"] * 4, "item": [0, 1, 2, 3] * 2, "group": [0, 0, 1, 1] * 2,
                          "fold": [0, 0, 1, 1, 0, 1, 1, 1], "correct": [1.0] * 8})
    with pytest.raises(ValueError, match="did not predict the same items in the same folds"):
        paired_rows(items, {"x": ("a", "b")}, n_resamples=100)
    with pytest.raises(ValueError, match=r"no probe of \['c'\]"):
        paired_rows(items, {"x": ("a", "c")}, n_resamples=100)


# ---------------------------------------------------------------------------------------------------
# The question module


def _tables(beyond: float, se: float, knockout: float = -0.05):
    """The tables Q4's analyse returns, made by hand: [SEP] adds ``beyond`` (SE ``se``) at layer 6."""
    paired, probes = [], []
    for negatives in ("same_topic", "same_article"):
        for layer in (3, 6):
            for comparison, (b, v) in {"sep_vs_text": (0.70, 0.10), "sep_vs_apart": (0.75, 0.05),
                                       "sep_vs_word": (0.72, 0.08), "sep_vs_cls": (0.79, 0.01),
                                       "sep_beyond_baselines": (0.76, beyond)}.items():
                value = v if layer == 6 else v / 2
                paired.append({"comparison": comparison, "negatives": negatives, "layer": layer, "value": value,
                               "se": se, "value_a": b + value, "value_b": b, "n_groups": 100,
                               "grouping": "document", "n_resamples": 200})
            for feat, v in (("sep1", 0.8), ("lit1", 0.72), ("cls", 0.79), ("baselines+sep1 (stacked)", 0.78)):
                probes.append({"features": feat, "layer": layer, "negatives": negatives, "value": v,
                               "ci_low": v - 0.03, "ci_high": v + 0.03, "majority_baseline": 0.5})
        for feat, v in (("text", 0.7), ("overlap", 0.68), ("lengths", 0.55), ("apart", 0.75), ("baselines", 0.76)):
            probes.append({"features": feat, "layer": pd.NA, "negatives": negatives, "value": v, "ci_low": v - 0.03,
                           "ci_high": v + 0.03, "majority_baseline": 0.5})
    ko = pd.DataFrame([{"condition_b": a, "condition": b, "value": v, "se": 0.01, "value_a": va + v, "value_b": va,
                        "n": 300, "n_seeds": 3, "n_groups": 40, "n_resamples": 200}
                       for a, b, v, va in (("clean", "sep_knockout", knockout - 0.01, 0.9),
                                           ("clean", "sep_knockout_control", -0.01, 0.9),
                                           ("sep_knockout_control", "sep_knockout", knockout, 0.89))])
    return {"q4_coherence_paired": pd.DataFrame(paired), "q4_coherence_probes": pd.DataFrame(probes),
            "q4_knockout": ko}


def _decided(T):
    from probing.study.questions.q4 import QUESTION
    from probing.study.rules import decide

    return decide(QUESTION.rows(T), QUESTION.rules)


def test_q4_answer_reports_what_sep_adds_when_it_adds_something():
    from probing.study.questions.q4 import QUESTION

    T = _tables(beyond=0.06, se=0.01)
    decided = _decided(T)
    assert set(decided["measure"]) == set(QUESTION.rules)
    assert decided.groupby("family").size().max() == 2     # a comparison's layers on one corpus
    a = QUESTION.answer(T, decided, None)
    assert a.words <= 60, a.text
    assert "At layer 6" in a.text and "at 80%; word overlap and lengths reach 70%" in a.text
    assert "encoded apart 75%" in a.text
    assert "adds +6.0 points" in a.text and a.confidence == "high"
    assert ("Knocking out attention to [SEP] moves fine-tuned next-sentence accuracy -5.0 points against a control "
            "(CI -7") in a.text
    ev = QUESTION.evidence(T, decided, None)
    assert "| the middle [SEP] | 80% (77%–83%) |" in ev and "knocked out" in ev


def test_q4_knockout_is_read_on_the_first_task_the_models_learnt():
    from probing.study.questions.q4 import QUESTION

    T = _tables(beyond=0.06, se=0.01)
    ko = T["q4_knockout"]
    T["q4_knockout"] = pd.concat([ko.assign(target="next", learnt=False, chance=0.5),
                                  ko.assign(target="topic", learnt=True, chance=0.22, value=ko["value"] / 5)],
                                 ignore_index=True)
    decided = _decided(T)
    assert set(decided[decided["measure"] == "knockout"]["family"]) == {"knockout (next)", "knockout (topic)"}
    a = QUESTION.answer(T, decided, None)
    assert "Knocking out attention to [SEP] moves fine-tuned topic accuracy -1.0 points" in a.text and a.words <= 60
    ev = QUESTION.evidence(T, decided, None)
    assert "- Fine-tuned `next`" in ev and "- Fine-tuned `topic`" in ev and "always guessing the commoner" in ev
    T["q4_knockout"]["learnt"] = False
    a = QUESTION.answer(T, _decided(T), None)
    assert a.text.endswith("Whether a fine-tuned model uses [SEP] is open: none learnt next-sentence or topic pairs.")
    assert a.words <= 60


def test_q4_answer_says_nothing_that_matters_for_a_null_and_open_when_unsure():
    from probing.study.questions.q4 import QUESTION

    T = _tables(beyond=0.002, se=0.003)
    a = QUESTION.answer(T, _decided(T), None)
    assert "adds nothing that matters" in a.text and a.confidence == "high"
    T = _tables(beyond=0.01, se=0.03)
    a = QUESTION.answer(T, _decided(T), None)
    assert "is open" in a.text and a.confidence == "low"


def test_q4_asks_the_protocol_for_knockouts_merged_with_a_clean_run():
    from analyses.finetune import RunSpec, merge_conditions
    from probing.study.config import load_config
    from probing.study.questions.q4 import QUESTION, probe_layers

    cfg = load_config("seed_questions", quick=True)
    specs = QUESTION.runs(cfg)
    assert [s.conditions for s in specs] == [("clean", "sep_knockout", "sep_knockout_control")] * len(specs)
    assert [(s.task, s.format, s.pooling) for s in specs] == [(t, "pair", "cls") for t in cfg.finetune.format_tasks
                                                              for _ in cfg.finetune.seeds]
    clean = RunSpec(specs[0].task, "pair", "cls", seed=specs[0].seed)
    merged = merge_conditions([clean, specs[0]])
    assert merged == [specs[0]]
    assert probe_layers(6) == [3, 6]
    jobs = QUESTION.jobs(cfg, {})
    assert {(j.corpus, j.format) for j in jobs} == {(c, f) for c in ("pairs", "pairs_article")
                                                    for f in ("pair", "single", "single2")}


def test_q4_knockout_table_reads_a_drop_only_under_the_sep_knockout():
    from types import SimpleNamespace

    from probing.study.questions.q4 import knockout_table

    rng = np.random.default_rng(0)
    n = 200
    rows = []
    for seed in (0, 1):
        for cond, p in (("clean", 0.9), ("sep_knockout", 0.6), ("sep_knockout_control", 0.88)):
            correct = (rng.random(n) < p).astype(int)
            rows.append(pd.DataFrame({"task": "next", "format": "pair", "pooling": "cls", "frozen": False,
                                      "n_train": None, "seed": seed, "condition": cond, "item": np.arange(n),
                                      "doc": np.arange(n) // 5, "label": np.arange(n) % 2, "correct": correct}))
    ctx = SimpleNamespace(tables={"finetune_predictions": pd.concat(rows, ignore_index=True)}, lm=None,
                          cfg=SimpleNamespace(finetune=SimpleNamespace(seeds=[0, 1], format_tasks=["next", "topic"]),
                                              corpus=SimpleNamespace(pairs="x"),
                                              study=SimpleNamespace(bootstrap_resamples=200, seed=0)))
    K = knockout_table(ctx).set_index(["condition", "condition_b"])
    assert K.loc[("sep_knockout", "sep_knockout_control"), "value"] == pytest.approx(-0.28, abs=0.05)
    assert K.loc[("sep_knockout", "sep_knockout_control"), "ci_high"] < 0
    control = K.loc[("sep_knockout_control", "clean")]
    assert abs(control["value"]) < 0.06 and control["ci_low"] < 0.02
    assert control["value"] == pytest.approx(control["value_a"] - control["value_b"])
    assert int(K["n_seeds"].iloc[0]) == 2
    # models at 90% against always guessing (50%) learnt the task; a task without runs has no rows
    assert K["learnt"].all() and K["chance"].eq(0.5).all() and set(K["target"]) == {"next"}


@pytest.mark.slow
def test_q4_runs_end_to_end_through_the_study_runner(tmp_path, bert_tokenizer, monkeypatch):
    """Q4 selected alone in a --quick study of a tiny random model: both pairs corpora's caches, the ',' cache with
    its literal, the fine-tuned runs under the three conditions, the decided rows and the answer in the report."""
    from probing.study import questions
    from probing.study.questions.q4 import QUESTION
    from probing.study.runner import run_study

    from .conftest import make_tiny_bert, quick_study_config

    monkeypatch.setitem(questions.QUESTIONS, "Q4", QUESTION)
    model_dir = tmp_path / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    cfg = quick_study_config(tmp_path, model_dir)
    report = run_study(cfg, quick=True, log=lambda s: None,
                       overrides={"study.questions": ["Q4"], "finetune.seeds": [0],
                                  "corpus.pairs_article": "generated:n=60,k=2,negatives=same_article"})
    out = report.parent
    md = report.read_text(encoding="utf-8")
    answer = re.search(r"\*\*Q4\. What does the output at \[SEP\] capture\?\*\* \[evidence\]\(#q4\)  \n(.*)\n", md)
    assert answer and "the middle [SEP] tells a true next sentence" in answer.group(1), md[:2000]
    P = pd.read_csv(out / "tables" / "finetune_predictions.csv")
    # one run per task of [finetune] format_tasks (quick: one seed), each evaluated under the three conditions
    assert set(P["condition"]) == set(("clean", "sep_knockout", "sep_knockout_control"))
    assert sorted(P["run"].unique()) == ["next/pair/cls/nall/seed0", "topic/pair/cls/nall/seed0"]
    probes = pd.read_csv(out / "tables" / "q4_coherence_probes.csv")
    assert set(probes["negatives"]) == {"same_topic", "same_article"}
    assert {"sep1", "lit1", "cls", "text", "apart", "baselines"} <= set(probes["features"])
    decided = pd.read_csv(out / "tables" / "q4_decisions.csv")
    assert set(decided["measure"]) == set(QUESTION.rules)
    assert (decided["ci_low"].dropna() <= decided["value"][decided["ci_low"].notna()]).all()
    assert (out / "figures" / "q4_coherence.png").is_file()
