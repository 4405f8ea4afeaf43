"""The chunked reads that keep the analyses' memory flat in corpus size (benchmarks/memory.py) give the same
results as the whole-array computations they replaced: bit for bit where only the reading is chunked, to
float rounding where sums are accumulated in another order (streaming CKA matrix, bootstrap batches)."""

import numpy as np
import pandas as pd
import pytest

import analyses.drift._metrics as drift_metrics
import analyses.stats._intervals as intervals
import analyses.selection as selection
import probing.cache as cache_module
from analyses.attention import group_counts
from analyses.cka import linear_cka_matrix, run_cka_matrix
from analyses.drift import run_drift
from analyses.stats import cache_groups, table_groups
from probing.cache import Cache
from probing.extract import extract


@pytest.fixture()
def caches(tmp_path, tiny_bert):
    from .conftest import sample_examples

    paths = extract(sample_examples(12, k=2), ["pair", "concat"], model=tiny_bert, out=tmp_path / "c",
                    attention=True, progress=False, log=lambda *a: None)
    return [Cache.open(p) for p in paths]


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of a few rows, so that every chunked loop runs many times on the tiny corpus."""
    monkeypatch.setattr(cache_module, "READ_CHUNK_BYTES", 1)
    monkeypatch.setattr(drift_metrics, "_BLOCK_ROWS", 7)
    monkeypatch.setattr(selection, "POOL_CHUNK_ROWS", 5)


def _whole(cache: Cache, layer, rows) -> np.ndarray:
    arr = np.concatenate([np.load(cache._check(s, "states"), allow_pickle=False) for s in cache._shards])
    return arr[np.asarray(rows)] if layer is None else arr[np.asarray(rows), cache.layer_index(layer)]


@pytest.mark.parametrize("seed", [0, 1])
def test_states_read_in_windows_equal_the_stored_rows(caches, small_chunks, seed):
    pair = caches[0]
    rows = np.random.default_rng(seed).integers(0, pair.n_tokens, 50)  # scattered, unsorted, repeated
    np.testing.assert_array_equal(pair.states(1, rows), _whole(pair, 1, rows))
    np.testing.assert_array_equal(pair.states(None, rows), _whole(pair, None, rows).astype(np.float32))
    lazy = pair.layer_rows(1, rows)
    assert lazy.shape == (50, pair.hidden_size) and len(lazy) == 50
    np.testing.assert_array_equal(np.asarray(lazy), _whole(pair, 1, rows))
    np.testing.assert_array_equal(lazy[3:9], _whole(pair, 1, rows[3:9]))
    np.testing.assert_array_equal(lazy[np.array([4, 0, 4])], _whole(pair, 1, rows[[4, 0, 4]]))
    np.testing.assert_array_equal(lazy[2], _whole(pair, 1, rows[[2]])[0])


def test_layer_rows_refuses_an_unknown_layer(caches):
    with pytest.raises(KeyError, match="layer 9 is not in this cache"):
        caches[0].layer_rows(9)


@pytest.mark.parametrize("kw", [{}, {"standardise": True}, {"subword": "mean"}, {"words_only": True}])
def test_drift_on_lazy_rows_equals_drift_on_whole_layers(caches, small_chunks, monkeypatch, kw):
    pair, concat = caches[:2]
    args = dict(n_resamples=100, n_pairs=300, progress=False, **kw)
    chunked = run_drift(pair, concat, **args)
    monkeypatch.setattr(Cache, "layer_rows", lambda self, layer, rows: self.states(layer, rows))  # the old read
    whole = run_drift(pair, concat, **args)
    pd.testing.assert_frame_equal(chunked, whole, check_exact=True)


def _old_pooled(cache: Cache, layer: int, choice: str):
    """The whole-layer pooling that :func:`analyses.selection.pooled` replaced."""
    kind, arg = selection.parse_choice(choice)
    if kind not in ("mean", "max", "mean_s<i>"):
        ex, rows = selection.choice_rows(cache, choice)
        return ex, cache.states(layer, rows)
    tok = cache.tokens
    mask = tok["role"].to_numpy() == "word"
    if kind == "mean_s<i>":
        mask &= tok["sentence"].to_numpy() == arg
    rows = np.flatnonzero(mask)
    X = cache.states(layer, rows).astype(np.float64)
    ex = tok["example"].to_numpy()[rows]
    starts = np.flatnonzero(np.r_[True, ex[1:] != ex[:-1]])
    if kind == "max":
        return ex[starts], np.maximum.reduceat(X, starts, axis=0).astype(np.float32)
    counts = np.diff(np.r_[starts, len(ex)])
    return ex[starts], (np.add.reduceat(X, starts, axis=0) / counts[:, None]).astype(np.float32)


@pytest.mark.parametrize("choice", ["mean", "max", "mean_s2", "cls", "sep_last"])
def test_pooled_in_chunks_equals_the_whole_layer(caches, small_chunks, choice):
    for cache in caches[:2]:
        ex, X = selection.pooled(cache, 2, choice)
        ex_ref, X_ref = _old_pooled(cache, 2, choice)
        np.testing.assert_array_equal(ex, ex_ref)
        np.testing.assert_array_equal(X, X_ref)


def test_item_rows_take_and_chunks():
    items = selection.ItemRows(np.array([3, 5, 7]), np.array([10, 11, 12, 20, 30, 31]), np.array([0, 3, 4, 6]),
                               "mean")
    sub = items.take(np.array([2, 0]))
    np.testing.assert_array_equal(sub.examples, [7, 3])
    np.testing.assert_array_equal(sub.rows, [30, 31, 10, 11, 12])
    np.testing.assert_array_equal(sub.starts, [0, 2, 5])
    assert [(s.start, s.stop) for s in selection.item_chunks(3, items)] == [(0, 1), (1, 3)]
    assert [(s.start, s.stop) for s in selection.item_chunks(100, items)] == [(0, 3)]


@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("choice", ["mean", "cls", "s1 words"])
@pytest.mark.parametrize("across", [False, True])
def test_streaming_cka_matrix_equals_the_whole_array_matrix(caches, small_chunks, debiased, choice, across):
    pair, concat = caches[:2]
    b = concat if across else None
    df = run_cka_matrix(pair, b, choice=choice, debiased=debiased)
    from analyses.cka._runner import _paired

    other = concat if across else pair
    Xs = [_paired(pair, other, choice, layer)[0] for layer in pair.layers]
    Ys = [_paired(pair, other, choice, layer)[1] for layer in other.layers]
    with np.errstate(all="ignore"), pytest.warns() if choice == "cls" else _nothing():
        ref = linear_cka_matrix(Xs, Ys, debiased=debiased)
    got = df.pivot(index="layer", columns="layer_b", values="value").to_numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12, equal_nan=True)
    assert (df["n"] == len(Xs[0])).all()
    assert (df["note"] != "").to_numpy().tolist() == np.isnan(got).ravel().tolist()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_bootstrap_batches_do_not_change_the_resamples(monkeypatch, method):
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 300, 3000)
    cols = {"a": rng.normal(size=3000), "b": rng.gamma(2.0, size=3000)}
    stats = ("mean", "median") if method == "percentile" else ("mean",)
    one_batch = intervals.bootstrap_cis(cols, groups, stats, n_resamples=200, method=method)
    ratio_one = intervals.ratio_bootstrap_ci(cols["b"], cols["b"] + 1, groups, n_resamples=200)
    monkeypatch.setattr(intervals, "_BATCH_ELEMENTS", 1000)  # a few resamples per batch
    many = intervals.bootstrap_cis(cols, groups, stats, n_resamples=200, method=method)
    for key, (point, lo, hi) in one_batch.items():
        np.testing.assert_allclose(many[key], (point, lo, hi), rtol=1e-13, atol=0)
    assert intervals.ratio_bootstrap_ci(cols["b"], cols["b"] + 1, groups, n_resamples=200) == ratio_one


def test_cache_groups_of_repeated_examples(caches):
    pair = caches[0]
    ex = pair.tokens["example"].to_numpy()
    groups, grouping = cache_groups(pair, ex)
    ref, ref_grouping = table_groups(pair.examples.iloc[ex])
    assert grouping == ref_grouping
    np.testing.assert_array_equal(groups, ref)
    assert cache_groups(pair, ex[:0])[0].shape == (0,)


def test_group_counts_equal_a_count_per_token(caches):
    att = caches[0]
    examples, _, groups = att.attention()
    counts = group_counts(att, examples, groups)
    tok = att.tokens
    ref = np.zeros((len(examples), len(groups)))
    pos = {e: i for i, e in enumerate(examples)}
    for r, s, o, e in zip(tok["role"], tok["sentence"], tok["occurrence"], tok["example"]):
        name = f"s{s}" if r == "word" else f"{r}{o}"
        if name in groups and e in pos:
            ref[pos[e], groups.index(name)] += 1
    np.testing.assert_array_equal(counts, ref)


def test_streamed_cka_formats_equal_the_whole_array_cka(caches, small_chunks, monkeypatch):
    import analyses.cka._runner as similarity

    pair, concat = caches[:2]
    args = dict(choices=("cls", "mean", "s1 words"), metrics=("linear_cka", "linear_cka_debiased", "rbf_cka"))
    chunked = similarity.run_cka_formats(pair, concat, **args)
    monkeypatch.setattr(similarity, "_measure_items", lambda a, b, ia, ib, layer, metrics: similarity._measure(
        selection.pool_chunked(a, layer, ia), selection.pool_chunked(b, layer, ib), metrics))  # the old whole arrays
    whole = similarity.run_cka_formats(pair, concat, **args)
    assert (chunked["note"] != "").any()  # [CLS] at the embedding layer: zero variance, NaN with its note
    pd.testing.assert_frame_equal(chunked.drop(columns="value"), whole.drop(columns="value"), check_exact=True)
    np.testing.assert_allclose(chunked["value"], whole["value"], rtol=0, atol=1e-12, equal_nan=True)


def _merge_align(a: Cache, b: Cache, rows_a=None):
    """The inner merge that :func:`probing.cache.align` replaced."""
    from probing.formats import KEY_COLUMNS

    ta = a.tokens[list(KEY_COLUMNS)]
    if rows_a is not None:
        ta = ta.iloc[np.asarray(rows_a)]
    left = ta.reset_index(names="_row_a")
    right = b.tokens[list(KEY_COLUMNS)].reset_index(names="_row_b")
    merged = left.merge(right, on=list(KEY_COLUMNS), how="inner", sort=False, validate="one_to_one")
    return merged["_row_a"].to_numpy(np.int64), merged["_row_b"].to_numpy(np.int64)


@pytest.mark.parametrize("subset", [False, True])
def test_align_equals_an_inner_merge(caches, subset):
    from probing.cache import align

    pair, concat = caches[:2]
    rows = np.random.default_rng(0).permutation(pair.n_tokens)[:100] if subset else None
    for a, b in ((pair, concat), (concat, pair), (pair, pair)):
        got, ref = align(a, b, rows_a=rows if a is pair else None), _merge_align(a, b, rows if a is pair else None)
        for x, y in zip(got, ref):
            assert x.dtype == np.int64
            np.testing.assert_array_equal(x, y)


def test_attention_summaries_and_from_all_tokens_in_chunks(caches, monkeypatch):
    import analyses.attention as attention

    att = caches[0]
    examples, mass, groups = att.attention()
    shards = np.concatenate([np.load(att._check(s, "attention"), allow_pickle=False) for s in att._shards])
    np.testing.assert_array_equal(mass, shards)
    assert mass.dtype == shards.dtype
    counts = group_counts(att, examples, groups)
    whole = np.nansum(np.nan_to_num(mass) * counts[:, None, None, :, None], axis=3) / counts.sum(1)[:, None, None, None]
    monkeypatch.setattr(attention, "_EXAMPLES_PER_CHUNK", 5)
    np.testing.assert_array_equal(attention.from_all_tokens(mass, counts), whole)



def _attention_whole(cache, n_resamples=200):
    """run_attention's table computed as it was before streaming: every summary in memory at once."""
    from analyses.attention import ALL_SEP, ALL_TOKENS, WEIGHTINGS, _is_sep, from_all_tokens, target_masses
    from analyses.stats import bootstrap_ci
    from analyses.selection import attention_group_names

    examples, mass, groups = cache.attention()
    clusters, _ = cache_groups(cache, examples)
    names = attention_group_names(cache, groups)
    named = target_masses(mass, names)
    everyone = from_all_tokens(mass, group_counts(cache, examples, groups))
    for b, gb in enumerate(names):
        named[(ALL_TOKENS, gb)] = everyone[..., b]
    named[(ALL_TOKENS, ALL_SEP)] = everyone[..., [j for j, g in enumerate(names) if _is_sep(g)]].sum(-1)
    rows = []
    for (src, tgt), arr in named.items():
        head_mean = arr.mean(axis=2)
        for li in range(head_mean.shape[1]):
            v = head_mean[:, li]
            ok = np.isfinite(v)
            if ok.any():
                rows.append((src, tgt, "mean") + bootstrap_ci(v[ok], clusters[ok], "mean", n_resamples=n_resamples))
                with np.errstate(all="ignore"):
                    rows += [(src, tgt, str(h), float(x), np.nan, np.nan)
                             for h, x in enumerate(np.nanmean(arr[ok, li, :], axis=0))]
    return pd.DataFrame(rows, columns=["role", "target", "head", "value", "ci_low", "ci_high"]), WEIGHTINGS


