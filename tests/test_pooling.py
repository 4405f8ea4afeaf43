"""Fine-tuning with different poolings (Q8): pools read the right positions (never padding), training
learns, the split is fixed and disjoint, results are tidy and reused, bad input fails clearly."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest
import torch

import analyses.finetune._train as FT
import analyses.finetune._experiment as P
from analyses.finetune import (POOLINGS, PRESETS, TrainConfig, epoch_batches, finetune, get_pooling, pool, pooling_mask,
                               run_pooling_experiment, sorted_batches, train_test_split)
from analyses.selection import TOKEN_CHOICES
from analyses.stats import example_groups
from probing.examples import Example
from probing.formats import Format, render, special_token_ids, tokenize_sentences
from probing.models import prepare_model

from .conftest import make_tiny_bert, make_tiny_roberta

FILLER = ["the", "a", "man", "woman", "saw", "took", "house", "river", "green", "old", "quickly", "went", "near"]


def keyword_examples(n: int = 48, seed: int = 0) -> list[Example]:
    """A learnable task: the label says which key word ('apple' or 'stone') sentence 2 contains.
    Examples come in documents of two (label ``doc``), both of one class."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = ["apple", "stone"][(i // 2) % 2]
        s1 = " ".join(rng.choice(FILLER) for _ in range(rng.randint(3, 7))) + "."
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        words.insert(rng.randint(0, len(words)), key)
        out.append(Example(f"k{i:03d}", (s1, " ".join(words) + "."), {"kind": key, "doc": f"d{i // 2}"}))
    return out


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and oversubscribed threads on a busy 2-core machine
    stall each other; restore torch's setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def tiny(bert_tokenizer):
    return prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny-bert")


FAST = dict(epochs=1, batch_size=8, lr=1e-3, max_length=None, device="cpu", preset="quick")


def _render(tokenizer, examples, fmt="pair"):
    fmt = Format.parse(fmt)
    specials = special_token_ids(tokenizer, fmt)
    return [render(fmt, e, tokenize_sentences(tokenizer, list(e.sentences)), specials) for e in examples]


# --------------------------------------------------------------------------------------------------
# pools select the right positions


def test_registry_and_pos_names():
    assert POOLINGS is TOKEN_CHOICES  # one grammar with the probes' token choices
    assert get_pooling("sep1").position is None and get_pooling("mean_s2").reduce == "mean"
    assert get_pooling("pos0").position == 0 and get_pooling("pos17").position == 17
    assert get_pooling("mean").reduce == "mean" and get_pooling("max").reduce == "max"


def test_masks_on_hand_built_batch(bert_tokenizer):
    ex = [Example("a", ("The cat sat.", "Unbelievably, dogs bark loudly today.")),
          Example("b", ("Hi.", "Yo."))]
    rendered = _render(bert_tokenizer, ex)
    T = max(len(r) for r in rendered)
    assert len(rendered[1]) < T  # example b is padded
    sep_id, cls_id = bert_tokenizer.sep_token_id, bert_tokenizer.cls_token_id
    for b, r in enumerate(rendered):
        ids = r.input_ids.tolist()
        words = [t for t, role in enumerate(r.role) if role == "word"]
        # reference positions computed from the token ids (allowed in a test, not in the code)
        expect = {
            "cls": [ids.index(cls_id)], "sep1": [ids.index(sep_id)], "sep_last": [len(ids) - 1],
            "first_word": [1], "pos2": [2], "mean_s1": words[:ids.index(sep_id) - 1],
            "mean_s2": words[ids.index(sep_id) - 1:],
            "mean": [t for t, i in enumerate(ids) if i not in (cls_id, sep_id)], "max": words,
        }
        assert expect["mean"] == words
        for name, pos in expect.items():
            m = pooling_mask(rendered, name, T)
            assert np.flatnonzero(m[b]).tolist() == pos, (name, b)
            assert not m[b, len(r):].any()  # padding never selected
    # the first [SEP] of 'pair' closes sentence 1: right after its last word
    n1 = len(bert_tokenizer("The cat sat.", add_special_tokens=False)["input_ids"])
    assert np.flatnonzero(pooling_mask(rendered, "sep1", T)[0]).tolist() == [1 + n1]
    assert np.flatnonzero(pooling_mask(rendered, "sep2", T)[0]).tolist() == [len(rendered[0]) - 1]


