import numpy as np
import pytest

from analyses.similarity import run_cka_formats, run_cka_matrix, run_cka_roles
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
    ok = df[~((df["role"] == "cls") & (df["layer"] == 0))]
    np.testing.assert_allclose(ok[ok["metric"] == "linear_cka"]["value"], 1.0, atol=1e-9)
    cls0 = df[(df["role"] == "cls") & (df["layer"] == 0)]
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
    assert set(zip(df["role"], df["target"])) == {("sep1", "cls"), ("sep1", "mean_s1")}
    assert (df["n"] == 16).all()
