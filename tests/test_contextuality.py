"""Ethayarajh 2019 contextuality measures: exact values on synthetic data, literal double loops,
context selection, and an end-to-end run on a tiny cache."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import analyses.contextuality._runner as ctx
import analyses.contextuality._metrics as contextuality_metrics
from analyses.contextuality import (METRICS, choose_contexts, intra_similarity, join_subwords, max_explainable_variance,
                                    random_word_sets, run_contextuality, self_similarity, word_table)
from analyses.drift import anisotropy_baseline_ci
from analyses.results import RESULT_COLUMNS
from probing.cache import Cache
from probing.extract import extract


def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def loop_self_similarity(V):
    n = len(V)
    return sum(_cos(V[j], V[k]) for j in range(n) for k in range(n) if j != k) / (n * (n - 1))


def loop_mev(V):
    s = np.linalg.svd(np.asarray(V, dtype=np.float64), compute_uv=False)
    return float(s[0] ** 2 / (s ** 2).sum())


def loop_intra(V):
    m = np.mean(V, axis=0)
    return sum(_cos(v, m) for v in V) / len(V)


# --------------------------------------------------------------------------------------------------
# Metric functions on synthetic data


def test_identical_occurrences_give_self_similarity_and_mev_one():
    rng = np.random.default_rng(0)
    v, w = rng.normal(size=16), rng.normal(size=16)
    X = np.stack([v] * 5 + [w * s for s in (1.0, 2.0, 0.5, 7.0)])  # type 1: positive multiples
    codes = np.array([0] * 5 + [1] * 4)
    np.testing.assert_allclose(self_similarity(X, codes), [1.0, 1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(max_explainable_variance(X, codes), [1.0, 1.0], rtol=0, atol=1e-12)


def test_orthogonal_occurrences_give_zero_self_similarity_and_mev_one_over_n():
    X = np.eye(6)[:5] * np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])  # orthogonal, unequal norms
    assert self_similarity(X, np.zeros(5, dtype=int))[0] == pytest.approx(0.0, abs=1e-15)
    E = np.eye(8)[:4] * 3.0  # 4 orthogonal rows of equal norm: every direction explains 1/4
    assert max_explainable_variance(E, np.zeros(4, dtype=int))[0] == pytest.approx(0.25, abs=1e-12)
    # opposite vectors: cosine -1, yet one direction explains all of the (uncentred) variance
    O = np.array([[1.0, 2.0], [-1.0, -2.0]])
    assert self_similarity(O, [0, 0])[0] == pytest.approx(-1.0)
    assert max_explainable_variance(O, [0, 0])[0] == pytest.approx(1.0)


def test_hand_computed_small_case():
    # type 0: (1,0), (0,1), (1,1): cosines 0, 1/√2, 1/√2 -> mean over 6 ordered pairs = √2/3
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert self_similarity(X, [0, 0, 0])[0] == pytest.approx(np.sqrt(2) / 3, abs=1e-14)
    # Gram [[1,0,1],[0,1,1],[1,1,2]]: eigenvalues 3, 1, 0, trace 4 -> MEV 3/4
    assert max_explainable_variance(X, [0, 0, 0])[0] == pytest.approx(0.75, abs=1e-14)
    # mean (2/3, 2/3): cos with (1,0) = cos with (0,1) = 1/√2, with (1,1) = 1
    assert intra_similarity(X, [0, 0, 0])[0] == pytest.approx((2 / np.sqrt(2) + 1) / 3, abs=1e-14)


def test_random_groups_match_literal_loops():
    rng = np.random.default_rng(1)
    sizes = [2, 5, 5, 9, 3, 7]
    codes = np.repeat(np.arange(len(sizes)), sizes)
    perm = rng.permutation(codes.size)  # rows of a group need not be contiguous
    codes = codes[perm]
    X = rng.normal(size=(codes.size, 12)) + rng.normal(size=12)  # a shared offset, like anisotropy
    X32 = X.astype(np.float32)
    ss, mev, intra = self_similarity(X32, codes), max_explainable_variance(X32, codes), intra_similarity(X32, codes)
    X32 = X32.astype(np.float64)
    for g in range(len(sizes)):
        V = X32[codes == g]
        assert ss[g] == pytest.approx(loop_self_similarity(V), abs=1e-12)
        assert mev[g] == pytest.approx(loop_mev(V), abs=1e-12)
        assert intra[g] == pytest.approx(loop_intra(V), abs=1e-12)


def test_centred_mev_is_pca_explained_variance_ratio():
    """Centred MEV = scikit-learn PCA's first explained-variance ratio (the authors' released code),
    uncentred MEV = the first squared singular value's share of the raw matrix (the paper's text)."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(3)
    sizes = [2, 5, 5, 9, 30]
    codes = np.repeat(np.arange(len(sizes)), sizes)[rng.permutation(sum(sizes))]
    X = rng.normal(size=(codes.size, 12)) * rng.uniform(0.2, 3, size=12) + 4 * rng.normal(size=12)
    centred = max_explainable_variance(X, codes, centred=True)
    raw = max_explainable_variance(X, codes)
    for g in range(len(sizes)):
        V = X[codes == g]
        assert centred[g] == pytest.approx(PCA(n_components=1).fit(V).explained_variance_ratio_[0], abs=1e-10)
        s = np.linalg.svd(V, compute_uv=False)
        assert raw[g] == pytest.approx(s[0] ** 2 / (s ** 2).sum(), abs=1e-12)
    # a shared offset makes the uncentred share large; centring removes it
    big = np.bincount(codes) > 2
    assert (raw[big] > centred[big]).all()
    # two rows: one direction holds all the variance around their mean
    assert centred[np.argmin([np.sum(codes == g) for g in range(len(sizes))])] == pytest.approx(1.0)
    # no variance (identical rows): undefined, not 1
    same = max_explainable_variance(np.ones((3, 4)), [0, 0, 0], centred=True)
    assert np.isnan(same[0])


