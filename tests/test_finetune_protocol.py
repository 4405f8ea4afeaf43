"""The shared fine-tuning protocol: leak-free grouped splits, runs as data run once, paired comparisons."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses.finetune import (RunSpec, compare_runs, grouped_split, leak_groups, make_task, run_protocol,
                                        shared_sentences, training_order)
from probing.examples import Example

from .conftest import sample_examples


def _docs(n_docs=30, per_doc=4, topics=("a", "b")):
    out = []
    for d in range(n_docs):
        for j in range(per_doc):
            out.append(Example(f"d{d}-{j}", (f"Sentence {j} of document {d} here.", f"Another {j} of {d}."),
                               {"doc": f"d{d}", "topic": topics[d % len(topics)]}))
    return out


def test_documents_that_share_a_sentence_are_one_unit_and_never_split():
    ex = _docs()
    # document 1's second example reuses a sentence of document 2 (as an is_next negative would)
    ex[5] = Example(ex[5].id, (ex[5].sentences[0], ex[8].sentences[1]), ex[5].labels)
    g = leak_groups(ex)
    assert g[4] == g[5] == g[8] and g[0] != g[4]
    for seed in range(5):
        test = grouped_split(ex, "topic", 0.3, seed)
        assert shared_sentences(ex, test) == []
        assert 0.2 < len(test) / len(ex) < 0.4
        assert {e.labels["topic"] for e in ex if e.id in test} == {"a", "b"}  # stratified


def test_a_split_that_cannot_keep_units_apart_is_refused():
    ex = _docs(10, 4)
    shared = ex[0].sentences[0]
    ex = [Example(e.id, (shared, e.sentences[1]), e.labels) if i % 2 == 0 else e for i, e in enumerate(ex)]
    with pytest.raises(ValueError, match="linked by shared documents or sentences"):
        grouped_split(ex, "topic")


def test_smaller_training_sets_are_prefixes_of_larger_ones():
    task = make_task(_docs(), "topic")
    order = training_order(task)
    assert set(order).isdisjoint(task.test_ids) and len(order) + len(task.test_ids) == len(task.examples)
    assert order == training_order(task) and order != training_order(task, seed=1)


def test_run_specs_are_checked():
    with pytest.raises(ValueError, match="conditions"):
        RunSpec("t", conditions=("nope",))
    with pytest.raises(ValueError, match="n_train"):
        RunSpec("t", n_train=1)
    with pytest.raises(ValueError, match="frozen"):
        RunSpec("t", frozen=True, conditions=("clean", "sep_knockout"))
    assert RunSpec("next", "pair", "cls", 100, 2).name == "next/pair/cls/n100/seed2"


def _predictions(acc_a, acc_b, n_items=400, seeds=(0, 1, 2), seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for run, acc in (("a", acc_a), ("b", acc_b)):
        for s in seeds:
            correct = rng.random(n_items) < acc
            rows.append(pd.DataFrame({"run": run, "seed": s, "item": np.arange(n_items), "doc": np.arange(n_items) // 4,
                                      "correct": correct}))
    return pd.concat(rows, ignore_index=True)


def test_a_planted_accuracy_difference_is_found_and_a_null_is_not():
    P = _predictions(0.6, 0.75)
    planted = compare_runs(P, {"run": "a"}, {"run": "b"}, n_resamples=400)
    acc = P.groupby("run")["correct"].mean()
    assert planted["value"] == pytest.approx(acc["b"] - acc["a"]) and planted["value_b"] == pytest.approx(acc["b"])
    assert planted["ci_low"] > 0.05 and planted["ci_low"] < planted["value"] < planted["ci_high"]
    null = compare_runs(_predictions(0.7, 0.7), {"run": "a"}, {"run": "b"}, n_resamples=400)
    assert null["ci_low"] < 0 < null["ci_high"] and null["se"] > 0
    assert null["n_seeds"] == 3 and null["n_items"] == 400 and null["n_groups"] == 100
    with pytest.raises(ValueError, match="no predictions"):
        compare_runs(_predictions(0.6, 0.7), {"run": "a"}, {"run": "c"})


@pytest.mark.slow
def test_runs_are_run_once_stored_and_evaluated_under_each_condition(tmp_path, tiny_bert, monkeypatch):
    import analyses.finetune._protocol as protocol

    ex = [Example(e.id, e.sentences, e.labels) for e in sample_examples(40, k=2)]
    task = make_task(ex, "topic", 0.3)
    specs = [RunSpec("t", "pair", "cls", None, 0, ("clean", "sep_knockout", "sep_knockout_control")),
             RunSpec("t", "pair", "cls", None, 0, ("clean", "sep_knockout", "sep_knockout_control")),  # the same
             RunSpec("t", "concat", "mean", 10, 1), RunSpec("t", "pair", "cls", None, frozen=True)]
    calls = []
    real = protocol._one_run
    monkeypatch.setattr(protocol, "_one_run", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    P = run_protocol({"t": task}, specs, model=tiny_bert, preset="quick", device="cpu", out=tmp_path,
                     progress=False, epochs=1)
    assert len(calls) == 3  # the repeated spec ran once
    n_test = len(task.test_ids)
    counts = P.groupby(["run", "condition"]).size()
    assert (counts == n_test).all() and len(counts) == 5
    assert set(P.loc[P["run"] == specs[2].name, "n_train"]) == {10}
    assert P["correct"].dtype == bool and set(P["item"]) == set(task.test_ids)
    again = run_protocol({"t": task}, specs, model=tiny_bert, preset="quick", device="cpu", out=tmp_path,
                         progress=False, epochs=1)
    assert len(calls) == 3  # every run reused from the store
    pd.testing.assert_frame_equal(P[["run", "condition", "item", "pred"]], again[["run", "condition", "item", "pred"]])


def test_items_longer_than_the_model_are_left_out_of_train_and_test_alike(tmp_path, bert_tokenizer):
    """A model with fewer positions than some items (a small model pretrained here at 128 tokens): the protocol
    leaves those items out of every run, as the study's extraction does, instead of stopping the study."""
    from probing.models import prepare_model

    from .conftest import make_tiny_bert

    lm = prepare_model(make_tiny_bert(bert_tokenizer, max_position_embeddings=64), bert_tokenizer, name="short")
    def long(i):  # a sentence of its own (a shared one would tie the items into one unit)
        return " ".join([f"word{i}"] * 30) + "."

    ex = [Example(e.id, (long(i), e.sentences[1]) if i % 7 == 0 else e.sentences, e.labels)
          for i, e in enumerate(sample_examples(40, k=2))]
    too_long = {e.id for e in ex if e.sentences[0].startswith("word")}
    task = make_task(ex, "topic", 0.3)
    P = run_protocol({"t": task}, [RunSpec("t", "pair", "cls", None, 0)], model=lm, preset="quick", device="cpu",
                     out=tmp_path, progress=False, epochs=1)
    assert set(P["item"]) == set(task.test_ids) - too_long and too_long & set(task.test_ids)
    assert set(P["n_train"]) == {len(ex) - len(task.test_ids) - len(too_long - set(task.test_ids))}
