"""Paired comparisons (analyses.paired) and document grouping (analyses.stats._grouping) on constructed data
with a known answer, and on tiny caches whose examples carry a ``doc`` label."""

import gc

import numpy as np
import pandas as pd
import pytest

from analyses.attention import run_attention
from analyses.drift import drift_summary, run_drift
from analyses.stats import add_holm, cache_groups, example_groups, holm, paired_difference, sign_flip_p_value
from analyses.neighbours import run_knn
from analyses.paired import main, run_paired_attention, run_paired_drift, run_role_contrast
from probing.cache import Cache
from probing.examples import Example
from probing.extract import extract


def _docs(n_docs=30, per_doc=5, effect=0.0, doc_sd=0.0, item_sd=0.1, seed=0):
    """Paired values b and a = b + effect + a document effect + item noise; groups = documents."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_docs), per_doc)
    b = rng.normal(0.5, 0.2, groups.size)
    a = b + effect + rng.normal(0, doc_sd, n_docs)[groups] + rng.normal(0, item_sd, groups.size)
    return a, b, groups


# --------------------------------------------------------------------------------------------------
# pure functions


def test_planted_difference_is_found():
    a, b, g = _docs(effect=0.05, doc_sd=0.02)
    r = paired_difference(a, b, g, n_resamples=2000)  # the p-value's resolution is about 2 / n_resamples
    assert r["p_value"] < 0.01
    assert 0 < r["ci_low"] < r["value"] < r["ci_high"] and abs(r["value"] - 0.05) < 0.02
    assert r["value"] == pytest.approx(np.mean(a - b))
    assert (r["n"], r["n_groups"]) == (150, 30)
    assert r["value_a"] == pytest.approx(a.mean()) and r["value_b"] == pytest.approx(b.mean())


def test_null_difference_rejected_at_about_the_nominal_rate():
    """No difference, correlated within documents: the cluster sign-flip test rejects at about 5%."""
    p = np.array([sign_flip_p_value(*(lambda a, b, g: (a - b, g))(*_docs(n_docs=15, per_doc=4, doc_sd=0.1,
                                                                           seed=s)), n_resamples=499, seed=s)
                  for s in range(400)])
    rate = float((p < 0.05).mean())
    assert 0.02 <= rate <= 0.09, rate  # 0.05 +- 3 binomial sd at 400 draws


def test_item_level_test_is_anticonservative_where_documents_are_not():
    """Why documents: with strong document effects and no true difference, resampling items rejects
    far too often, resampling documents does not."""
    p_item, p_doc = [], []
    for s in range(100):
        a, b, g = _docs(n_docs=10, per_doc=10, doc_sd=0.1, item_sd=0.02, seed=s)
        p_item.append(sign_flip_p_value(a - b, np.arange(a.size), n_resamples=199, seed=s))
        p_doc.append(sign_flip_p_value(a - b, g, n_resamples=199, seed=s))
    assert np.mean(np.array(p_item) < 0.05) > 0.5
    assert np.mean(np.array(p_doc) < 0.05) < 0.15


def test_sign_flip_p_has_no_floor_at_two_over_n_resamples():
    """A fixed count of n sign vectors cannot give p below 2 / (n + 1), and Holm over more than
    α (n + 1) / 2 rows then never passes (a 12-layer model's Q4 family: 36 rows at n = 1,000). Where
    fewer than 10 of the first n draws reach the observed sum, drawing goes on (Besag & Clifford 1991):
    a strong effect gets a p that Holm over 36 rows passes, and a p near 0.004 is estimated from its
    tenth reaching draw, close to the exact value."""
    from analyses.stats import _stats as stats

    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(40), 5)
    strong = sign_flip_p_value(rng.normal(1.0, 1.0, g.size), g, n_resamples=1000)
    assert strong == pytest.approx(1 / (stats.SEQUENTIAL_FACTOR * 1000 + 1)) and strong * 36 < 0.05
    # 16 groups: the exact p over all 65,536 sign vectors against the sequential estimate from 1,000 draws
    sums = np.array([1.0] * 11 + [-0.5, 0.25, -1.0, 0.3, -0.4]) + np.linspace(0, 0.01, 16)
    exact = sign_flip_p_value(sums, np.arange(16), n_resamples=2 ** 16)
    assert 0.003 < exact < 0.005  # 3 to 5 reaching draws expected in the first 1,000: fewer than 10
    estimates = [sign_flip_p_value(sums, np.arange(16), n_resamples=1000, seed=s) for s in range(20)]
    assert np.median(estimates) == pytest.approx(exact, rel=0.25)
    assert min(estimates) < 2 / 1001  # below what a fixed count of 1,000 draws could say


def test_exact_sign_flip_with_few_groups():
    # two groups with sums +1 and +1: of the 4 sign vectors, 2 reach |T| = 2
    assert sign_flip_p_value([0.5, 0.5, 1.0], ["x", "x", "y"]) == pytest.approx(0.5)
    assert sign_flip_p_value([0.0, 0.0], ["x", "y"]) == 1.0
    with pytest.raises(ValueError, match="finite"):
        sign_flip_p_value([np.nan], ["x"])
    with pytest.raises(ValueError, match="groups must have shape"):
        sign_flip_p_value([1.0, 2.0], ["x"])


def test_holm_matches_statsmodels_and_families():
    from statsmodels.stats.multitest import multipletests

    assert holm([0.01, 0.02, 0.04]).tolist() == pytest.approx([0.03, 0.04, 0.04])
    rng = np.random.default_rng(0)
    gc.freeze()  # multipletests' Holm calls gc.collect() each time: over the frozen heap it costs little
    try:
        for i in range(300):  # families of 1-40, skewed to small p, every third rounded so that p-values tie
            p = rng.uniform(size=rng.integers(1, 41)) ** 3
            p = np.round(p, 2) if i % 3 == 0 else p
            np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1], rtol=0, atol=1e-15)
    finally:
        gc.unfreeze()
    with_nan = holm([0.2, np.nan, 0.01, 0.03])
    assert np.isnan(with_nan[1]) and with_nan[[0, 2, 3]].tolist() == pytest.approx([0.2, 0.03, 0.06])
    assert holm(np.array([[0.5, 0.9], [0.01, np.nan]])).shape == (2, 2)
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
        holm([0.5, 1.2])
    df = pd.DataFrame({"role": ["x", "x", "y"], "metric": "m", "p_value": [0.01, 0.04, 0.01]})
    out = add_holm(df, ["role", "metric"])
    assert out["p_holm"].tolist() == pytest.approx([0.02, 0.04, 0.01])


def test_document_grouping_widens_the_drift_ci():
    """Tokens of one document drift together: resampling documents gives a wider interval than
    resampling examples, which treats the examples of a document as independent."""
    rng = np.random.default_rng(0)
    n_docs, ex_per_doc, tok_per_ex, dim = 12, 6, 4, 8
    doc = np.repeat(np.arange(n_docs), ex_per_doc * tok_per_ex)
    ex = np.repeat(np.arange(n_docs * ex_per_doc), tok_per_ex)
    A = rng.normal(size=(doc.size, dim)) + 3.0
    shift = rng.normal(0, 1.0, (n_docs, dim))[doc]  # one drift direction per document
    B = A + 0.5 * shift + 0.05 * rng.normal(size=A.shape)
    roles = np.full(doc.size, "s1 words")
    by_ex = {r["metric"]: r for r in drift_summary(A, B, ex, roles, n_resamples=400, n_pairs=500,
                                                    overall_label=None)}
    by_doc = {r["metric"]: r for r in drift_summary(A, B, ex, roles, n_resamples=400, n_pairs=500,
                                                     overall_label=None, clusters=doc)}
    w_ex = by_ex["drift_mean"]["ci_high"] - by_ex["drift_mean"]["ci_low"]
    w_doc = by_doc["drift_mean"]["ci_high"] - by_doc["drift_mean"]["ci_low"]
    assert by_doc["drift_mean"]["value"] == by_ex["drift_mean"]["value"]
    assert w_doc > 1.5 * w_ex
    assert by_doc["drift_mean"]["n_groups"] == n_docs and by_ex["drift_mean"]["n_groups"] == n_docs * ex_per_doc


def test_example_groups_rule():
    with_doc = [Example("a", ("x.",), {"doc": 1}), Example("b", ("y.",), {"doc": 1})]
    g, how = example_groups(with_doc)
    assert how == "document" and g.tolist() == [1, 1]
    with pytest.raises(ValueError, match=r"the 'doc' label is missing for 1 of 3 examples \('c'\)"):
        example_groups(with_doc + [Example("c", ("z.",))])  # one without: refused, not grouped by example
    g, how = example_groups([Example("c", ("z.",))])  # none with: examples
    assert how == "example" and g.tolist() == ["c"]


# --------------------------------------------------------------------------------------------------
# runners on caches


def doc_examples(n=12, per_doc=3):
    from .conftest import sample_examples

    return [Example(e.id, e.sentences, {**e.labels, "doc": f"d{i // per_doc}"})
            for i, e in enumerate(sample_examples(n, k=2))]


@pytest.fixture()
def doc_caches(tmp_path, tiny_bert):
    paths = extract(doc_examples(), ["single", "pair", "concat"], model=tiny_bert, out=tmp_path / "c",
                    attention=True, progress=False, log=lambda *a: None)
    return [Cache.open(p) for p in paths]


def test_cache_groups_reads_the_doc_label(doc_caches):
    g, how = cache_groups(doc_caches[0], np.array([0, 1, 3, 11]))
    assert how == "document" and g.tolist() == ["d0", "d0", "d1", "d3"]


def test_paired_drift_known_answers(doc_caches):
    single, pair, concat = doc_caches
    df = run_paired_drift(single, pair, concat, n_resamples=100, progress=False)
    cols = ["analysis", "model", "corpus", "format", "format_b", "reference", "layer", "role", "metric", "value",
            "ci_low", "ci_high", "p_value", "p_holm", "n", "n_groups", "grouping"]
    assert set(cols) <= set(df.columns)
    assert (df["grouping"] == "document").all() and (df["n_groups"] == 4).all()
    assert set(df["role"]) == {"s1 words"} and (df["metric"] == "drift_diff").all()
    assert (df["format"] == "pair").all() and (df["format_b"] == "concat").all() and (df["reference"] == "single").all()
    # value_a / value_b are the marginal drifts run_drift reports for the same words
    for fmt, col in (("pair", "value_a"), ("concat", "value_b")):
        d = run_drift(single, pair if fmt == "pair" else concat, words_only=True, n_resamples=100, n_pairs=100,
                      progress=False)
        ref = d[(d["metric"] == "drift_mean") & (d["role"] == "s1 words")].set_index("layer")["value"]
        got = df.set_index("layer")[col]
        np.testing.assert_allclose(got.to_numpy(), ref.reindex(got.index).to_numpy(), atol=1e-6)
    np.testing.assert_allclose(df["value"], df["value_b"] - df["value_a"], atol=1e-9)
    assert (df["p_holm"] >= df["p_value"] - 1e-12).all()
    # a format against itself: no difference at all
    same = run_paired_drift(single, pair, pair, n_resamples=100, progress=False)
    assert (same["value"] == 0).all() and (same["p_value"] == 1).all()


class _EdgeShifted:
    """A cache whose word states at sentence edges (first and last word) are rotated by a fixed amount at
    every layer, and otherwise the cache it wraps: a planted effect on the edge words only."""

    def __init__(self, cache):
        self._cache = cache
        tok = cache.tokens
        words = tok["role"].to_numpy() == "word"
        last = tok[words].groupby(["example", "sentence"])["index"].transform("max")
        self._edge = np.zeros(len(tok), dtype=bool)
        self._edge[np.flatnonzero(words)] = (tok.loc[words, "index"] == 0).to_numpy() | (
            tok.loc[words, "index"].to_numpy() == last.to_numpy())

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def states(self, layer=None, rows=None, dtype=np.float32):
        h = self._cache.states(layer, rows, dtype)
        rows = np.arange(self._cache.n_tokens) if rows is None else np.asarray(rows)
        e = self._edge[rows]
        h[e] = h[e] + 0.5 * np.linalg.norm(h[e], axis=-1, keepdims=True) * np.roll(h[e], 1, axis=-1) / \
            np.linalg.norm(h[e], axis=-1, keepdims=True)
        return h


def test_paired_drift_edges_find_a_planted_edge_effect_and_no_inner_one(doc_caches):
    """B = A with only sentence 1's first and last words moved: the edge rows find it, the inner rows
    are exactly 0, and the rows of all words lie between them (their token-weighted mean)."""
    single, pair, _ = doc_caches
    df = run_paired_drift(single, pair, _EdgeShifted(pair), edges=True, n_resamples=100, progress=False)
    assert set(df["role"]) == {"s1 words", "s1 inner words", "s1 edge words"}
    by = {r: g.set_index("layer") for r, g in df.groupby("role")}
    assert (by["s1 inner words"]["value"] == 0).all() and (by["s1 inner words"]["p_value"] == 1).all()
    assert (by["s1 edge words"]["value"] > 0.01).all() and (by["s1 edge words"]["ci_low"] > 0).all()
    weighted = (by["s1 inner words"]["value"] * by["s1 inner words"]["n"] + by["s1 edge words"]["value"]
                * by["s1 edge words"]["n"]) / (by["s1 inner words"]["n"] + by["s1 edge words"]["n"])
    np.testing.assert_allclose(by["s1 words"]["value"], weighted, atol=1e-6)
    assert (by["s1 words"]["n"] == by["s1 inner words"]["n"] + by["s1 edge words"]["n"]).all()
    # without edges, the table is what it was (and so is its stored key)
    plain = run_paired_drift(single, pair, _EdgeShifted(pair), n_resamples=100, progress=False)
    assert set(plain["role"]) == {"s1 words"}


def test_edge_cells_on_a_constructed_token_table():
    from analyses.paired import edge_cells

    tok = pd.DataFrame({"example": [0, 0, 0, 0, 0, 0, 1, 1, 1], "sentence": [0, 1, 1, 1, 1, 1, 1, 1, 2],
                        "role": ["cls", "word", "word", "word", "word", "sep", "word", "word", "word"],
                        "index": [0, 0, 1, 2, 3, 0, 0, 1, 0]})
    roles = np.array(["cls", "s1 words", "s1 words", "s1 words", "s1 words", "sep1", "s1 words", "s1 words",
                      "s2 words"])
    cells = dict(edge_cells(tok, roles))
    assert cells["s1 inner words"].tolist() == [False, False, True, True, False, False, False, False, False]
    assert cells["s1 edge words"].tolist() == [False, True, False, False, True, False, True, True, False]
    assert cells["s2 edge words"].tolist() == [False] * 8 + [True] and "s2 inner words" not in cells


def test_paired_drift_per_example_and_all_tokens(doc_caches):
    single, pair, concat = doc_caches
    df = run_paired_drift(single, pair, concat, unit="example", words_only=False, n_resamples=100, progress=False)
    assert (df["n"] == 12).all() and (df["unit"] == "example").all()
    with pytest.raises(ValueError, match="unit"):
        run_paired_drift(single, pair, concat, unit="word", progress=False)


def test_role_contrast_cls_minus_words(doc_caches, tmp_path):
    _, pair, concat = doc_caches
    both = run_role_contrast(pair, concat, "cls", n_resamples=100, n_pairs=100, out=tmp_path / "r", progress=False)
    d = run_drift(pair, concat, n_resamples=100, n_pairs=100, progress=False)
    cls = d[(d["metric"] == "drift_mean") & (d["role"] == "cls")].set_index("layer")["value"]
    df = both[both["metric"] == "drift_diff_roles"]
    got = df.set_index("layer")
    assert got.index.tolist() == sorted(set(d["layer"]))
    np.testing.assert_allclose(got["value_a"], cls.reindex(got.index), atol=1e-6)  # one [CLS] per example
    np.testing.assert_allclose(got["value"], got["value_a"] - got["value_b"], atol=1e-9)
    assert (df["role"] == "cls").all() and (df["role_b"] == "words").all() and (df["grouping"] == "document").all()
    # normalised: each group's drift over its own spread, 1 − the mean cosine of its random pairs (the same
    # pairs as the drift table's [CLS] baseline: same rows, seed and count); none at the embedding layer,
    # where [CLS] is one vector for every input
    norm = both[both["metric"] == "normalised_drift_diff_roles"].set_index("layer")
    assert 0 not in norm.index and norm.index.tolist() == [l for l in got.index if l > 0]
    cls_base = d[(d["metric"] == "anisotropy_baseline") & (d["role"] == "cls")].set_index("layer")["value"]
    np.testing.assert_allclose(norm["spread_a"], 1 - cls_base.reindex(norm.index), rtol=1e-12)
    np.testing.assert_allclose(norm["value_a"], got["value_a"].reindex(norm.index) / norm["spread_a"], rtol=1e-6)
    np.testing.assert_allclose(norm["value_b"], got["value_b"].reindex(norm.index) / norm["spread_b"], rtol=1e-6)
    np.testing.assert_allclose(norm["value"], norm["value_a"] - norm["value_b"], atol=1e-9)
    assert (norm["p_holm"] >= norm["p_value"]).all()
    assert len(list((tmp_path / "r").glob("role_contrast-*.csv"))) == 1
    with pytest.raises(ValueError, match="'nope'"):
        run_role_contrast(pair, concat, "nope", progress=False)


def test_paired_cli(doc_caches, tmp_path, capsys):
    single, pair, concat = (str(c.path) for c in doc_caches)
    assert main([single, pair, concat, "--resamples", "100", "--out", str(tmp_path / "r")]) == 0
    assert "document" in capsys.readouterr().out
    assert main(["--contrast", "cls", pair, concat, "--resamples", "100", "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out  # both contrasts, each row named by its metric
    assert "normalised_drift_diff_roles" in printed and " drift_diff_roles" in printed
    assert main([single, pair]) == 2
    assert "expected 3 cache directories" in capsys.readouterr().err


def test_runner_tables_record_document_grouping(doc_caches):
    single, pair, concat = doc_caches
    d = run_drift(pair, concat, n_resamples=100, n_pairs=100, progress=False)
    cells = d[d["metric"] != "anisotropy_baseline"]
    assert (cells["grouping"] == "document").all()
    assert (cells.loc[cells["role"] == "cls", "n_groups"] == 4).all()
    a = run_attention(pair, n_resamples=100, per_head=False)
    assert (a["grouping"] == "document").all() and (a["n_groups"] == 4).all()
    k = run_knn(pair, ("cls",), "topic", n_resamples=100)
    assert (k["grouping"] == "document").all() and (k["n_groups"] == 4).all()
    # the CI of a document-grouped cell equals a bootstrap over documents of the same values
    hit = k[k["metric"] == "knn_accuracy"].iloc[0]
    assert hit["n"] == 12


def test_paired_attention_pair_vs_concat(doc_caches):
    _, pair, concat = doc_caches
    df = run_paired_attention(pair, concat, n_resamples=100)
    att_p, att_c = (run_attention(c, n_resamples=100, per_head=False) for c in (pair, concat))
    for col, att in (("value_a", att_p), ("value_b", att_c)):
        ref = att[(att["role"] == "s1 words") & (att["target"] == "s2 words")].set_index("layer")["value"]
        np.testing.assert_allclose(df.set_index("layer")[col], ref.reindex(df["layer"]).to_numpy(), atol=1e-9)
    np.testing.assert_allclose(df["value"], df["value_b"] - df["value_a"], atol=1e-12)
    assert (df["grouping"] == "document").all() and (df["metric"] == "attention_diff").all()
    same = run_paired_attention(pair, pair, n_resamples=100)
    assert (same["value"] == 0).all() and (same["p_value"] == 1).all()
    with pytest.raises(ValueError, match="no attention pair"):
        run_paired_attention(pair, concat, pairs=[("s1 words", "sep9")])


# --------------------------------------------------------------------------------------------------
# the format effect as the input grows (Q3): the first 2 and the first 4 sentences of the same documents


@pytest.fixture()
def prefix_caches(tmp_path, tiny_bert):
    from .conftest import sample_examples

    full = [Example(e.id, e.sentences, {**e.labels, "doc": f"d{i // 2}"})
            for i, e in enumerate(sample_examples(24, k=4))]
    out = {}
    for k in (2, 4):
        part = [Example(e.id, e.sentences[:k], e.labels) for e in full]
        paths = extract(part, ["multi", "concat"], model=tiny_bert, out=tmp_path / f"k{k}", progress=False,
                        log=lambda *a: None)
        out[k] = [Cache.open(p) for p in paths]
    return out


def test_prefix_drift_known_answers(prefix_caches):
    from analyses.paired import run_prefix_drift

    (sm, sc), (lm, lc) = prefix_caches[2], prefix_caches[4]
    both = run_prefix_drift(sm, sc, lm, lc, n_resamples=200, n_pairs=100, progress=False)
    df = both[both["metric"] == "drift_growth"]
    assert set(df["role"]) == {"cls", "s1 words", "s2 words", "all"}  # no [SEP], no word of sentences 3-4
    assert set(both["metric"]) == {"drift_growth", "normalised_drift_growth", "own_spread_drift_growth"}
    assert (df["grouping"] == "document").all()
    # normalised: both drifts over the role's spread in the short inputs (the drift table's own baseline of
    # that role: the same rows, seed and pairs), so the p-value is the raw row's; none for the pooled "all",
    # nor at layer 0 for [CLS] (one vector for every input)
    norm = both[both["metric"] == "normalised_drift_growth"]
    assert set(norm["role"]) == {"cls", "s1 words", "s2 words"}
    assert 0 not in set(norm.loc[norm["role"] == "cls", "layer"])
    d_short = run_drift(sm, sc, n_resamples=100, n_pairs=100, progress=False)
    for role in ("cls", "s1 words"):
        n_ = norm[norm["role"] == role].set_index("layer")
        raw = df[df["role"] == role].set_index("layer").reindex(n_.index)
        base = d_short[(d_short["metric"] == "anisotropy_baseline") & (d_short["role"] == role)].set_index("layer")
        np.testing.assert_allclose(n_["spread_a"], 1 - base["value"].reindex(n_.index), rtol=1e-9)
        np.testing.assert_allclose(n_["value"], raw["value"] / n_["spread_a"], rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(n_["p_value"], raw["p_value"])
    # each input's drift over its own spread: spread_b is the long inputs' baseline of the role (the drift
    # table's, the same tokens: [CLS] and sentence 1's words are in both), and the row is d_long / spread_b
    # − d_short / spread_a, paired per token, with a CI of its own
    own = both[both["metric"] == "own_spread_drift_growth"]
    assert set(own["role"]) == set(norm["role"])
    d_long = run_drift(lm, lc, n_resamples=100, n_pairs=100, progress=False)
    for role in ("cls", "s1 words"):
        o = own[own["role"] == role].set_index("layer")
        n_ = norm[norm["role"] == role].set_index("layer").reindex(o.index)
        raw = df[df["role"] == role].set_index("layer").reindex(o.index)
        base_b = d_long[(d_long["metric"] == "anisotropy_baseline") & (d_long["role"] == role)].set_index("layer")
        np.testing.assert_allclose(o["spread_a"], n_["spread_a"], rtol=1e-12)
        np.testing.assert_allclose(o["spread_b"], 1 - base_b["value"].reindex(o.index), rtol=1e-9)
        np.testing.assert_allclose(o["value_a"], raw["value_a"] / o["spread_a"], rtol=1e-6)
        np.testing.assert_allclose(o["value_b"], raw["value_b"] / o["spread_b"], rtol=1e-6)
        np.testing.assert_allclose(o["value"], o["value_b"] - o["value_a"], rtol=1e-6, atol=1e-12)
        assert ((o["ci_low"] <= o["value"] + 1e-12) & (o["value"] <= o["ci_high"] + 1e-12)).all()
        assert (o["p_holm"] >= o["p_value"] - 1e-12).all()
    assert (df["n_groups"] == 12).all() and (df["k"] == 2).all() and (df["k_b"] == 4).all()
    # value_a / value_b are the marginal drifts run_drift reports for the same tokens in each input
    for cache_a, cache_b, col in ((sm, sc, "value_a"), (lm, lc, "value_b")):
        d = run_drift(cache_a, cache_b, n_resamples=100, n_pairs=100, progress=False)
        for role in ("cls", "s1 words", "s2 words"):
            ref = d[(d["metric"] == "drift_mean") & (d["role"] == role)].set_index("layer")["value"]
            got = df[df["role"] == role].set_index("layer")[col]
            np.testing.assert_allclose(got.to_numpy(), ref.reindex(got.index).to_numpy(), atol=1e-6)
    np.testing.assert_allclose(df["value"], df["value_b"] - df["value_a"], atol=1e-9)
    # layer 0 holds token, position and segment embeddings only: the same for a shared word at k = 2 and 4
    assert df.loc[df["layer"] == 0, "value"].abs().max() < 1e-6
    assert (df["p_holm"] >= df["p_value"] - 1e-12).all()


def test_prefix_drift_null_and_planted(prefix_caches):
    from analyses.paired import run_prefix_drift

    (sm, sc), (lm, lc) = prefix_caches[2], prefix_caches[4]
    null = run_prefix_drift(sm, sc, sm, sc, n_resamples=200, progress=False)  # the same inputs twice
    assert (null["value"] == 0).all() and (null["p_value"] == 1).all()
    # planted: no drift at all in the short inputs (a format against itself), multi -> concat in the long ones
    planted = run_prefix_drift(sm, sm, lm, lc, n_resamples=200, progress=False)
    words = planted[(planted["role"] == "all") & (planted["layer"] >= 1)]
    assert (words["value_a"] == 0).all() and (words["ci_low"] > 0).all() and (words["p_value"] < 0.01).all()


def test_prefix_drift_edges_leave_a_planted_edge_effect_out_of_cls_and_inner_words(prefix_caches):
    """Short inputs against themselves (no drift), the long ones against themselves with only the edge
    words moved: every edge cell finds it; [CLS] and the inner words show exactly none."""
    from analyses.paired import run_prefix_drift

    (sm, _), (lm, _) = prefix_caches[2], prefix_caches[4]
    both = run_prefix_drift(sm, sm, lm, _EdgeShifted(lm), edges=True, n_resamples=200, n_pairs=100, progress=False)
    df = both[both["metric"] == "drift_growth"]
    assert {"cls and inner words", "inner words", "s1 inner words", "s1 edge words", "s2 inner words",
            "s2 edge words"} <= set(df["role"])
    by = {r: g for r, g in df.groupby("role")}
    for role in ("cls and inner words", "inner words", "s1 inner words", "s2 inner words", "cls"):
        assert (by[role]["value"] == 0).all() and (by[role]["p_value"] == 1).all(), role
    for role in ("s1 edge words", "s2 edge words", "all"):
        assert (by[role]["ci_low"] > 0).all(), role
    # "inner words" is the inner words of both sentences together: as many tokens as the two cells, and its
    # spread is that of those words (a normalised row, unlike the cells that mix [CLS] with words)
    assert (by["inner words"]["n"].to_numpy() == by["s1 inner words"]["n"].to_numpy()
            + by["s2 inner words"]["n"].to_numpy()).all()
    norm = both[both["metric"] == "normalised_drift_growth"]
    assert "inner words" in set(norm["role"]) and not {"all", "cls and inner words"} & set(norm["role"])
    assert (norm.loc[norm["role"] == "inner words", "spread_a"] > 0.01).all()
    assert set(run_prefix_drift(sm, sm, lm, _EdgeShifted(lm), n_resamples=100, progress=False)["role"]) == {
        "cls", "s1 words", "s2 words", "all"}


def test_prefix_drift_refuses_other_documents(prefix_caches, tmp_path, tiny_bert):
    from analyses.paired import run_prefix_drift
    from probing.cache import IncomparableCaches, check_prefix

    from .conftest import sample_examples

    (sm, sc), (lm, _) = prefix_caches[2], prefix_caches[4]
    with pytest.raises(IncomparableCaches, match="more sentences"):
        check_prefix(lm, sm)  # the long one is no prefix of the short one
    other = [Example(e.id, (e.sentences[0], "Another second sentence.", *e.sentences[2:]), e.labels)
             for e in sample_examples(24, k=4)]
    paths = extract(other, ["multi", "concat"], model=tiny_bert, out=tmp_path / "other", progress=False,
                    log=lambda *a: None)
    om, oc = (Cache.open(p) for p in paths)
    with pytest.raises(IncomparableCaches, match="sentence_2 differs in 24 examples"):
        run_prefix_drift(sm, sc, om, oc, progress=False)
    renamed = [Example(f"x{e.id}", e.sentences, e.labels) for e in sample_examples(24, k=4)]
    paths = extract(renamed, ["multi", "concat"], model=tiny_bert, out=tmp_path / "renamed", progress=False,
                    log=lambda *a: None)
    with pytest.raises(IncomparableCaches, match="different examples"):
        run_prefix_drift(sm, sc, *(Cache.open(p) for p in paths), progress=False)


def test_prefix_cli(prefix_caches, tmp_path, capsys):
    (sm, sc), (lm, lc) = prefix_caches[2], prefix_caches[4]
    paths = [str(c.path) for c in (sm, sc, lm, lc)]
    assert main(["--prefix", *paths, "--resamples", "100", "--out", str(tmp_path / "r")]) == 0
    assert "s2 words" in capsys.readouterr().out
    assert len(list((tmp_path / "r").glob("prefix_drift-*.csv"))) == 1
    assert main(["--prefix", *paths[:3]]) == 2
    assert "expected 4 cache directories" in capsys.readouterr().err
    assert main(["--prefix", "--attention", *paths[:2]]) == 2
    assert "separate analyses" in capsys.readouterr().err
