"""The notebook API end to end: probing.load_model / extract_caches / Cache.find, and analyses.*_table
returning DataFrames, on a tiny random model and small corpora."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pandas as pd
import pytest

import analyses
import probing
from probing.cache import CacheError

QUIET = dict(progress=False, log=lambda *a: None)


def test_import_probing_is_light():
    code = ("import sys, probing, analyses; heavy = [m for m in ('torch', 'transformers', 'pandas', 'sklearn') "
            "if m in sys.modules]; print(','.join(heavy) or 'none')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "none"


@pytest.mark.parametrize("package", [probing, analyses])
def test_api_names_are_not_submodules_and_resolve(package):
    """A package attribute named like a submodule is replaced when the submodule is imported."""
    submodules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    names = list(package.API)
    assert names and not set(names) & submodules
    for name in names:
        assert callable(getattr(package, name)), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(probing, "nope")


def test_probing_api_resolves_to_the_implementations():
    from probing.cache import Cache

    assert probing.Cache is Cache
    assert not hasattr(probing, "run_study")  # the study is above the core: probing.study.run
    importlib.import_module("probing.extract")  # the submodule does not shadow the function
    assert probing.extract_caches.__module__ == "probing.api"


@pytest.fixture()
def two_caches(tmp_path, tiny_bert, examples):
    caches = probing.extract_caches(tiny_bert, examples, formats=["pair", "concat"], layers="0,-1",
                                    out=tmp_path / "caches", **QUIET)
    return tmp_path / "caches", caches


def test_extract_caches_returns_caches_and_find_finds_them(two_caches, tiny_bert):
    root, (pair, concat) = two_caches
    assert isinstance(pair, probing.Cache) and pair.format_name == "pair" and concat.format_name == "concat"
    assert pair.layers == concat.layers == [0, tiny_bert.n_layers]  # -1 is the last layer
    found = probing.Cache.find(root, model="tiny-bert", format="concat")
    assert found.path == concat.path
    assert probing.Cache.find(root, format="pair", corpus="custom").path == pair.path
    with pytest.raises(CacheError, match=r"no cache below .* matches .*format='single'.*there are: model='tiny-bert'"):
        probing.Cache.find(root, format="single")
    with pytest.raises(CacheError, match="2 caches below .* match model='tiny-bert'"):
        probing.Cache.find(root, model="tiny-bert")
    with pytest.raises(CacheError, match="random_init=True.*there are"):
        probing.Cache.find(root, format="pair", random_init=True)
    with pytest.raises(CacheError, match="there is no complete cache there"):
        probing.Cache.find(root / "empty", format="pair")


def test_a_corpus_spec_names_the_corpus(tmp_path, tiny_bert):
    (c,) = probing.extract_caches(tiny_bert, "generated:n=24,k=2", formats="native", layers="-1", out=tmp_path,
                                  **QUIET)
    assert c.manifest["corpus"]["name"] == "generated:n=24,k=2" and c.manifest["corpus"]["n_examples"] == 24
    assert c.manifest["format"] == {"name": "native", "template": "[CLS] {1} [SEP] <1> {2} [SEP]"}
    assert probing.Cache.find(tmp_path, corpus="generated:n=24,k=2").path == c.path


def test_tables_are_dataframes_with_the_layer_spec(two_caches, tiny_bert):
    from analyses.drift import run_drift

    _, (pair, concat) = two_caches
    last = tiny_bert.n_layers
    drift = analyses.drift_table(pair, concat, layers="-1", n_resamples=100)
    assert isinstance(drift, pd.DataFrame) and set(drift["layer"]) == {last}
    ref = run_drift(pair, concat, layers=[last], n_resamples=100, progress=False)
    pd.testing.assert_frame_equal(drift, ref)
    cka = analyses.cka_table(pair, concat, choices=["cls", "mean"], layers="-1")
    assert set(cka["choice"]) == {"cls", "mean"} and set(cka["layer"]) == {last}
    assert cka["value"].between(0, 1 + 1e-9).all()
    within = analyses.cka_table(pair, choices=[("sep1", "cls")], layers="all")
    assert set(within["layer"]) == {0, last} and set(within["choice"]) == {"sep1"}
    knn = analyses.neighbours_table(pair, choices=["mean"], targets=["topic", "parity"], layers="-1", group=None,
                                   n_resamples=100)
    assert set(knn["target"]) == {"topic", "parity"} and set(knn["metric"]) == {"knn_accuracy", "chance_knn_accuracy"}


def test_probe_table(two_caches, tiny_bert):
    _, (pair, _) = two_caches
    df = analyses.probe_table(pair, choices=["cls"], targets=["topic"], layers="-1", folds=3, control=False)
    assert isinstance(df, pd.DataFrame)
    acc = df[(df["metric"] == "accuracy") & (df["choice"] == "cls")]
    assert set(acc["layer"].astype(int)) == {tiny_bert.n_layers}
    assert acc["value"].between(0, 1).all()


def test_layer_errors_name_the_spec(two_caches):
    _, (pair, concat) = two_caches
    with pytest.raises(ValueError,
                       match=r"--layers '1': layer\(s\) \[1\] are not stored; the cache holds layers \[0, 2\]"):
        analyses.drift_table(pair, concat, layers="1")
