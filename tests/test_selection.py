import numpy as np
import pytest

from analyses.selection import choice_rows, parse_choice, pooled, role_groups
from probing.cache import Cache
from probing.extract import extract


@pytest.fixture()
def pair_cache(tmp_path, tiny_bert, examples):
    (p,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="all", progress=False,
                   log=lambda *a: None)
    return Cache.open(p)


def test_examples_table_and_labels(pair_cache, examples):
    t = pair_cache.examples
    assert t["example_id"].tolist() == [e.id for e in examples]
    assert t["sentence_2"].tolist() == [e.sentences[1] for e in examples]
    assert pair_cache.labels("topic").tolist() == [e.labels["topic"] for e in examples]
    assert pair_cache.labels("topic", np.array([4, 1])).tolist() == [examples[4].labels["topic"], 1]
    with pytest.raises(KeyError, match="no label 'nope'"):
        pair_cache.labels("nope")


def test_pooled_choices_match_manual_selection(pair_cache):
    tok = pair_cache.tokens
    layer = 2
    ex, X = pooled(pair_cache, layer, "mean")
    for e in (0, 5):
        rows = tok.index[(tok["example"] == e) & (tok["role"] == "word")]
        np.testing.assert_allclose(X[list(ex).index(e)], pair_cache.states(layer, rows).mean(0), rtol=1e-5, atol=1e-6)
    ex, X = pooled(pair_cache, layer, "max")
    rows = tok.index[(tok["example"] == 3) & (tok["role"] == "word")]
    np.testing.assert_allclose(X[3], pair_cache.states(layer, rows).max(0))
    ex, X = pooled(pair_cache, layer, "mean_s2")
    rows = tok.index[(tok["example"] == 2) & (tok["role"] == "word") & (tok["sentence"] == 2)]
    np.testing.assert_allclose(X[2], pair_cache.states(layer, rows).mean(0), rtol=1e-5, atol=1e-6)
    for choice, want in [("cls", (0, "cls")), ("sep1", None), ("sep_last", None), ("pos3", None)]:
        ex, rows = choice_rows(pair_cache, choice)
        assert len(ex) == len(set(ex)) == pair_cache.manifest["corpus"]["n_examples"]
    ex, rows = choice_rows(pair_cache, "sep1")
    assert (tok.loc[rows, "role"] == "sep").all() and (tok.loc[rows, "occurrence"] == 0).all()
    ex, rows = choice_rows(pair_cache, "sep_last")
    assert (tok.loc[rows, "occurrence"] == 1).all()
    ex, rows = choice_rows(pair_cache, "pos3")
    assert (tok.loc[rows, "position"] == 3).all()


def test_role_groups(pair_cache):
    g = role_groups(pair_cache.tokens)
    assert set(g) == {"cls", "sep1", "sep2", "s1 words", "s2 words"}
    n = pair_cache.manifest["corpus"]["n_examples"]
    assert len(g["cls"]) == len(g["sep1"]) == len(g["sep2"]) == n


def test_unknown_choice_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown token choice 'bogus'.*cls"):
        parse_choice("bogus")
    assert parse_choice("sep2") == ("sep<i>", 2)


@pytest.fixture()
def roberta_native(tmp_path, roberta_tokenizer, examples):
    """A tiny RoBERTa-style model's cache in the ``native`` format: <s> a </s></s> b </s>, with attention."""
    from transformers import RobertaConfig, RobertaModel

    from probing.models import prepare_model

    import torch

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=len(roberta_tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, type_vocab_size=1,
                        pad_token_id=roberta_tokenizer.pad_token_id)
    lm = prepare_model(RobertaModel(cfg).eval(), roberta_tokenizer, name="tiny-roberta")
    (p,) = extract([e.__class__(e.id, e.sentences[:2], e.labels) for e in examples], ["native"], model=lm,
                   out=tmp_path, roles="all", attention=True, progress=False, log=lambda *a: None)
    return Cache.open(p)


def test_native_roberta_roles_follow_the_choice_grammar(roberta_native, roberta_tokenizer, examples):
    c = roberta_native
    assert c.manifest["format"] == {"name": "native", "template": "[CLS] {1} [SEP] [SEP] {2} [SEP]"}
    first = c.tokens[c.tokens["example"] == 0].sort_values("position")
    ids = roberta_tokenizer(*examples[0].sentences[:2])["input_ids"]
    assert first["token"].tolist() == roberta_tokenizer.convert_ids_to_tokens(ids)
    groups = role_groups(c.tokens)
    assert {"cls", "sep1", "sep1_2", "sep2", "s1 words", "s2 words"} <= set(groups)
    n_words_1 = int(((first["role"] == "word") & (first["sentence"] == 1)).sum())
    for name, position in (("cls", 0), ("sep1", n_words_1 + 1), ("sep1_2", n_words_1 + 2), ("sep2", len(first) - 1)):
        ex, rows = choice_rows(c, name)
        assert len(ex) == len(examples)
        assert c.tokens.loc[rows[0], "position"] == position, name
    assert parse_choice("sep1_2") == ("sep<i>_<j>", (1, 2))
    with pytest.raises(ValueError, match="counts from 2"):
        parse_choice("sep1_1")


def test_attention_groups_use_the_choice_grammar(roberta_native):
    from analyses.attention import run_attention
    from analyses.selection import attention_group_names

    _, _, groups = roberta_native.attention()
    assert attention_group_names(roberta_native, groups) == ["cls", "sep1", "sep1_2", "sep2", "s1 words", "s2 words"]
    df = run_attention(roberta_native, n_resamples=100, per_head=False)
    assert {"cls", "sep1", "sep1_2", "sep2", "s1 words", "all tokens"} <= set(df["role"])
    row = df.set_index(["layer", "role", "target"])["value"]
    assert row[(1, "cls", "all [SEP]")] == pytest.approx(
        row[(1, "cls", "sep1")] + row[(1, "cls", "sep1_2")] + row[(1, "cls", "sep2")])