def test_pool_values_equal_reference_and_ignore_padding(bert_tokenizer):
    ex = [Example("a", ("The cat sat on the mat.", "It purred.")), Example("b", ("Hi.", "Yo."))]
    rendered = _render(bert_tokenizer, ex)
    T = max(len(r) for r in rendered)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, T, 5, generator=g, dtype=torch.float64)
    h[1, len(rendered[1]):] = 1e6  # padding: would dominate mean and max if it leaked in
    for name in ["cls", "sep1", "first_word", "pos2", "mean", "max"]:
        p = get_pooling(name)
        got = pool(h, torch.from_numpy(pooling_mask(rendered, name, T)), p.reduce).numpy()
        for b, r in enumerate(rendered):
            words = [t for t, role in enumerate(r.role) if role == "word"]
            ref = {"cls": h[b, 0], "sep1": h[b, r.role.index("sep")], "first_word": h[b, 1], "pos2": h[b, 2],
                   "mean": h[b, words].mean(0), "max": h[b, words].max(0).values}[name].numpy()
            np.testing.assert_allclose(got[b], ref, rtol=0, atol=1e-12, err_msg=f"{name} example {b}")
    assert pool(h, torch.from_numpy(pooling_mask(rendered, "max", T)), "max").max() < 1e5


def test_classifier_pool_equals_unpadded_forward(bert_tokenizer, tiny):
    """End to end: the pooled vector of a padded batch equals the pool of each example run alone."""
    ex = [Example("a", ("The cat sat on the mat.", "It purred loudly.")), Example("b", ("Hi.", "Yo."))]
    rendered = _render(bert_tokenizer, ex)
    model = tiny.model.eval()
    for name in ["mean", "max", "sep1", "cls"]:
        p = get_pooling(name)
        batch = FT._collate(rendered, p, bert_tokenizer.pad_token_id, torch.device("cpu"))
        with torch.no_grad():
            h = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"]).last_hidden_state
            got = pool(h, batch["pool_mask"], p.reduce)
            for b, r in enumerate(rendered):
                alone = model(input_ids=torch.from_numpy(r.input_ids)[None],
                              token_type_ids=torch.from_numpy(r.token_type_ids)[None]).last_hidden_state[0]
                pos = torch.from_numpy(p.select(r))
                ref = alone[pos].mean(0) if p.reduce == "mean" else alone[pos].max(0).values
                torch.testing.assert_close(got[b], ref, atol=1e-5, rtol=1e-5)


def test_roles_work_for_roberta_style_tokenizer(roberta_tokenizer):
    ex = [Example("a", ("The cat sat.", "A dog barked."))]
    (r,) = _render(roberta_tokenizer, ex)
    ids = r.input_ids.tolist()
    assert np.flatnonzero(pooling_mask([r], "cls")[0]).tolist() == [ids.index(roberta_tokenizer.cls_token_id)] == [0]
    assert np.flatnonzero(pooling_mask([r], "sep1")[0]).tolist() == [ids.index(roberta_tokenizer.sep_token_id)]
    specials = {roberta_tokenizer.cls_token_id, roberta_tokenizer.sep_token_id}
    assert np.flatnonzero(pooling_mask([r], "mean")[0]).tolist() == [t for t, i in enumerate(ids) if i not in specials]


# --------------------------------------------------------------------------------------------------
# training


def test_training_lowers_loss_and_learns(tiny):
    ex = keyword_examples(64)
    r = finetune(ex, "kind", model=tiny, pooling="mean", seed=0,
                 **{**FAST, "epochs": 8, "lr": 3e-3, "head_lr": 1e-2, "max_train": 10_000})
    first, last = r["train_loss_epochs"][0], r["train_loss_epochs"][-1]
    assert len(r["train_loss_epochs"]) == 8
    assert len(r["train_loss_steps"]) == 8 * math.ceil(r["n_train"] / 8)
    assert first == pytest.approx(math.log(2), abs=0.05)  # an untrained 2-class head is near chance
    assert last < 0.4 * first, r["train_loss_epochs"]
    assert r["test_accuracy"] >= 0.75
    assert r["n_train"] + r["n_test"] == 64


def test_same_seed_same_run_other_seed_differs(tiny):
    ex = keyword_examples(32)
    a = finetune(ex, "kind", model=tiny, pooling="cls", seed=3, **FAST)
    b = finetune(ex, "kind", model=tiny, pooling="cls", seed=3, **FAST)
    c = finetune(ex, "kind", model=tiny, pooling="cls", seed=4, **FAST)
    assert a["train_loss_steps"] == b["train_loss_steps"] and a["test_accuracy"] == b["test_accuracy"]
    assert a["train_loss_steps"] != c["train_loss_steps"]


