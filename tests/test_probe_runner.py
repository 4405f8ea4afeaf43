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
    # fw_s1, not bow_s1: every content word of this tiny corpus is in the top frequency band
    df = run_probes(a, ("cls", "mean", "sep1"), ("topic", "length", "fw_s1"), random_cache=b, bow_Cs=(0.1,),
                    out=tmp_path, **kw)
    acc = df[df["metric"] == "accuracy"]
    assert set(acc["model_kind"]) == {"trained", "random_init"}
    assert len(acc) == 2 * 2 * 3 * 3  # models x single-label targets x choices x layers
    assert set(df[df["target"] == "fw_s1"]["metric"]) >= {"micro_f1", "macro_auc", "majority_baseline"}
    assert set(df["grouping"]) == {"example"} and set(df["n_groups"]) == {30}  # no doc label: one group per example
    assert set(df[df["target"] == "topic"]["metric"]) >= {"majority_baseline", "control_accuracy", "selectivity"}
    assert (df[df["target"] == "fw_s1"]["chosen_C"].str.split(";").explode().astype(float) == 0.1).all()
    ok = df["ci_low"].notna()
    assert ((df.loc[ok, "ci_low"] >= -1) & (df.loc[ok, "ci_high"] <= 1)).all()
    acc_ok = ok & df["metric"].isin(["accuracy", "micro_f1"])
    assert ((df.loc[acc_ok, "ci_low"] >= 0) & (df.loc[acc_ok, "ci_high"] <= 1)).all()
    maj = df[(df["metric"] == "majority_baseline") & (df["target"] == "topic")]["value"]
    assert np.allclose(maj, maj.iloc[0])  # the same labels for every feature set
    again = run_probes(a, ("cls", "mean", "sep1"), ("topic", "length", "fw_s1"), random_cache=b, bow_Cs=(0.1,),
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
