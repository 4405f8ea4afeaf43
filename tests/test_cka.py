"""Tests for analyses/cka/_metrics.py: known answers, invariances, a slow float64 Gram-form reference,
streaming == in-memory, merging, the torch path, and the error/undefined paths."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from analyses.cka import (
    CKAUndefinedWarning,
    StreamingCKAMatrix,
    StreamingLinearCKA,
    gram_cka,
    linear_cka,
    linear_cka_matrix,
    rbf_cka,
)

SEEDS = [0, 1, 2]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# --------------------------------------------------------------------------- slow reference
# Written out literally from the papers, float64, O(n^3): no shortcuts shared with the module.

def ref_gram_linear(X):
    X = np.asarray(X, dtype=np.float64)
    return X @ X.T


def ref_gram_rbf(X, sigma):
    """Kornblith et al.'s convention: exp(-d² / (2 σ² median(d²))), median over all n² entries."""
    X = np.asarray(X, dtype=np.float64)
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-D / (2 * sigma**2 * np.median(D)))


def ref_hsic_biased(K, L):
    """Gretton et al. 2005: tr(KHLH) / (n-1)^2."""
    n = K.shape[0]
    H = np.eye(n) - np.ones((n, n)) / n
    return np.trace(K @ H @ L @ H) / (n - 1) ** 2


def ref_hsic_unbiased(K, L):
    """Song et al. 2012 (JMLR 13), eq. 5, with K~, L~ the Gram matrices with zeroed diagonals."""
    n = K.shape[0]
    Kt, Lt = K.copy(), L.copy()
    np.fill_diagonal(Kt, 0.0)
    np.fill_diagonal(Lt, 0.0)
    one = np.ones(n)
    return (
        np.trace(Kt @ Lt)
        + (one @ Kt @ one) * (one @ Lt @ one) / ((n - 1) * (n - 2))
        - 2.0 / (n - 2) * (one @ Kt @ Lt @ one)
    ) / (n * (n - 3))