def test_model_is_not_modified(tiny):
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    finetune(keyword_examples(24), "kind", model=tiny, pooling="max", **FAST)
    for k, v in tiny.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_training_never_reads_test_examples(tiny):
    """Changing the test examples' text and labels leaves the training run bit-identical."""
    ex = keyword_examples(32)
    test_ids = {e.id for e in ex[-8:]}
    a = finetune(ex, "kind", model=tiny, pooling="mean", test_ids=test_ids, **FAST)
    changed = ex[:-8] + [Example(e.id, ("Completely different words here.", "And more of them."),
                                 {"kind": "apple"}) for e in ex[-8:]]
    b = finetune(changed, "kind", model=tiny, pooling="mean", test_ids=test_ids, **FAST)
    assert a["train_loss_steps"] == b["train_loss_steps"]
    assert sorted(a["test_ids"]) == sorted(test_ids)


def test_epoch_batches_cover_each_index_once():
    train = np.array([0, 2, 3, 5, 7, 8, 9, 11, 12, 13, 15])
    lengths = np.arange(20) % 7
    g = torch.Generator().manual_seed(1)
    batches = epoch_batches(train, lengths, 3, 2, g)
    assert sorted(np.concatenate(batches).tolist()) == train.tolist()
    assert [len(b) for b in batches] == [3, 3, 3, 2]
    g2 = torch.Generator().manual_seed(1)
    assert all((x == y).all() for x, y in zip(batches, epoch_batches(train, lengths, 3, 2, g2)))


# --------------------------------------------------------------------------------------------------
# the split


def test_split_is_fixed_grouped_and_disjoint(tiny):
    ex = keyword_examples(40)
    runs = [finetune(ex, "kind", model=tiny, pooling=p, seed=s, **FAST) for p in ("cls", "pos2") for s in (0, 1)]
    train, test = runs[0]["train_ids"], runs[0]["test_ids"]
    for r in runs[1:]:
        assert r["train_ids"] == train and r["test_ids"] == test
    assert not set(train) & set(test) and len(set(train) | set(test)) == 40
    doc = {e.id: e.labels["doc"] for e in ex}
    assert not {doc[i] for i in train} & {doc[i] for i in test}  # documents never straddle


def test_split_depends_on_ids_not_order():
    ex = keyword_examples(60)
    tr, te = train_test_split(ex, test_fraction=0.3, split_group="id")
    shuffled = list(ex)
    random.Random(5).shuffle(shuffled)
    tr2, te2 = train_test_split(shuffled, test_fraction=0.3, split_group="id")
    assert {ex[i].id for i in te} == {shuffled[i].id for i in te2}
    assert 0.1 < len(te) / 60 < 0.5
    # a different split seed gives a different split; max_train keeps a subset of the same train side
    _, te3 = train_test_split(ex, test_fraction=0.3, seed=1, split_group="id")
    assert set(te3.tolist()) != set(te.tolist())
    tr4, te4 = train_test_split(ex, test_fraction=0.3, split_group="id", max_train=10)
    assert len(tr4) == 10 and set(tr4) <= set(tr) and (te4 == te).all()


# --------------------------------------------------------------------------------------------------
# the experiment table and its reuse

POOLS = ["cls", "mean", "max", "sep1", "first_word", "pos2"]


CV = dict(FAST, folds=3, run_folds=3, max_train=10_000)


