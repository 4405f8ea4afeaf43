"""Q1 and Q2 as question modules: the derived corpora they share (two words swapped, sentence 2 replaced), their
rows and plain answers from constructed tables with a known answer, the config's refusals, and both questions end
to end through the runner on a tiny model."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from probing.examples import Example
from probing.study.answers import MAX_WORDS, word_count
from probing.study.questions import _common, q1, q2
from probing.study.rules import decide


def _pairs(n_docs: int = 6, per_doc: int = 3, topics=("a", "b")) -> list[Example]:
    out = []
    for d in range(n_docs):
        for j in range(per_doc):
            out.append(Example(f"doc{d}:{j}", (f"The tall writer {d} met the young editor {j} today.",
                                               f"Later sentence {d} {j} followed it."),
                               {"doc": f"doc{d}", "topic": topics[d % len(topics)], "is_next": 1}))
    return out


def _pool(n_docs: int = 8, topics=("a", "b")) -> list[Example]:
    return [Example(f"p{d}:{j}", (f"Pool sentence {d} {j} about {topics[d % len(topics)]}.",),
                    {"doc": f"pool{d}", "topic": topics[d % len(topics)]}) for d in range(n_docs) for j in range(2)]


# --------------------------------------------------------------------------------------------------
# derived corpora


def test_document_subset_keeps_documents_whole_and_follows_the_seed():
    ex = _pairs(n_docs=10)
    sub = _common.document_subset(ex, 7, seed=0)
    docs = {e.labels["doc"] for e in sub}
    assert len(sub) == 3 * len(docs) and len(sub) >= 7 and len(sub) < len(ex)  # whole documents, just enough
    assert [e.id for e in sub] == [e.id for e in ex if e.labels["doc"] in docs]  # corpus order kept
    assert _common.document_subset(ex, 7, seed=0) == sub and _common.document_subset(ex, None) == ex
    assert {e.labels["doc"] for e in _common.document_subset(ex, 7, seed=1)} != docs or len(docs) == 10
    with pytest.raises(ValueError, match="integer >= 1"):
        _common.document_subset(ex, 0)


def test_swap_changes_one_adjacent_pair_of_sentence_1_only():
    ex = _pairs() + [Example("same", ("word word word", "Other."), {"doc": "x", "topic": "a"})]
    out = _common.swap_in_every_example(ex, seed=2)
    assert [e.id for e in out] == [e.id for e in ex[:-1]]  # nothing to swap in "word word word": left out
    for before, after in zip(ex, out):
        a, b = before.sentences[0].split(), after.sentences[0].split()
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        i = after.labels["swap_word"]
        assert diff == [i, i + 1] and (a[i], a[i + 1]) == (b[i + 1], b[i])
        assert after.sentences[1] == before.sentences[1] and after.labels["swapped"] == 1
        assert after.labels["doc"] == before.labels["doc"]


def test_replacing_sentence_2_draws_same_topic_sentences_of_other_articles():
    ex, pool = _pairs(), _pool(n_docs=12)
    pool.append(Example("dup", (ex[0].sentences[1],), {"doc": "pool99", "topic": "a"}))  # a sentence of the pairs
    pool.append(Example("own", ("From a document the pairs hold.",), {"doc": "doc0", "topic": "a"}))
    out = _common.replace_second(ex, pool, seed=0)
    by_text = {s: p for p in pool for s in p.sentences}
    assert [e.id for e in out] == [e.id for e in ex]
    own = {s for e in ex for s in e.sentences}
    for before, after in zip(ex, out):
        new = after.sentences[1]
        assert after.sentences[0] == before.sentences[0] and new not in own
        assert by_text[new].labels["topic"] == before.labels["topic"] == after.labels["topic_s2"]
        assert after.labels["s2_doc"] == by_text[new].labels["doc"] and after.labels["s2_doc"].startswith("pool")
        assert "is_next" not in after.labels and after.labels["doc"] == before.labels["doc"]
    assert len({e.sentences[1] for e in out}) == len(out)  # without replacement while the candidates last
    assert _common.replace_second(ex, pool, seed=0) == out and _common.replace_second(ex, pool, seed=1) != out


def test_replacing_sentence_2_without_a_candidate_of_its_topic_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"corpus.replacements \(x\) has no sentence of topic 'b'"):
        _common.replace_second(_pairs(), _pool(topics=("a",)), pool_name="corpus.replacements (x)")


def test_derived_pairs_from_a_config(tmp_path):
    from probing.study.config import load_config

    cfg = load_config("seed_questions", quick=True, overrides={"corpus.derived_examples": 7})
    derived = _common.derived_pairs(cfg, {"pairs": _pairs(n_docs=10), "replacements": _pool()})
    assert set(derived) == {_common.SWAPPED, _common.REPLACED}
    assert [e.id for e in derived[_common.SWAPPED]] == [e.id for e in derived[_common.REPLACED]]
    assert 7 <= len(derived[_common.REPLACED]) < 30


def test_the_config_refuses_a_bad_derived_size_or_replacement_corpus():
    from probing.study.config import StudyError, load_config

    with pytest.raises(StudyError, match="derived_examples"):
        load_config("seed_questions", overrides={"corpus.derived_examples": 1})
    with pytest.raises(StudyError, match="replacements"):
        load_config("seed_questions", overrides={"corpus.replacements": "nonsense:n=3"})


# --------------------------------------------------------------------------------------------------
# rows and answers from constructed tables


def _q1_tables(concat: float, swap: float, se: float, ft: tuple[float, float] | None = (-0.004, 0.006)) -> dict:
    rows = []
    for rep in q1.REPRESENTATIONS:
        role, choice = (rep, "") if rep.endswith("words") else ("", rep)
        for layer in (0, 6):
            for change, v in (("concat", concat), ("swap_words", swap), ("replace_s2", 3 * swap)):
                if change in q1.REPRESENTATIONS[rep]:
                    rows.append({"metric": "share", "layer": layer, "role": role, "choice": choice, "change": change,
                                 "change_b": "", "value": v, "ci_low": v - 2 * se, "ci_high": v + 2 * se, "se": se,
                                 "spread": 0.9, "n": 500, "n_groups": 60, "grouping": "document",
                                 "n_resamples": 1000})
            for (a, b), vb in zip(q1.COMPARISONS, (swap, 3 * swap)):
                if b in q1.REPRESENTATIONS[rep]:
                    rows.append({"metric": "share_diff", "layer": layer, "role": role, "choice": choice, "change": a,
                                 "change_b": b, "value": concat - vb, "se": se, "value_a": concat, "value_b": vb,
                                 "ci_low": concat - vb - 2 * se, "ci_high": concat - vb + 2 * se, "n": 500,
                                 "n_groups": 60, "grouping": "document", "n_resamples": 1000})
    T = {q1.TABLE: pd.DataFrame(rows)}
    if ft is not None:
        T[q1.FINETUNE_TABLE] = pd.DataFrame([
            {"frozen": False, "value": ft[0], "se": ft[1], "value_a": 0.80 + ft[0], "value_b": 0.80, "n": 300,
             "n_groups": 40, "grouping": "document", "n_resamples": 1000, "n_seeds": 3, "n_train": 700},
            {"frozen": True, "value": 0.01, "se": 0.01, "value_a": 0.71, "value_b": 0.70, "n": 300, "n_groups": 40,
             "grouping": "document", "n_resamples": 1000, "n_seeds": 1, "n_train": 700}])
    return T


def _answer(module, T, cfg=None):
    decided = decide(module.rows(T), module.RULES)
    return decided, module.answer(T, decided, cfg)


def test_q1_answer_when_dropping_sep_moves_less_than_a_swap():
    T = _q1_tables(concat=0.009, swap=0.041, se=0.001)
    decided, a = _answer(q1, T)
    assert set(decided["measure"]) == {"vs_swap", "vs_replace", "finetuned", "frozen"}
    assert (decided[decided["measure"] == "vs_swap"]["layer"] == 6).all()  # the last layer only
    assert len(decided[decided["measure"] == "vs_swap"]) == 5 and len(decided[decided["measure"] == "vs_replace"]) == 3
    # a real difference (3.2 points) below the 5-point threshold
    assert a.text.startswith("Not a lot: dropping [SEP] moves last-layer word vectors 0.90% of the way to another "
                             "input, less than swapping two words does (4.1%).")
    assert "accuracy without [SEP] changes by -0.40 points (CI -1.6 to +0.78)" in a.text
    assert "no difference that matters" in a.text
    assert a.words <= MAX_WORDS and a.confidence == "high"
    _, far = _answer(q1, _q1_tables(concat=0.009, swap=0.091, se=0.001))
    assert "less than swapping two words does (9.1%)." in far.text


def test_q1_answer_cannot_tell_and_without_fine_tuning():
    T = _q1_tables(concat=0.03, swap=0.04, se=0.02, ft=None)
    decided, a = _answer(q1, T)
    assert a.text.startswith("Cannot tell: dropping [SEP] moves last-layer word vectors 3.0%")
    assert "not measured in this run" in a.text and a.confidence == "low" and a.words <= MAX_WORDS
    assert not (decided["measure"] == "finetuned").any()


def test_q1_answer_says_when_the_fine_tuned_models_did_not_learn():
    T = _q1_tables(concat=0.009, swap=0.041, se=0.001, ft=(0.02, 0.02))
    T[q1.FINETUNE_TABLE]["learnt"] = [False, True]
    T[q1.FINETUNE_TABLE]["chance"] = 0.51
    _, a = _answer(q1, T)
    assert ("Fine-tuned on next-sentence pairs, the two formats did not both clear chance (next-sentence: pair 80.0%, "
            "concat 82.0%, always guessing the commoner answer 51.0%), so this run cannot compare them.") in a.text
    assert "changes by" not in a.text and a.confidence == "low" and a.words <= MAX_WORDS
    T[q1.FINETUNE_TABLE]["learnt"] = [True, True]  # models that learnt: the difference is read
    assert "changes by +2.0 points" in _answer(q1, T)[1].text


def test_q1_answer_reads_the_first_task_both_formats_learnt():
    """next at chance, topic learnt: the answer reads topic and says next was not learnt; one family per task."""
    T = _q1_tables(concat=0.009, swap=0.041, se=0.001, ft=(0.02, 0.02))
    nxt = T[q1.FINETUNE_TABLE].assign(target="next", learnt=[False, True], chance=0.51)
    topic = T[q1.FINETUNE_TABLE].assign(target="topic", learnt=True, chance=0.22, value=-0.05, value_a=0.75,
                                        value_b=0.80, se=0.005)
    T[q1.FINETUNE_TABLE] = pd.concat([nxt, topic], ignore_index=True)
    decided, a = _answer(q1, T)
    tuned = decided[decided["measure"] == "finetuned"]
    assert set(tuned["family"]) == {"Q1: fine-tuned accuracy on next, concat − pair",
                                    "Q1: fine-tuned accuracy on topic, concat − pair"}
    assert ("Fine-tuned on topic pairs (next-sentence pairs were not learnt), accuracy without [SEP] changes by "
            "-5.0 points") in a.text and "a difference that matters" in a.text and a.words <= MAX_WORDS
    from probing.study.config import StudyConfig

    ev = q1.evidence(T, decided, StudyConfig())
    assert "**The fine-tuned model, `next`.**" in ev and "**The fine-tuned model, `topic`.**" in ev


def test_q1_answer_when_dropping_sep_moves_more():
    _, a = _answer(q1, _q1_tables(concat=0.20, swap=0.04, se=0.005))
    assert a.text.startswith("Yes: dropping [SEP] moves last-layer word vectors 20.0%")
    assert "more than swapping" in a.text
    # more than a swap, but by less than the 5-point threshold: not a lot
    _, small = _answer(q1, _q1_tables(concat=0.010, swap=0.005, se=0.0005))
    assert small.text.startswith("Not a lot: dropping [SEP] moves last-layer word vectors 1.0% of the way to another "
                                 "input, slightly more than swapping two words does (0.50%).")
    # about as much as a swap
    _, same = _answer(q1, _q1_tables(concat=0.010, swap=0.0101, se=0.002))
    assert "about as much as swapping two words does (1.0%)" in same.text and same.text.startswith("Not a lot")


def _q2_tables(pair: float, concat: float, se: float) -> dict:
    rows = []
    for rep in q2.REPRESENTATIONS:
        role, choice = (rep, "") if "words" in rep else ("", rep)
        for layer in (0, 6):
            for change, v in (("pair", pair), ("concat", concat)):
                rows.append({"metric": "share", "layer": layer, "role": role, "choice": choice, "change": change,
                             "change_b": "", "value": v, "ci_low": v - se, "ci_high": v + se, "se": se, "n": 500,
                             "n_groups": 60, "grouping": "document", "n_resamples": 1000})
            base = {"layer": layer, "role": role, "choice": choice, "change": "concat", "change_b": "pair", "n": 500,
                    "n_groups": 60, "grouping": "document", "n_resamples": 1000, "value_a": concat, "value_b": pair}
            rows.append({**base, "metric": "share_diff", "value": concat - pair, "se": se,
                         "ci_low": concat - pair - 2 * se,
                         "ci_high": concat - pair + 2 * se})
            rows.append({**base, "metric": "share_ratio", "value": concat / pair, "se": 0.1,
                         "ci_low": concat / pair - 0.2,
                         "ci_high": concat / pair + 0.2})
    dec = pd.DataFrame([{"metric": m, "layer": 6, "format": f, "value": v, "ci_low": v - 0.01, "ci_high": v + 0.01,
                         "se": 0.005, "value_a": 0.71, "value_b": 0.70, "n": 1000, "n_groups": 120,
                         "grouping": "document", "n_resamples": 1000}
                        for m, f, v in (("macro_auc", "pair", 0.70), ("macro_auc", "concat", 0.71),
                                        ("macro_auc_diff", "pair", 0.01))])
    att = pd.DataFrame([{"metric": "attention_norm_diff", "layer": layer, "value": 0.01, "se": 0.002,
                         "value_a": 0.2, "value_b": 0.21, "n": 1000, "n_groups": 120, "grouping": "document",
                         "n_resamples": 1000} for layer in (1, 6)])
    return {q2.TABLE: pd.DataFrame(rows), q2.DECODING: dec, q2.ATTENTION: att}


def test_q2_answer_reads_the_interchange_and_its_ratio():
    T = _q2_tables(pair=0.03, concat=0.06, se=0.002)
    decided, a = _answer(q2, T)
    assert set(decided["measure"]) == {"interchange", "decoding", "attention"}
    assert set(decided[decided["measure"] == "interchange"]["representation"]) == {"s1 words", "mean_s1"}
    assert a.text == ("Slightly: replacing sentence 2 moves sentence 1's last-layer words 3.0% (with [SEP]) vs 6.0% "
                      "(without) of the way to another input: 2.0 times as much without [SEP].")
    assert a.words <= MAX_WORDS
    att = decided[decided["measure"] == "attention"].iloc[0]
    assert att["value_a"] == 0.21 and att["value_b"] == 0.2 and "norm-based" in att["label"]


def test_q2_answer_yes_and_no():
    _, yes = _answer(q2, _q2_tables(pair=0.03, concat=0.12, se=0.002))
    assert yes.text.startswith("Yes: ") and "4.0 times" in yes.text
    _, no = _answer(q2, _q2_tables(pair=0.03, concat=0.031, se=0.002))
    assert no.text.startswith("No, not by a difference that matters") and no.confidence == "high"
    decided, less = _answer(q2, _q2_tables(pair=0.12, concat=0.03, se=0.002))
    assert less.text.startswith("No, less: ") and "0.2 times as much" in less.text
    # the asker asks "more": a significant difference the other way reads as the opposite in the decided rows
    assert decided[decided["measure"] == "interchange"]["verdict"].tolist() == ["No (the opposite)"] * 2


def test_evidence_holds_the_numbers_of_the_answer():
    T = _q1_tables(concat=0.009, swap=0.041, se=0.001)
    decided = decide(q1.rows(T), q1.RULES)
    from probing.study.config import load_config

    text = q1.evidence(T, decided, load_config("seed_questions"))
    assert "layer 6" in text and "0.90% (0.70% to 1.1%)" in text and "| [CLS] |" in text
    assert "pair 80.0%, concat 79.6%" in text
    T2 = _q2_tables(pair=0.03, concat=0.06, se=0.002)
    text2 = q2.evidence(T2, decide(q2.rows(T2), q2.RULES), None)
    assert "| sentence 1's words | 3.0%" in text2 and "pair 0.700, concat 0.710" in text2
    assert "Norm-based attention" in text2


# --------------------------------------------------------------------------------------------------
# end to end


@pytest.mark.slow
def test_q1_and_q2_run_end_to_end(tmp_path, bert_tokenizer, monkeypatch):
    from probing.study import questions
    from probing.study.runner import run_study
    from .conftest import make_tiny_bert, quick_study_config

    monkeypatch.setitem(questions.QUESTIONS, "Q1", q1.QUESTION)
    monkeypatch.setitem(questions.QUESTIONS, "Q2", q2.QUESTION)
    model_dir = tmp_path / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    cfg = quick_study_config(tmp_path, model_dir)
    report = run_study(cfg, quick=True, overrides={"study.questions": ["Q1", "Q2"]}, log=lambda *a: None)
    out = report.parent
    md = report.read_text(encoding="utf-8")
    for key, module in (("Q1", q1), ("Q2", q2)):
        m = re.search(rf"\*\*{key}\. {re.escape(module.ASKED)}\*\* \[evidence\]\(#{key.lower()}\)  \n(.*)\n", md)
        assert m and word_count(m.group(1)) <= MAX_WORDS + 3  # the answer and its confidence word
    assert "last-layer word vectors" in md and "of the way to another input" in md
    tables = out / "tables"
    for name in (q1.TABLE, q1.FINETUNE_TABLE, q2.TABLE, q2.DECODING, q2.ATTENTION, "q1_decisions", "q2_decisions"):
        assert (tables / f"{name}.csv").exists(), name
    decided = pd.read_csv(tables / "q1_decisions.csv")
    assert {"vs_swap", "vs_replace", "finetuned", "frozen"} <= set(decided["measure"])
    change = pd.read_csv(tables / f"{q1.TABLE}.csv")
    share = change[change["metric"] == "share"]
    # layer 0 is a null for sentence 1's words: same token, position and segment in pair, concat and a swap
    s1 = share[(share["role"] == "s1 words") & (share["layer"] == 0)]
    assert np.allclose(s1["value"], 0, atol=1e-6)
    # the decoding probe is fitted at the last layer only, the layer its row reads
    assert set(pd.read_csv(tables / f"{q2.DECODING}.csv")["layer"]) == {int(change["layer"].max())}
    assert (out / "figures" / "q1_change.png").exists() and (out / "figures" / "q2_interchange.png").exists()
    # the pairs' caches carry the norm-based attention summary (Job.attention_norm reaches extraction)
    attention = pd.read_csv(tables / f"{q2.ATTENTION}.csv")
    assert set(attention["metric"]) == {"attention_norm_diff"} and "Norm-based attention" in md
