"""Runners that read caches and write tidy tables: drift and attention (CKA and probe runners have
their own files)."""

import numpy as np
import pandas as pd
import pytest

from analyses.attention import run_attention
from analyses.drift import run_drift
from analyses.results import RESULT_COLUMNS
from probing.cache import Cache
from probing.extract import extract


@pytest.fixture()
def caches(tmp_path, tiny_bert):
    from .conftest import sample_examples

    paths = extract(sample_examples(12, k=2), ["pair", "concat", "single"], model=tiny_bert, out=tmp_path / "c",
                    attention=True, progress=False, log=lambda *a: None)
    return [Cache.open(p) for p in paths]


def test_drift_of_a_cache_with_itself_is_zero(caches, tmp_path):
    pair = caches[0]
    df = run_drift(pair, pair, n_resamples=100, n_pairs=500, progress=False)
    d = df[df["metric"].isin(["drift_mean", "normalised_drift", "relative_l2_mean"])]
    # normalised drift is undefined (NaN) only where the group is one vector for every input: [CLS] at the
    # embedding layer, whose own random pairs have cosine 1
    undefined = d["value"].isna()
    base = df[df["metric"] == "anisotropy_baseline"].set_index(["layer", "role"])["value"]
    keys = list(zip(d.loc[undefined, "layer"], d.loc[undefined, "role"]))
    assert keys and set(d.loc[undefined, "metric"]) == {"normalised_drift"}
    assert all(1 - base[k] < 1e-12 for k in keys) and {r for _, r in keys} == {"cls"}
    assert len(d) > 0 and (d.loc[~undefined, "value"] == 0).all()
    assert list(df.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)


def test_drift_pair_vs_concat(caches, tmp_path):
    pair, concat = caches[0], caches[1]
    df = run_drift(pair, concat, n_resamples=100, n_pairs=500, out=tmp_path / "r", progress=False)
    roles = set(df["role"])
    assert {"cls", "s1 words", "s2 words", "sep2", "all"} <= roles and "sep1" not in roles
    dm = df[df["metric"] == "drift_mean"].set_index(["layer", "role"])["value"]
    assert dm[(0, "cls")] == pytest.approx(0.0, abs=1e-7)  # same token, same position, same segment
    assert dm[(0, "s2 words")] > 0  # segment and position embeddings differ
    assert (df["format"] == "pair").all() and (df["format_b"] == "concat").all()
    ci = df[df["metric"] == "drift_mean"]
    assert ((ci["ci_low"] <= ci["value"] + 1e-12) & (ci["value"] <= ci["ci_high"] + 1e-12)).all()
    # a second call reuses the written table
    again = run_drift(pair, concat, n_resamples=100, n_pairs=500, out=tmp_path / "r", progress=False)
    pd.testing.assert_frame_equal(df.reset_index(drop=True), again.reset_index(drop=True), check_dtype=False)


def test_context_effect_single_vs_pair(caches):
    single, pair = caches[2], caches[0]
    df = run_drift(single, pair, words_only=True, subword="mean", n_resamples=100, n_pairs=500, progress=False)
    assert set(df["role"]) == {"s1 words", "all"}
    v = df[(df["metric"] == "drift_mean") & (df["role"] == "s1 words")]
    assert (v.set_index("layer")["value"].loc[1:] > 0).all()


def test_drift_rejects_different_models(tmp_path, bert_tokenizer, caches):
    from probing.models import prepare_model

    from .conftest import make_tiny_bert

    other = prepare_model(make_tiny_bert(bert_tokenizer, seed=1), bert_tokenizer, name="tiny-bert")
    (p,) = extract(list(Cache.open(caches[0].path).examples.pipe(_to_examples)), ["concat"], model=other,
                   out=tmp_path / "o", progress=False, log=lambda *a: None)
    with pytest.raises(ValueError, match="different models"):
        run_drift(caches[0], Cache.open(p), progress=False)


def test_attention_table(caches):
    df = run_attention(caches[0], n_resamples=100)
    mean = df[df["head"] == "mean"].set_index(["layer", "role", "target"])["value"]
    for layer in (1, 2):
        total = sum(mean[(layer, "s1 words", t)] for t in ["cls", "all [SEP]", "own sentence", "other sentences"])
        assert total == pytest.approx(1.0, abs=1e-5)
    assert set(df[df["head"] != "mean"]["head"]) == {"0", "1", "2", "3"}
    assert (df["metric"] == "attention_mass").all()


def test_attention_from_all_tokens_matches_the_model(caches, tiny_bert):
    """Clark et al.'s measure: attention to [CLS] averaged over every query token, head and example,
    recomputed here from the model's own attention maps."""
    import torch

    df = run_attention(caches[0], n_resamples=100, per_head=False)
    table = df[(df["role"] == "all tokens") & (df["head"] == "mean")].set_index(["layer", "target"])["value"]
    for layer in (1, 2):
        parts = ["cls", "sep1", "sep2", "s1 words", "s2 words"]
        assert sum(table[(layer, t)] for t in parts) == pytest.approx(1.0, abs=1e-5)
        assert table[(layer, "all [SEP]")] == pytest.approx(table[(layer, "sep1")] + table[(layer, "sep2")])
    model, tok = tiny_bert.model, tiny_bert.tokenizer
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        to_cls = {1: [], 2: []}
        for r in caches[0].examples.itertuples():
            enc = tok(r.sentence_1, r.sentence_2, return_tensors="pt", split_special_tokens=True)
            with torch.inference_mode():
                att = model(**enc, output_attentions=True).attentions
            for layer in (1, 2):
                to_cls[layer].append(att[layer - 1][0, :, :, 0].mean().item())  # heads x queries -> [CLS]
    finally:
        model.set_attn_implementation(before)
    for layer in (1, 2):
        assert table[(layer, "cls")] == pytest.approx(np.mean(to_cls[layer]), abs=1e-5)


def _to_examples(table):
    from probing.examples import Example

    return [Example(r.example_id, (r.sentence_1, r.sentence_2)) for r in table.itertuples()]
