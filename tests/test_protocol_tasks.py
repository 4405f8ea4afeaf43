"""The protocol's shared pair tasks (leak-free next-sentence and topic examples), runs that differ only in their
conditions trained once, frozen probes sharing a forward pass, and the protocol table's accuracies and paired
differences: a planted difference found, a null not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses.finetune import (RunSpec, article_units, grouped_split, leak_groups, make_task, merge_conditions,
                               next_sentence_examples, pair_topic_examples, protocol_table, shared_sentences)
from probing.examples import Example


def _pairs(n_docs=24, per_doc=5, topics=("a", "b"), chain=True):
    """A pair corpus as the readers build it: consecutive sentences of each document, every second example a
    negative whose sentence 2 is a sentence of another document of its topic (``chain``: always the next
    document's, so the negatives tie every document of a topic together, as BBC pairs do)."""
    sent = {(d, j): f"Document {d} says thing {j} about {topics[d % len(topics)]}." for d in range(n_docs)
            for j in range(2 * per_doc)}
    out = []
    for d in range(n_docs):
        for j in range(per_doc):
            s1, s2 = sent[d, 2 * j], sent[d, 2 * j + 1]
            neg = j % 2 == 1
            if neg and chain:
                s2 = sent[(d + len(topics)) % n_docs, 0]
            out.append(Example(f"d{d}:{j}", (s1, s2), {"doc": f"d{d}", "topic": topics[d % len(topics)],
                                                        "is_next": int(not neg)}))
    return out


def test_chained_negatives_cannot_be_split_but_the_next_task_can():
    raw = _pairs()
    with pytest.raises(ValueError, match="linked by shared documents or sentences"):
        grouped_split(raw, "is_next")
    ex = next_sentence_examples(raw)
    assert [e.id for e in ex] == [e.id for e in raw] and [e.labels["is_next"] for e in ex] == [
        e.labels["is_next"] for e in raw]
    # positives untouched; every negative's sentence 2 comes from the other article of its unit, same topic
    units = article_units(raw)
    article_of = {s: e.labels["doc"] for e in raw for s in e.sentences[:1]}
    article_of.update({e.sentences[1]: e.labels["doc"] for e in raw if e.labels["is_next"] == 1})
    for e, r in zip(ex, raw):
        assert e.labels["doc"] == units[r.labels["doc"]] and e.labels["article"] == r.labels["doc"]
        assert e.labels["topic_s2"] == e.labels["topic"] == r.labels["topic"]
        if r.labels["is_next"] == 1:
            assert e.sentences == r.sentences
        else:
            source = article_of[e.sentences[1]]
            assert source != r.labels["doc"] and source in e.labels["doc"].split("+")
    assert len(set(leak_groups(ex))) == len(set(units.values())) == 12  # 24 articles, two per unit
    for seed in range(3):
        task = make_task(ex, "is_next", 0.3, seed)
        assert shared_sentences(ex, task.test_ids) == []
        assert {e.labels["is_next"] for e in ex if e.id in task.test_ids} == {0, 1}


def test_units_pair_articles_of_one_topic_and_take_an_odd_one_into_a_triple():
    raw = _pairs(n_docs=15, topics=("a", "b", "c"))  # five articles per topic
    units = article_units(raw)
    names = set(units.values())
    assert len(names) == 6 and sorted(len(n.split("+")) for n in names) == [2, 2, 2, 3, 3, 3]
    topic = {e.labels["doc"]: e.labels["topic"] for e in raw}
    assert all(len({topic[d] for d in n.split("+")}) == 1 for n in names)
    assert article_units(raw, seed=0) == units and article_units(raw, seed=1) != units


@pytest.mark.parametrize("n_docs", [24, 15])
def test_other_topic_negatives_come_from_an_article_of_another_topic(n_docs):
    raw = _pairs(n_docs=n_docs, topics=("a", "b", "c"))
    units = article_units(raw, negatives="other_topic")
    topic = {e.labels["doc"]: e.labels["topic"] for e in raw}
    names = set(units.values())
    assert sorted(len(n.split("+")) for n in names) == [2] * (n_docs // 2 - 1) + [2 + n_docs % 2]
    assert all(len({topic[d] for d in n.split("+")}) >= 2 for n in names)
    ex = next_sentence_examples(raw, negatives="other_topic")
    article_of = {s: e.labels["doc"] for e in raw for s in e.sentences[:1]}
    article_of.update({e.sentences[1]: e.labels["doc"] for e in raw if e.labels["is_next"] == 1})
    for e, r in zip(ex, raw):
        if r.labels["is_next"] == 1:
            assert e.sentences == r.sentences and e.labels["topic_s2"] == e.labels["topic"]
        else:  # sentence 2 from the unit's other article, whose topic is the recorded topic_s2, not sentence 1's
            source = article_of[e.sentences[1]]
            assert source in e.labels["doc"].split("+") and source != r.labels["doc"]
            assert e.labels["topic_s2"] == topic[source] != e.labels["topic"]
    task = make_task(ex, "is_next", 0.3, 0)
    assert shared_sentences(ex, task.test_ids) == []
    # the same-topic task is unchanged by the option's existence: its negatives keep sentence 1's topic
    same = next_sentence_examples(raw)
    assert all(e.labels["topic_s2"] == e.labels["topic"] for e in same)


def test_other_topic_units_refuse_a_topic_holding_half_the_articles():
    raw = _pairs(n_docs=12, topics=("a", "b"))
    article_units(raw, negatives="other_topic")  # 6 of 12: every unit still pairs a with b
    extra = [Example(f"x{i}:0", (f"Extra {i} one.", f"Extra {i} two."), {"doc": f"x{i}", "topic": "a", "is_next": 1})
             for i in range(2)]
    with pytest.raises(ValueError, match="topic 'a' holds 8 of 14 articles"):
        article_units(raw + extra, negatives="other_topic")
    with pytest.raises(ValueError, match="unknown negatives 'random'"):
        article_units(raw, negatives="random")


def test_topic_task_holds_the_coherent_pairs():
    ex = pair_topic_examples(_pairs())
    assert ex and all(e.labels["is_next"] == 1 for e in ex)
    task = make_task(ex, "topic", 0.3)
    assert shared_sentences(ex, task.test_ids) == []


def test_bad_pair_corpora_are_refused_naming_the_problem():
    raw = _pairs()
    with pytest.raises(ValueError, match="topic 'z' has a single article"):
        article_units(raw + [Example("x:0", ("One here.", "Two here."), {"doc": "x", "topic": "z", "is_next": 1})])
    with pytest.raises(ValueError, match="label 'is_next' is missing"):
        next_sentence_examples([Example("x:0", ("One.", "Two."), {"doc": "x", "topic": "a"})])
    with pytest.raises(ValueError, match="examples of 2 sentences"):
        next_sentence_examples([Example("x:0", ("One.", "Two.", "Three."), {"doc": "x", "topic": "a", "is_next": 1})])
    with pytest.raises(ValueError, match="no examples"):
        next_sentence_examples([])


def test_runs_that_differ_only_in_conditions_are_one_run():
    a = RunSpec("next", "pair", "cls", None, 0)
    b = RunSpec("next", "pair", "cls", None, 0, ("sep_knockout_control", "clean", "sep_knockout"))
    c = RunSpec("next", "pair", "cls", None, 1)
    merged = merge_conditions([a, c, b, a])
    assert merged == [RunSpec("next", "pair", "cls", None, 0, ("clean", "sep_knockout_control", "sep_knockout")), c]


# ---------------------------------------------------------------------------------------------------
# The protocol table on predictions with a known answer


def _predictions(acc: dict, n_items=600, seeds=(0, 1, 2), rng_seed=0):
    """Predictions of the runs ``acc`` (spec -> accuracy); items of documents of 3."""
    rng = np.random.default_rng(rng_seed)
    frames = []
    for spec, p in acc.items():
        for s in ((-1,) if spec.frozen else seeds):
            if not spec.frozen and s != spec.seed:
                continue
            frames.append(pd.DataFrame({"run": spec.name, "task": spec.task, "format": spec.format,
                                        "pooling": spec.pooling, "n_train": spec.n_train or 500, "seed": s,
                                        "frozen": spec.frozen, "condition": "clean", "item": np.arange(n_items),
                                        "doc": np.arange(n_items) // 3, "label": np.arange(n_items) % 4 == 0,
                                        "correct": rng.random(n_items) < p,
                                        "epochs": 2, "steps": 64}))
    return pd.concat(frames, ignore_index=True)


def _position_specs(seeds=(0, 1, 2)):
    specs = [RunSpec("next", f, "cls", None, s) for f in ("pair", "cls_mid", "cls_last") for s in seeds]
    return specs + [RunSpec("next", f, "cls", None, frozen=True) for f in ("pair", "cls_mid", "cls_last")]


def test_a_planted_position_effect_is_found_and_a_null_is_not():
    specs = _position_specs()
    acc = {s: {"pair": 0.75, "cls_mid": 0.75, "cls_last": 0.55}[s.format] if not s.frozen else 0.6 for s in specs}
    T = protocol_table(_predictions(acc), specs, compare="format", reference="pair", n_resamples=300)
    assert T.loc[T["metric"] == "majority", ["target", "value", "n"]].values.tolist() == [["next", 0.75, 600]]
    acc_rows = T[T["metric"] == "accuracy"].set_index(["format", "condition"])
    assert len(acc_rows) == 6 and (acc_rows["n"] == 600).all()
    assert acc_rows.loc[("cls_last", "fine_tuned"), "value"] == pytest.approx(0.55, abs=0.04)
    assert acc_rows.loc[("cls_last", "fine_tuned"), "ci_seeds"] == 3
    assert pd.isna(acc_rows.loc[("pair", "frozen"), "ci_seeds"])
    d = T[(T["metric"] == "accuracy_diff") & (T["condition_b"] == T["condition"])].set_index(["format", "condition"])
    assert set(d["format_b"]) == {"pair"}
    assert set(d.index) == {("cls_mid", "fine_tuned"), ("cls_last", "fine_tuned"), ("cls_mid", "frozen"),
                            ("cls_last", "frozen")}
    last, mid = d.loc[("cls_last", "fine_tuned")], d.loc[("cls_mid", "fine_tuned")]
    assert last["value"] == pytest.approx(last["value_a"] - last["value_b"]) and last["value"] < -0.12
    assert last["ci_high"] < 0 and mid["ci_low"] < 0 < mid["ci_high"] and mid["se"] > 0
    assert (d["n_groups"] == 200).all() and (d["grouping"] == "document").all() and (d["n_resamples"] == 300).all()
    # what fine-tuning adds: each position against its frozen probe
    gain = T[(T["metric"] == "accuracy_diff") & (T["condition_b"] == "frozen")].set_index("format")
    assert gain.loc["pair", "value"] == pytest.approx(0.15, abs=0.06) and gain.loc["pair", "ci_low"] > 0
    assert set(T.loc[T["condition"] == "fine_tuned", "steps"]) == {64}


def test_pooling_differences_per_training_size():
    seeds = (0, 1)
    specs = [RunSpec("next", "pair", p, n, s) for p in ("cls", "mean", "max") for n in (None, 100) for s in seeds
             if not (p == "max" and n == 100)]
    acc = {s: 0.8 if s.n_train is None else (0.5 if s.pooling == "cls" else 0.7) for s in specs}
    P = _predictions(acc, seeds=seeds)
    T = protocol_table(P, specs, compare="pooling", reference="mean", n_resamples=200)
    d = T[T["metric"] == "accuracy_diff"].set_index(["pooling", "n_train"])
    assert set(d.index) == {("cls", 500), ("max", 500), ("cls", 100)} and set(d["pooling_b"]) == {"mean"}
    assert d.loc[("cls", 100), "ci_high"] < 0 and d.loc[("cls", 500), "ci_low"] < 0 < d.loc[("cls", 500), "ci_high"]
    with pytest.raises(ValueError, match="no run 'next/pair/sep1/nall/seed0'"):
        protocol_table(P, specs + [RunSpec("next", "pair", "sep1")], compare="pooling", reference="mean")
    with pytest.raises(ValueError, match="compare must be one of"):
        protocol_table(P, specs, compare="layer", reference="mean")