@pytest.mark.parametrize("per_chunk", [1, 3, 1000])
def test_attention_read_in_chunks_equals_the_whole_summaries(caches, monkeypatch, per_chunk):
    """run_attention reads the summaries a few examples at a time, once per source group, and gives the
    table of the whole-array computation bit for bit (values, intervals, per-head means, row order)."""
    import analyses.attention as attention

    att = caches[0]
    examples, mass, groups = att.attention()
    ex, g, chunks = att.attention_chunks(examples_per_chunk=per_chunk)
    assert list(ex) == list(examples) and g == groups
    for _ in range(2):  # a second pass reads the same
        parts = list(chunks())
        assert [k for k, _ in parts] == list(range(0, len(examples), per_chunk))[:len(parts)]
        np.testing.assert_array_equal(np.concatenate([p for _, p in parts]), mass)
    ref, _ = _attention_whole(att)
    monkeypatch.setattr(attention, "_EXAMPLES_PER_CHUNK", per_chunk)
    monkeypatch.setattr(attention, "_TOKENS_PER_BLOCK", 7)  # group_counts a few tokens at a time
    got = attention.run_attention(att, n_resamples=200)
    got = got[got["role"].notna()][["role", "target", "head", "value", "ci_low", "ci_high"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got.astype({"head": str}), ref, check_dtype=False, rtol=0, atol=0)

# ---------------------------------------------------------------------------------------------------
# Probes: pooled features kept on disk and read a batch at a time; standardisation in row chunks


def test_stored_array_reads_its_rows_on_use(tmp_path):
    import doctest

    import analyses.stored as stored

    assert doctest.testmod(stored).failed == 0
    a = np.arange(20, dtype=np.float32).reshape(5, 4)
    s = stored.StoredArray.save(a, tmp_path / "a.npy")
    assert s.shape == (5, 4) and s.dtype == np.float32 and len(s) == 5
    np.testing.assert_array_equal(np.asarray(s), a)
    sub = s.take([4, 1, 1])
    assert sub.shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(sub), a[[4, 1, 1]])
    np.testing.assert_array_equal(np.asarray(sub.take([2, 0])), a[[1, 4]])  # rows of the selection
    np.testing.assert_array_equal(np.asarray(s, dtype=np.float64), a.astype(np.float64))
    (tmp_path / "a.npy").write_bytes(b"")  # read on use: a file changed afterwards is what is read
    with pytest.raises((ValueError, EOFError, OSError)):
        np.asarray(s)


