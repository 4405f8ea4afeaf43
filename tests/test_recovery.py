"""analyses.recovery: decoders that read a sentence back from its vector, on constructed data where the answer is
known (a planted effect is found, a null is not), and run_recovery on tiny caches with its error paths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses.recovery import (
    adjacent_pairs,
    bshift_scores,
    content_scores,
    grouped_folds,
    minimal_pair_scores,
    order_scores,
    pair_features,
    r_precision,
    run_recovery,
    sign_correct,
)

from .conftest import make_tiny_bert


def _groups(n: int, per_doc: int = 4) -> np.ndarray:
    return np.arange(n) // per_doc


def test_r_precision_counts_the_top_c_against_the_c_present():
    Y = np.array([[1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    S = np.array([[0.9, 0.1, 0.8, 0.0], [0.0, 0.0, 0.0, 1.0], [0.5, 0.4, 0.3, 0.2]])
    r = r_precision(Y, S)
    assert r[0] == 0.5 and r[1] == 1.0 and np.isnan(r[2])
    with pytest.raises(ValueError, match="differ"):
        r_precision(Y, S[:, :3])


def test_ridge_predictions_match_scikit_learn_in_primal_and_dual_form():
    from sklearn.linear_model import Ridge

    from analyses.recovery import ridge_predictions

    rng = np.random.default_rng(5)
    for n, p in ((40, 8), (8, 40)):
        X, Y, Xt = rng.normal(size=(n, p)), rng.normal(size=(n, 2)), rng.normal(size=(3, p))
        for intercept in (True, False):
            P = ridge_predictions(X, Y, Xt, [0.01, 1.0], intercept)
            mu = X.mean(0) if intercept else 0.0
            sd = X.std(0) if intercept else np.sqrt((X ** 2).mean(0))
            for k, a in enumerate([0.01, 1.0]):
                ref = Ridge(alpha=a * n, fit_intercept=intercept).fit((X - mu) / sd, Y).predict((Xt - mu) / sd)
                assert np.allclose(P[k], ref, atol=1e-9)


def test_sign_correct_scores_a_tie_as_a_coin_flip():
    assert sign_correct(np.array([2.0, -1.0, 0.0])).tolist() == [1.0, 0.0, 0.5]


def _bags(n: int, V: int, rng) -> np.ndarray:
    Y = (rng.random((n, V)) < 0.15).astype(float)
    Y[Y.sum(axis=1) == 0, rng.integers(V)] = 1.0
    return Y


def test_content_decoder_recovers_planted_words_and_not_from_noise():
    rng = np.random.default_rng(0)
    n, V = 240, 12
    Y = _bags(n, V, rng)
    groups = _groups(n)
    folds = grouped_folds(groups, 4, 0)
    planted = Y @ rng.normal(size=(V, 20)) + 0.1 * rng.normal(size=(n, 20))
    dec, freq, alphas = content_scores(planted, Y, groups, folds, inner_splits=2)
    assert np.nanmean(dec) > 0.9 and np.nanmean(freq) < 0.4 and len(alphas) == 4
    noise = rng.normal(size=(n, 20))
    dec0, freq0, _ = content_scores(noise, Y, groups, folds, inner_splits=2)
    assert abs(np.nanmean(dec0) - np.nanmean(freq0)) < 0.08
    assert np.array_equal(freq0, freq)  # the frequency decoder ignores the vector


def test_pair_features_flip_sign_when_the_pair_is_shown_the_other_way_round():
    rng = np.random.default_rng(1)
    a, b, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    assert np.allclose(pair_features(a, b, v), -pair_features(b, a, v))
    assert pair_features(a, b).shape == (5, 3 + 3)


def _order_data(n: int, rng, prior: bool):
    """One adjacent pair per sentence; ``prior``: the first word always from one set, the second from another
    (a word-pair prior); otherwise the order is random, so only a vector can tell it."""
    k = 6
    lex = rng.normal(size=(40, k))
    if prior:  # the first words form a cluster of their own (like function words before nouns)
        lex[:20, 0] += 3.0
        A, B = lex[rng.integers(0, 20, n)], lex[rng.integers(20, 40, n)]
    else:
        i, j = rng.integers(0, 40, n), rng.integers(0, 40, n)
        j = np.where(i == j, (j + 1) % 40, j)
        A, B = lex[i], lex[j]
    return A, B


def test_word_order_decoder_finds_a_planted_order_signal_and_word_pair_priors():
    rng = np.random.default_rng(2)
    n = 300
    groups = _groups(n, 3)
    folds = grouped_folds(groups, 3, 0)
    A, B = _order_data(n, rng, prior=False)
    item = np.arange(n)
    vectors = {"planted": (A - B) + 0.05 * rng.normal(size=A.shape), "noise": rng.normal(size=A.shape)}
    out = order_scores(A, B, item, vectors, groups, folds, inner_splits=2, word_dims=6, vector_dims=6)
    assert out["planted"][0].mean() > 0.9
    assert abs(out["noise"][0].mean() - 0.5) < 0.1 and abs(out["words_only"][0].mean() - 0.5) < 0.1
    A2, B2 = _order_data(n, rng, prior=True)
    priors = order_scores(A2, B2, item, None, groups, folds, inner_splits=2, word_dims=6)
    assert priors["words_only"][0].mean() > 0.9


def test_minimal_pairs_and_bshift_find_a_planted_swap_direction_and_not_a_null():
    rng = np.random.default_rng(3)
    n, d = 200, 10
    groups = _groups(n)
    folds = grouped_folds(groups, 4, 0)
    X = rng.normal(size=(n, d))
    direction = np.zeros(d)
    direction[0] = 1.0
    planted = X + direction + 0.2 * rng.normal(size=(n, d))
    correct, _ = minimal_pair_scores(X, planted, groups, folds, inner_splits=2)
    assert correct.mean() > 0.95
    null, _ = minimal_pair_scores(X, X + 0.2 * rng.normal(size=(n, d)), groups, folds, inner_splits=2)
    assert abs(null.mean() - 0.5) < 0.12
    same, _ = minimal_pair_scores(X, X.copy(), groups, folds, inner_splits=2)
    assert (same == 0.5).all()  # identical vectors: a coin flip, not a miss
    shown = rng.random(n) < 0.5
    bs, _ = bshift_scores(X, X + 3 * direction, shown, groups, folds, inner_splits=2)
    assert bs.mean() > 0.85
    bs0, _ = bshift_scores(X, X + 0.2 * rng.normal(size=(n, d)), shown, groups, folds, inner_splits=2)
    assert abs(bs0.mean() - 0.5) < 0.12


def test_adjacent_pairs_keep_two_different_words_of_letters_in_one_sentence():
    words = pd.DataFrame({"example": [0, 0, 0, 0, 1, 1], "index": [0, 1, 2, 3, 0, 1],
                          "text": ["The", "the", "cat", "3", "A", "dog"]})
    first, second = adjacent_pairs(words, per_sentence=5)
    assert first.tolist() == [1, 4] and second.tolist() == [2, 5]
    with pytest.raises(ValueError, match="at least 1"):
        adjacent_pairs(words, per_sentence=0)


# ---------------------------------------------------------------------------------------------------
# run_recovery on tiny caches


@pytest.fixture(scope="module")
def tiny_caches(tmp_path_factory, bert_tokenizer):
    from probing.cache import Cache
    from probing.corpora import load_corpus
    from probing.extract import extract
    from probing.models import load_model
    from probing.study.questions.q7 import swapped_copy

    root = tmp_path_factory.mktemp("recovery")
    model_dir = root / "tiny"
    make_tiny_bert(bert_tokenizer).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    ex = load_corpus("generated:n=90,k=1")
    sw = swapped_copy(ex)
    out = {}
    for rnd in (False, True):
        lm = load_model(str(model_dir), random_init=rnd, seed=1)
        if not rnd:
            out["embeddings"] = lm.model.get_input_embeddings().weight.detach().numpy()
        for name, corpus in (("orig", ex), ("swapped", sw)):
            path = extract(corpus, ["single"], model=lm, out=root / "caches", corpus_name=f"s-{name}",
                           progress=False, log=lambda s: None)[0]
            out[name, rnd] = Cache.open(path)
    return out


def _run(c, tmp_path, **kw):
    args = {"embeddings": c["embeddings"], "swapped": c["swapped", False], "random_cache": c["orig", True],
            "random_swapped": c["swapped", True], "vocab": 15, "folds": 3, "inner_splits": 2, "n_resamples": 100,
            "out": tmp_path}
    return run_recovery(c["orig", False], **{**args, **kw})


@pytest.mark.slow
def test_run_recovery_table_on_tiny_caches(tiny_caches, tmp_path):
    T = _run(tiny_caches, tmp_path)
    assert set(T["target"]) == {"content_words", "word_order", "minimal_pairs", "bshift"}
    layers = sorted(int(x) for x in pd.to_numeric(T["layer"]).dropna().unique())
    assert layers == [0, 1, 2]
    scored = T[T["metric"].isin(["r_precision", "pair_order_accuracy", "accuracy", "difference"])]
    assert (scored["ci_low"] <= scored["value"] + 1e-12).all() and (scored["value"] <= scored["ci_high"] + 1e-12).all()
    assert (scored["se"] >= 0).all() and (scored["grouping"] == "document").all()
    assert (scored["n_resamples"] == 100).all() and (scored["n_groups"] > 1).all()
    counts = T[T["ci_low"].isna()]  # the vocabulary's counts: no interval, so no resamples and no grouping
    assert set(counts["metric"]) == {"vocabulary_size", "sentences_with_vocabulary", "vocabulary_words_per_sentence"}
    assert counts["n_resamples"].isna().all() and (counts["grouping"].fillna("") == "").all()
    # layer 0's [CLS] is the same vector for every sentence: it cannot tell a sentence from its swapped copy
    mp0 = T[(T["target"] == "minimal_pairs") & (T["metric"] == "accuracy") & (T["choice"] == "cls")
            & (pd.to_numeric(T["layer"]) == 0)]
    assert (mp0["value"] == 0.5).all() and len(mp0) == 1
    # random weights: minimal pairs at the last layer only; BShift of [CLS] only
    rnd = T[(T["target"] == "minimal_pairs") & (T["model_kind"] == "random_init")]
    assert set(pd.to_numeric(rnd["layer"])) == {2}
    assert set(T.loc[T["target"] == "bshift", "choice"]) == {"cls"}
    # differences are the paired difference of their two sides
    d = T[(T["metric"] == "difference") & T["value_a"].notna()]
    assert np.allclose(d["value"], d["value_a"] - d["value_b"])
    kinds = set(T.loc[T["target"] == "minimal_pairs", "model_kind"])
    assert kinds == {"trained", "random_init"}
    # stored: a second call reads the same table back
    again = _run(tiny_caches, tmp_path)
    cols = ["target", "metric", "model_kind", "value", "se"]
    pd.testing.assert_frame_equal(T[cols].reset_index(drop=True), again[cols].reset_index(drop=True),
                                  check_dtype=False)


@pytest.mark.slow
def test_run_recovery_without_swapped_or_random_caches(tiny_caches, tmp_path):
    T = run_recovery(tiny_caches["orig", False], embeddings=tiny_caches["embeddings"], vocab=15, folds=3,
                     inner_splits=2, n_resamples=100, choices=("mean",))
    assert set(T["target"]) == {"content_words", "word_order"}
    assert set(T["model_kind"]) <= {"", "trained"} and set(T["choice"].dropna()) <= {"", "mean"}


@pytest.mark.slow
@pytest.mark.parametrize("kw, message", [
    ({"vocab": 0}, "vocab must be a whole number >= 1, got 0"),
    ({"folds": 1}, "folds must be a whole number >= 2, got 1"),
    ({"embeddings": np.zeros(5)}, "embeddings must be a \\(vocab_size, dim\\) matrix"),
    ({"embeddings": np.zeros((10, 4))}, "the embedding matrix has 10 rows"),
    ({"random_cache": None}, "random_swapped needs swapped and random_cache"),
])
def test_run_recovery_refuses_bad_input(tiny_caches, tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        _run(tiny_caches, tmp_path, **kw)
    assert not list(tmp_path.rglob("*.parquet")) and not list(tmp_path.rglob("*.csv"))


@pytest.mark.slow
def test_run_recovery_refuses_a_swapped_cache_that_is_not_the_copy(tiny_caches, tmp_path):
    c = tiny_caches
    with pytest.raises(ValueError, match="is not the swapped copy of .*different models"):
        _run(c, tmp_path, swapped=c["swapped", True], random_swapped=None)
    with pytest.raises(ValueError, match="of its sentences are the original's, unswapped"):
        _run(c, tmp_path, swapped=c["orig", False], random_swapped=None)


@pytest.mark.slow
def test_q7_rows_answer_evidence_and_figure_from_the_tiny_table(tiny_caches, tmp_path):
    from probing.study.config import StudyConfig
    from probing.study.questions import q7
    from probing.study.rules import decide

    T = {q7.TABLE: _run(tiny_caches, tmp_path)}
    rows = q7.rows(T)
    assert set(rows["measure"]) == {"content", "order", "minimal", "training"}
    assert set(rows["pooling"]) == {"cls", "mean"} and (rows["layer"] == 2).all()
    assert rows["se"].notna().all() and (rows["n_groups"] > 1).all()
    decided = decide(rows, q7.RULES)
    ans = q7.answer(T, decided, StudyConfig())
    assert ans.words <= 60 and "at least" in ans.text and not ans.text.startswith("No")
    content = decided[(decided["measure"] == "content") & (decided["pooling"] == "cls")].iloc[0]
    assert f"{100 * content['value_a']:.0f}%" in ans.text
    md = q7.evidence(T, decided, StudyConfig())
    assert "| content words (R-precision) |" in md and "Jawahar" in md and "| 2 |" in md
    pngs = q7.figures(T, tmp_path / "fig", print)
    assert [p.name for p in pngs] == ["q7_recovery.png"] and pngs[0].stat().st_size > 0


@pytest.mark.slow
def test_run_recovery_reads_the_sentences_a_short_model_kept(tmp_path, bert_tokenizer):
    """A model with fewer positions than some sentences (one pretrained here at 128 tokens): extraction skips them,
    and the decoders read the sentences every cache holds instead of refusing the run."""
    from probing.cache import Cache
    from probing.corpora import load_corpus
    from probing.examples import Example
    from probing.extract import extract
    from probing.models import load_model
    from probing.study.questions.q7 import swapped_copy

    model_dir = tmp_path / "tiny"
    make_tiny_bert(bert_tokenizer).save_pretrained(model_dir)  # 64 positions
    bert_tokenizer.save_pretrained(model_dir)
    ex = load_corpus("generated:n=90,k=1")
    long = {3, 40, 77}
    ex = [Example(e.id, (" ".join(f"token{i} word{j}" for j in range(40)) + ".",) if i in long else e.sentences,
                  e.labels) for i, e in enumerate(ex)]
    caches = {}
    for rnd in (False, True):
        lm = load_model(str(model_dir), random_init=rnd, seed=1)
        for name, corpus in (("orig", ex), ("swapped", swapped_copy(ex))):
            path = extract(corpus, ["single"], model=lm, out=tmp_path / "caches", corpus_name=f"short-{name}",
                           on_overflow="skip", progress=False, log=lambda s: None)[0]
            caches[name, rnd] = Cache.open(path)
    assert len(np.unique(caches["orig", False].tokens["example"])) == 87
    embeddings = load_model(str(model_dir)).model.get_input_embeddings().weight.detach().numpy()
    T = run_recovery(caches["orig", False], embeddings=embeddings, swapped=caches["swapped", False],
                     random_cache=caches["orig", True], random_swapped=caches["swapped", True], vocab=15, folds=3,
                     inner_splits=2, n_resamples=100)
    assert set(T["target"]) == {"content_words", "word_order", "minimal_pairs", "bshift"}
    # the sentences read: the 87 held (the vocabulary's counts), of which those holding a vocabulary word are scored
    assert T.loc[T["metric"] == "vocabulary_size", "n"].tolist() == [87]
    scored = T[T["metric"].isin(["r_precision", "accuracy"])]
    assert len(scored) and (scored["n"] <= 87).all() and scored["value"].notna().all()


@pytest.mark.slow
def test_run_recovery_gives_the_same_table_on_one_worker_and_on_two(tiny_caches, tmp_path):
    """The content decoders of the layers and choices run side by side in workers (one per torch thread); the
    table is the one a single worker computes, value for value."""
    import torch

    before = torch.get_num_threads()
    try:
        tables = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            tables.append(_run(tiny_caches, tmp_path / f"t{threads}", choices=("cls", "mean")))
    finally:
        torch.set_num_threads(before)
    pd.testing.assert_frame_equal(tables[0], tables[1])
