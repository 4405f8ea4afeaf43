"""analyses.format_probes (one probe of the same items in several formats, paired) and the norm-based
weighting of analyses.paired.run_paired_attention: planted differences found, nulls not, and the errors."""

import numpy as np
import pytest

from analyses.format_probes import format_differences, run_format_probes
from analyses.paired import run_paired_attention
from analyses.probes import probe_many_results
from probing.cache import Cache, CacheError
from probing.examples import Example
from probing.extract import extract

R = 200


def _planted(multilabel: bool, informative: bool, seed: int = 0):
    """Two formats' features of the same 160 items in 40 documents: format "a" is noise; format "b" carries the
    labels (``informative``) or is other noise."""
    rng = np.random.default_rng(seed)
    n = 160
    groups = np.repeat(np.arange(40), 4)
    y = (rng.random((n, 4)) < 0.4).astype(int) if multilabel else rng.integers(0, 2, n)
    signal = (2 * y - 1 if multilabel else (2 * y - 1)[:, None]).astype(float)
    a = rng.normal(size=(n, 8))
    b = rng.normal(size=(n, 8))
    if informative:
        b[:, :signal.shape[1]] += 1.5 * signal
    feats = {("a", 0): a, ("b", 0): b}
    res = probe_many_results(feats, y, groups, n_splits=4, seed=seed, Cs=(1.0,), n_resamples=R, device="cpu",
                             num_threads=1)
    return format_differences(res, ["a", "b"], [0], multilabel, R, seed)


@pytest.mark.parametrize("multilabel", [True, False])
def test_a_format_that_carries_the_labels_decodes_better(multilabel):
    (row,) = _planted(multilabel, informative=True)
    assert row["metric"] == ("macro_auc_diff" if multilabel else "accuracy_diff")
    assert (row["format"], row["format_b"]) == ("a", "b")
    assert row["ci_low"] > 0.1 and row["value"] == pytest.approx(row["value_a"] - row["value_b"])
    assert row["value_a"] > row["value_b"]  # value_a is format_b's score: the difference is b − a


@pytest.mark.parametrize("multilabel", [True, False])
def test_two_formats_of_noise_do_not_differ(multilabel):
    (row,) = _planted(multilabel, informative=False, seed=3)
    assert row["ci_low"] < 0 < row["ci_high"] and abs(row["value"]) < 0.15


def _doc_examples(n: int = 48) -> list[Example]:
    from probing.corpora import load_corpus

    return load_corpus(f"generated:n={n},k=2")


@pytest.fixture(scope="module")
def caches(tmp_path_factory, bert_tokenizer):
    from probing.models import prepare_model
    from .conftest import make_tiny_bert

    lm = prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")
    out = tmp_path_factory.mktemp("fp")
    paths = extract(_doc_examples(), ["pair", "concat"], model=lm, out=out, attention_norm=True, progress=False,
                    log=lambda *a: None)
    plain = extract(_doc_examples(), ["pair", "concat"], model=lm, out=out, attention=True, progress=False,
                    log=lambda *a: None)
    other = extract(_doc_examples(24), ["concat"], model=lm, out=out, progress=False, log=lambda *a: None)
    return [Cache.open(p) for p in paths], [Cache.open(p) for p in plain], Cache.open(other[0])


def test_format_probes_on_caches_pair_every_layer(caches, tmp_path):
    (pair, concat), _, _ = caches
    kw = dict(n_splits=3, vocab=5, bow_Cs=(1.0,), n_resamples=R, device="cpu", num_threads=1, out=tmp_path)
    df = run_format_probes({"pair": pair, "concat": concat}, "mean_s1", "bow_s2", **kw)
    auc = df[df["metric"] == "macro_auc"]
    assert set(zip(auc["format"], auc["layer"])) == {(f, layer) for f in ("pair", "concat") for layer in (0, 1, 2)}
    diff = df[df["metric"] == "macro_auc_diff"].set_index("layer")
    assert len(diff) == 3 and (diff["format"] == "pair").all() and (diff["format_b"] == "concat").all()
    for layer in (0, 1, 2):
        a = auc[(auc["format"] == "pair") & (auc["layer"] == layer)]["value"].item()
        b = auc[(auc["format"] == "concat") & (auc["layer"] == layer)]["value"].item()
        assert diff.loc[layer, "value"] == pytest.approx(b - a)
    assert (diff["p_holm"] >= diff["p_value"] - 1e-12).all() and (diff["grouping"] == "document").all()
    # sentence 1's words at the embeddings do not depend on the format: no difference at all
    assert diff.loc[0, "value"] == pytest.approx(0, abs=1e-6)
    again = run_format_probes({"pair": pair, "concat": concat}, "mean_s1", "bow_s2", **kw)
    assert again.attrs["reused"]


def test_format_probes_refuse_one_format_and_other_corpora(caches):
    (pair, concat), _, other = caches
    with pytest.raises(ValueError, match="at least two caches"):
        run_format_probes({"pair": pair}, "mean_s1", "bow_s2", n_resamples=R)
    with pytest.raises(ValueError, match="different corpora"):
        run_format_probes({"pair": pair, "concat": other}, "mean_s1", "bow_s2", n_resamples=R)
    with pytest.raises(ValueError, match="choice"):
        run_format_probes({"pair": pair, "concat": concat}, "pooler", "bow_s2", n_resamples=R)


def test_paired_attention_with_norm_based_weights(caches):
    (pair, concat), (raw_pair, raw_concat), _ = caches
    norm = run_paired_attention(pair, concat, weighting="norm", n_resamples=R)
    raw = run_paired_attention(pair, concat, n_resamples=R)
    assert (norm["metric"] == "attention_norm_diff").all() and (raw["metric"] == "attention_diff").all()
    assert len(norm) == len(raw) > 0 and not np.allclose(norm["value_a"], raw["value_a"])
    assert ((norm["value_a"] >= 0) & (norm["value_a"] <= 1)).all()
    with pytest.raises(ValueError, match="weighting must be one of"):
        run_paired_attention(pair, concat, weighting="grad")
    with pytest.raises(CacheError, match="no norm-based attention"):
        run_paired_attention(raw_pair, raw_concat, weighting="norm", n_resamples=R)