def test_mev_batches_and_wide_groups(monkeypatch):
    # n > dim (rank-deficient Gram) and batches split across several chunks
    monkeypatch.setattr(contextuality_metrics, "_BATCH_ELEMENTS", 50)
    rng = np.random.default_rng(2)
    codes = np.repeat(np.arange(7), [6, 6, 6, 6, 4, 4, 8])
    X = rng.normal(size=(codes.size, 3))
    got = max_explainable_variance(X, codes)
    for g in range(7):
        assert got[g] == pytest.approx(loop_mev(X[codes == g]), abs=1e-12)


def test_intra_similarity_one_word_sentence_and_errors():
    X = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    assert intra_similarity(X, [0, 1, 1])[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="zero norm"):
        self_similarity(np.array([[1.0, 0.0], [0.0, 0.0]]), [0, 0])
    with pytest.raises(ValueError, match=">= 2 occurrences"):
        self_similarity(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), [0, 0, 1])
    with pytest.raises(ValueError, match="zero mean"):
        intra_similarity(np.array([[1.0, 0.0], [-1.0, 0.0]]), [0, 0])
    with pytest.raises(ValueError, match="zero or non-finite"):
        max_explainable_variance(np.zeros((2, 3)), [0, 0])


# --------------------------------------------------------------------------------------------------
# Word types and the occurrences used


def test_join_subwords_strips_markers():
    assert join_subwords(["un", "##believ", "##ably"], [0, 1, 2]) == "unbelievably"
    assert join_subwords(["Ġparrot", "s"], [0, 1]) == "parrots"
    assert join_subwords(["▁Shake", "speare"], [0, 1]) == "Shakespeare"
    assert join_subwords(["low", "er</w>"], [0, 1]) == "lower"
    assert join_subwords(["##"], [0]) == "##"  # a word that is literally '##' keeps it


def _tokens(words, text_column=True):
    """Token table rows: words = [(example, sentence, index, [subword tokens], surface text)]."""
    rows = []
    for e, s, i, toks, text in words:
        for k, t in enumerate(toks):
            rows.append({"example": e, "role": "word", "sentence": s, "index": i, "subword": k, "token": t,
                         "word_text": text})
        rows.append({"example": e, "role": "sep", "sentence": s, "index": 0, "subword": 0, "token": "[SEP]",
                     "word_text": ""})
    df = pd.DataFrame(rows)
    return df if text_column else df.drop(columns="word_text")


def test_word_table_types_from_word_text_or_tokens():
    tok = _tokens([(0, 1, 0, ["the"], "The"), (0, 1, 1, ["un", "##believ", "##ably"], "Unbelievably"),
                   (1, 1, 0, ["the"], "the")])
    words, word_of_row = word_table(tok)
    assert words["type"].tolist() == ["the", "unbelievably", "the"]
    assert words["first_row"].tolist() == [0, 2, 6]
    assert word_of_row.tolist() == [0, 1, 1, 1, 2]
    assert word_table(tok, lowercase=False)[0]["type"].tolist() == ["The", "Unbelievably", "the"]
    no_text = word_table(_tokens([(0, 1, 0, ["un", "##believ", "##ably"], ""), (0, 1, 1, ["x"], "")],
                                 text_column=False))[0]
    assert no_text["type"].tolist() == ["unbelievably", "x"]
    with pytest.raises(ValueError, match="no word tokens"):
        word_table(tok[tok["role"] != "word"])