def test_table_has_every_run_and_summaries(tiny):
    ex = keyword_examples(36)
    df, pred = run_pooling_experiment(ex, "kind", POOLS, [0, 1], model=tiny, progress=False, with_predictions=True,
                                      **CV)
    acc = df[df.metric == "test_accuracy"]
    runs = sorted((p, s, f) for p in POOLS for s in (0, 1) for f in (0, 1, 2))
    assert sorted(zip(acc.pooling, acc.seed.astype(int), acc.fold.astype(int))) == runs
    frozen = df[df.metric == "frozen_test_accuracy"]
    assert sorted(zip(frozen.pooling, frozen.fold.astype(int))) == sorted((p, f) for p in POOLS for f in (0, 1, 2))
    assert (df.analysis == "finetune_pooling").all() and (df.target == "kind").all()
    assert (df.grouping == "document").all() and acc.value.between(0, 1).all()
    assert len(df[df.metric == "train_loss_epoch"]) == len(POOLS) * 2 * 3  # one epoch each
    for metric in ("best_constant", "majority_baseline", "chance"):
        assert len(df[(df.metric == metric) & df.fold.notna()]) == 3
    # `role` (a stored token role elsewhere) is empty; the pooling has its own column, empty on the rows
    # that depend on no pooling; no cell packs two values ("cls − mean")
    assert df.role.isna().all()
    baselines = df.metric.isin(["best_constant", "majority_baseline", "chance"])
    assert (df.condition[baselines] == "baseline").all()
    assert df.pooling[baselines | (df.metric == "n_skipped")].isna().all()
    assert set(df.pooling.dropna()) == set(POOLS) and set(df.pooling_b.dropna()) == set(POOLS)
    assert set(df.condition.dropna()) | set(df.condition_b.dropna()) <= {"fine_tuned", "frozen", "baseline", ""}
    assert df.pooling_b.notna().eq(df.metric == "accuracy_diff").all()
    # the pooled accuracy is the mean over items of each item's correctness averaged over seeds, its CI a
    # bootstrap over documents
    for cond, metric in (("fine_tuned", "test_accuracy_mean"), ("frozen", "frozen_test_accuracy_mean")):
        summ = df[df.metric == metric].set_index("pooling")
        assert sorted(summ.index) == sorted(POOLS)
        for p in POOLS:
            items = pred[(pred.pooling == p) & (pred.condition == cond)].groupby("example")
            per_item = items["correct"].mean()
            assert summ.loc[p, "value"] == pytest.approx(per_item.mean())
            assert summ.loc[p, "n"] == 36 and summ.loc[p, "n_groups"] == 18
            assert summ.loc[p, "ci_low"] <= summ.loc[p, "value"] <= summ.loc[p, "ci_high"]
    # paired differences on per-item correctness, Holm-adjusted over the family
    diff = df[df.metric == "accuracy_diff"].set_index(["pooling", "condition", "pooling_b", "condition_b"])
    ft = pred[pred.condition == "fine_tuned"].groupby(["pooling", "example"])["correct"].mean()
    fz = pred[pred.condition == "frozen"].groupby(["pooling", "example"])["correct"].mean()
    for p in POOLS:
        assert diff.loc[(p, "fine_tuned", p, "frozen"), "value"] == pytest.approx((ft.loc[p] - fz.loc[p]).mean())
    assert diff.loc[("cls", "frozen", "mean", "frozen"), "value"] == pytest.approx(
        (fz.loc["cls"] - fz.loc["mean"]).mean())
    assert diff.loc[("cls", "fine_tuned", "mean", "fine_tuned"), "value"] == pytest.approx(
        (ft.loc["cls"] - ft.loc["mean"]).mean())
    assert len(diff) == len(POOLS) + 2 * (len(POOLS) - 1)
    assert (diff["p_holm"] >= diff["p_value"] - 1e-12).all() and diff["p_value"].between(0, 1).all()
    # two training seeds: every CI with a fine-tuned side resamples the seeds as well as the documents
    # (seed_document_ci on each item's correctness per seed); the frozen-only ones do not
    from analyses.finetune import seed_document_ci

    per_seed = pred[pred.condition == "fine_tuned"].groupby(["pooling", "example", "seed"])["correct"].mean()
    docs = pred.drop_duplicates("example").set_index("example")["doc"]
    summ = df[df.metric == "test_accuracy_mean"].set_index("pooling")
    for p in POOLS:
        a = per_seed.loc[p].unstack("seed")
        want = seed_document_ci(a.to_numpy(float), None, docs.loc[a.index].to_numpy())
        assert (summ.loc[p, "ci_low"], summ.loc[p, "ci_high"]) == pytest.approx(want[1:3])
        assert summ.loc[p, "ci_seeds"] == 2
    assert df.loc[df.metric == "frozen_test_accuracy_mean", "ci_seeds"].isna().all()
    with_ft = diff.index.get_level_values("condition") == "fine_tuned"
    assert (diff.loc[with_ft, "ci_seeds"] == 2).all() and diff.loc[~with_ft, "ci_seeds"].isna().all()
    a = per_seed.loc["cls"].unstack("seed")
    b = per_seed.loc["mean"].unstack("seed").loc[a.index]
    want = seed_document_ci(a.to_numpy(float), b.to_numpy(float), docs.loc[a.index].to_numpy())
    got = diff.loc[("cls", "fine_tuned", "mean", "fine_tuned")]
    assert (got["ci_low"], got["ci_high"], got["se"]) == pytest.approx(want[1:])


