import numpy as np
import pytest

from analyses.cka import run_cka_formats, run_cka_matrix, run_cka_roles
from probing.cache import Cache
from probing.extract import extract

from .conftest import sample_examples


@pytest.fixture()
def caches(tmp_path, tiny_bert):
    paths = extract(sample_examples(16, k=2), ["pair", "concat"], model=tiny_bert, out=tmp_path, progress=False,
                    log=lambda *a: None)
    return [Cache.open(p) for p in paths]


def test_cka_of_a_cache_with_itself(caches):
    pair = caches[0]
    df = run_cka_formats(pair, pair, ["cls", "mean", "s1 words"])
    ok = df[~((df["choice"] == "cls") & (df["layer"] == 0))]
    np.testing.assert_allclose(ok[ok["metric"] == "linear_cka"]["value"], 1.0, atol=1e-9)
    cls0 = df[(df["choice"] == "cls") & (df["layer"] == 0)]
    assert cls0["value"].isna().all() and cls0["note"].str.contains("variance").all()


def test_cka_across_formats_is_in_range(caches):
    df = run_cka_formats(caches[0], caches[1], ["cls", "mean"], metrics=["linear_cka", "rbf_cka"])
    v = df[~df["value"].isna()]["value"]
    assert len(v) == 2 * 2 * 3 - 2 and ((v > 0) & (v <= 1 + 1e-9)).all()
    assert set(df["metric"]) == {"linear_cka", "rbf_cka"}


def test_cka_matrix(caches, tmp_path):
    df = run_cka_matrix(caches[0], choice="mean", out=tmp_path / "r")
    M = df.pivot_table(index="layer", columns="layer_b", values="value")
    assert M.shape == (3, 3)
    np.testing.assert_allclose(np.diag(M.to_numpy()), 1.0, atol=1e-9)
    np.testing.assert_allclose(M.to_numpy(), M.to_numpy().T, atol=1e-9)
    assert list((tmp_path / "r").glob("cka-*.csv"))


def test_cka_roles(caches):
    df = run_cka_roles(caches[0], [("sep1", "cls"), ("sep1", "mean_s1")])
    assert set(zip(df["choice"], df["choice_b"])) == {("sep1", "cls"), ("sep1", "mean_s1")}
    assert (df["n"] == 16).all()


def _other_corpus(tmp_path, tiny_bert):
    """The same formats on another corpus of the same size (other sentences, other fingerprint)."""
    (p,) = extract(sample_examples(18, k=2)[2:], ["concat"], model=tiny_bert, out=tmp_path / "other",
                   progress=False, log=lambda *a: None)
    return Cache.open(p)


@pytest.mark.parametrize("mode", ["formats", "matrix"])
def test_cka_refuses_caches_of_different_corpora(caches, tmp_path, tiny_bert, capsys, mode):
    """Issue 10, item 3: pairing examples of different corpora by index gave CKA 0.30-0.46 with exit 0."""
    from analyses.cka import main
    from probing.cache import IncomparableCaches

    other = _other_corpus(tmp_path, tiny_bert)
    run = run_cka_formats if mode == "formats" else run_cka_matrix
    with pytest.raises(IncomparableCaches, match="different corpora"):
        run(caches[0], other)
    out = tmp_path / "results"
    assert main([mode, str(caches[0].path), str(other.path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot combine caches") and "different corpora" in err
    assert str(caches[0].path) in err and str(other.path) in err
    assert not out.exists()


def test_cross_model_cka_names_both_models(caches, tmp_path, bert_tokenizer):
    from probing.models import prepare_model

    from .conftest import make_tiny_bert

    other = prepare_model(make_tiny_bert(bert_tokenizer, seed=3), bert_tokenizer, name="other-bert")
    (p,) = extract(sample_examples(16, k=2), ["pair"], model=other, out=tmp_path / "o", progress=False,
                   log=lambda *a: None)
    df = run_cka_formats(caches[0], Cache.open(p), ["mean"], metrics=["linear_cka"])
    assert set(df["model"]) == {"tiny-bert"} and set(df["model_b"]) == {"other-bert"}
    assert (df[df["layer"] > 0]["value"] < 1 - 1e-6).all()
    M = run_cka_matrix(caches[0], Cache.open(p), "mean")
    assert set(M["model_b"]) == {"other-bert"}


def test_cka_roles_refuses_two_examples(tmp_path, tiny_bert, capsys):
    """Issue 10, item 4: on a 2-example cache linear CKA was 1.0 at every layer (always 1 at n = 2)."""
    from analyses.cka import main

    (p,) = extract(sample_examples(2, k=2), ["pair"], model=tiny_bert, out=tmp_path / "c", progress=False,
                   log=lambda *a: None)
    with pytest.raises(ValueError, match="only 2 items.*at least 4"):
        run_cka_roles(Cache.open(p), [("sep1", "cls")])
    out = tmp_path / "results"
    assert main(["roles", str(p), "--pairs", "sep1:cls", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and p.name in err and "only 2 items" in err
    assert not out.exists()


def test_cka_names_both_caches_when_one_lacks_the_role(caches, tmp_path, tiny_bert):
    """A choice reading [SEP] states needs [SEP] stored in both caches; the error names both."""
    from probing.cache import IncomparableCaches

    (p,) = extract(sample_examples(16, k=2), ["concat"], model=tiny_bert, out=tmp_path / "nosep", roles="cls,word",
                   progress=False, log=lambda *a: None)
    with pytest.raises(IncomparableCaches, match=r"second cache stores no \['sep'\] tokens") as err:
        run_cka_formats(caches[0], Cache.open(p), ["sep_last"])
    assert str(caches[0].path) in str(err.value) and str(p) in str(err.value)
    assert len(run_cka_formats(caches[0], Cache.open(p), ["cls"], metrics=["linear_cka"])) == 3
