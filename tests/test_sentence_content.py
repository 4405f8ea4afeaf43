"""k-sentence inputs (Q3, Q5): replacement corpora (donors, interchange, intruders), the control format, the
content readout and the interchange test, each on constructed data where the answer is known, and their errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from analyses.sentence_content import (OWN_CLS, auc_draws, content_rows, control_template, cross_fit_scores,
                                       group_draws, interchange_rows, own_cls_rows, paired_auc_difference,
                                       run_interchange, run_sentence_content, segment_format)
from probing.corpora import load_corpus
from probing.corpus_replace import balanced_positions, hold_out_documents, intruder_examples, replace_sentences
from probing.examples import Example

# ---------------------------------------------------------------------------------------------------
# Replacement corpora


def _groups(n=90, k=4):
    return load_corpus(f"generated:n={n},k={k},pairing=consecutive")


def test_donors_are_whole_documents_of_every_topic():
    ex = _groups()
    items, donors = hold_out_documents(ex, 0.2, seed=0)
    docs_i, docs_d = {e.labels["doc"] for e in items}, {e.labels["doc"] for e in donors}
    assert docs_i and docs_d and not docs_i & docs_d and len(items) + len(donors) == len(ex)
    assert {e.labels["topic"] for e in donors} == {e.labels["topic"] for e in ex}  # a donor for every topic
    assert [e.id for e in items] == [e.id for e in ex if e.labels["doc"] in docs_i]  # corpus order kept
    assert hold_out_documents(ex, 0.2, seed=0) == (items, donors)  # deterministic
    assert hold_out_documents(ex, 0.2, seed=1)[1] != donors


def test_donor_errors_name_the_problem():
    ex = _groups()
    with pytest.raises(ValueError, match="share of documents held out"):
        hold_out_documents(ex, 1.0)
    one_doc = [Example(f"a{i}", ("x.", "y."), {"doc": "d0" if i < 3 else f"d{i}", "topic": "t" if i < 3 else "u"})
               for i in range(6)]
    with pytest.raises(ValueError, match="topic 't' has 1 document"):
        hold_out_documents(one_doc, 0.3)
    with pytest.raises(ValueError, match="needs a 'doc' label"):
        hold_out_documents([Example("a", ("x.",), {"topic": "t"})], 0.3)


def test_replaced_sentences_come_from_another_document_of_the_same_topic():
    items, donors = hold_out_documents(_groups(), 0.25)
    positions = balanced_positions(len(items), 4, seed=0)
    assert sorted(Counter(positions).values())[-1] - sorted(Counter(positions).values())[0] <= 1
    out = replace_sentences(items, positions, donors, seed=0)
    donor_sentences = {s: (d.labels["topic"], d.labels["doc"]) for d in donors for s in d.sentences}
    for e, new, p in zip(items, out, positions):
        assert new.id == e.id and new.labels["replaced"] == p
        changed = [i + 1 for i, (a, b) in enumerate(zip(e.sentences, new.sentences)) if a != b]
        assert changed == [p]
        topic, doc = donor_sentences[new.sentences[p - 1]]
        assert topic == e.labels["topic"] and doc == new.labels["replaced_doc"] != e.labels["doc"]
    used = Counter(new.sentences[p - 1] for new, p in zip(out, positions))
    assert max(used.values()) <= -(-len(out) // len(donor_sentences)) + 1  # dealt evenly from the pool
    with pytest.raises(ValueError, match="replaced before"):
        replace_sentences(out, positions, donors)
    with pytest.raises(ValueError, match="cannot replace sentence 5"):
        replace_sentences(items[:1], [5], donors)


def test_intruders_in_exactly_half_never_sentence_one():
    items, donors = hold_out_documents(_groups(), 0.25)
    out = intruder_examples(items, 3, donors, seed=0)
    assert all(e.n_sentences == 3 for e in out)
    flags = [e.labels["intruded"] for e in out]
    assert sum(flags) == len(out) // 2
    pos = [e.labels["intruder_position"] for e in out if e.labels["intruded"]]
    assert set(pos) == {2, 3} and abs(pos.count(2) - pos.count(3)) <= 1
    for e, o in zip(items, out):
        assert o.sentences[0] == e.sentences[0]
        same = [a == b for a, b in zip(e.sentences[:3], o.sentences)]
        assert same.count(False) == o.labels["intruded"]
    # no sentence of an intruded example sits in another example: the split can keep every unit apart
    from analyses.finetune import make_task, shared_sentences

    task = make_task(out, "intruded", 0.3)
    assert shared_sentences(out, task.test_ids) == []
    with pytest.raises(ValueError, match="fewer than k=5"):
        intruder_examples(items, 5, donors)


def test_intruders_of_another_topic_come_from_another_topic_and_the_same_examples_otherwise():
    items, donors = hold_out_documents(_groups(), 0.25)
    topic_of = {s: e.labels["topic"] for e in donors for s in e.sentences}
    same = intruder_examples(items, 3, donors, seed=0)
    other = intruder_examples(items, 3, donors, seed=0, other=True)
    assert [e.labels["intruder_position"] for e in same] == [e.labels["intruder_position"] for e in other]
    for e, s, o in zip(items, same, other):
        p = o.labels["intruder_position"]
        if not p:
            assert o.sentences == s.sentences == e.sentences[:3]
            continue
        assert topic_of[s.sentences[p - 1]] == e.labels["topic"]  # same_topic: the item's own topic
        assert topic_of[o.sentences[p - 1]] != e.labels["topic"]  # other_topic: never the item's
        assert o.sentences[:p - 1] + o.sentences[p:] == e.sentences[:p - 1] + e.sentences[p:3]
    # every other topic supplies intruders, not one
    assert len({topic_of[o.sentences[o.labels["intruder_position"] - 1]] for o in other
                if o.labels["intruded"]}) == len({e.labels["topic"] for e in donors})
    one = [e for e in donors if e.labels["topic"] == donors[0].labels["topic"]]
    with pytest.raises(ValueError, match="no donor sentence of a topic other than"):
        intruder_examples([e for e in items if e.labels["topic"] == one[0].labels["topic"]], 3, one, other=True)


# ---------------------------------------------------------------------------------------------------
# The control format


def test_control_differs_from_multi_only_in_the_inner_separators(bert_tokenizer):
    from probing.formats import Format, render, special_token_ids, tokenize_sentences

    e = Example("a", ("The cat sat.", "A dog ran.", "It rained."))
    out = {}
    for spec in ("multi", segment_format("control", 3)):
        f = Format.parse(spec)
        words = tokenize_sentences(bert_tokenizer, e.sentences)
        out[f.name] = render(f, e, words, special_token_ids(bert_tokenizer, f))
    multi, control = out["multi"], out["control3"]
    assert list(multi.token_type_ids) == list(control.token_type_ids)
    differ = [i for i, (a, b) in enumerate(zip(multi.input_ids, control.input_ids)) if a != b]
    assert len(multi.input_ids) == len(control.input_ids) and len(differ) == 2
    assert {bert_tokenizer.convert_ids_to_tokens(int(control.input_ids[i])) for i in differ} == {","}
    assert {bert_tokenizer.convert_ids_to_tokens(int(multi.input_ids[i])) for i in differ} == {"[SEP]"}
    assert control_template(2) == "[CLS] <0> {1} ',' <1> {2} [SEP]"
    with pytest.raises(ValueError, match="k >= 2"):
        control_template(1)
    with pytest.raises(ValueError, match="unknown format kind"):
        segment_format("pair", 2)


# ---------------------------------------------------------------------------------------------------
# Content readout and interchange on constructed vectors


def _bags(rng, n, L, p=0.25):
    return (rng.random((n, L)) < p).astype(int)


def test_a_sentence_one_format_drops_is_found_and_equal_formats_are_not():
    rng = np.random.default_rng(0)
    n, L, d = 300, 10, 40
    groups = np.arange(n) // 5
    Y = {i: _bags(rng, n, L) for i in (1, 2, 3)}
    W = {i: rng.normal(size=(L, d)) for i in (1, 2, 3)}
    noise = lambda: rng.normal(scale=1.0, size=(n, d))  # noqa: E731
    full = sum(Y[i] @ W[i] for i in (1, 2, 3))
    # concat: sentence 3's words replaced by unrelated ones (as hard to read past, none of sentence 3 in it)
    other = _bags(rng, n, L)
    features = {("multi", "cls"): full + noise(), ("concat", "cls"): Y[1] @ W[1] + Y[2] @ W[2] + other @ W[3] + noise(),
                ("control", "cls"): full + noise()}
    kw = dict(n_splits=5, seed=0, Cs=(0.1,), max_iter=200, n_resamples=200)
    comparisons = [(("multi", "cls"), ("concat", "cls")), (("multi", "cls"), ("control", "cls")),
                   (("multi", "cls"), ("nothing", "cls"))]  # a side never fitted: skipped
    rows3 = {(r["format"], r.get("format_b")): r for r in content_rows(features, Y[3], groups, comparisons, **kw)}
    planted = rows3[("multi", "concat")]
    assert planted["ci_low"] > 0.1 and planted["value_a"] > 0.8 and planted["value_b"] < 0.6  # concat lost s3
    null = rows3[("multi", "control")]
    assert null["ci_low"] < 0 < null["ci_high"] and null["se"] > 0
    assert ("multi", "nothing") not in rows3 and len(rows3) == 5  # 3 levels + 2 comparisons
    rows1 = {(r["format"], r.get("format_b")): r for r in content_rows(features, Y[1], groups, comparisons, **kw)}
    assert rows1[("multi", "concat")]["ci_low"] < 0 < rows1[("multi", "concat")]["ci_high"]  # s1 is in both


def _interchange_world(seed=0, n=400, k=3, L=10, d=40, stuck=False):
    rng = np.random.default_rng(seed)
    groups = np.arange(n) // 4
    old = {i: _bags(rng, n, L) for i in range(1, k + 1)}
    new = {i: _bags(rng, n, L) for i in range(1, k + 1)}
    W = {i: rng.normal(size=(L, d)) for i in range(1, k + 1)}
    replaced = np.asarray(balanced_positions(n, k, seed))
    clean = sum(old[i] @ W[i] for i in old)
    swapped_bags = {i: np.where((replaced == i)[:, None], new[i], old[i]) for i in old}
    swapped = sum(swapped_bags[i] @ W[i] for i in old)
    noise = rng.normal(scale=0.7, size=(n, d))
    Xc, Xs = clean + noise, (clean if stuck else swapped) + noise
    from analyses.probes import make_splits

    splits = make_splits(old[1], groups, 5, seed)
    S_clean, S_swap = {}, {}
    for i in old:
        S_clean[i], S_swap[i] = cross_fit_scores(Xc, old[i], splits, [Xs], Cs=(0.1,), max_iter=200)
    return interchange_rows(S_clean, S_swap, old, new, replaced, groups, n_resamples=200, seed=seed)


def test_a_readout_that_follows_its_sentence_is_found_and_others_stay():
    rows = _interchange_world()
    follow = [r for r in rows if r["metric"] == "interchange_follow"]
    stay = [r for r in rows if r["metric"] == "interchange_stay"]
    assert len(follow) == len(stay) == 3
    assert all(r["ci_low"] > 0.2 for r in follow)  # the readout ranks the new words, not the old ones
    assert all(r["ci_low"] < 0.03 and r["ci_high"] > -0.03 and abs(r["value"]) < 0.03 for r in stay)
    assert all(r["n"] > 100 for r in follow) and all(r["n"] > 200 for r in stay)
    # the mean over positions pools every position's items: the same answer, a narrower interval
    (fm,) = [r for r in rows if r["metric"] == "interchange_follow_mean"]
    (sm,) = [r for r in rows if r["metric"] == "interchange_stay_mean"]
    assert "position" not in fm and fm["value"] == pytest.approx(np.mean([r["value"] for r in follow]))
    assert fm["ci_low"] > 0.2 and fm["se"] < min(r["se"] for r in follow) and fm["n"] == sum(r["n"] for r in follow)
    assert abs(sm["value"]) < 0.03 and sm["ci_low"] < 0 < sm["ci_high"] and sm["se"] < max(r["se"] for r in stay)


def test_a_readout_stuck_on_the_old_input_does_not_follow():
    rows = _interchange_world(stuck=True)
    follow = [r for r in rows if r["metric"] == "interchange_follow"]
    assert all(r["ci_high"] < 0 for r in follow)  # it still reads the old sentence
    (fm,) = [r for r in rows if r["metric"] == "interchange_follow_mean"]
    assert fm["ci_high"] < 0


def test_paired_auc_difference_of_identical_scores_is_zero():
    rng = np.random.default_rng(1)
    Y, S = _bags(rng, 80, 6), rng.random((80, 6))
    codes, times = group_draws(np.arange(80) // 4, 200, 0)
    a = auc_draws(Y, S, codes, times)
    d = paired_auc_difference(a, a)
    assert d["value"] == 0 and d["ci_low"] == d["ci_high"] == 0 and d["se"] == 0
    assert 0.3 < a[0] < 0.7 and a[1].shape == (200,)
    with pytest.raises(ValueError, match="shape"):
        cross_fit_scores(S, Y, [(np.arange(40), np.arange(40, 80))], [S[:10]])


# ---------------------------------------------------------------------------------------------------
# The runners on caches of a tiny model


@pytest.fixture(scope="module")
def segment_caches(tmp_path_factory, bert_tokenizer):
    from probing.cache import Cache
    from probing.extract import extract
    from probing.models import prepare_model

    from .conftest import make_tiny_bert

    root = tmp_path_factory.mktemp("seg")
    lm = prepare_model(make_tiny_bert(bert_tokenizer, max_position_embeddings=160), bert_tokenizer, name="tiny")
    items, donors = hold_out_documents(_groups(n=60, k=3), 0.2)
    quiet = dict(model=lm, out=root, progress=False, log=lambda *a: None)
    caches = {}
    for k in (2, 3):
        ex = [Example(e.id, e.sentences[:k], e.labels) for e in items]
        paths = extract(ex, ["multi", "concat", segment_format("control", k), "bertsum"], corpus_name=f"k{k}",
                        **quiet)
        for kind, p in zip(("multi", "concat", "control", "bertsum"), paths):
            caches[(k, kind)] = Cache.open(p)
    swapped = replace_sentences(items, balanced_positions(len(items), 3), donors)
    (s,) = extract(swapped, ["multi"], corpus_name="swap", **quiet)
    (other,) = extract(items[:-3], ["multi"], corpus_name="fewer", **quiet)
    return caches, Cache.open(s), Cache.open(other)


def test_content_table_pairs_every_format_of_a_k(segment_caches, tmp_path):
    caches, _, _ = segment_caches
    choices = {"multi": ("cls", "mean"), "concat": ("cls", "mean"), "control": ("cls",), "bertsum": (OWN_CLS,)}
    kw = dict(choices=choices, vocab=6, n_splits=3, Cs=(0.1,), max_iter=50, n_resamples=100, progress=False)
    df = run_sentence_content(caches, out=tmp_path, **kw)
    levels = df[df["metric"] == "macro_auc"]
    assert set(zip(levels["k"], levels["position"])) == {(2, 1), (2, 2), (3, 1), (3, 2), (3, 3)}
    assert len(levels) == 5 * 7  # 6 choices + the length-only probe, per (k, position)
    assert levels["layer"].isna().sum() == 5 and (levels["layer"].dropna() == 2).all()  # the last layer
    diffs = df[df["metric"] == "macro_auc_diff"]
    # multi − concat (cls, mean), multi − control (cls), multi − length, bertsum own − multi: 5 per (k, position)
    assert len(diffs) == 25 and (diffs["se"] > 0).all() and diffs["n_groups"].nunique() == 1
    assert np.allclose(diffs["value"], diffs["value_a"] - diffs["value_b"])
    cos = df[df["metric"] == "cosine"]
    assert len(cos) == 1 + 2 and cos["value"].between(-1, 1).all()  # own [CLS] of sentence 2 (k=2), 2-3 (k=3)
    again = run_sentence_content(caches, out=tmp_path, **kw)
    assert again.attrs["reused"] and len(again) == len(df)


def test_own_cls_is_the_cls_before_each_sentence(segment_caches):
    caches, _, _ = segment_caches
    b = caches[(3, "bertsum")]
    pos = [b.tokens.loc[own_cls_rows(b, i)[1], "position"].to_numpy() for i in (1, 2, 3)]
    assert (pos[0] == 0).all() and (pos[1] > pos[0]).all() and (pos[2] > pos[1]).all()
    with pytest.raises(ValueError, match="bertsum"):
        own_cls_rows(caches[(3, "multi")], 2)


def test_content_and_interchange_refuse_unpaired_caches(segment_caches, tmp_path):
    caches, swapped, fewer = segment_caches
    kw = dict(vocab=6, n_splits=3, max_iter=50, n_resamples=100)
    with pytest.raises(ValueError, match="hold different examples"):
        run_sentence_content({(3, "multi"): caches[(3, "multi")], (3, "concat"): fewer},
                             choices={"multi": ("cls",), "concat": ("cls",)}, progress=False, **kw)
    with pytest.raises(ValueError, match=r"no token choices given for format\(s\) \['concat'\]"):
        run_sentence_content({(3, "concat"): caches[(3, "concat")]}, choices={}, progress=False, **kw)
    with pytest.raises(ValueError, match="hold different examples"):
        run_interchange(fewer, swapped, **kw)
    with pytest.raises(ValueError, match="no 'replaced' label"):
        run_interchange(caches[(3, "multi")], caches[(3, "multi")], **kw)
    with pytest.raises(ValueError, match="one format"):
        run_interchange(caches[(3, "concat")], swapped, **kw)
    assert not list(tmp_path.iterdir())  # nothing written


def test_interchange_table_has_follow_and_stay_per_position(segment_caches, tmp_path):
    caches, swapped, _ = segment_caches
    df = run_interchange(caches[(3, "multi")], swapped, vocab=6, n_splits=3, max_iter=50, n_resamples=100,
                         out=tmp_path)
    assert sorted(df["metric"].unique()) == ["interchange_follow", "interchange_follow_mean", "interchange_stay",
                                             "interchange_stay_mean"]
    assert sorted(df["position"].dropna().unique()) == [1, 2, 3] and (df["analysis"] == "interchange").all()
    assert df[df["metric"].str.endswith("_mean")]["position"].isna().all()
    df = df[df["position"].notna()]
    follow = df[df["metric"] == "interchange_follow"]
    stay = df[df["metric"] == "interchange_stay"]
    assert follow["n"].sum() == len(swapped.examples)  # every item has exactly one sentence replaced
    assert (stay["n"] == len(swapped.examples) - follow.set_index("position")["n"].reindex(stay["position"]).to_numpy()
            ).all()