def test_choose_contexts_min_max_and_one_occurrence_per_example():
    # 'a' in examples 0..5 (twice in example 0), 'b' in 4 examples (3 times in example 9), 'c' in 8
    types = ["a", "a"] + ["a"] * 5 + ["b"] * 3 + ["b"] * 3 + ["c"] * 8
    examples = [0, 0, 1, 2, 3, 4, 5, 9, 9, 9, 10, 11, 12] + list(range(20, 28))
    words, codes, names, available = choose_contexts(types, examples, min_contexts=5, max_contexts=50)
    assert names.tolist() == ["a", "c"] and available.tolist() == [6, 8]
    assert words[codes == 0].tolist() == [0, 2, 3, 4, 5, 6]  # the second 'a' of example 0 is not a context
    # 'b' has 6 occurrences but only 4 examples: dropped at 5, kept (first one per example) at 4
    words4, codes4, names4, _ = choose_contexts(types, examples, min_contexts=4, max_contexts=50)
    assert names4.tolist() == ["a", "b", "c"]
    assert words4[codes4 == 1].tolist() == [7, 10, 11, 12]
    # the cap samples distinct examples, reproducibly with the seed
    w1, c1, _, _ = choose_contexts(types, examples, min_contexts=5, max_contexts=5, seed=3)
    w2, c2, _, _ = choose_contexts(types, examples, min_contexts=5, max_contexts=5, seed=3)
    assert np.array_equal(w1, w2) and np.bincount(c1).tolist() == [5, 5]
    ex = np.asarray(examples)
    assert all(np.unique(ex[w1[c1 == g]]).size == 5 for g in (0, 1))
    others = {tuple(choose_contexts(types, examples, 5, 5, seed=s)[0]) for s in range(10)}
    assert len(others) > 1


def test_random_word_sets_draw_distinct_examples():
    examples = np.repeat(np.arange(10), [1, 2, 3, 4, 5, 1, 2, 3, 4, 5])
    words, codes = random_word_sets([5, 10, 2], examples, seed=0)
    assert np.bincount(codes).tolist() == [5, 10, 2]
    for g in range(3):
        ex = examples[words[codes == g]]
        assert np.unique(ex).size == ex.size
    with pytest.raises(ValueError, match="only 10 examples"):
        random_word_sets([11], examples)


# --------------------------------------------------------------------------------------------------
# End to end on a tiny cache


@pytest.fixture(scope="module")
def tiny_caches(tmp_path_factory, bert_tokenizer):
    from probing.models import prepare_model

    from .conftest import make_tiny_bert, sample_examples

    model = prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")
    root = tmp_path_factory.mktemp("ctx")
    from probing.examples import Example

    examples = sample_examples(16, k=2) + [Example("one-word", ("Hello", "The cat sat again."))]
    (pair,) = extract(examples, ["pair"], model=model, out=root / "c", shard_mb=0.01,
                      progress=False, log=lambda *a: None)
    (nowords,) = extract(sample_examples(6, k=2), ["pair"], model=model, out=root / "n", roles="cls,sep",
                         progress=False, log=lambda *a: None)
    return Cache.open(pair), Cache.open(nowords)


def _literal(cache, layer, min_contexts):
    """Self-similarity, MEV and intra-similarity at one layer by plain loops over the token table."""
    tok = cache.tokens
    first = tok[(tok["role"] == "word") & (tok["subword"] == 0)]
    vec = {r: cache.states(layer, [r])[0].astype(np.float64) for r in first.index}
    by_type: dict[str, dict[int, int]] = {}
    for r, t in zip(first.index, first.itertuples()):
        by_type.setdefault(t.word_text.strip().lower(), {}).setdefault(t.example, r)  # first per example
    kept = {t: list(d.values()) for t, d in by_type.items() if len(d) >= min_contexts}
    ss = np.mean([loop_self_similarity([vec[r] for r in rows]) for rows in kept.values()])
    mev = np.mean([loop_mev([vec[r] for r in rows]) for rows in kept.values()])
    sents = [[vec[r] for r in g.index] for _, g in first.groupby(["example", "sentence"])]
    intra = np.mean([loop_intra(V) for V in sents if len(V) >= 2])
    X = np.stack([vec[r] for r in first.index])
    return len(kept), ss, mev, intra, X, first["example"].to_numpy()