def test_pooled_store_computes_each_key_once_and_removes_its_directory():
    from analyses.stored import PooledStore

    calls = []

    def compute(key):
        calls.append(key)
        return np.array([3, 5]), np.full((2, 3), float(key), dtype=np.float32)

    with PooledStore(compute) as store:
        ex, X = store(1)
        _, X2 = store(2)
        again = store(1)
        directory = X.path.parent
        assert calls == [1, 2] and again[1] is X and directory.is_dir()
        np.testing.assert_array_equal(ex, [3, 5])
        np.testing.assert_array_equal(np.asarray(X2), np.full((2, 3), 2.0))
    assert not directory.exists()


@pytest.mark.parametrize("shape", [(1, 3), (255, 5), (256, 7), (1000, 24), (4097, 3)])
def test_column_moments_equal_numpys_bit_for_bit(shape):
    from analyses.probes._batched import column_moments

    rng = np.random.default_rng(shape[0])
    a = (rng.normal(size=shape) * rng.uniform(0.1, 30, shape[1]) + rng.normal(0, 50, shape[1])).astype(np.float32)
    for rows in (None, 1, 7, 300):
        mean, std = column_moments(a, rows)
        np.testing.assert_array_equal(mean, a.mean(0, dtype=np.float64))
        np.testing.assert_array_equal(std, a.std(0, dtype=np.float64))


