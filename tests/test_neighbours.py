"""Nearest-neighbour label agreement (analyses.neighbours): exact small cases, scikit-learn as the
reference, same-document exclusion, and the runner's table on a tiny cache."""

import numpy as np
import pytest

from analyses.neighbours import chance_agreement, knn_predict, run_knn
from probing.cache import Cache
from probing.extract import extract


def test_knn_matches_scikit_learn_brute_force():
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 16))
    y = rng.integers(0, 4, size=300)
    ours = knn_predict(X, y, k=1)
    # scikit-learn's leave-one-out: fit on all rows, ask for 2 neighbours, drop the row itself
    nn = KNeighborsClassifier(n_neighbors=2, metric="cosine", algorithm="brute").fit(X, y)
    idx = nn.kneighbors(X, return_distance=False)
    ref = np.array([y[row[row != i][0]] for i, row in enumerate(idx)])
    assert (ours == ref).all()


def test_same_group_neighbours_are_excluded():
    X = np.array([[1.0, 0.0], [0.99, 0.01], [0.0, 1.0], [0.7, 0.7]])
    y = np.array([0, 0, 1, 1])
    assert knn_predict(X, y).tolist() == [0, 0, 1, 0]
    # rows 0 and 1 share a document: each must look elsewhere
    assert knn_predict(X, y, groups=np.array(["a", "a", "b", "c"])).tolist() == [1, 1, 1, 0]
    with pytest.raises(ValueError, match="no neighbour outside its own group"):
        knn_predict(X, y, groups=np.zeros(4))


def test_k_votes_by_majority():
    X = np.array([[1.0, 0.0], [0.95, 0.05], [0.9, 0.1], [0.85, 0.15], [0.0, 1.0]])
    y = np.array([0, 1, 0, 0, 1])
    assert knn_predict(X, y, k=1)[0] == 1  # nearest is row 1
    assert knn_predict(X, y, k=3)[0] == 0  # rows 1, 2, 3 vote 1, 0, 0


def test_chance_agreement_is_the_random_neighbour_rate():
    y = np.array([0, 0, 0, 1, 1, 2])
    same = [(y[i] == y[j]) for i in range(len(y)) for j in range(len(y)) if i != j]
    assert chance_agreement(y) == pytest.approx(np.mean(same))


def test_run_knn_table_and_reuse(tmp_path, tiny_bert):
    from probing.corpus_generated import generated_corpus

    (path,) = extract(generated_corpus(40, k=1), ["single"], model=tiny_bert, out=tmp_path / "c", progress=False,
                      log=lambda *a: None)
    cache = Cache.open(path)
    df = run_knn(cache, ("cls", "mean"), "topic", n_resamples=100, out=tmp_path / "r")
    acc = df[df["metric"] == "knn_accuracy"]
    assert len(acc) == 2 * len(cache.layers)
    assert ((acc["ci_low"] <= acc["value"]) & (acc["value"] <= acc["ci_high"])).all()
    assert ((acc["value"] >= 0) & (acc["value"] <= 1)).all()
    chance = df.loc[df["metric"] == "chance_knn_accuracy", "value"].unique()
    assert len(chance) == 1 and 0 < chance[0] < 1
    (stored,) = list((tmp_path / "r").glob("knn-*.csv"))
    stamp = stored.stat().st_mtime_ns
    again = run_knn(cache, ("cls", "mean"), "topic", n_resamples=100, out=tmp_path / "r")
    assert stored.stat().st_mtime_ns == stamp
    assert np.allclose(again["value"].to_numpy(float), df["value"].to_numpy(float), equal_nan=True)


def test_run_knn_compares_choices_on_the_same_examples(tmp_path, tiny_bert, capsys):
    """versus: each choice − the reference per example (paired), its sides the marginal accuracies; the
    reference swapped flips the sign; an unknown reference is refused."""
    from analyses.neighbours import main
    from probing.corpus_generated import generated_corpus

    (path,) = extract(generated_corpus(40, k=1), ["single"], model=tiny_bert, out=tmp_path / "c", progress=False,
                      log=lambda *a: None)
    cache = Cache.open(path)
    df = run_knn(cache, ("cls", "mean", "max"), "topic", versus="cls", n_resamples=200)
    diff = df[df["metric"] == "knn_accuracy_diff"]
    assert set(diff["choice"]) == {"mean", "max"} and (diff["choice_b"] == "cls").all()
    assert (diff["analysis"] == "knn_comparison").all() and len(diff) == 2 * len(cache.layers)
    acc = df[df["metric"] == "knn_accuracy"].set_index(["choice", "layer"])["value"]
    for _, r in diff.iterrows():
        assert r["value_a"] == pytest.approx(acc[r["choice"], r["layer"]])
        assert r["value_b"] == pytest.approx(acc["cls", r["layer"]])
        assert r["value"] == pytest.approx(r["value_a"] - r["value_b"])
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["p_holm"] >= r["p_value"]
    same = run_knn(cache, ("cls", "mean"), "topic", versus="mean", n_resamples=100)
    flipped = same[same["metric"] == "knn_accuracy_diff"].set_index("layer")["value"]
    mean_minus_cls = diff[diff["choice"] == "mean"].set_index("layer")["value"]
    np.testing.assert_allclose(flipped.to_numpy(), -mean_minus_cls.reindex(flipped.index).to_numpy(), atol=1e-12)
    with pytest.raises(ValueError, match="versus='sep1' is not one of the choices"):
        run_knn(cache, ("cls", "mean"), "topic", versus="sep1")
    assert main([str(path), "--versus", "cls", "--resamples", "100", "--no-progress"]) == 0
    assert "choice_b" in capsys.readouterr().out