@pytest.mark.parametrize("tokenizer", ["bert_tokenizer", "roberta_tokenizer"])
def test_native_format_is_the_tokenizers_own_template(tiny, tokenizer, request):
    """``native`` trains and probes on what ``tokenizer(s1, s2)`` gives (probing.formats.resolve_format, as
    extraction resolves it): the same numbers as that template written out, keyed ``native``."""
    from probing.formats import native_template

    tok = request.getfixturevalue(tokenizer)
    lm = tiny if tokenizer == "bert_tokenizer" else prepare_model(make_tiny_roberta(tok), tok, name="tiny-roberta")
    ex = keyword_examples(24)
    kw = dict(model=lm, progress=False, **{**FAST, "folds": 2, "run_folds": 1})
    native = run_pooling_experiment(ex, "kind", "cls,sep1", "0", fmt="native", **kw)
    written = run_pooling_experiment(ex, "kind", "cls,sep1", "0", fmt="own=" + native_template(tok), **kw)
    assert (native.format == "native").all() and (written.format == "own").all()
    cols = ["metric", "pooling", "condition", "value", "n"]
    pd.testing.assert_frame_equal(native[cols], written[cols])
    one = FT.finetune(ex, "kind", model=lm, pooling="sep1", fmt="native", epochs=1, batch_size=8, device="cpu",
                      preset="quick")
    assert one["n_train"] > 0 and 0 <= one["test_accuracy"] <= 1


def test_frozen_and_fine_tuned_score_identical_test_items(tiny):
    ex = keyword_examples(36)
    _, pred = run_pooling_experiment(ex, "kind", "cls,mean", "0,1", model=tiny, progress=False,
                                     with_predictions=True, **{**CV, "run_folds": 2})
    for (fold, pooling), g in pred.groupby(["fold", "pooling"]):
        sets = {(c, s): tuple(sorted(x.example)) for (c, s), x in g.groupby(["condition", g.seed.fillna(-1)])}
        assert set(sets) == {("frozen", -1), ("fine_tuned", 0), ("fine_tuned", 1)}
        assert len(set(sets.values())) == 1, (fold, pooling)
    # two of three folds run: their test items, each once per condition and seed, no document on both sides
    per = pred[(pred.pooling == "cls") & (pred.condition == "frozen")]
    assert per.example.is_unique and per.fold.nunique() == 2
    doc = {e.id: e.labels["doc"] for e in ex}
    for fold, g in per.groupby("fold"):
        assert g.doc.tolist() == [doc[i] for i in g.example]


def test_cv_splits_are_grouped_and_stratified():
    ex = keyword_examples(60)
    y = np.asarray([e.labels["kind"] == "apple" for e in ex], dtype=int)
    groups, how = example_groups(ex)
    assert how == "document"
    splits = P.cv_splits(ex, y, groups, TrainConfig(folds=3, repeats=2, max_train=20))
    assert [(s.repeat, s.fold) for s in splits] == [(r, f) for r in (0, 1) for f in range(3)]
    for s in splits:
        assert not set(groups[s.train]) & set(groups[s.test]) and len(s.train) == 20
        assert abs(y[s.test].mean() - 0.5) < 0.15  # stratified by the label
    assert not all((a.test == b.test).all() for a, b in zip(splits[:3], splits[3:]))  # repeats differ
    for r in (0, 1):  # each repeat's folds partition the examples
        tests = np.concatenate([s.test for s in splits if s.repeat == r])
        assert sorted(tests.tolist()) == list(range(60))


def test_long_example_is_counted_never_dropped_silently(tiny):
    ex = keyword_examples(30)
    long = Example("long", (" ".join(["river"] * 70) + ".", "A stone."), {"kind": "stone", "doc": "dlong"})
    with pytest.warns(RuntimeWarning, match="1 of 31 examples are longer than 64 tokens"):
        df, pred = run_pooling_experiment(ex + [long], "kind", "mean", "0", model=tiny, progress=False,
                                          with_predictions=True, **CV)
    assert df.attrs["n_skipped"] == 1 and df.attrs["skipped_ids"] == ["long"]
    assert df.loc[df.metric == "n_skipped", "value"].tolist() == [1.0] and (df["n_skipped"] == 1).all()
    assert sorted(set(pred.example)) == sorted(e.id for e in ex)  # every other example is scored
    with pytest.raises(ValueError, match="'long' is .* tokens"):
        run_pooling_experiment(ex + [long], "kind", "mean", "0", model=tiny, progress=False,
                               **{**CV, "on_overflow": "error"})


