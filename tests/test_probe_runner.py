import numpy as np
import pytest

from analyses.probe_runner import example_target, run_probes
from probing.cache import Cache
from probing.extract import extract
from probing.models import prepare_model

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
    df = run_probes(a, ("cls", "mean", "sep1"), ("topic", "length", "bow_s1"), random_cache=b, bow_Cs=(0.1,),
                    out=tmp_path, **kw)
    acc = df[df["metric"] == "accuracy"]
    assert set(acc["model_kind"]) == {"trained", "random_init"}
    assert len(acc) == 2 * 2 * 3 * 3  # models x single-label targets x choices x layers
    assert set(df[df["target"] == "bow_s1"]["metric"]) >= {"micro_f1", "macro_auc", "majority_baseline"}
    assert set(df[df["target"] == "topic"]["metric"]) >= {"majority_baseline", "control_accuracy", "selectivity"}
    assert (df[df["target"] == "bow_s1"]["chosen_C"].str.split(";").explode().astype(float) == 0.1).all()
    ok = df["ci_low"].notna()
    assert ((df.loc[ok, "ci_low"] >= -1) & (df.loc[ok, "ci_high"] <= 1)).all()
    acc_ok = ok & df["metric"].isin(["accuracy", "micro_f1"])
    assert ((df.loc[acc_ok, "ci_low"] >= 0) & (df.loc[acc_ok, "ci_high"] <= 1)).all()
    maj = df[(df["metric"] == "majority_baseline") & (df["target"] == "topic")]["value"]
    assert np.allclose(maj, maj.iloc[0])  # the same labels for every feature set
    again = run_probes(a, ("cls", "mean", "sep1"), ("topic", "length", "bow_s1"), random_cache=b, bow_Cs=(0.1,),
                       out=tmp_path, **kw)
    assert len(again) == len(df)


def test_token_level_segment_probe(caches):
    a, _ = caches
    df = run_probes(a, ("cls",), ("segment",), n_splits=3, Cs=(1.0,), max_iter=100, progress=False)
    acc = df[df["metric"] == "accuracy"]
    assert set(acc["role"]) == {"word"} and len(acc) == 3
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
    Y, ml = example_target(a, "bow_s2", ex, vocab=5)
    assert ml and Y.shape[0] == 30 and 0 < Y.shape[1] <= 5
    with pytest.raises(KeyError, match="no label 'nope'"):
        example_target(a, "nope", ex)
    with pytest.raises(ValueError, match="unknown token choice"):
        run_probes(a, ("bogus",), ("topic",), progress=False)


def test_random_cache_must_be_the_random_init_baseline(caches, tmp_path, bert_tokenizer, capsys):
    """Issue 10, item 5: a trained model on another corpus was accepted as --random-cache and labelled
    random_init. The baseline must have random weights, this model's architecture, corpus and format."""
    from analyses.probe_runner import main
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
