"""analyses.representation_change: how far a representation moves under a change of input, in units of its
spread, on constructed data with a known answer (planted moves found, nulls not) and on tiny caches."""

import numpy as np
import pytest

from analyses.representation_change import (change_comparison, change_summary, example_means, group_mask,
                                            resampled_means, run_representation_change, share_of_spread,
                                            token_pairs)
from probing.cache import Cache
from probing.corpus_pairs import swap_adjacent_words
from probing.examples import Example
from probing.extract import extract
from probing.interventions import Intervention, Knockout

R = 200  # bootstrap resamples: the floor is 100


# --------------------------------------------------------------------------------------------------
# pure functions


def test_share_of_spread_known_values_and_refusals():
    A = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    B = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    np.testing.assert_allclose(share_of_spread(A, B, 0.5), [0.0, 2.0, 4.0])
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="spread must be a positive number"):
            share_of_spread(A, B, bad)


def test_example_means_and_resampled_means():
    ids, means = example_means([1.0, 3.0, 10.0], ["b", "b", "a"])
    assert ids.tolist() == ["a", "b"] and means.tolist() == [10.0, 2.0]
    v = np.arange(12, dtype=float)
    groups = np.repeat(np.arange(4), 3)
    draws = resampled_means(np.stack([v, 2 * v], axis=1), groups, n_resamples=R, seed=1)
    assert draws.shape == (R, 2)
    np.testing.assert_allclose(draws[:, 1], 2 * draws[:, 0])  # the columns share every resample
    assert abs(draws[:, 0].mean() - v.mean()) < 1.0
    # the same seed draws the same resamples
    np.testing.assert_array_equal(draws, resampled_means(np.stack([v, 2 * v], axis=1), groups, R, seed=1))
    with pytest.raises(ValueError, match="resamples"):
        resampled_means(v, groups, n_resamples=10)