class _CountingFeatures:
    """A lazy feature set: its shape without reading, every read counted."""

    def __init__(self, array, reads):
        self.array, self.reads, self.shape = array, reads, array.shape

    def __array__(self, dtype=None, copy=None):
        self.reads.append(id(self))
        return self.array


@pytest.mark.parametrize("batch_elements", [None, 1])
def test_batched_probes_read_lazy_features_per_batch_with_the_same_results(batch_elements):
    """Lazy features give the results of arrays in memory, bit for bit. With one batch per worker each
    set is read once (kept from the spectrum pass to the solve); with more batches than workers (the
    bound binding) each is read again for its solve instead of being held."""
    from analyses.probes import probe_many_results

    from .test_probes import CS, planted

    feats = {}
    for i, s in enumerate([0.3, 1.0, 2.0]):
        X, y, groups = planted(n=120, d=5, k=3, strength=s, seed=3)
        feats[i] = X.astype(np.float32)
    kw = dict(Cs=CS, num_threads=1)
    if batch_elements is not None:
        kw["max_batch_elements"] = batch_elements
    reads: list = []
    lazy = {k: _CountingFeatures(X, reads) for k, X in feats.items()}
    got = probe_many_results(lazy, y, groups, **kw)
    ref = probe_many_results(feats, y, groups, **kw)
    for k in feats:
        np.testing.assert_array_equal(got[k].scores, ref[k].scores)
        np.testing.assert_array_equal(got[k].chosen_Cs, ref[k].chosen_Cs)
        pd.testing.assert_frame_equal(got[k].items, ref[k].items)
    per_set = {k: reads.count(id(v)) for k, v in lazy.items()}
    assert per_set == {k: 1 if batch_elements is None else 2 for k in feats}


