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