def test_runs_that_do_not_learn_are_flagged(tiny):
    ex = keyword_examples(24)
    with pytest.warns(RuntimeWarning, match="not above the training majority share|not below the first"):
        df = run_pooling_experiment(ex, "kind", "cls", "0", model=tiny, progress=False,
                                    **{**CV, "lr": 1e-12, "head_lr": 1e-12})
    runs = df[df.metric == "test_accuracy"]
    assert (~runs.converged.astype(bool)).all() and runs.warning.str.contains("training").all()
    summ = df[df.metric == "test_accuracy_mean"]
    assert summ.warning.iloc[0].endswith("3 of 3 runs did not converge")
    assert df.attrs["warnings"] and all("Q8 fine_tuned cls" in w for w in df.attrs["warnings"] if "fine_tuned" in w)


def test_stored_result_is_reused(tiny, tmp_path, monkeypatch):
    ex = keyword_examples(24)
    df = run_pooling_experiment(ex, "kind", "cls,mean", "0", model=tiny, out=tmp_path, progress=False, **FAST)
    assert len(list(tmp_path.glob("finetune_pooling-*.csv"))) == 2  # the table and its per-item predictions
    assert len(list(tmp_path.glob("finetune_pooling-*.predictions.csv"))) == 1

    def no_training(*a, **k):
        raise AssertionError("trained although a stored result exists")

    monkeypatch.setattr(P, "_finetune_task", no_training)
    again = run_pooling_experiment(ex, "kind", "cls,mean", "0", model=tiny, out=tmp_path, progress=False, **FAST)
    assert again.attrs["reused"] is True
    pd.testing.assert_frame_equal(df.reset_index(drop=True), again.reset_index(drop=True), check_dtype=False)
    with pytest.raises(AssertionError, match="trained although"):
        run_pooling_experiment(ex, "kind", "cls,mean", "0", model=tiny, out=tmp_path, force=True,
                               progress=False, **FAST)
    with pytest.raises(AssertionError, match="trained although"):  # other hyperparameters: a new result
        run_pooling_experiment(ex, "kind", "cls,mean", "0", model=tiny, out=tmp_path, progress=False,
                               **{**FAST, "lr": 2e-3})


def test_sorted_batches_cover_each_row_once_longest_first():
    lengths = np.array([5, 9, 2, 9, 7, 1, 5])
    batches = sorted_batches(lengths, 3)
    assert [b.tolist() for b in batches] == [[1, 3, 4], [0, 6, 2], [5]]
    assert sorted(np.concatenate(batches).tolist()) == list(range(7))


def test_evaluation_order_does_not_change_predictions(tiny, monkeypatch):
    """Length-sorted evaluation batches give each test item the prediction of a batch in index order."""
    ex = keyword_examples(40)
    a = finetune(ex, "kind", model=tiny, pooling="mean", seed=0, **{**FAST, "eval_batch_size": 5})
    monkeypatch.setattr(FT, "sorted_batches", lambda lengths, size: [np.arange(s, min(s + size, len(lengths)))
                                                                      for s in range(0, len(lengths), size)])
    b = finetune(ex, "kind", model=tiny, pooling="mean", seed=0, **{**FAST, "eval_batch_size": 5})
    assert a["test_ids"] == b["test_ids"] and len(set(a["test_ids"])) > 5
    assert a["test_pred"].tolist() == b["test_pred"].tolist() and a["train_loss_steps"] == b["train_loss_steps"]


# --------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(pooling="avg"), "'avg'"),
    (dict(pooling="pos999"), "pos999"),
    (dict(label="sentiment"), "'sentiment'"),
    (dict(pooling="sep1", fmt="no_special"), "'sep1'"),
    (dict(epochs=0), "epochs=0"),
    (dict(schedule="cosine"), "'cosine'"),
    (dict(max_length=4, on_overflow="error"), "max_length=4"),
])
def test_bad_input_names_the_value(tiny, kwargs, match):
    kw = {**FAST, "label": "kind", **kwargs}
    label = kw.pop("label")
    with pytest.raises(ValueError, match=match):
        finetune(keyword_examples(16), label, model=tiny, **kw)


