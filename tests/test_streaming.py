"""Streaming drift and CKA (analyses.drift._streaming) against the cached path: same numbers to 1e-6, flat
accumulator memory, clear errors."""

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyses.drift import run_drift, stream_compare
from analyses.cka import run_cka_formats
from probing.cache import Cache
from probing.examples import Example
from probing.extract import ExtractError, extract
from probing.models import prepare_model

from .conftest import make_tiny_bert, make_tiny_roberta, sample_examples

CHOICES = ["cls", "mean", "sep2", "sep_last", "max", "mean_s1", "first_word", "pos3"]
DRIFT = ["cosine_mean", "drift_mean", "relative_l2_mean"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's operations are microseconds; with several threads each pays a thread-pool
    wake-up, which on a busy machine costs milliseconds (the whole file: ~5 s instead of ~20 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lm(bert_tokenizer):
    return prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")


def _cached(lm, examples, formats, tmp_path, **kw):
    paths = extract(examples, formats, model=lm, out=tmp_path, progress=False, log=lambda *a: None, **kw)
    return [Cache.open(p) for p in paths]


def _compare_drift(cached: pd.DataFrame, streamed: pd.DataFrame) -> None:
    key = ["layer", "role", "metric"]
    c = cached[cached["metric"].isin(DRIFT)].set_index(key).sort_index()
    s = streamed.set_index(key).sort_index()
    assert list(c.index) == list(s.index)  # same layers, role groups and metrics, row for row
    np.testing.assert_allclose(s["value"].to_numpy(float), c["value"].to_numpy(float), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(s["n"].to_numpy(int), c["n"].to_numpy(int))
    np.testing.assert_array_equal(s["n_examples"].to_numpy(int), c["n_examples"].to_numpy(int))


def _compare_cka(cached: pd.DataFrame, streamed: pd.DataFrame) -> None:
    key = ["layer", "choice", "metric"]
    c = cached.set_index(key).sort_index()
    s = streamed.set_index(key).sort_index()
    assert list(c.index) == list(s.index)
    cv, sv = c["value"].to_numpy(float), s["value"].to_numpy(float)
    np.testing.assert_array_equal(np.isnan(sv), np.isnan(cv))  # [CLS] at layer 0: NaN in both
    # float32 states of other batch compositions differ by rounding; on an AVX2 CPU (OpenBLAS/oneDNN pick other
    # kernels per shape) the CKA of 16 examples moved by up to 1.1e-6, so 5e-6 (a streaming error is far larger)
    np.testing.assert_allclose(sv[~np.isnan(sv)], cv[~np.isnan(cv)], rtol=0, atol=5e-6)
    np.testing.assert_array_equal(s["n"].to_numpy(int), c["n"].to_numpy(int))


@pytest.mark.parametrize("fa,fb,k,batch_tokens", [
    ("pair", "concat", 2, 8192),
    ("pair", "concat", 2, 48),  # a few examples per batch: other batch compositions than the extractor's
    ("bertsum", "plain=( [CLS] {i} [SEP] )", 3, 8192),  # several [CLS] and [SEP]: cls@1.0, sep1, sep2, ...
])
def test_streaming_equals_cached(lm, tmp_path, fa, fb, k, batch_tokens):
    examples = sample_examples(16, k=k)
    a, b = _cached(lm, examples, [fa, fb], tmp_path)
    fb = b.format_name
    choices = CHOICES
    cached_drift = run_drift(a, b, n_resamples=100, n_pairs=200, progress=False)
    words = [f"s{i} words" for i in range(1, k + 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the zero-variance warning of [CLS] at layer 0
        cached_cka = run_cka_formats(a, b, choices + words)
    out = stream_compare(examples, a.manifest["format"]["name"] + "=" + a.manifest["format"]["template"],
                         fb + "=" + b.manifest["format"]["template"], model=lm, choices=choices, word_groups=True,
                         n_resamples=100, batch_tokens=batch_tokens, progress=False)
    _compare_drift(cached_drift, out["drift"])
    _compare_cka(cached_cka, out["cka"])
    if k == 3:
        assert {"cls", "cls@1.0", "cls@2.0", "sep1", "sep2", "sep3", "s3 words", "all"} <= set(out["drift"]["role"])
    assert (out["drift"]["format"] == fa).all() and (out["drift"]["format_b"] == fb).all()
    assert (out["cka"]["model"] == "tiny-bert").all()


@pytest.mark.parametrize("tokenizer", ["bert_tokenizer", "roberta_tokenizer"])
def test_native_streams_as_the_extracted_native_cache(lm, tmp_path, tokenizer, request):
    """``native`` (the tokenizer's own pair template: [CLS] a [SEP] b [SEP] for BERT, <s> a </s></s> b </s>
    for RoBERTa) is resolved as extraction resolves it, so streaming equals the cached path on it."""
    if tokenizer == "roberta_tokenizer":
        tok = request.getfixturevalue(tokenizer)
        lm = prepare_model(make_tiny_roberta(tok), tok, name="tiny-roberta")
    examples = sample_examples(12, k=2)
    a, b = _cached(lm, examples, ["native", "concat"], tmp_path)
    choices = ["cls", "mean", "sep_last", "first_word"]
    cached_drift = run_drift(a, b, n_resamples=100, n_pairs=100, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the zero-variance warning of [CLS] at layer 0
        cached_cka = run_cka_formats(a, b, choices + ["s1 words", "s2 words"])
    out = stream_compare(examples, "native", "concat", model=lm, choices=choices, n_resamples=100, progress=False)
    _compare_drift(cached_drift, out["drift"])
    _compare_cka(cached_cka, out["cka"])
    assert (out["drift"]["format"] == "native").all() and (out["cka"]["format"] == "native").all()
    assert {"cls", "sep2", "s1 words", "s2 words"} <= set(out["drift"]["role"])


def test_context_effect_words_only_mean_subwords(lm, tmp_path):
    examples = sample_examples(12, k=2)
    single, pair = _cached(lm, examples, ["single", "pair"], tmp_path)
    cached = run_drift(single, pair, words_only=True, subword="mean", n_resamples=100, n_pairs=100, progress=False)
    out = stream_compare(examples, "single", "pair", model=lm, words_only=True, subword="mean",
                         choices=["mean_s1"], word_groups=False, n_resamples=100, progress=False)
    _compare_drift(cached, out["drift"])
    assert set(out["drift"]["role"]) == {"s1 words", "all"}
    d = out["drift"][(out["drift"]["metric"] == "drift_mean") & (out["drift"]["role"] == "s1 words")]
    assert (d.set_index("layer")["value"].loc[1:] > 0).all()  # sentence 2 changes sentence 1's words


def test_a_format_against_itself(lm):
    out = stream_compare(sample_examples(10, k=2), "pair", "pair", model=lm, n_resamples=100, progress=False)
    d = out["drift"]
    assert (d[d["metric"] == "drift_mean"]["value"].abs() < 1e-12).all()
    assert (d[d["metric"] == "cosine_mean"]["value"] > 1 - 1e-12).all()
    c = out["cka"]
    undefined = (c["choice"] == "cls") & (c["layer"] == 0)
    np.testing.assert_allclose(c[~undefined]["value"], 1.0, atol=1e-9)
    assert c[undefined]["value"].isna().all() and c[undefined]["note"].str.contains("variance").all()
    assert {"s1 words", "s2 words"} <= set(c["choice"])


def test_accumulator_memory_does_not_grow_with_the_corpus(lm):
    small = stream_compare(sample_examples(8, k=2), "pair", "concat", model=lm, n_resamples=100, progress=False)
    large = stream_compare(sample_examples(40, k=2), "pair", "concat", model=lm, n_resamples=100, progress=False)
    pd.testing.assert_frame_equal(small["memory"], large["memory"])
    assert small["memory"]["bytes"].sum() > 0
    n = lambda t: t["cka"].query("choice == 'cls'")["n"].max()  # noqa: E731
    assert (n(small), n(large)) == (8, 40)


def test_bootstrap_intervals_do_not_depend_on_batching(lm, tmp_path):
    examples = sample_examples(16, k=2)
    kw = dict(model=lm, choices=[], word_groups=False, n_resamples=400, progress=False)
    one = stream_compare(examples, "pair", "concat", batch_tokens=8192, **kw)["drift"]
    many = stream_compare(examples, "pair", "concat", batch_tokens=48, **kw)["drift"]
    # the same resampling weights whatever the batches: equal up to the float32 rounding of states computed in
    # other batch shapes (1 − cos of 0.005 moved by 3e-9 on an AVX2 CPU); weights drawn per batch would move
    # the interval by a share of its width (about 1e-3 here)
    np.testing.assert_allclose(one[["ci_low", "ci_high"]], many[["ci_low", "ci_high"]], rtol=1e-6, atol=1e-8)
    ok = one["n_examples"] >= 2
    assert ((one["ci_low"] <= one["value"] + 1e-12) & (one["value"] <= one["ci_high"] + 1e-12))[ok].all()
    # Poisson and multinomial cluster bootstraps estimate the same interval: widths of the same size
    a, b = _cached(lm, examples, ["pair", "concat"], tmp_path)
    cached = run_drift(a, b, n_resamples=400, n_pairs=100, progress=False)
    sel = lambda t: t[(t["metric"] == "drift_mean") & (t["role"] == "s2 words")].set_index("layer")  # noqa: E731
    ratio = (sel(one)["ci_high"] - sel(one)["ci_low"]) / (sel(cached)["ci_high"] - sel(cached)["ci_low"])
    assert ((ratio > 0.5) & (ratio < 2.0)).all(), ratio
    none = stream_compare(examples, "pair", "concat", model=lm, choices=[], n_resamples=0, progress=False)
    assert none["drift"]["ci_low"].isna().all() and "drift.bootstrap" not in set(none["memory"]["accumulator"])


def test_bad_inputs_name_the_offending_values(lm):
    ex = sample_examples(6, k=2)
    with pytest.raises(ValueError, match=r"'left'.*'right'.*share no token keys"):
        stream_compare(ex, "left=[CLS] {1}", "right={2} [SEP]", model=lm, choices=[], progress=False)
    with pytest.raises(ValueError, match="'bogus'"):
        stream_compare(ex, "pair", "concat", model=lm, choices=["cls", "bogus"], progress=False)
    with pytest.raises(ValueError, match=r"\['sep1'\].*'concat'"):
        stream_compare(ex, "pair", "concat", model=lm, choices=["sep1"], progress=False)
    with pytest.raises(ValueError, match="rbf_cka"):
        stream_compare(ex, "pair", "concat", model=lm, metrics=["rbf_cka"], progress=False)
    with pytest.raises(ValueError, match="'last'"):
        stream_compare(ex, "pair", "concat", model=lm, subword="last", progress=False)


def test_overlong_examples_error_or_are_skipped_in_both_formats(lm):
    ex = sample_examples(8, k=2)
    long = Example("too-long", (" ".join(["word"] * 80) + ".", "Short one."), {})
    with pytest.raises(ExtractError, match="'too-long'"):
        stream_compare(ex + [long], "pair", "concat", model=lm, progress=False)
    out = stream_compare(ex + [long], "pair", "concat", model=lm, on_overflow="skip", n_resamples=100, progress=False)
    assert (out["cka"]["n"][out["cka"]["choice"] == "cls"] == 8).all()
    assert (out["drift"].query("role == 'all'")["n_examples"] == 8).all()


def test_extract_and_streaming_do_not_import_each_other():
    """Both build on probing.forward and probing.planning; neither imports the other (no cycle)."""
    import ast

    repo = Path(__file__).resolve().parents[1]
    files = {"extract": repo / "probing" / "extract.py", "streaming": repo / "analyses" / "drift" / "_streaming.py"}
    for name, other in (("extract", "streaming"), ("streaming", "extract")):
        tree = ast.parse(files[name].read_text())
        imported = {(n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m.split(".")[-1].lstrip("_") == other for m in imported), (name, sorted(imported))
        assert {"forward", "planning"} <= {m.split(".")[-1] for m in imported}, name