def ref_cka(K, L, debiased):
    hsic = ref_hsic_unbiased if debiased else ref_hsic_biased
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def related(seed, n=40, d1=7, d2=11, noise=1.0, offset=3.0):
    """X (n, d1) and Y (n, d2) linearly related plus noise, with a non-zero mean and uneven scales."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d1)) * rng.uniform(0.5, 3.0, size=d1) + offset
    Y = X @ rng.normal(size=(d1, d2)) + noise * rng.normal(size=(n, d2)) - offset
    return X, Y


def random_orthogonal(rng, d):
    Q, R = np.linalg.qr(rng.normal(size=(d, d)))
    return Q * np.sign(np.diag(R))


# --------------------------------------------------------------------------- known answers


def test_kornblith_demo_values():
    """The published demo (np.random.seed(1337)) prints 0.55761, 0.65483 and 0.51346."""
    np.random.seed(1337)
    X = np.random.randn(100, 10)
    Y = np.random.randn(100, 10) + X
    assert linear_cka(X, Y) == pytest.approx(0.55761, abs=5e-6)
    assert rbf_cka(X, Y, 0.5) == pytest.approx(0.65483, abs=5e-6)
    assert linear_cka(X, Y, debiased=True) == pytest.approx(0.51346, abs=5e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("fn", [linear_cka, rbf_cka])
def test_invariant_to_orthogonal_isotropic_scaling_translation(seed, debiased, fn):
    X, Y = related(seed)
    rng = np.random.default_rng(seed + 100)
    Q = random_orthogonal(rng, X.shape[1])
    T = 2.7 * X @ Q + rng.normal(size=X.shape[1]) * 10
    base = fn(X, Y, debiased=debiased)
    assert 0.2 < base < 0.999
    assert fn(T, Y, debiased=debiased) == pytest.approx(base, abs=1e-10)
    assert fn(Y, T, debiased=debiased) == pytest.approx(base, abs=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
def test_changed_by_general_linear_map(seed, debiased):
    X, Y = related(seed, n=60, d1=8, d2=8)
    rng = np.random.default_rng(seed + 200)
    M = random_orthogonal(rng, 8) @ np.diag(np.geomspace(0.1, 10, 8)) @ random_orthogonal(rng, 8)
    assert abs(linear_cka(X @ M, Y, debiased) - linear_cka(X, Y, debiased)) > 0.02


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("fn", [linear_cka, rbf_cka])
def test_self_cka_is_one_and_symmetric(seed, debiased, fn):
    X, Y = related(seed)
    assert fn(X, X, debiased=debiased) == pytest.approx(1.0, abs=1e-12)
    assert fn(X, Y, debiased=debiased) == pytest.approx(fn(Y, X, debiased=debiased), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [linear_cka, rbf_cka])
def test_debiased_near_zero_for_independent_data(seed, fn):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(50, 40)), rng.normal(size=(50, 40))
    assert fn(X, Y) > 0.35  # biased estimator: large when n is close to d
    assert abs(fn(X, Y, debiased=True)) < 0.1


# --------------------------------------------------------------------------- fast == slow reference


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
def test_linear_matches_gram_reference(seed, debiased):
    X, Y = related(seed, n=33, d1=5, d2=9)
    ref = ref_cka(ref_gram_linear(X), ref_gram_linear(Y), debiased)
    assert linear_cka(X, Y, debiased) == pytest.approx(ref, abs=1e-8)
    assert gram_cka(ref_gram_linear(X), ref_gram_linear(Y), debiased) == pytest.approx(ref, abs=1e-8)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_rbf_matches_gram_reference(seed, debiased, sigma):
    X, Y = related(seed, n=36, d1=6, d2=4)
    ref = ref_cka(ref_gram_rbf(X, sigma), ref_gram_rbf(Y, sigma), debiased)
    assert rbf_cka(X, Y, sigma=sigma, debiased=debiased) == pytest.approx(ref, abs=1e-8)


def test_rbf_odd_n_and_sigma_matters():
    X, Y = related(5, n=31)
    a, b = rbf_cka(X, Y, sigma=0.5), rbf_cka(X, Y, sigma=4.0)
    assert a == pytest.approx(ref_cka(ref_gram_rbf(X, 0.5), ref_gram_rbf(Y, 0.5), False), abs=1e-8)
    assert abs(a - b) > 1e-3


def test_float32_input_is_accumulated_in_float64():
    X, Y = related(3, n=200, d1=20, d2=30)
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    ref = ref_cka(ref_gram_linear(X32), ref_gram_linear(Y32), False)
    assert linear_cka(X32, Y32) == pytest.approx(ref, abs=1e-10)


# --------------------------------------------------------------------------- layer x layer matrix


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
def test_matrix_equals_pairwise(seed, debiased):
    rng = np.random.default_rng(seed)
    Xs = [rng.normal(size=(45, d)) + i for i, d in enumerate([3, 8, 5])]
    Ys = [Xs[0] @ rng.normal(size=(3, 6)) + rng.normal(size=(45, 6)), rng.normal(size=(45, 4))]
    M = linear_cka_matrix(Xs, Ys, debiased=debiased)
    assert M.shape == (3, 2)
    want = np.array([[linear_cka(X, Y, debiased) for Y in Ys] for X in Xs])
    np.testing.assert_allclose(M, want, atol=1e-12, rtol=0)
    S = linear_cka_matrix(Xs, debiased=debiased)
    want_s = np.array([[linear_cka(A, B, debiased) for B in Xs] for A in Xs])
    np.testing.assert_allclose(S, want_s, atol=1e-12, rtol=0)
    np.testing.assert_allclose(np.diag(S), 1.0, atol=1e-12)
    assert np.array_equal(S, S.T)


# --------------------------------------------------------------------------- streaming


def random_batches(n, rng, include_one=True):
    """Split range(n) into batches of random sizes, one of them of size 1."""
    sizes = []
    while sum(sizes) < n:
        sizes.append(int(rng.integers(1, 40)))
    if include_one:
        sizes.insert(int(rng.integers(0, len(sizes))), 1)
    edges = np.minimum(np.cumsum([0] + sizes), n + 1)
    edges = np.unique(np.minimum(edges, n))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
def test_streaming_equals_in_memory(seed, debiased):
    X, Y = related(seed, n=300, d1=12, d2=7, offset=50.0)
    rng = np.random.default_rng(seed)
    batches = random_batches(300, rng)
    assert any(b - a == 1 for a, b in batches)
    acc = StreamingLinearCKA(debiased=debiased)
    for a, b in batches:
        acc.update(X[a:b], Y[a:b])
    assert acc.n_items == 300
    assert acc.result() == pytest.approx(linear_cka(X, Y, debiased), abs=1e-10)
    if debiased:
        assert acc.result(debiased=False) == pytest.approx(linear_cka(X, Y), abs=1e-10)


def test_streaming_first_batch_of_one():
    X, Y = related(9, n=120, offset=20.0)
    for debiased in (False, True):
        acc = StreamingLinearCKA(debiased=debiased).update(X[:1], Y[:1])
        for k in range(1, 120, 17):
            acc.update(X[k:k + 17], Y[k:k + 17])
        assert acc.result() == pytest.approx(linear_cka(X, Y, debiased), abs=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("self_mode", [False, True])
def test_streaming_matrix_equals_in_memory(seed, debiased, self_mode):
    rng = np.random.default_rng(seed)
    n = 200
    Xs = [rng.normal(size=(n, d)) * (i + 1) + 5 * i for i, d in enumerate([4, 9, 6])]
    Ys = None if self_mode else [Xs[1] @ rng.normal(size=(9, 5)) + rng.normal(size=(n, 5)), rng.normal(size=(n, 3))]
    acc = StreamingCKAMatrix(debiased=debiased)
    for a, b in random_batches(n, rng):
        acc.update([X[a:b] for X in Xs], None if Ys is None else [Y[a:b] for Y in Ys])
    np.testing.assert_allclose(acc.result(), linear_cka_matrix(Xs, Ys, debiased), atol=1e-10, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("self_mode", [False, True])
def test_merge_equals_single_accumulator(seed, debiased, self_mode):
    rng = np.random.default_rng(seed)
    n = 240
    Xs = [rng.normal(size=(n, d)) + 10 * rng.normal(size=d) for d in (5, 3)]
    Ys = None if self_mode else [Xs[0] @ rng.normal(size=(5, 4)) + rng.normal(size=(n, 4)) - 7]
    # the halves have very different means, so the two accumulators' shifts differ a lot
    Xs[0][n // 2:] += 25.0
    one, first, second = (StreamingCKAMatrix(debiased=debiased) for _ in range(3))
    for a, b in random_batches(n, rng):
        xb, yb = [X[a:b] for X in Xs], None if Ys is None else [Y[a:b] for Y in Ys]
        one.update(xb, yb)
        (first if a < n // 2 else second).update(xb, yb)
    merged = first.merge(second)
    assert merged.n_items == n
    np.testing.assert_allclose(merged.result(), one.result(), atol=1e-10, rtol=0)
    np.testing.assert_allclose(merged.result(), linear_cka_matrix(Xs, Ys, debiased), atol=1e-10, rtol=0)
    # merging into an empty accumulator copies, and state_dict round-trips
    fresh = StreamingCKAMatrix(debiased=debiased).merge(second)
    np.testing.assert_allclose(fresh.result(), second.result(), atol=1e-12, rtol=0)
    restored = StreamingCKAMatrix.from_state_dict(merged.state_dict())
    np.testing.assert_allclose(restored.result(), merged.result(), atol=1e-12, rtol=0)


def test_merge_rejects_mismatched_layouts():
    rng = np.random.default_rng(0)
    a = StreamingLinearCKA().update(rng.normal(size=(10, 3)), rng.normal(size=(10, 2)))
    b = StreamingLinearCKA().update(rng.normal(size=(10, 4)), rng.normal(size=(10, 2)))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        a.merge(b)
    with pytest.raises(ValueError, match="differs from the first batch"):
        a.update(rng.normal(size=(10, 4)), rng.normal(size=(10, 2)))
    c = StreamingLinearCKA(debiased=True)
    with pytest.raises(ValueError, match="debiased"):
        c.merge(a)


# --------------------------------------------------------------------------- torch path


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("debiased", [False, True])
def test_torch_equals_numpy(device, debiased):
    X, Y = related(4, n=80, d1=9, d2=6)
    tX = torch.tensor(X, dtype=torch.float32, device=device)
    tY = torch.tensor(Y, dtype=torch.float32, device=device)
    X32, Y32 = tX.cpu().numpy(), tY.cpu().numpy()
    assert linear_cka(tX, tY, debiased) == pytest.approx(linear_cka(X32, Y32, debiased), abs=1e-12)
    assert rbf_cka(tX, tY, 0.7, debiased) == pytest.approx(rbf_cka(X32, Y32, 0.7, debiased), abs=1e-12)
    assert linear_cka(tX, Y32, debiased) == pytest.approx(linear_cka(X32, Y32, debiased), abs=1e-12)
    Ms = linear_cka_matrix([tX, tX[:, :4]], [tY], debiased)
    np.testing.assert_allclose(Ms, linear_cka_matrix([X32, X32[:, :4]], [Y32], debiased), atol=1e-12, rtol=0)
    acc_t = StreamingLinearCKA(debiased=debiased)
    acc_n = StreamingLinearCKA(debiased=debiased)
    for k in range(0, 80, 13):
        acc_t.update(tX[k:k + 13], tY[k:k + 13])
        acc_n.update(X32[k:k + 13], Y32[k:k + 13])
    assert acc_t.device == tX.device  # where its input is (cuda:0 for "cuda")
    assert acc_t.result() == pytest.approx(acc_n.result(), abs=1e-12)
    assert acc_t.result() == pytest.approx(linear_cka(X32, Y32, debiased), abs=1e-10)
    # merging a numpy accumulator into a torch one moves and re-shifts the statistics
    acc_a = StreamingLinearCKA(debiased=debiased).update(tX[:30], tY[:30])
    acc_b = StreamingLinearCKA(debiased=debiased).update(X32[30:], Y32[30:])
    assert acc_a.merge(acc_b).result() == pytest.approx(linear_cka(X32, Y32, debiased), abs=1e-10)


def test_torch_rbf_median_even_count_matches_numpy():
    """torch.median takes the lower middle value; numpy (the reference) averages the two."""
    X, Y = related(8, n=20)
    assert rbf_cka(torch.tensor(X), torch.tensor(Y)) == pytest.approx(rbf_cka(X, Y), abs=1e-13)


# --------------------------------------------------------------------------- undefined and errors


@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("fn", [linear_cka, rbf_cka])
def test_zero_variance_gives_nan_and_warning(fn, debiased):
    rng = np.random.default_rng(0)
    cls = np.tile(rng.normal(size=(1, 6)) * 0.1, (30, 1))  # 0.1-ish values: mean is not exact
    Y = rng.normal(size=(30, 4))
    with pytest.warns(CKAUndefinedWarning, match=r"X has zero variance \(all 30 rows identical"):
        assert np.isnan(fn(cls, Y, debiased=debiased))
    with pytest.warns(CKAUndefinedWarning, match="Y has zero variance"):
        assert np.isnan(fn(Y, cls, debiased=debiased))
    with pytest.warns(CKAUndefinedWarning, match="zero variance"):
        assert np.isnan(fn(cls, cls, debiased=debiased))  # never 1.0


def test_zero_variance_matrix_and_streaming():
    rng = np.random.default_rng(1)
    cls = np.tile(rng.normal(size=(1, 5)), (50, 1))
    words = rng.normal(size=(50, 5))
    with pytest.warns(CKAUndefinedWarning, match=r"Xs\[0\] has zero variance"):
        M = linear_cka_matrix([cls, words])
    assert np.isnan(M[0]).all() and np.isnan(M[:, 0]).all()
    assert M[1, 1] == pytest.approx(1.0, abs=1e-12)
    acc = StreamingCKAMatrix(debiased=True)
    for k in range(0, 50, 7):
        acc.update([cls[k:k + 7], words[k:k + 7]])
    with pytest.warns(CKAUndefinedWarning, match="layer 0 of X has zero variance"):
        R = acc.result()
    assert np.isnan(R[0]).all() and R[1, 1] == pytest.approx(1.0, abs=1e-12)
    with pytest.warns(CKAUndefinedWarning, match="zero variance"):
        assert np.isnan(gram_cka(np.ones((6, 6)), words[:6] @ words[:6].T))


def test_no_warning_for_ordinary_input():
    X, Y = related(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear_cka(X, Y)
        rbf_cka(X, Y, debiased=True)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("debiased", [False, True])
def test_every_cka_needs_four_items(n, debiased):
    """At n = 2 the centred items span one direction and linear CKA is 1 whatever X and Y are (issue
    10, item 4: ``analyses.cka roles`` on 2 examples reported 1.0 at every layer): every variant
    refuses n < 4, naming n."""
    rng = np.random.default_rng(n)
    X, Y = rng.normal(size=(n, 5)), rng.normal(size=(n, 3))
    calls = [lambda: linear_cka(X, Y, debiased=debiased), lambda: rbf_cka(X, Y, debiased=debiased),
             lambda: gram_cka(X @ X.T, Y @ Y.T, debiased=debiased),
             lambda: linear_cka_matrix([X], [Y], debiased=debiased),
             lambda: linear_cka_matrix([X], debiased=debiased),
             lambda: StreamingLinearCKA(debiased=debiased).update(X, Y).result()]
    for call in calls:
        with pytest.raises(ValueError, match=f"n_items >= 4.*n={n}"):
            call()
    X4, Y4 = rng.normal(size=(4, 5)), rng.normal(size=(4, 3))
    assert np.isfinite(linear_cka(X4, Y4, debiased=debiased)) and linear_cka(X4, Y4) < 1


@pytest.mark.parametrize("fn", [linear_cka, rbf_cka])
def test_shape_and_value_errors(fn):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"X\.shape=\(10, 3\) and Y\.shape=\(11, 3\)"):
        fn(rng.normal(size=(10, 3)), rng.normal(size=(11, 3)))
    with pytest.raises(ValueError, match=r"2-D.*X\.shape=\(10,\)"):
        fn(rng.normal(size=10), rng.normal(size=(10, 3)))
    with pytest.raises(ValueError, match=r"Y\.shape=\(10, 3, 2\)"):
        fn(rng.normal(size=(10, 3)), rng.normal(size=(10, 3, 2)))
    bad = rng.normal(size=(10, 3))
    bad[2, 1] = np.nan
    bad[4, 0] = np.inf
    with pytest.raises(ValueError, match=r"X \(shape \(10, 3\)\) contains 2 non-finite"):
        fn(bad, rng.normal(size=(10, 3)))
    with pytest.raises(ValueError, match="empty"):
        fn(np.zeros((0, 3)), np.zeros((0, 3)))


def test_shape_errors_matrix_streaming_gram():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"Xs\[0\]\.shape=\(10, 3\) and Ys\[1\]\.shape=\(9, 2\)"):
        linear_cka_matrix([rng.normal(size=(10, 3))], [rng.normal(size=(10, 2)), rng.normal(size=(9, 2))])
    with pytest.raises(ValueError, match=r"sequence.*\(10, 3\)"):
        linear_cka_matrix(rng.normal(size=(10, 3)))
    with pytest.raises(ValueError, match=r"Xs\[0\]\.shape=\(10, 3\) and Ys\[0\]\.shape=\(8, 2\)"):
        StreamingLinearCKA().update(rng.normal(size=(10, 3)), rng.normal(size=(8, 2)))
    with pytest.raises(ValueError, match="empty accumulator"):
        StreamingLinearCKA().result()
    with pytest.raises(ValueError, match=r"square.*\(4, 5\)"):
        gram_cka(np.zeros((4, 5)), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="symmetric"):
        gram_cka(np.triu(np.ones((4, 4))), np.eye(4))
    with pytest.raises(ValueError, match="sigma"):
        rbf_cka(rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), sigma=0.0)


def test_rbf_undefined_bandwidth_warns():
    """More than half the pairs identical: median distance 0, bandwidth 0."""
    X = np.zeros((10, 2))
    X[0] = 1.0
    with pytest.warns(CKAUndefinedWarning, match="median squared distance of X is 0"):
        assert np.isnan(rbf_cka(X, np.random.default_rng(0).normal(size=(10, 2))))


def test_inputs_not_modified():
    X, Y = related(2)
    X0, Y0 = X.copy(), Y.copy()
    K, L = X @ X.T, Y @ Y.T
    K0 = K.copy()
    linear_cka(X, Y, True), rbf_cka(X, Y, debiased=True), gram_cka(K, L, True), linear_cka_matrix([X], [Y])
    assert np.array_equal(X, X0) and np.array_equal(Y, Y0) and np.array_equal(K, K0)


def test_blocked_symmetric_products_match(monkeypatch):
    """numpy's A @ A.T (syrk) segfaults for large A (numpy #19685); the blocked path must agree."""
    import analyses.cka._numerics as cka_mod

    X, Y = related(6, n=50, d1=23, d2=9)
    rng = np.random.default_rng(6)
    Xs = [X, rng.normal(size=(50, 12))]
    before = (linear_cka(X, Y, True), rbf_cka(X, Y, 0.5, True), linear_cka_matrix(Xs, debiased=True))
    acc_before = StreamingCKAMatrix(debiased=True).update(Xs).update([A + 1 for A in Xs]).result()
    monkeypatch.setattr(cka_mod, "_SYRK_BLOCK", 7)
    G = cka_mod._outer_self(X)
    np.testing.assert_allclose(G, X @ X.T.copy(), atol=1e-12, rtol=0)
    assert np.array_equal(G, G.T)
    assert linear_cka(X, Y, True) == pytest.approx(before[0], abs=1e-12)
    assert rbf_cka(X, Y, 0.5, True) == pytest.approx(before[1], abs=1e-12)
    np.testing.assert_allclose(linear_cka_matrix(Xs, debiased=True), before[2], atol=1e-12, rtol=0)
    acc = StreamingCKAMatrix(debiased=True).update(Xs).update([A + 1 for A in Xs]).result()
    np.testing.assert_allclose(acc, acc_before, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------- extreme scales (issue 10, item 10)

SCALES = [1e-200, 1e-100, 1e-75, 1e77, 1e100, 1e200]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("backend", ["numpy", *DEVICES])
def test_every_cka_path_is_scale_invariant_at_extreme_scales(scale, debiased, backend):
    """Before the fix |x| > 1e77 gave 0.0 and |x| < 1e-75 gave NaN (sums of fourth powers over- or
    underflow in float64). Every path (linear, debiased, RBF, Gram, matrix, streaming, merge, torch)
    must give the value of the unscaled inputs, whatever the scale of each input."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6))
    Y = X[:, :4] @ rng.normal(size=(4, 5)) + 0.5 * rng.normal(size=(40, 5))
    as_in = (lambda A: A) if backend == "numpy" else (lambda A: torch.from_numpy(A).to(backend))
    Xs, Ys = as_in(X * scale), as_in(Y / scale)  # one input huge, the other tiny
    expect = linear_cka(X, Y, debiased=debiased)
    assert 0.3 < expect < 1
    assert linear_cka(Xs, Ys, debiased=debiased) == pytest.approx(expect, rel=1e-9)
    assert linear_cka(Xs, as_in(Y * scale + 3 * scale), debiased=debiased) == pytest.approx(expect, rel=1e-9)
    assert rbf_cka(Xs, Ys, debiased=debiased) == pytest.approx(rbf_cka(X, Y, debiased=debiased), rel=1e-9)
    K, L = X @ X.T, Y @ Y.T
    assert gram_cka(as_in(K * scale), as_in(L / scale), debiased=debiased) == pytest.approx(
        gram_cka(K, L, debiased=debiased), rel=1e-9)
    M = linear_cka_matrix([Xs, as_in(X)], [Ys, as_in(Y)], debiased=debiased)
    np.testing.assert_allclose(M, linear_cka_matrix([X, X], [Y, Y], debiased=debiased), rtol=1e-9)
    np.testing.assert_allclose(linear_cka_matrix([Xs, Ys], debiased=debiased),
                               linear_cka_matrix([X, Y], debiased=debiased), rtol=1e-9)
    acc, parts = StreamingLinearCKA(debiased=debiased), []
    for k in range(0, 40, 16):
        acc.update(Xs[k:k + 16], Ys[k:k + 16])
        parts.append(StreamingLinearCKA(debiased=debiased).update(Xs[k:k + 16], Ys[k:k + 16]))
    assert acc.result() == pytest.approx(expect, rel=1e-9)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.result() == pytest.approx(expect, rel=1e-9)
    restored = StreamingLinearCKA.from_state_dict(merged.state_dict())
    assert restored.result() == pytest.approx(expect, rel=1e-9)
    self_acc = StreamingCKAMatrix(debiased=debiased)
    for k in range(0, 40, 16):
        self_acc.update([Xs[k:k + 16], Ys[k:k + 16]])
    np.testing.assert_allclose(self_acc.result(), linear_cka_matrix([X, Y], debiased=debiased), rtol=1e-9)


@pytest.mark.parametrize("debiased", [False, True])
def test_streaming_batches_of_very_different_scales(debiased):
    """The accumulator's units follow the data: a later batch 1e150 times larger than the first (or a
    merge of accumulators of different scales) rescales the statistics instead of overflowing."""
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(60, 5)), rng.normal(size=(60, 4))
    Y[:, :2] += X[:, :2]
    scale = np.where(np.arange(60) < 20, 1.0, 1e150)[:, None]
    expect = linear_cka(X * scale, Y * scale, debiased=debiased)
    acc = StreamingLinearCKA(debiased=debiased)
    for k in range(0, 60, 10):
        acc.update(X[k:k + 10] * scale[k:k + 10], Y[k:k + 10] * scale[k:k + 10])
    assert np.isfinite(expect) and acc.result() == pytest.approx(expect, rel=1e-6)
    a = StreamingLinearCKA(debiased=debiased).update(X[:20], Y[:20])
    b = StreamingLinearCKA(debiased=debiased).update(X[20:] * 1e150, Y[20:] * 1e150)
    assert a.merge(b).result() == pytest.approx(expect, rel=1e-6)


@pytest.mark.parametrize("module", ["analyses.cka._metrics", "analyses.cka._streaming"])
def test_doctests(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