def test_single_class_and_bad_lists(tiny):
    one = [Example(f"e{i}", ("A b c.", "D e f."), {"kind": "apple"}) for i in range(8)]
    with pytest.raises(ValueError, match="single class.*'apple'"):
        finetune(one, "kind", model=tiny, **FAST)
    with pytest.raises(ValueError, match="'avg'"):
        run_pooling_experiment(keyword_examples(8), "kind", "cls,avg", "0", model=tiny, **FAST)
    with pytest.raises(ValueError, match="'x'"):
        run_pooling_experiment(keyword_examples(8), "kind", "cls", "0,x", model=tiny, **FAST)
    with pytest.raises(ValueError, match="'nope'"):
        run_pooling_experiment(keyword_examples(8), "kind", "cls", "0", model=tiny, **{**FAST, "preset": "nope"})


def test_presets_are_valid():
    assert {"quick", "default", "full"} <= set(PRESETS)
    for name, pre in PRESETS.items():
        TrainConfig(**pre["train"])
        for p in pre["poolings"]:
            get_pooling(p)
    assert PRESETS["default"]["poolings"] == ("cls", "mean", "max", "sep1", "first_word")
    # the CPU budget of the docstring: 15 fine-tuning runs of 128 examples x 3 epochs by default, 4 tiny ones quick
    d, q = PRESETS["default"], PRESETS["quick"]
    assert len(d["poolings"]) * d["train"]["run_folds"] * len(d["train_seeds"]) == 15
    assert len(q["poolings"]) * q["train"]["run_folds"] * len(q["train_seeds"]) == 4
    assert all(pre["train"]["max_length"] is None for pre in PRESETS.values())  # the model's own limit


# --------------------------------------------------------------------------------------------------
# command line


def test_cli_help_lists_every_choice(capsys):
    with pytest.raises(SystemExit):
        P.main(["--help"])
    text = capsys.readouterr().out
    for name in list(POOLINGS) + list(PRESETS) + ["--force", "--out", "--model", "--train-seeds", "--targets",
                                                 "--folds", "--run-folds", "--seed", "--init-seed", "--Cs"]:
        assert name in text


def test_cli_runs_end_to_end(tmp_path, bert_tokenizer, capsys):
    model_dir = tmp_path / "tiny"
    make_tiny_bert(bert_tokenizer, seed=0).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    argv = ["--corpus", "generated:n=30,k=2", "--targets", "topic", "--poolings", "cls,mean", "--train-seeds", "0,1",
            "--preset", "quick", "--model", str(model_dir), "--out", str(tmp_path / "res"), "--device", "cpu",
            "--no-progress", "--lr", "1e-3", "--Cs", "0.1,1"]
    assert P.main(argv) == 0
    out = capsys.readouterr().out
    assert "cls" in out and "fine_tuned" in out and "frozen" in out and "written" in out
    table = pd.read_csv(next((tmp_path / "res").glob("finetune_pooling-*[0-9a-f].csv")))
    chosen = set(table.loc[table["condition"] == "frozen", "C"].dropna())
    assert chosen and chosen <= {0.1, 1.0}  # the frozen probe searched the --Cs grid
    assert P.main(argv) == 0
    assert "reused" in capsys.readouterr().out
    assert P.main(argv[:4] + ["--poolings", "avg"] + argv[6:]) == 2
    assert "'avg'" in capsys.readouterr().err


def test_figure_draws_frozen_and_fine_tuned_from_the_same_splits(tiny, tmp_path, monkeypatch):
    import figures.pooling as F

    df = run_pooling_experiment(keyword_examples(24), "kind", "cls,mean", "0", model=tiny, progress=False, **FAST)
    seen = {}
    save = F.style.save

    def keep(fig, out):
        seen["fig"] = fig
        return save(fig, out)

    monkeypatch.setattr(F.style, "save", keep)
    paths = F.plot_pooling(df, tmp_path / "q8")
    assert all(p.exists() for p in paths)
    labels = [t.get_text() for t in seen["fig"].axes[0].get_legend().get_texts()]
    assert any(t.startswith("frozen probe (same test items") and "over documents" in t for t in labels), labels
    assert any(t.startswith("fine-tuned (2 runs;") for t in labels), labels
    # a separate probe table does not replace the same-split probe
    probes = pd.DataFrame({"analysis": "probe", "model": "tiny-bert", "corpus": df.corpus.iloc[0], "format": "pair",
                           "format_b": "", "layer": 2, "choice": ["cls", "mean"], "target": "kind",
                           "metric": "accuracy", "value": [0.11, 0.12], "ci_low": 0.1, "ci_high": 0.13, "n": 24,
                           "seed": 0})
    F.plot_pooling(df, tmp_path / "q8b", frozen_df=probes)
    bars = [p.get_height() for p in seen["fig"].axes[0].patches]
    assert 0.11 not in bars and 0.12 not in bars
    frozen = df[df.metric == "frozen_test_accuracy_mean"].set_index("pooling")["value"]
    assert any(b == pytest.approx(frozen["cls"]) for b in bars)


