from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyses.probes import STOP_WORDS, content_vocabulary, example_target, function_vocabulary, presence, run_probes
from probing.cache import Cache
from probing.extract import extract
from probing.models import prepare_model

from probing.corpus_generated import generated_corpus

from .conftest import make_tiny_bert, sample_examples


@pytest.fixture(scope="module")
def caches(tmp_path_factory, bert_tokenizer):
    root = tmp_path_factory.mktemp("c")
    ex = sample_examples(30, k=2)
    trained = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny")
    rnd = prepare_model(make_tiny_bert(bert_tokenizer, seed=5), bert_tokenizer, name="tiny", random_init=True, seed=5)
    (a,) = extract(ex, ["pair"], model=trained, out=root, progress=False, log=lambda *x: None)
    (b,) = extract(ex, ["pair"], model=rnd, out=root, progress=False, log=lambda *x: None)
    return Cache.open(a), Cache.open(b)


def test_probe_table_has_every_cell_and_baselines(caches, tmp_path):
    a, b = caches
    kw = dict(n_splits=3, Cs=(0.1, 1.0), inner_splits=2, max_iter=100, vocab=8, progress=False)
    # fw_s1, not bow_s1: every content word of this tiny corpus is in the top frequency band
    df = run_probes(a, ("cls", "mean", "sep1"), ("topic", "length", "fw_s1"), random_cache=b, bow_Cs=(0.1,),
                    out=tmp_path, **kw)
    acc = df[df["metric"] == "accuracy"]
    assert set(acc["model_kind"]) == {"trained", "random_init"}
    assert len(acc) == 2 * 2 * 3 * 3  # models x single-label targets x choices x layers
    assert set(df[df["target"] == "fw_s1"]["metric"]) >= {"micro_f1", "macro_auc", "majority_baseline"}
    assert set(df["grouping"]) == {"example"} and set(df["n_groups"]) == {30}  # no doc label: one group per example
    assert set(df[df["target"] == "topic"]["metric"]) >= {"majority_baseline", "control_accuracy", "selectivity"}
    fw = df[df["target"] == "fw_s1"]
    assert (fw[["chosen_C", "chosen_C_min", "chosen_C_max"]] == 0.1).all().all()
    assert "feature" not in df.columns and df["seed"].dtype.kind == "i" and (df["seed"] == 0).all()
    assert set(df.loc[df["target"] == "topic", "chosen_C"]) <= {0.1, 1.0}  # the median of 3 folds is a grid value
    # bootstrap intervals (now the macro AUC's too) stay in range by construction; t-intervals over folds
    # (the chance micro-F1) are not clipped, and say so in ci_method
    ok = df["ci_low"].notna() & (df["ci_method"] == "cluster_bootstrap")
    assert set(df.loc[df["metric"] == "macro_auc", "ci_method"]) == {"cluster_bootstrap"}
    assert set(df.loc[df["metric"] == "chance_micro_f1", "ci_method"]) == {"t_folds"}
    assert ((df.loc[ok, "ci_low"] >= -1) & (df.loc[ok, "ci_high"] <= 1)).all()
    acc_ok = ok & df["metric"].isin(["accuracy", "micro_f1"])
    assert ((df.loc[acc_ok, "ci_low"] >= 0) & (df.loc[acc_ok, "ci_high"] <= 1)).all()
    maj = df[(df["metric"] == "majority_baseline") & (df["target"] == "topic")]["value"]
    assert np.allclose(maj, maj.iloc[0])  # the same labels for every feature set
    again = run_probes(a, ("cls", "mean", "sep1"), ("topic", "length", "fw_s1"), random_cache=b, bow_Cs=(0.1,),
                       out=tmp_path, **kw)
    assert len(again) == len(df)