def _docs(effect: float, n_docs: int = 40, per_doc: int = 5, seed: int = 0):
    """Per-example shares of two changes on the same examples: b, and a = b + effect + document and item noise."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_docs), per_doc)
    b = rng.uniform(0.02, 0.06, groups.size)
    a = b + effect + rng.normal(0, 0.01, n_docs)[groups] + rng.normal(0, 0.01, groups.size)
    return a, b, groups


def test_a_planted_difference_between_two_changes_is_found():
    a, b, g = _docs(effect=0.03)
    r = change_comparison(a, b, g, n_resamples=1000)
    assert 0 < r["ci_low"] < r["value"] < r["ci_high"] and abs(r["value"] - 0.03) < 0.01
    assert r["value"] == pytest.approx(np.mean(a - b)) and r["value_a"] == pytest.approx(a.mean())
    assert r["ratio"] == pytest.approx(a.mean() / b.mean()) and 1 < r["ratio_low"] < r["ratio"] < r["ratio_high"]
    assert (r["n"], r["n_groups"], r["n_resamples"]) == (200, 40, 1000)
    # the bootstrap SE is the large-sample value of the cluster standard error
    from analyses.stats import cluster_se

    assert r["se"] == pytest.approx(cluster_se(a - b, g), rel=0.2)


def test_no_difference_is_not_found_at_more_than_the_nominal_rate():
    """Two changes of the same size, correlated within documents: the 95% interval excludes 0 about 5% of
    the time."""
    hits = 0
    for s in range(200):
        a, b, g = _docs(effect=0.0, n_docs=15, per_doc=4, seed=s)
        r = change_comparison(a, b, g, n_resamples=R, seed=s)
        hits += not (r["ci_low"] <= 0 <= r["ci_high"])
    assert hits / 200 <= 0.10


def test_summary_of_one_group_has_no_interval():
    r = change_summary([0.1, 0.3], ["d", "d"], n_resamples=R)
    assert r["value"] == pytest.approx(0.2) and np.isnan(r["se"]) and np.isnan(r["ci_low"])
    with pytest.raises(ValueError, match="paired item by item"):
        change_comparison([0.1, 0.2], [0.1], [0, 1], n_resamples=R)


# --------------------------------------------------------------------------------------------------
# tiny caches


def _examples(n: int = 16, per_doc: int = 4) -> list[Example]:
    from .conftest import sample_examples

    return [Example(e.id, e.sentences, {**e.labels, "doc": f"d{i // per_doc}"})
            for i, e in enumerate(sample_examples(n, k=2))]


def _replaced(examples: list[Example]) -> list[Example]:
    """Sentence 2 replaced by another sentence (the same for every example: only the content changes)."""
    return [Example(e.id, (e.sentences[0], "Nobody had expected the weather to turn so quickly."), e.labels)
            for e in examples]


@pytest.fixture(scope="module")
def caches(tmp_path_factory, bert_tokenizer):
    """pair and concat of the examples; pair of the examples with two words of sentence 1 swapped; pair and
    concat of the examples with sentence 2 replaced; pair and pair-with-sentence-2-replaced extracted with
    sentence 1's words unable to attend to anything outside sentence 1 (a planted null of the interchange)."""
    from probing.models import prepare_model
    from .conftest import make_tiny_bert

    # weights 15 times the default scale: attention then depends on content and order (at BERT's initial scale it is
    # near uniform, so a random model hardly sees word order or which sentence a word sits next to)
    lm = prepare_model(make_tiny_bert(bert_tokenizer, initializer_range=0.3), bert_tokenizer, name="tiny-bert")
    out = tmp_path_factory.mktemp("rc")
    kw = dict(model=lm, out=out, progress=False, log=lambda *a: None)
    ex = _examples()
    swapped = swap_adjacent_words(ex, fraction=1.0, seed=3)
    replaced = _replaced(ex)
    c = {}
    c["pair"], c["concat"] = extract(ex, ["pair", "concat"], corpus_name="pairs", **kw)
    (c["swap"],) = extract(swapped, ["pair"], corpus_name="swapped", **kw)
    c["r_pair"], c["r_concat"] = extract(replaced, ["pair", "concat"], corpus_name="replaced", **kw)
    walled = Intervention(tuple(Knockout("s1", keys, (1, 2)) for keys in ("s2", "sep", "cls")))
    (c["w_pair"],) = extract(ex, ["pair"], corpus_name="pairs", intervention=walled, **kw)
    (c["w_r_pair"],) = extract(replaced, ["pair"], corpus_name="replaced", intervention=walled, **kw)
    return {k: Cache.open(p) for k, p in c.items()}, swapped, lm


class _Rotated:
    """A cache whose word tokens of sentence ``sentence`` are rotated by angle ``theta`` at every layer but 0
    (1 − cos = 1 − cos(theta) exactly for each), and otherwise the cache it wraps: a planted move."""

    def __init__(self, cache, sentence: int, theta: float):
        self._cache, self._theta = cache, theta
        tok = cache.tokens
        self._moved = (tok["role"].to_numpy() == "word") & (tok["sentence"].to_numpy() == sentence)

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def states(self, layer=None, rows=None, dtype=np.float32):
        h = self._cache.states(layer, rows, np.float64)
        rows = np.arange(self._cache.n_tokens) if rows is None else np.asarray(rows)
        m = self._moved[rows]
        x = h[m] if layer is not None else h[m][:, 1:]  # (k, [layers,] dim); layer 0 left alone
        u = np.roll(x, 1, axis=-1)
        u = u - (u * x).sum(-1, keepdims=True) / (x * x).sum(-1, keepdims=True) * x
        u = u / np.linalg.norm(u, axis=-1, keepdims=True) * np.linalg.norm(x, axis=-1, keepdims=True)
        y = np.cos(self._theta) * x + np.sin(self._theta) * u
        if layer is None:
            h[np.flatnonzero(m)[:, None], np.arange(1, h.shape[1])[None, :]] = y
        elif layer != 0:
            h[m] = y
        return h.astype(dtype)