def test_end_to_end_table_against_literal_loops(tiny_caches, tmp_path, monkeypatch):
    cache = tiny_caches[0]
    df = run_contextuality(cache, min_contexts=5, max_contexts=1000, n_pairs=2000, n_resamples=200, seed=1,
                           out=tmp_path / "r")
    assert list(df.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert len(df) == len(METRICS) * 3 and set(df["metric"]) == set(METRICS)
    assert sorted(set(df["layer"])) == [0, 1, 2]
    assert (df["analysis"] == "contextuality").all() and (df["format"] == "pair").all()
    v = df.set_index(["layer", "metric"])
    for layer in (0, 2):
        n_types, ss, mev, intra, X, ex = _literal(cache, layer, 5)
        assert n_types >= 3
        assert v.loc[(layer, "self_similarity"), "n"] == n_types
        assert v.loc[(layer, "self_similarity"), "value"] == pytest.approx(ss, abs=1e-9)
        assert v.loc[(layer, "mev"), "value"] == pytest.approx(mev, abs=1e-9)
        assert v.loc[(layer, "intra_similarity"), "value"] == pytest.approx(intra, abs=1e-9)
        assert v.loc[(layer, "intra_similarity"), "n"] == 33  # 17 examples x 2 sentences, less 'Hello'
        b = anisotropy_baseline_ci(X, ex, n_pairs=2000, seed=1, n_resamples=200)
        got = v.loc[(layer, "anisotropy_baseline"), ["value", "ci_low", "ci_high"]].to_numpy(dtype=float)
        np.testing.assert_allclose(got, b, rtol=0, atol=1e-12)
    # adjusted = raw - baseline, for the value and both CI ends
    for raw in ("self_similarity", "intra_similarity"):
        for layer in (0, 1, 2):
            base = v.loc[(layer, "anisotropy_baseline"), "value"]
            for col in ("value", "ci_low", "ci_high"):
                want = v.loc[(layer, raw), col] - base
                assert v.loc[(layer, f"{raw}_adjusted"), col] == pytest.approx(want, abs=1e-12)
    # MEV adjusted: the mean over types of MEV(w) - MEV(as many random words from different examples)
    words, _ = word_table(cache.tokens)
    _, codes, _, _ = choose_contexts(words["type"].to_numpy(dtype=object), words["example"].to_numpy(), 5, 1000)
    rnd, rnd_set = random_word_sets(np.bincount(codes), words["example"].to_numpy(), seed=1)
    for layer in (0, 2):
        X = cache.states(layer, words["first_row"].to_numpy()).astype(np.float64)
        mev_rand = np.mean([loop_mev(X[rnd[rnd_set == k]]) for k in range(codes.max() + 1)])
        assert v.loc[(layer, "mev_adjusted"), "value"] == pytest.approx(v.loc[(layer, "mev"), "value"] - mev_rand,
                                                                         abs=1e-9)
    # MEV of random words is below MEV of the same word (trained or not, the same word id shares its embedding)
    assert (v.xs("mev_adjusted", level="metric")["value"] > 0).all()
    # centred MEV: the PCA explained-variance ratio of each type's occurrences, averaged over types
    from sklearn.decomposition import PCA

    for layer in (0, 2):
        X = cache.states(layer, words["first_row"].to_numpy()).astype(np.float64)
        sel, sel_codes, _, _ = choose_contexts(words["type"].to_numpy(dtype=object), words["example"].to_numpy(), 5,
                                               1000)
        want = np.mean([PCA(n_components=1).fit(X[sel][sel_codes == k]).explained_variance_ratio_[0]
                        for k in range(sel_codes.max() + 1)])
        assert v.loc[(layer, "mev_centred"), "value"] == pytest.approx(want, abs=1e-6)
    assert ((df["ci_low"] <= df["value"] + 1e-12) & (df["value"] <= df["ci_high"] + 1e-12)).all()
    # a second call reuses the stored table: nothing is recomputed
    monkeypatch.setattr(ctx, "self_similarity", lambda *a, **k: pytest.fail("recomputed"))
    again = run_contextuality(cache, min_contexts=5, max_contexts=1000, n_pairs=2000, n_resamples=200, seed=1,
                              out=tmp_path / "r")
    pd.testing.assert_frame_equal(df.reset_index(drop=True), again.reset_index(drop=True), check_dtype=False)
    assert len(list((tmp_path / "r").glob("contextuality-*.csv"))) == 1
    with pytest.raises(pytest.fail.Exception, match="recomputed"):
        run_contextuality(cache, min_contexts=5, max_contexts=1000, n_pairs=2000, n_resamples=200, seed=1,
                          out=tmp_path / "r", force=True)


def test_min_contexts_filters_types_and_max_contexts_caps(tiny_caches):
    cache = tiny_caches[0]
    counts = [run_contextuality(cache, layers=[1], min_contexts=m, max_contexts=100, n_pairs=200,
                                n_resamples=100).set_index("metric").loc["self_similarity", "n"] for m in (2, 5, 12)]
    literal = [_literal(cache, 1, m)[0] for m in (2, 5, 12)]
    assert counts == literal and counts[0] > counts[1] > counts[2] > 0
    capped = run_contextuality(cache, layers=[1], min_contexts=5, max_contexts=5, n_pairs=200, n_resamples=100)
    full = run_contextuality(cache, layers=[1], min_contexts=5, max_contexts=100, n_pairs=200, n_resamples=100)
    c, f = capped.set_index("metric"), full.set_index("metric")
    assert c.loc["mev", "n"] == f.loc["mev", "n"]  # same types, fewer occurrences each
    assert c.loc["mev", "value"] != f.loc["mev", "value"]
    with pytest.raises(ValueError, match="no word type occurs in 100 or more examples"):
        run_contextuality(cache, min_contexts=100, max_contexts=100, n_resamples=100)
    with pytest.raises(ValueError, match="min_contexts must be"):
        run_contextuality(cache, min_contexts=1)
    with pytest.raises(ValueError, match="max_contexts must be"):
        run_contextuality(cache, min_contexts=5, max_contexts=4)


def test_layers_subword_mean_and_no_words(tiny_caches):
    cache, nowords = tiny_caches
    first = run_contextuality(cache, layers=[-1], n_pairs=300, n_resamples=100)
    mean = run_contextuality(cache, layers=[2], subword="mean", n_pairs=300, n_resamples=100)
    assert set(first["layer"]) == {2} and set(mean["layer"]) == {2}
    assert (mean["subword"] == "mean").all()
    # the sample has multi-subword words ('unbelievably', 'shakespeare'), so pooling changes intra-similarity
    a = first.set_index("metric").loc["intra_similarity", "value"]
    b = mean.set_index("metric").loc["intra_similarity", "value"]
    assert abs(a - b) > 1e-6
    with pytest.raises(ValueError, match="no word tokens"):
        run_contextuality(nowords)
    with pytest.raises(ValueError, match=r"layer 7 is out of range; this model has layers 0..2"):
        run_contextuality(cache, layers=[7])
    assert set(run_contextuality(cache, layers="-1", n_pairs=300, n_resamples=100)["layer"]) == {2}


def test_cli_summary_and_errors(tiny_caches, tmp_path, capsys):
    cache, nowords = tiny_caches
    code = ctx.main([str(cache.path), "--out", str(tmp_path / "r"), "--pairs", "300", "--resamples", "100"])
    out = capsys.readouterr().out
    assert code == 0
    assert "self_similarity" in out and "mev_adjusted" in out and "word types in >= 5 examples" in out
    table = next((tmp_path / "r").glob("contextuality-*.csv"))
    assert f"table: {table}" in out
    assert ctx.main([str(nowords.path), "--out", str(tmp_path / "r")]) == 2
    assert "no word tokens" in capsys.readouterr().err
    argv = [str(cache.path), "--min-contexts", "99", "--max-contexts", "99", "--out", str(tmp_path / "r")]
    assert ctx.main(argv) == 2
    assert "no word type occurs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ctx.main(["--help"])
    assert "maximum explainable variance" in capsys.readouterr().out


def test_figure(tiny_caches, tmp_path):
    from matplotlib import image as mpimg

    from figures import contextuality as figmod

    df = run_contextuality(tiny_caches[0], n_pairs=300, n_resamples=100)
    paths = figmod.plot_contextuality(df, tmp_path / "fig")
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.exists() for p in paths)
    img = mpimg.imread(paths[0])
    assert img.shape[0] > 300 and len(np.unique(img.reshape(-1, img.shape[2])[::7], axis=0)) > 10
    table = tmp_path / "t.csv"
    df.to_csv(table, index=False)
    assert figmod.main([str(table), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli.png").exists() and (tmp_path / "cli.pdf").exists()
    with pytest.raises(ValueError, match="analysis"):
        figmod.plot_contextuality(df.assign(analysis="drift"), tmp_path / "x")
    mixed = pd.concat([df, df.assign(format="concat")])
    with pytest.raises(ValueError, match="format"):
        figmod.plot_contextuality(mixed, tmp_path / "x")