def test_random_versus_compares_each_choice_with_itself_on_random_weights(caches, tmp_path):
    """random_versus: a multi-label probe's macro AUC on the trained model minus the same probe's on the
    random-init model, on the same resamples of the same items: value_a and value_b are the two models' own
    macro AUC rows, the difference their difference, Holm over each choice's layers; single-label targets
    and other choices get none; asking without a random cache, or for a choice not probed, is an error."""
    from analyses.probes import main

    a, b = caches
    kw = dict(n_splits=3, Cs=(1.0,), max_iter=100, vocab=8, progress=False, control=False)
    df = run_probes(a, ("cls", "sep1"), ("topic", "fw_s1"), random_cache=b, random_versus=("sep1",), **kw)
    d = df[df["model_kind_b"].eq("random_init").fillna(False)]
    assert set(d["choice"]) == set(d["choice_b"]) == {"sep1"} and set(d["target"]) == {"fw_s1"}
    assert set(d["model_kind"]) == {"trained"} and set(d["metric"]) == {"macro_auc_diff"}
    assert sorted(d["layer"]) == sorted(a.layers) and set(d["model"]) == set(df[df["model_kind"] == "trained"]["model"])
    auc = df[(df["metric"] == "macro_auc") & (df["choice"] == "sep1")].set_index(["model_kind", "layer"])["value"]
    for _, r in d.iterrows():
        assert r["value_a"] == pytest.approx(auc.loc[("trained", r["layer"])])
        assert r["value_b"] == pytest.approx(auc.loc[("random_init", r["layer"])])
        assert r["value"] == pytest.approx(r["value_a"] - r["value_b"])
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["p_holm"] >= r["p_value"]
    # the rows every run has are those of a run without random_versus
    plain = run_probes(a, ("cls", "sep1"), ("topic", "fw_s1"), random_cache=b, **kw)
    pd.testing.assert_frame_equal(df[df["model_kind_b"].isna()].reset_index(drop=True)[plain.columns],
                                  plain.reset_index(drop=True), check_dtype=False)
    with pytest.raises(ValueError, match="give random_cache"):
        run_probes(a, ("sep1",), ("fw_s1",), random_versus=("sep1",), **kw)
    with pytest.raises(ValueError, match=r"random_versus \['mean'\] are not among the choices"):
        run_probes(a, ("sep1",), ("fw_s1",), random_cache=b, random_versus=("mean",), **kw)
    # the command line: --random-versus, and its error without --random-cache
    out = tmp_path / "cli"
    assert main([str(a.path), "--random-cache", str(b.path), "--choices", "sep1", "--targets", "fw_s1", "--vocab", "8",
                 "--random-versus", "sep1", "--folds", "3", "--no-control", "--no-progress", "--out", str(out)]) == 0
    cli = pd.read_csv(next(out.glob("probe-*.csv")))
    assert (cli["model_kind_b"] == "random_init").sum() == len(a.layers)
    assert main([str(a.path), "--choices", "sep1", "--targets", "fw_s1", "--random-versus", "sep1",
                 "--no-progress", "--out", str(tmp_path / "bad")]) != 0
    assert not list((tmp_path / "bad").glob("probe-*"))


def test_token_level_segment_probe(caches):
    a, _ = caches
    df, items = run_probes(a, ("cls",), ("segment",), n_splits=3, Cs=(1.0,), max_iter=100, progress=False,
                           items=True)
    acc = df[df["metric"] == "accuracy"]
    # token-level items: one row per word token and layer, grouped by example (no documents here)
    tok = a.tokens.loc[items["token"].astype(int)]
    assert (tok["example"].to_numpy() == items["example"].to_numpy()).all()
    assert (tok["sentence"].astype(str).to_numpy() == items["y_true"].to_numpy()).all()
    assert set(items["grouping"]) == {"example"} and len(items) == 3 * len(set(items["token"]))
    assert set(acc["choice"]) == {"word"} and len(acc) == 3
    # the segment embedding makes sentence membership readable at the embedding layer already
    assert acc[acc["layer"] == 0]["value"].iloc[0] > 0.9