def test_a_cache_against_itself_moves_nothing(caches):
    c, _, _ = caches
    df = run_representation_change({"same": (c["pair"], c["pair"])},
                                   {"words": ["same"], "s1 words": ["same"], "mean": ["same"], "cls": ["same"]},
                                   n_resamples=R)
    share = df[df["metric"] == "share"]
    assert set(share["layer"]) == {0, 1, 2} and len(share) == 12
    finite = share[np.isfinite(share["value"])]
    assert np.allclose(finite["value"], 0, atol=1e-6)
    # [CLS] is one vector for every input at layer 0: no spread, no share
    cls0 = share[(share["choice"] == "cls") & (share["layer"] == 0)]
    assert cls0["value"].isna().all() and (cls0["spread"] < 1e-9).all()
    assert (share["grouping"] == "document").all() and (share["n_groups"] == 4).all()


def test_a_planted_rotation_is_measured_exactly(caches):
    """Sentence 2's words rotated by theta: their share is (1 − cos theta) / spread at every layer but 0,
    sentence 1's words do not move, and the pair→rotated − swap comparison finds the planted size."""
    c, _, _ = caches
    theta = 0.3
    rotated = _Rotated(c["pair"], 2, theta)
    df = run_representation_change({"rot": (c["pair"], rotated), "swap": (c["pair"], c["swap"])},
                                   {"s1 words": ["rot", "swap"], "s2 words": ["rot", "swap"]},
                                   comparisons=[("rot", "swap")], n_resamples=R)
    share = df[df["metric"] == "share"].set_index(["role", "change", "layer"])
    for layer in (1, 2):
        row = share.loc[("s2 words", "rot", layer)]
        assert row["value"] == pytest.approx((1 - np.cos(theta)) / row["spread"], rel=1e-5)
        assert row["drift"] == pytest.approx(1 - np.cos(theta), rel=1e-5)
        assert abs(share.loc[("s1 words", "rot", layer), "value"]) < 1e-6
    assert abs(share.loc[("s2 words", "rot", 0), "value"]) < 1e-6
    diff = df[(df["metric"] == "share_diff") & (df["role"] == "s2 words")].set_index("layer")
    planted = (1 - np.cos(theta)) / share.loc[("s2 words", "rot", 2), "spread"]
    swap2 = share.loc[("s2 words", "swap", 2), "value"]
    assert diff.loc[2, "value"] == pytest.approx(planted - swap2, rel=1e-4)
    assert diff.loc[2, "change"] == "rot" and diff.loc[2, "change_b"] == "swap"
    ratio = df[(df["metric"] == "share_ratio") & (df["role"] == "s2 words")].set_index("layer")
    assert ratio.loc[2, "value"] == pytest.approx(planted / swap2, rel=1e-4)


def test_the_swapped_words_drop_out_and_layer_zero_is_a_null(caches):
    c, swapped, _ = caches
    pairs = token_pairs(c["pair"], c["swap"], "s1 words")
    tok = c["pair"].tokens
    s1 = int(group_mask(tok, "s1 words").sum())
    # every swapped word's tokens are missing, every other token of sentence 1 is paired
    swapped_words = sum(2 for e in swapped if e.labels["swapped"])
    assert len(pairs) < s1 and s1 - len(pairs) >= swapped_words
    df = run_representation_change({"concat": (c["pair"], c["concat"]), "swap": (c["pair"], c["swap"])},
                                   {"s1 words": ["concat", "swap"]}, comparisons=[("concat", "swap")],
                                   n_resamples=R)
    share = df[df["metric"] == "share"].set_index(["change", "layer"])
    # layer 0: sentence 1's words keep token, position and segment in concat and (but the swapped ones) under a swap
    assert abs(share.loc[("concat", 0), "value"]) < 1e-6 and abs(share.loc[("swap", 0), "value"]) < 1e-6
    # above it, dropping the [SEP] and a swap move them
    for change in ("concat", "swap"):
        assert share.loc[(change, 2), "value"] > 0.001 and share.loc[(change, 2), "ci_low"] > 0
    assert (share["n"] == 16).all()