def test_frozen_features_leave_the_callers_model_as_it_was(tiny, bert_tokenizer):
    """frozen_features runs the encoder in eval mode but hands the model back in the mode, dtype and
    device it came in, and its numbers equal an eval-mode forward pass of the same model."""
    ex = keyword_examples(12)
    rendered = _render(bert_tokenizer, ex)
    pools = [get_pooling("cls"), get_pooling("mean")]
    tiny.model.train()
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    feats = P.frozen_features(tiny, rendered, pools, TrainConfig(), torch.device("cpu"))
    assert tiny.model.training, "frozen_features left the caller's model in eval mode"
    p = next(tiny.model.parameters())
    assert p.dtype == torch.float32 and p.device.type == "cpu"
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())
    tiny.model.eval()
    with torch.inference_mode():
        r = rendered[0]
        h = tiny.model(input_ids=torch.as_tensor(r.input_ids)[None],
                       attention_mask=torch.ones(1, len(r), dtype=torch.long),
                       token_type_ids=torch.as_tensor(r.token_type_ids)[None]).last_hidden_state[0]
    np.testing.assert_allclose(feats["cls"][0], h[0].double().numpy(), rtol=1e-5, atol=1e-6)


def test_seed_document_ci_holds_the_randomness_of_training():
    """Planted: seed 1's model loses a tenth of seed 0's hits. A bootstrap over documents of the seed-averaged
    items misses that spread; the two-stage bootstrap (seeds, then documents) is wider and holds both seeds'
    accuracies. Null: identical seeds give the documents-only interval; a side against itself gives 0."""
    from analyses.stats import bootstrap_ci
    from analyses.finetune import seed_document_ci

    rng = np.random.default_rng(1)
    docs = np.repeat(np.arange(75), 8)
    hits = (rng.random(docs.size) < 0.9).astype(float)
    planted = np.stack([hits, hits * (rng.random(docs.size) < 0.9)], axis=1)
    point, lo, hi, se = seed_document_ci(planted, None, docs)
    _, dlo, dhi = bootstrap_ci(planted.mean(axis=1), docs, "mean", n_resamples=1000, seed=0)
    assert point == pytest.approx(planted.mean())
    assert hi - lo > 2 * (dhi - dlo) and lo <= planted[:, 1].mean() and planted[:, 0].mean() <= hi
    same = np.stack([hits, hits], axis=1)
    _, slo, shi, _ = seed_document_ci(same, None, docs)
    _, blo, bhi = bootstrap_ci(hits, docs, "mean", n_resamples=1000, seed=0)
    assert abs((shi - slo) - (bhi - blo)) < 0.01  # no seed spread: the documents' interval
    assert seed_document_ci(planted, planted, docs)[:3] == (0.0, 0.0, 0.0)
    frozen = hits[:, None]  # the frozen probe: one column, no seed
    point, lo, hi, _ = seed_document_ci(planted, frozen, docs)
    assert point == pytest.approx((planted.mean(axis=1) - hits).mean()) and lo < point <= hi <= 1e-12
    _, one_lo, one_hi, _ = seed_document_ci(hits[:, None], None, docs)  # one seed: the documents' interval
    assert abs((one_hi - one_lo) - (bhi - blo)) < 0.01
    for bad, match in ((np.zeros((docs.size, 0)), "at least 1 seed"),
                       (np.full((docs.size, 2), np.nan), "finite")):
        with pytest.raises(ValueError, match=match):
            seed_document_ci(bad, None, docs)
    with pytest.raises(ValueError, match="b must be"):
        seed_document_ci(planted, np.zeros((docs.size, 3)), docs)