def test_batched_probes_refuse_a_lazy_feature_set_read_with_another_shape():
    from analyses.probes import probe_many_results

    from .test_probes import CS, planted

    X, y, groups = planted(n=60, d=4, k=2, seed=1)
    liar = _CountingFeatures(X, [])
    liar.shape = (60, 5)
    with pytest.raises(ValueError, match=r"read with shape \(60, 4\), not its announced \(60, 5\)"):
        probe_many_results({"x": liar}, y, groups, Cs=CS, num_threads=1)
    with pytest.raises(ValueError, match=r"must be \(n_items, dim\)"):
        probe_many_results({"x": X[:, 0]}, y, groups, Cs=CS, num_threads=1)
    bad = X.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"1 NaN/inf values .* first at features\['x'\]\[7, 2\]"):
        probe_many_results({"x": bad}, y, groups, Cs=CS, num_threads=1)


def test_run_probes_batch_bound_is_checked_and_leaves_no_pooled_files(caches, tmp_path, monkeypatch, capsys):
    import tempfile

    from analyses.probes import batch_elements, main, run_probes

    assert batch_elements(1) == 2 ** 18 and batch_elements(None) > batch_elements(16)
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="batch_mb must be a positive number"):
            batch_elements(bad)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    pair = caches[0]
    kw = dict(layers=[1, 2], Cs=[1.0], n_splits=3, control=False, progress=False, num_threads=1)
    small = run_probes(pair, ("cls", "mean"), ("topic",), batch_mb=0.001, **kw)  # one feature set per batch
    default = run_probes(pair, ("cls", "mean"), ("topic",), **kw)
    assert list(small["value"].round(6)) == list(default["value"].round(6))
    assert list((tmp_path / "tmp").iterdir()) == []  # the pooled features' temporary directory is gone
    with pytest.raises(SystemExit) as stop:
        main([str(pair.path), "--batch-mb", "0"])
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err