def test_interchange_finds_a_planted_wall_and_no_effect_where_there_is_none(caches):
    """Sentence 1's words cannot see outside sentence 1 in the walled pair: replacing sentence 2 moves them by
    nothing there, but does in the clean concat; the comparison concat − walled pair finds it. In the walled
    pair against itself (walled both sides) nothing moves at any layer."""
    c, _, _ = caches
    df = run_representation_change({"pair": (c["w_pair"], c["w_r_pair"]), "concat": (c["concat"], c["r_concat"])},
                                   {"s1 words": ["pair", "concat"], "mean_s1": ["pair", "concat"]},
                                   comparisons=[("concat", "pair")], n_resamples=R)
    assert df.loc[df["choice"] == "mean_s1", "role"].isna().all()  # a token choice has no token role
    share = df[df["metric"] == "share"].fillna({"role": ""}).set_index(["role", "choice", "change", "layer"])
    for layer in (0, 1, 2):
        assert abs(share.loc[("s1 words", "", "pair", layer), "value"]) < 1e-5
        assert abs(share.loc[("", "mean_s1", "pair", layer), "value"]) < 1e-5
    assert share.loc[("s1 words", "", "concat", 2), "value"] > 0.001
    diff = df[(df["metric"] == "share_diff") & (df["role"] == "s1 words")].set_index("layer")
    assert diff.loc[2, "ci_low"] > 0 and diff.loc[2, "value"] == pytest.approx(
        share.loc[("s1 words", "", "concat", 2), "value"], abs=1e-5)
    assert abs(diff.loc[0, "value"]) < 1e-6  # no context at the embeddings in either format
    assert (df["format"].isin(["pair", "concat"])).all() and set(df["corpus_b"]) == {"replaced"}


def test_stored_table_is_reused(caches, tmp_path):
    c, _, _ = caches
    kw = dict(n_resamples=R, out=tmp_path)
    first = run_representation_change({"concat": (c["pair"], c["concat"])}, {"cls": ["concat"]}, **kw)
    again = run_representation_change({"concat": (c["pair"], c["concat"])}, {"cls": ["concat"]}, **kw)
    assert not first.attrs["reused"] and again.attrs["reused"]
    assert list(first.columns) == list(again.columns) and len(first) == len(again) == 3
    np.testing.assert_allclose(first["value"], again["value"])


def test_bad_requests_are_refused_before_any_work(caches, bert_tokenizer, tmp_path):
    c, _, lm = caches
    with pytest.raises(ValueError, match="unknown representation 'pooler'"):
        run_representation_change({"x": (c["pair"], c["concat"])}, {"pooler": ["x"]}, n_resamples=R)
    with pytest.raises(ValueError, match=r"names changes \['y'\]"):
        run_representation_change({"x": (c["pair"], c["concat"])}, {"cls": ["y"]}, n_resamples=R)
    with pytest.raises(ValueError, match="comparison"):
        run_representation_change({"x": (c["pair"], c["concat"])}, {"cls": ["x"]}, comparisons=[("x", "z")],
                                  n_resamples=R, out=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
    from probing.models import prepare_model
    from .conftest import make_tiny_bert

    other = prepare_model(make_tiny_bert(bert_tokenizer, seed=1), bert_tokenizer, name="tiny-bert")
    (p,) = extract(_examples(), ["concat"], model=other, out=tmp_path / "o", progress=False, log=lambda *a: None)
    with pytest.raises(ValueError, match="different models"):
        run_representation_change({"x": (c["pair"], Cache.open(p))}, {"cls": ["x"]}, n_resamples=R)
    unrelated = [Example(f"u{i}", ("A sentence here.", "And another one.")) for i in range(4)]
    (q,) = extract(unrelated, ["concat"], model=lm, out=tmp_path / "u", progress=False, log=lambda *a: None)
    with pytest.raises(ValueError, match="no example id in common"):
        run_representation_change({"x": (c["pair"], Cache.open(q))}, {"cls": ["x"]}, n_resamples=R)