def test_targets(caches):
    a, _ = caches
    ex = np.arange(30)
    y, ml = example_target(a, "length", ex)
    assert not ml and set(y) <= {0, 1, 2}
    y6, _ = example_target(a, "length6", ex)
    n = np.asarray([len(s.split()) for s in a.examples.loc[ex, "sentence_1"]])
    assert len(set(y6)) >= len(set(y)) and set(y6) <= set(range(6))
    assert all(n[y6 == c].max() <= n[y6 == c + 1].min() for c in sorted(set(y6))[:-1])  # bins ordered by length
    with pytest.raises(ValueError, match="at least 2 length bins"):
        example_target(a, "length1", ex)
    Y, ml = example_target(a, "fw_s2", ex, vocab=5)
    assert ml and Y.shape[0] == 30 and 0 < Y.shape[1] <= 5
    with pytest.raises(ValueError, match="bow_s2': no word of its vocabulary varies"):
        example_target(a, "bow_s2", ex)  # 5 subjects and 5 verbs: each content word is in 20% of sentences
    with pytest.raises(KeyError, match="no label 'nope'"):
        example_target(a, "nope", ex)
    with pytest.raises(ValueError, match="unknown token choice"):
        run_probes(a, ("bogus",), ("topic",), progress=False)


def test_random_cache_must_be_the_random_init_baseline(caches, tmp_path, bert_tokenizer, capsys):
    """Issue 10, item 5: a trained model on another corpus was accepted as --random-cache and labelled
    random_init. The baseline must have random weights, this model's architecture, corpus and format."""
    from analyses.probes import main
    from probing.cache import IncomparableCaches

    a, _ = caches
    root = tmp_path / "c"
    trained = prepare_model(make_tiny_bert(bert_tokenizer, seed=2), bert_tokenizer, name="tiny")
    (other,) = extract(sample_examples(33, k=2)[3:], ["pair"], model=trained, out=root, progress=False,
                       log=lambda *x: None)
    deeper = prepare_model(make_tiny_bert(bert_tokenizer, seed=5, num_hidden_layers=3), bert_tokenizer, name="tiny",
                           random_init=True, seed=5)
    (arch,) = extract(sample_examples(30, k=2), ["pair"], model=deeper, out=root, progress=False,
                      log=lambda *x: None)
    rnd = prepare_model(make_tiny_bert(bert_tokenizer, seed=5), bert_tokenizer, name="tiny", random_init=True, seed=5)
    (fmt,) = extract(sample_examples(30, k=2), ["concat"], model=rnd, out=root, progress=False, log=lambda *x: None)
    kw = dict(n_splits=2, Cs=(1.0,), max_iter=50, progress=False)
    for path, why in [(other, "trained weights.*different corpora|different corpora.*trained weights"),
                      (arch, "different architectures"), (fmt, "different formats")]:
        with pytest.raises(IncomparableCaches, match=why):
            run_probes(a, ("cls",), ("topic",), random_cache=Cache.open(path), **kw)
    out = tmp_path / "results"
    assert main([str(a.path), "--choices", "cls", "--random-cache", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot combine caches") and str(a.path) in err and str(other) in err
    assert "random" in err and not out.exists()


def test_stored_tables_are_keyed_by_backend_code_and_cache_content(caches, tmp_path, monkeypatch):
    """Issue 10, item 6: --backend sklearn after a torch run returned the torch table, and after a code
    fix the old table came back: keys now hold the backend, device, caches' manifests and code hash."""
    import types

    import analyses.results as R

    a, _ = caches
    kw = dict(n_splits=2, Cs=(1.0,), inner_splits=2, max_iter=50, progress=False, out=tmp_path, layers=[2],
              device="cpu")
    torch_df = run_probes(a, ("cls",), ("topic",), backend="torch", **kw)
    sk_df = run_probes(a, ("cls",), ("topic",), backend="sklearn", **kw)
    assert len(list(tmp_path.glob("probe-*.csv"))) == 2  # the sklearn run computed its own table
    assert len(sk_df) == len(torch_df)
    again = run_probes(a, ("cls",), ("topic",), backend="auto", **kw)  # auto is torch on the CPU
    assert len(list(tmp_path.glob("probe-*.csv"))) == 2 and len(again) == len(torch_df)
    code = R.code_version()
    assert len(code["code_sha256"]) == 64 and code["toolkit"]
    monkeypatch.setattr(R, "code_version", lambda: {**code, "code_sha256": "0" * 64})  # the code changed
    run_probes(a, ("cls",), ("topic",), backend="torch", **kw)
    assert len(list(tmp_path.glob("probe-*.csv"))) == 3
    # a cache rebuilt under the same directory name (other shards, so another manifest) is another input
    same_name = types.SimpleNamespace(path=a.path, manifest={**a.manifest, "manifest_sha256": "f" * 64})
    assert R.result_key({"cache": R.cache_identity(a)}) != R.result_key({"cache": R.cache_identity(same_name)})


@pytest.fixture(scope="module")
def doc_caches(tmp_path_factory, bert_tokenizer):
    """Generated corpus (documents, same-topic negatives) and one with other-topic negatives."""
    root = tmp_path_factory.mktemp("d")
    model = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny")
    out = []
    for neg in ("same_topic", "other_topic"):
        ex = generated_corpus(60, k=2, seed=2, negatives=neg)
        (path,) = extract(ex, ["pair"], model=model, out=root / neg, progress=False, log=lambda *x: None)
        out.append(Cache.open(path))
    return out


def test_document_grouping_items_and_length_baseline(doc_caches, tmp_path):
    c, _ = doc_caches
    kw = dict(n_splits=3, Cs=(1.0,), max_iter=100, vocab=10, progress=False, control=False)
    df, items = run_probes(c, ("cls", "mean"), ("topic", "bow_s1"), length_baseline=True, items=True,
                           out=tmp_path, **kw)
    docs = c.examples["label_doc"]
    assert set(df["grouping"]) == {"document"} and set(df["n_groups"]) == {docs.nunique()}
    assert set(df["ci_method"][df["metric"].isin(["accuracy", "micro_f1"])]) == {"cluster_bootstrap"}
    # one item row per example, layer, role and target; a document never straddles folds
    n_layers = len(c.layers)
    for target in ("topic", "bow_s1"):
        t = items[items["target"] == target]
        assert len(t) == 60 * (2 * n_layers + 1)
        assert (t.groupby(["layer", "choice", "group"], dropna=False)["fold"].nunique() == 1).all()
        assert (t["group"].to_numpy() == docs.loc[t["example"]].to_numpy()).all()
    # the table's value is the items' pooled score
    acc = df[(df["metric"] == "accuracy") & (df["choice"] == "cls") & (df["layer"] == 1)]["value"].iloc[0]
    it = items[(items["target"] == "topic") & (items["choice"] == "cls") & (items["layer"] == 1)]
    assert acc == pytest.approx(it["correct"].mean())
    f1 = df[(df["metric"] == "micro_f1") & (df["choice"] == "mean") & (df["layer"] == 0)]["value"].iloc[0]
    it = items[(items["target"] == "bow_s1") & (items["choice"] == "mean") & (items["layer"] == 0)]
    assert f1 == pytest.approx(it["num"].sum() / it["den"].sum())
    length = df[(df["choice"] == "length_only") & (df["metric"] == "accuracy")]
    assert len(length) == 1 and length["layer"].isna().all() and 0 <= length["value"].iloc[0] <= 1
    # layer 0's [CLS] is the same vector for every example: its probe predicts the training fold's majority
    # class, item for item the majority baseline, so no difference from it is detectable (MDE 0)
    acc_rows = df[df["metric"] == "accuracy"]
    flat = (acc_rows["choice"] == "cls") & (acc_rows["layer"] == 0)
    it = items[(items["target"] == "topic") & (items["choice"] == "cls") & (items["layer"] == 0)]
    assert (it["num"] == it["baseline_num"]).all() and (acc_rows.loc[flat, "mde"] == 0).all()
    assert (acc_rows.loc[~flat, "mde"] > 0).all()
    # the length-only probe reads a length target from word counts alone
    ln = run_probes(c, ("cls",), ("length",), length_baseline=True, **{**kw, "Cs": (100.0,)})
    ln = ln[(ln["metric"] == "accuracy")].set_index("choice")["value"]
    assert ln.loc["length_only"] > 0.95
    # every layer's probe against the length-only probe, paired on the same items
    from analyses.probes import compare_probes

    vs_length = compare_probes(items[items["target"] == "topic"], a={"choice": "cls"}, b={"choice": "length_only"},
                               n_resamples=100)
    assert sorted(vs_length["layer"]) == list(c.layers) and (vs_length["n"] == 60).all()
    # a multi-label target also gets each probe's macro AUC against the length-only probe's, on the same
    # resamples, Holm over the layers of each choice; none for single-label targets
    auc = df[df["metric"] == "macro_auc_diff"]
    assert set(auc["target"]) == {"bow_s1"} and set(auc["choice_b"]) == {"length_only"}
    assert len(auc) == 2 * n_layers and set(auc["choice"]) == {"cls", "mean"}
    aucs = df[(df["metric"] == "macro_auc") & (df["target"] == "bow_s1")].set_index(["choice", "layer"], drop=False)
    length_auc = df[(df["metric"] == "macro_auc") & (df["choice"] == "length_only")]["value"].iloc[0]
    for _, r in auc.iterrows():
        assert r["value"] == pytest.approx(aucs.loc[(r["choice"], r["layer"]), "value"] - length_auc)
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["p_holm"] >= r["p_value"]
    # versus: each other choice against it at the same layer, on the same resamples. At layer 0 [CLS] is
    # one vector for every example (macro AUC 0.5) while the mean of the word embeddings sees the words:
    # a planted deficit that must come out significant; the length-only rows are unchanged by it
    vs = run_probes(c, ("cls", "mean"), ("bow_s1",), length_baseline=True, versus="mean", **kw)
    vm = vs[(vs["metric"] == "macro_auc_diff") & (vs["choice_b"] == "mean")].set_index("layer")
    assert set(vm["choice"]) == {"cls"} and sorted(vm.index) == sorted(c.layers)
    for layer, r in vm.iterrows():
        assert r["value"] == pytest.approx(aucs.loc[("cls", layer), "value"] - aucs.loc[("mean", layer), "value"])
    assert vm.loc[0, "ci_high"] < 0 and vm.loc[0, "p_value"] < 0.05 and vm.loc[0, "p_holm"] >= vm.loc[0, "p_value"]
    assert aucs.loc[("cls", 0), "value"] == pytest.approx(0.5)
    pd.testing.assert_frame_equal(
        vs[vs["choice_b"] == "length_only"].reset_index(drop=True),
        auc[auc["target"] == "bow_s1"].reset_index(drop=True)[vs.columns], check_dtype=False)
    with pytest.raises(ValueError, match="versus='sep1' is not one of the choices"):
        run_probes(c, ("cls", "mean"), ("bow_s1",), versus="sep1", **kw)
    # length_versus: only those choices are compared with the length-only probe (a study question owns its
    # own comparisons); their rows, Holm included, are those of a run that compares every choice
    own = run_probes(c, ("cls", "mean"), ("bow_s1",), length_baseline=True, length_versus=("mean",), **kw)
    om = own[own["metric"] == "macro_auc_diff"].reset_index(drop=True)
    assert set(om["choice"]) == {"mean"} and len(om) == n_layers
    pd.testing.assert_frame_equal(om, auc[auc["choice"] == "mean"].reset_index(drop=True)[om.columns],
                                  check_dtype=False)
    with pytest.raises(ValueError, match=r"length_versus \['sep1'\] are not among the choices"):
        run_probes(c, ("cls", "mean"), ("bow_s1",), length_baseline=True, length_versus=("sep1",), **kw)
    # stored beside the result (only when asked), read back
    assert len(list(tmp_path.glob("probe_items-*.csv"))) == 1
    again, items2 = run_probes(c, ("cls", "mean"), ("topic", "bow_s1"), length_baseline=True, items=True,
                               out=tmp_path, **kw)
    assert len(items2) == len(items) and len(again) == len(df)


def test_bow_targets_hold_content_words_only(doc_caches):
    c, _ = doc_caches
    sents = c.examples["sentence_1"].tolist()
    content, function = content_vocabulary(sents, 40), function_vocabulary(sents, 40)
    assert content and not set(content) & STOP_WORDS and set(function) <= STOP_WORDS
    share = presence(sents, content).mean(axis=0)
    assert share.max() <= 0.1  # the top frequency band is out
    Y, ml = example_target(c, "bow_s1", np.arange(60), vocab=40)
    kept = [w for w, col in zip(content, presence(sents, content).T) if 0 < col.sum() < 60]
    assert ml and (Y == presence(sents, kept)).all()


def test_topic_refused_where_undefined(doc_caches):
    same, other = doc_caches
    ex = np.arange(60)
    y, _ = example_target(same, "topic", ex)  # same-topic negatives: every pair has one topic
    assert (y == same.labels("topic_s2", ex)).all()
    with pytest.raises(ValueError, match=r"target 'topic' is undefined for 30 of 60 examples.*topic_s1 or topic_s2"):
        example_target(other, "topic", ex)
    s1, _ = example_target(other, "topic_s1", ex)
    s2, _ = example_target(other, "topic_s2", ex)
    assert (s1 == other.labels("topic", ex)).all() and (s1 != s2).sum() == 30


def test_compare_probes_pairs_items(doc_caches):
    from analyses.probes import compare_probes

    c, _ = doc_caches
    _, items = run_probes(c, ("cls", "mean"), ("topic",), n_splits=3, Cs=(1.0,), max_iter=100, items=True,
                          progress=False, control=False)
    cmp = compare_probes(items, a={"choice": "cls"}, b={"choice": "mean"}, n_resamples=200)
    assert len(cmp) == len(c.layers) and set(cmp["analysis"]) == {"probe_comparison"}
    assert cmp["same_folds"].all() and set(cmp["grouping"]) == {"document"}
    assert (cmp["p_holm"] >= cmp["p_value"] - 1e-12).all() and set(cmp["family"]) == {"choice=cls vs choice=mean"}
    assert (cmp["mde"] > 0).all() and (cmp["groups_needed"] > 0).all()
    one = cmp[cmp["layer"] == 1].iloc[0]
    a = items[(items["choice"] == "cls") & (items["layer"] == 1)].set_index("example")["correct"]
    b = items[(items["choice"] == "mean") & (items["layer"] == 1)].set_index("example")["correct"]
    assert one["value"] == pytest.approx((a - b.loc[a.index]).mean())
    assert one["n"] == 60 and one["n_groups"] == c.examples["label_doc"].nunique()
    assert one["ci_low"] <= one["value"] <= one["ci_high"]
    with pytest.raises(ValueError, match=r"condition a=\{'nope': 1\} names unknown columns \['nope'\]"):
        compare_probes(items, a={"nope": 1}, b={"choice": "mean"})
    with pytest.raises(ValueError, match=r"condition b=\{'choice': 'sep9'\} matches no item"):
        compare_probes(items, a={"choice": "cls"}, b={"choice": "sep9"})


def test_cli_refuses_undefined_topic_and_stores_items(doc_caches, tmp_path, capsys):
    from analyses.probes import main

    same, other = doc_caches
    out = tmp_path / "r"
    assert main([str(other.path), "--targets", "topic", "--out", str(out), "--folds", "3"]) == 2
    err = capsys.readouterr().err
    assert "error: target 'topic' is undefined for 30 of 60" in err and "topic_s1 or topic_s2" in err
    assert not out.exists()
    assert main([str(same.path), "--targets", "is_next", "--choices", "cls", "--layers", "0", "--folds", "3",
                 "--items", "--no-control", "--out", str(out)]) == 0
    items = pd.read_csv(next(out.glob("probe_items-*.csv")))
    assert len(items) == 60 and set(items["grouping"]) == {"document"} and set(items["y_true"]) == {0, 1}
    # --layers takes the one spec every command takes (ranges, 'all'), not only a comma list
    ranged = tmp_path / "ranged"
    assert main([str(same.path), "--targets", "is_next", "--choices", "cls", "--layers", "0-1", "--folds", "3",
                 "--no-control", "--out", str(ranged), "--no-progress"]) == 0
    assert set(pd.read_csv(next(ranged.glob("probe-*.csv")))["layer"]) == {0, 1}


def test_compare_trained_with_random_init_on_the_same_items(caches):
    from analyses.probes import compare_probes

    a, b = caches
    _, items = run_probes(a, ("cls",), ("topic",), random_cache=b, n_splits=3, Cs=(1.0,), max_iter=100,
                          items=True, progress=False, control=False)
    assert items.groupby("model_kind")["model"].nunique().tolist() == [1, 1]  # the two models' labels differ
    cmp = compare_probes(items, a={"model_kind": "trained"}, b={"model_kind": "random_init"}, n_resamples=200,
                         family="Q3 trained vs random")
    assert len(cmp) == 3 and cmp["same_folds"].all() and (cmp["n"] == 30).all()
    assert set(cmp["family"]) == {"Q3 trained vs random"} and set(cmp["grouping"]) == {"example"}


def test_cli_takes_every_study_setting(caches, tmp_path, capsys):
    """The study's [probes] settings on the command line, with the shared vocabulary; bad values are
    usage errors (``error: ...``, exit 2) and nothing is written."""
    from analyses.probes import main

    a, _ = caches
    out = tmp_path / "r"
    args = [str(a.path), "--choices", "cls", "--targets", "topic", "--layers=-1", "--folds", "3", "--inner-folds", "2",
            "--Cs", "0.01,1", "--max-iter", "50", "--seed", "3", "--resamples", "100", "--threads", "1",
            "--no-progress", "--out", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().err == ""  # --no-progress: no bar
    df = pd.read_csv(next(out.glob("probe-*.csv")))
    acc = df[df["metric"] == "accuracy"]
    assert set(acc["layer"]) == {max(a.layers)} and set(acc["seed"]) == {3} and (acc["n_folds"] == 3).all()
    assert set(acc["chosen_C"]) <= {0.01, 1.0} and (acc["chosen_C_min"] <= acc["chosen_C_max"]).all()
    for bad, message in [(["--folds", "1"], "argument --folds: '1': must be at least 2"),
                         (["--Cs", "0.1,-1"], "argument --Cs: '-1': must be a positive finite number"),
                         (["--inner-folds", "x"], "argument --inner-folds: 'x' is not an integer"),
                         (["--layers", "99"], "layer 99 is out of range"),
                         (["--layers", "1-x"], "'1-x' is not an integer or a range"),
                         (["--resamples", "1"], "argument --resamples: '1': a 95% interval needs at least 100")]:
        fresh = tmp_path / "bad"
        try:  # argparse exits; an error found while running returns the status
            status = main([str(a.path), "--out", str(fresh), "--no-progress"] + bad)
        except SystemExit as exit_:
            status = exit_.code
        assert status == 2
        err = capsys.readouterr().err
        assert "error: " in err and message in err, err
        assert not fresh.exists()



def test_topic_is_refused_where_any_sentence_has_another_topic_and_left_out_by_the_knockout_items():
    """One rule for 'topic': every label_topic_s<i> must equal it (sentence 3 counts as well as 2)."""
    from types import SimpleNamespace

    from analyses.interventions import _items
    from analyses.probes._runner import _topic, topic_mismatch
    from probing.cache import Cache

    table = pd.DataFrame({"example": [0, 1, 2, 3], "label_topic": ["a", "a", "b", "b"],
                          "label_topic_s1": ["a", "a", "b", "b"], "label_topic_s2": ["a", "a", "b", "b"],
                          "label_topic_s3": ["a", "b", "b", "b"]})  # example 1: sentence 3 elsewhere
    cache = SimpleNamespace(examples=table, path=Path("x"))
    cache.labels = lambda name, ex=None: Cache.labels(cache, name, ex)
    np.testing.assert_array_equal(topic_mismatch(cache, np.arange(4)), [False, True, False, False])
    with pytest.raises(ValueError, match="undefined for 1 of 4 examples"):
        _topic(cache, "topic", np.arange(4))
    assert list(_topic(cache, "topic_s3", np.arange(4))) == ["a", "b", "b", "b"]
    ex, y = _items(cache, "topic")
    assert list(ex) == [0, 2, 3] and list(y) == ["a", "b", "b"]
