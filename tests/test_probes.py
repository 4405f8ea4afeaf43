"""Linear probes: known answers on planted data, grouping, control task, batched path vs sklearn."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, GroupKFold, StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from analyses.probes._metrics import _evaluate_fold
from analyses.probes._solver import HISTORY, _Problems, _lbfgs
from analyses.probes import (DEFAULT_CS, LinearProbe, ProbeResult, control_labels, cross_validate_probe,
                             fold_t_interval, make_splits, mdl_online_codelength, probe_many, probe_many_results,
                             probe_rows, probe_table)
from analyses.results import RESULT_COLUMNS

CS = (1e-2, 1.0, 100.0)  # a short grid keeps the sklearn path quick


def planted(n=240, d=10, k=3, strength=2.0, seed=0, per_group=3, offset=5.0):
    """Class-mean signal of ``strength`` along random directions, items grouped in threes, non-zero means."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    means = rng.normal(size=(k, d))
    X = offset + strength * means[y] + rng.normal(size=(n, d))
    return X, y, np.arange(n) // per_group


def planted_bow(n=240, d=10, words=8, strength=3.0, seed=0):
    """Multi-label y (n, words): word j present when a noisy linear score beats a word-specific cut."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    V = rng.normal(size=(d, words))
    score = strength * X @ V / np.sqrt(d) + rng.normal(size=(n, words))
    cuts = np.quantile(score, np.linspace(0.3, 0.85, words), axis=0).diagonal()  # prevalences 0.7 .. 0.15
    return X, (score > cuts).astype(int), np.arange(n) // 2


# ----------------------------------------------------------------------------------------------
# Known answers on planted data (sklearn reference path)


def test_planted_signal_scores_near_one():
    X, y, groups = planted(strength=2.0)
    res = cross_validate_probe(X, y, groups, n_splits=5, Cs=CS)
    assert isinstance(res, ProbeResult)
    assert res.metric == "accuracy" and res.scores.shape == (5,)
    assert res.mean > 0.95
    assert res.ci[0] <= res.mean <= res.ci[1]
    assert res.n == 240 and res.n_groups == 80
    assert 0.2 < res.majority_baseline < 0.5
    assert set(res.chosen_Cs) <= set(CS)


def test_noise_scores_near_imbalanced_majority_baseline():
    rng = np.random.default_rng(1)
    n = 300
    y = rng.choice(["a", "b", "c"], size=n, p=[0.7, 0.2, 0.1])
    X = rng.normal(size=(n, 12))
    res = cross_validate_probe(X, y, np.arange(n) // 3, Cs=CS)
    assert 0.6 < res.majority_baseline < 0.8
    assert abs(res.mean - res.majority_baseline) < 0.05
    assert res.chosen_Cs.min() == CS[0]  # pure noise: the strongest penalty wins the inner CV somewhere


def test_grouped_cv_defeats_memorising_example_ids():
    """Labels that are random per example: only memorising the example would help. Grouped CV scores
    chance; CV that lets an example straddle train and test (groups=None) is fooled."""
    rng = np.random.default_rng(2)
    n_ex, per, d = 50, 4, 80  # d > examples: a linear probe can memorise every example's label
    groups = np.repeat(np.arange(n_ex), per)
    y = rng.integers(0, 2, n_ex)[groups]
    X = rng.normal(size=(n_ex, d))[groups] * 3 + 0.3 * rng.normal(size=(n_ex * per, d))
    grouped = cross_validate_probe(X, y, groups, Cs=CS)
    leaky = cross_validate_probe(X, y, None, Cs=CS)
    assert grouped.mean < 0.65
    assert leaky.mean > 0.9


@pytest.mark.parametrize("multilabel", [False, True])
def test_splits_never_put_a_group_on_both_sides(multilabel):
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 37, 200)
    y = rng.integers(0, 2, (200, 4)) if multilabel else rng.integers(0, 3, 200)
    splits = make_splits(y, groups, 5, seed=0)
    assert len(splits) == 5
    seen = np.concatenate([te for _, te in splits])
    assert np.array_equal(np.sort(seen), np.arange(200))  # test folds partition the items
    for tr, te in splits:
        assert len(np.intersect1d(tr, te)) == 0
        assert len(np.intersect1d(groups[tr], groups[te])) == 0
    # inner splits of LinearProbe are grouped too: the same function on the training rows
    tr = splits[0][0]
    for itr, ite in make_splits(y[tr], groups[tr], 3, seed=0):
        assert len(np.intersect1d(groups[tr][itr], groups[tr][ite])) == 0


def test_fold_t_interval_known_answer():
    mean, lo, hi = fold_t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = stats.t.ppf(0.975, 4) * math.sqrt(2.5) / math.sqrt(5)
    assert mean == 3.0
    assert lo == pytest.approx(3.0 - half) and hi == pytest.approx(3.0 + half)
    assert fold_t_interval([0.5, 0.5, 0.5])[1:] == (0.5, 0.5)
    assert math.isnan(fold_t_interval([0.7])[1])


# ----------------------------------------------------------------------------------------------
# Control task (Hewitt & Liang 2019)


def test_control_labels_one_label_per_type_from_y():
    rng = np.random.default_rng(4)
    y = rng.choice([0, 1, 2], size=4000, p=[0.6, 0.3, 0.1])
    types = rng.integers(0, 1500, 4000)
    yc = control_labels(y, types, seed=0)
    assert yc.shape == y.shape
    for t in np.unique(types)[:200]:
        assert len(np.unique(yc[types == t])) == 1
    assert set(np.unique(yc)) <= {0, 1, 2}
    per_type = np.array([yc[types == t][0] for t in np.unique(types)])
    assert abs(np.mean(per_type == 0) - 0.6) < 0.05  # drawn from y's empirical distribution
    assert np.array_equal(yc, control_labels(y, types, seed=0))
    assert not np.array_equal(yc, control_labels(y, types, seed=1))


def test_control_task_scores_below_real_task():
    """Word types with a type embedding; the real label is a linear function of the embedding, the
    control label a random one per type: the same probe learns the first far better."""
    rng = np.random.default_rng(5)
    n_types, d, n = 60, 6, 600
    emb = rng.normal(size=(n_types, d))
    type_label = (emb @ rng.normal(size=d) > 0).astype(int)
    types = rng.integers(0, n_types, n)
    X = emb[types] + 0.3 * rng.normal(size=(n, d))
    y = type_label[types]
    res = cross_validate_probe(X, y, np.arange(n) // 2, Cs=CS, control_types=types)
    assert res.mean > 0.9
    assert res.control_score < res.mean - 0.1
    assert res.selectivity > 0.1
    np.testing.assert_allclose(res.folds["selectivity"], res.folds["accuracy"] - res.folds["control_accuracy"])
    assert res.control_chosen_Cs.shape == (5,)


# ----------------------------------------------------------------------------------------------
# Multi-label (bag of words)


def test_multilabel_planted_and_noise():
    X, Y, groups = planted_bow()
    res = cross_validate_probe(X, Y, groups, Cs=CS)
    assert res.metric == "micro_f1"
    assert res.mean > 0.8
    assert res.interval("macro_auc")[0] > 0.9
    assert res.folds["majority_baseline_macro_auc"].tolist() == [0.5] * 5
    rng = np.random.default_rng(6)
    noise = cross_validate_probe(rng.normal(size=X.shape), Y, groups, Cs=CS)
    assert abs(noise.interval("macro_auc")[0] - 0.5) < 0.08
    assert abs(noise.mean - noise.majority_baseline) < 0.08
    assert 0.2 < noise.majority_baseline < noise.mean + 0.1


def test_multilabel_baselines_known_answer():
    y_train = np.array([[1, 0], [1, 0], [1, 1], [0, 0]])  # prevalence p = (0.75, 0.25)
    y_test = np.array([[1, 0], [0, 1]])  # q = (0.5, 0.5)
    out = _evaluate_fold(y_train, y_test, np.array([[0.9, 0.1], [0.2, 0.8]]), np.arange(2), True)
    assert out["micro_f1"] == 1.0 and out["macro_auc"] == 1.0
    # majority predicts word 0 always, word 1 never: TP=1, FP=1, FN=1 -> F1 = 2/4
    assert out["majority_baseline"] == 0.5
    assert out["majority_baseline_macro_auc"] == 0.5
    assert out["chance_micro_f1"] == pytest.approx(2 * (0.75 * 0.5 + 0.25 * 0.5) / (1.0 + 1.0))


# ----------------------------------------------------------------------------------------------
# Batched torch path against the sklearn reference


@pytest.mark.parametrize("kind, k", [("softmax", 4), ("sigmoid", 1)])
def test_batched_solver_matches_sklearn_coefficients(kind, k):
    """One masked problem in float64: the folded standardisation + L-BFGS reach sklearn's optimum."""
    rng = np.random.default_rng(7)
    n, d = 150, 5
    y = rng.integers(0, 4, n) if kind == "softmax" else rng.integers(0, 2, n)
    X = 3.0 + 2.0 * (rng.normal(size=(4, d))[y] * 0.7 + rng.normal(size=(n, d)))
    mask = rng.random(n) < 0.7
    T = np.eye(4)[y] if kind == "softmax" else y[:, None].astype(float)
    Xg = (X - X.mean(0)) / X.std(0)
    X1 = torch.tensor(np.concatenate([Xg, np.ones((n, 1))], 1)[None])
    for C in (0.05, 3.0):
        ref = LogisticRegression(C=C, tol=1e-12, max_iter=10_000).fit(StandardScaler().fit_transform(X[mask]), y[mask])
        problems = _Problems(X1, torch.tensor(mask[:, None], dtype=torch.float64), torch.tensor(T[:, :, None]),
                             torch.tensor([[1.0 / C]], dtype=torch.float64), kind)
        theta, iters = _lbfgs(problems, torch.zeros(1, 1, (d + 1) * k, dtype=torch.float64), max_iter=2000, tol=1e-10)
        Wb = theta.view(d + 1, k).numpy()
        np.testing.assert_allclose(Wb[:d].T, ref.coef_, atol=1e-6)
        np.testing.assert_allclose(Wb[d], ref.intercept_, atol=1e-6)
        assert 0 < int(iters) < 2000


def test_preconditioned_solver_and_curvature_memory_reach_sklearns_optimum():
    """Anisotropic features (covariance condition number ~1e5): Böhning-preconditioned L-BFGS in the
    eigenbasis, with and without the curvature pairs carried from the previous C, reaches the same
    optimum as plain L-BFGS and as sklearn, in fewer iterations."""
    rng = np.random.default_rng(3)
    n, d, k = 300, 12, 3
    y = rng.integers(0, k, n)
    scales = np.logspace(0, -2.5, d)
    X = (rng.normal(size=(k, d))[y] * 0.5 + rng.normal(size=(n, d))) * scales @ np.linalg.qr(rng.normal(size=(d, d)))[0]
    mask = rng.random(n) < 0.7
    Xg = (X - X.mean(0)) / X.std(0)
    X1 = torch.tensor(np.concatenate([Xg, np.ones((n, 1))], 1)[None])
    problems = _Problems(X1, torch.tensor(mask[:, None], dtype=torch.float64), torch.tensor(np.eye(k)[y][:, :, None]),
                         torch.ones(1, 1, dtype=torch.float64), "softmax")
    assert float(problems.lam.max() / problems.lam.min()) > 1e4
    memory: dict = {}
    theta = torch.zeros(1, 1, (d + 1) * k, dtype=torch.float64)
    for C in (0.1, 10.0, 1000.0):
        at_C = problems.with_inv_C(torch.tensor([[1.0 / C]], dtype=torch.float64))
        plain, plain_iters = _lbfgs(at_C, torch.zeros_like(theta), max_iter=5000, tol=1e-9, precondition=False)
        fresh, fresh_iters = _lbfgs(at_C, torch.zeros_like(theta), max_iter=5000, tol=1e-9)
        theta, _ = _lbfgs(at_C, theta, max_iter=5000, tol=1e-9, memory=memory)
        ref = LogisticRegression(C=C, tol=1e-12, max_iter=100_000).fit(StandardScaler().fit_transform(X[mask]), y[mask])
        for got in (plain, fresh, theta):
            Wb = got.view(d + 1, k).numpy()
            np.testing.assert_allclose(Wb[:d].T, ref.coef_, atol=2e-4 * max(1.0, np.abs(ref.coef_).max()))
        assert int(fresh_iters) < int(plain_iters)
    assert memory["S"].shape == (HISTORY, 1, 1, (d + 1) * k)


def test_batched_gradient_matches_autograd():
    rng = np.random.default_rng(8)
    n, d, k, G = 40, 3, 3, 2
    X1 = torch.tensor(np.concatenate([rng.normal(size=(2, n, d)), np.ones((2, n, 1))], 2))
    masks = torch.tensor((rng.random((n, G)) < 0.6).astype(float))
    T = torch.tensor(np.eye(k)[rng.integers(0, k, (n, G))].transpose(0, 2, 1).copy())
    problems = _Problems(X1, masks, T, torch.tensor([[0.5, 2.0], [1.0, 4.0]], dtype=torch.float64), "softmax")
    theta = torch.tensor(rng.normal(size=(2, G, (d + 1) * k)), requires_grad=True)
    f, g = problems.value_grad(theta.detach().reshape(2 * G, 1, -1))  # problems laid out flat: p = b * G + g
    f, g = f.view(2, G), g.view(theta.shape)
    Z = problems.full_logits(theta)
    loss = torch.logsumexp(Z, 2) - (Z * T).sum(2)
    W = theta.view(2, G, d + 1, k)[:, :, :d]
    f_ref = (loss * masks / masks.sum(0)).sum(1) + 0.5 * problems.pen.view(2, G) * (W ** 2).sum((2, 3))
    f_ref.sum().backward()
    torch.testing.assert_close(f, f_ref.detach())
    torch.testing.assert_close(g, theta.grad)


@pytest.mark.parametrize("kind", ["softmax", "binary", "multilabel"])
@pytest.mark.parametrize("select_by", ["log_loss", "metric"])
def test_device_inner_scores_in_row_blocks_equal_the_reference_scores(kind, select_by, monkeypatch):
    """The inner-CV scores, computed a block of rows at a time, are _inner_score's on each problem's
    evaluation rows (probabilities from the problems' own logits)."""
    import analyses.probes._solver as solver
    from analyses.probes._metrics import _inner_score

    monkeypatch.setattr(solver, "BLOCK_ELEMENTS", 1)  # blocks of 64 rows: five blocks here
    rng = np.random.default_rng(4)
    n, d, B, G = 300, 4, 2, 3
    K = {"softmax": 3, "binary": 1, "multilabel": 4}[kind]
    X1 = torch.tensor(np.concatenate([rng.normal(size=(B, n, d)), np.ones((B, n, 1))], 2))
    masks = torch.tensor((rng.random((n, G)) < 0.6).astype(float))
    evals = 1.0 - masks
    if kind == "softmax":
        labels = rng.integers(0, K, (n, G))
        T = np.eye(K)[labels].transpose(0, 2, 1).copy()
    else:
        T = (rng.random((n, K, G)) < 0.4).astype(float)
    problems = _Problems(X1, masks, torch.tensor(T), torch.ones(B, G, dtype=torch.float64),
                         "softmax" if kind == "softmax" else "sigmoid")
    theta = torch.tensor(rng.normal(size=(B, G, (d + 1) * K)))
    got = solver._device_inner_scores(problems, theta, evals, select_by, kind == "multilabel")
    Z = problems.full_logits(theta).numpy()  # (B, n, K, G)
    for b in range(B):
        for g in range(G):
            rows = evals[:, g].numpy() > 0
            z = Z[b, rows, :, g]
            if kind == "softmax":
                P = np.exp(z - z.max(1, keepdims=True))
                ref = _inner_score(labels[rows, g], P / P.sum(1, keepdims=True), np.arange(K), False, select_by)
            elif kind == "binary":
                p1 = 1 / (1 + np.exp(-z[:, 0]))
                ref = _inner_score(T[rows, 0, g], np.stack([1 - p1, p1], 1), np.array([0.0, 1.0]), False, select_by)
            else:
                ref = _inner_score(T[rows, :, g], 1 / (1 + np.exp(-z)), np.arange(K), True, select_by)
            assert float(got[b, g]) == pytest.approx(ref, rel=1e-9, abs=1e-12), (b, g)


def test_macro_auc_equals_sklearns_with_ties_and_one_class_labels():
    """The rank (Mann-Whitney) form of the macro AUC gives roc_auc_score's value, ties counting one half;
    labels with one class among the rows are left out, and none left gives NaN."""
    from sklearn.metrics import roc_auc_score

    from analyses.probes._metrics import _macro_auc

    rng = np.random.default_rng(14)
    for _ in range(100):
        n, k = int(rng.integers(4, 50)), int(rng.integers(1, 7))
        Y = (rng.random((n, k)) < rng.random(k)).astype(int)
        Y[:, 0] = 1  # a label with one class
        P = np.round(rng.random((n, k)), int(rng.integers(1, 3)))  # coarse scores: many ties
        ok = Y.min(0) != Y.max(0)
        got = _macro_auc(Y, P)
        if ok.any():
            assert got == pytest.approx(roc_auc_score(Y[:, ok], P[:, ok], average="macro"), abs=1e-12)
        else:
            assert math.isnan(got)
    assert _macro_auc(np.array([[0], [1], [1]]), np.array([[0.5], [0.5], [0.5]])) == 0.5


def test_reduced_softmax_gradient_equals_the_full_one_on_the_zero_sum_plane():
    """With weights and intercepts summing to zero over the classes, the products over K - 1 classes give
    the full objective and gradient; off that plane they would not (the reduction is not vacuous), and
    the solver started off the plane still reaches sklearn's optimum (it starts from the projection)."""
    rng = np.random.default_rng(13)
    n, d, k, G = 60, 4, 4, 3
    X1 = torch.tensor(np.concatenate([rng.normal(size=(2, n, d)), np.ones((2, n, 1))], 2))
    masks = torch.tensor((rng.random((n, G)) < 0.6).astype(float))
    T = torch.tensor(np.eye(k)[rng.integers(0, k, (n, G))].transpose(0, 2, 1).copy())
    problems = _Problems(X1, masks, T, torch.full((2, G), 0.7, dtype=torch.float64), "softmax")
    assert problems.reducible()
    off = torch.tensor(rng.normal(size=(2 * G, 1, (d + 1) * k)))
    assert (problems.value_grad(off, reduced=True)[0] - problems.value_grad(off)[0]).abs().max() > 1e-3
    W = off.view(2 * G, d + 1, k)
    theta = (W - W.mean(2, keepdim=True)).view(off.shape)  # onto the plane
    f, g = problems.value_grad(theta)
    f_red, g_red = problems.value_grad(theta, reduced=True)
    torch.testing.assert_close(f_red, f)
    torch.testing.assert_close(g_red, g)
    assert not _Problems(X1, masks, T[:, :1], torch.ones(2, G, dtype=torch.float64), "sigmoid").reducible()
    # a start off the plane
    y = rng.integers(0, k, n)
    Xg = X1[0, :, :d].numpy()
    one = _Problems(X1[:1], torch.ones(n, 1, dtype=torch.float64), torch.tensor(np.eye(k)[y][:, :, None]),
                    torch.tensor([[1.0]], dtype=torch.float64), "softmax")
    start = torch.tensor(rng.normal(size=(1, 1, (d + 1) * k)))
    theta, _ = _lbfgs(one, start, max_iter=2000, tol=1e-10)
    ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit(StandardScaler().fit_transform(Xg), y)
    np.testing.assert_allclose(theta.view(d + 1, k).numpy()[:d].T, ref.coef_, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_batched_path_agrees_with_sklearn(dtype):
    feats, y, groups = {}, None, None
    for i, s in enumerate([0.0, 0.3, 2.0]):
        X, y, groups = planted(n=180, d=8, k=3, strength=s, seed=9)
        feats[(i, "cls")] = X if i != 1 else X * 40 + 300  # large means/scales: float32 must cope
    ref = {key: cross_validate_probe(X, y, groups, Cs=CS, control_types=groups) for key, X in feats.items()}
    fast = probe_many_results(feats, y, groups, Cs=CS, control_types=groups, dtype=dtype, device="cpu",
                              num_threads=1)
    for key in feats:
        assert abs(fast[key].mean - ref[key].mean) <= 0.02
        assert abs(fast[key].control_score - ref[key].control_score) <= 0.02
        assert np.mean(fast[key].chosen_Cs == ref[key].chosen_Cs) >= 0.8
        assert fast[key].majority_baseline == ref[key].majority_baseline
    assert fast[(2, "cls")].mean > 0.95
    assert np.median(fast[(2, "cls")].chosen_Cs) > np.median(fast[(0, "cls")].chosen_Cs)  # sensible Cs


def test_batched_path_preconditions_anisotropic_features_only(monkeypatch):
    """A feature set whose covariance is ill-conditioned (correlated states, as in trained encoders)
    switches preconditioning on for the whole call: the eigenvectors are computed then and only then,
    and the results match sklearn's and the unpreconditioned solver's."""
    import analyses.probes._batched as batched

    rng = np.random.default_rng(12)
    X, y, groups = planted(n=180, d=8, k=3, strength=1.0, seed=12)
    mixed = X @ (np.eye(8) + 3.0 * rng.normal(size=(8, 8)) * np.logspace(0, -3, 8)[:, None])
    mixed[:, 1] = mixed[:, 0] + 1e-2 * rng.normal(size=len(X))  # two nearly collinear features
    feats = {"plain": X, "anisotropic": mixed}
    calls, real = [], batched.feature_basis
    monkeypatch.setattr(batched, "feature_basis", lambda X1: calls.append(X1.shape) or real(X1))
    on = probe_many_results(feats, y, groups, Cs=CS, num_threads=1)
    assert calls, "an ill-conditioned feature set must switch preconditioning on"
    calls.clear()
    monkeypatch.setattr(batched, "PRECONDITION_ABOVE", float("inf"))
    off = probe_many_results(feats, y, groups, Cs=CS, num_threads=1)
    assert not calls
    for key, Xk in feats.items():
        ref = cross_validate_probe(Xk, y, groups, Cs=CS)
        assert abs(on[key].mean - ref.mean) <= 0.02 and abs(on[key].mean - off[key].mean) <= 0.01
        np.testing.assert_array_equal(on[key].chosen_Cs, off[key].chosen_Cs)


def test_batched_path_binary_and_multilabel_agree_with_sklearn():
    X, y, groups = planted(n=150, d=6, k=2, strength=0.8, seed=10)
    ref = cross_validate_probe(X, y, groups, Cs=CS)
    fast = probe_many_results({"x": X}, y, groups, Cs=CS, num_threads=1)["x"]
    assert abs(fast.mean - ref.mean) <= 0.02
    Xb, Y, gb = planted_bow(n=160, d=6, words=5)
    ref = cross_validate_probe(Xb, Y, gb, Cs=CS)
    fast = probe_many_results({"x": Xb}, Y, gb, Cs=CS, num_threads=1)["x"]
    assert fast.metric == "micro_f1"
    assert abs(fast.mean - ref.mean) <= 0.02
    assert abs(fast.interval("macro_auc")[0] - ref.interval("macro_auc")[0]) <= 0.02


def test_batched_path_select_by_metric_and_chunking_agree():
    feats = {}
    for i, s in enumerate([0.2, 1.0]):
        X, y, groups = planted(n=150, d=6, k=3, strength=s, seed=11)
        feats[i] = X
    ref = {k: cross_validate_probe(X, y, groups, Cs=CS, select_by="metric") for k, X in feats.items()}
    one = probe_many_results(feats, y, groups, Cs=CS, select_by="metric", num_threads=1)
    chunked = probe_many_results(feats, y, groups, Cs=CS, select_by="metric", num_threads=1, max_batch_elements=1)
    for k in feats:
        assert abs(one[k].mean - ref[k].mean) <= 0.02
        np.testing.assert_allclose(chunked[k].scores, one[k].scores)
        np.testing.assert_array_equal(chunked[k].chosen_Cs, one[k].chosen_Cs)


def test_probe_many_table():
    X, y, groups = planted(n=120, d=5, strength=1.0)
    df = probe_many({(3, "cls"): X, (4, "mean"): X[:, ::-1]}, y, groups, Cs=(1.0,), control_types=groups,
                    meta={"model": "m", "format": "pair", "target": "topic", "analysis": "probe"}, num_threads=1)
    assert list(df.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert set(df["metric"]) == {"accuracy", "majority_baseline", "control_accuracy", "selectivity"}
    assert sorted(set(zip(df["layer"], df["choice"]))) == [(3, "cls"), (4, "mean")]
    assert (df["model"] == "m").all() and (df["n"] == 120).all() and (df["seed"] == 0).all()
    assert (df[["chosen_C", "chosen_C_min", "chosen_C_max"]] == 1.0).all().all() and "feature" not in df.columns
    named = probe_many({"first": X, 7: X[:, ::-1]}, y, groups, Cs=(1.0,), num_threads=1)
    assert set(named["feature"]) == {"first", 7} and named["layer"].isna().all()


# ----------------------------------------------------------------------------------------------
# Rows, estimator conventions, errors


def test_probe_rows_match_result():
    X, y, groups = planted(n=120, d=5, strength=1.0)
    res = cross_validate_probe(X, y, groups, Cs=(0.1, 1.0), control_types=groups)
    rows = probe_rows(res, model="m", corpus="c", format="pair", layer=2, choice="cls", target="topic", seed=0)
    df = pd.DataFrame(rows)
    acc = df.set_index("metric").loc["accuracy"]
    assert acc["value"] == pytest.approx(res.mean)
    assert acc["ci_low"] <= acc["value"] <= acc["ci_high"]
    assert df.set_index("metric").loc["selectivity", "value"] == pytest.approx(res.selectivity)
    table = probe_table(res, layer=2, choice="cls")
    assert list(table.columns[: len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    assert len(table) == 4 and (table["n_folds"] == 5).all()


def test_sklearn_estimator_conventions():
    X, y, groups = planted(n=90, d=4, strength=2.0)
    probe = LinearProbe(Cs=(0.1, 1.0), inner_splits=3, seed=1)
    with pytest.raises(NotFittedError):
        probe.predict(X)
    assert not hasattr(probe, "C_")
    assert probe.fit(X, y, groups) is probe
    for attr in ("C_", "Cs_", "classes_", "coef_", "intercept_", "scaler_", "cv_scores_", "n_features_in_"):
        assert hasattr(probe, attr)
    assert probe.coef_.shape == (3, 4) and probe.cv_scores_.shape == (3, 2)
    twin = clone(probe)
    assert twin.get_params() == probe.get_params() and not hasattr(twin, "coef_")
    P = probe.predict_proba(X)
    np.testing.assert_allclose(P.sum(1), 1.0)
    assert probe.score(X, y) == pytest.approx(np.mean(probe.predict(X) == y))
    assert probe.set_params(Cs=(5.0,)).fit(X, y).C_ == 5.0
    # binary: one weight vector, as sklearn; string labels come back as strings
    yb = np.where(y == 0, "no", "yes")
    binary = LinearProbe(Cs=(1.0,)).fit(X, yb)
    assert binary.coef_.shape == (1, 4) and set(binary.predict(X)) <= {"no", "yes"}


@parametrize_with_checks([LinearProbe(Cs=(1.0,), max_iter=200),
                          LinearProbe(Cs=(0.1, 1.0), inner_splits=2, max_iter=200)])
def test_scikit_learn_estimator_checks(estimator, check):
    """scikit-learn's own conventions (cloning, input validation, n_features_in_, sparse refusal,
    pickling round trips by sklearn's checks, ...), with one C and with an inner CV."""
    check(estimator)


@pytest.mark.parametrize("splitter", [GroupKFold(n_splits=3),
                                      StratifiedKFold(n_splits=3, shuffle=True, random_state=0)])
def test_pipeline_and_grid_search_with_any_splitter(splitter):
    X, y, groups = planted(n=120, d=5, strength=1.5)
    pipe = Pipeline([("scale", StandardScaler()), ("probe", LinearProbe(inner_splits=2))])
    search = GridSearchCV(pipe, {"probe__Cs": [(0.01,), (0.1, 1.0)]}, cv=splitter)
    search.fit(X, y, groups=groups)
    assert search.best_score_ > 0.8 and search.best_estimator_.score(X, y) > 0.8
    assert search.cv_results_["mean_test_score"].shape == (2,)
    alone = LinearProbe(Cs=search.best_params_["probe__Cs"], inner_splits=2).fit(StandardScaler().fit_transform(X), y)
    np.testing.assert_allclose(search.best_estimator_.predict_proba(X),
                               alone.predict_proba(StandardScaler().fit_transform(X)), atol=1e-6)


def test_default_grid_is_sorted_and_positive():
    assert list(DEFAULT_CS) == sorted(DEFAULT_CS) and min(DEFAULT_CS) > 0


def test_error_messages_name_the_offending_values():
    X, y, groups = planted(n=30, d=3)
    with pytest.raises(ValueError, match=r"X\.shape=\(30, 3\).*y\.shape=\(29,\)"):
        cross_validate_probe(X, y[:29], groups[:29])
    with pytest.raises(ValueError, match=r"single class \[7\]"):
        cross_validate_probe(X, np.full(30, 7), groups)
    with pytest.raises(ValueError, match=r"only 3 distinct groups .*n_splits=5"):
        cross_validate_probe(X, y, np.arange(30) % 3)
    bad = X.copy()
    bad[4, 2] = np.nan
    with pytest.raises(ValueError, match=r"1 NaN/inf .*X\[4, 2\] = nan"):
        cross_validate_probe(bad, y, groups)
    with pytest.raises(ValueError, match=r"groups\.shape=\(10,\)"):
        cross_validate_probe(X, y, groups[:10])
    with pytest.raises(ValueError, match=r"Cs=\[-1\.0\]"):
        LinearProbe(Cs=(-1.0,)).fit(X, y)
    with pytest.raises(ValueError, match=r"select_by='auc'"):
        LinearProbe(select_by="auc").fit(X, y)
    with pytest.raises(ValueError, match=r"features\[\('b', 1\)\]\.shape=\(29, 3\)"):
        probe_many_results({("a", 0): X, ("b", 1): X[:29]}, y, groups)
    with pytest.raises(ValueError, match=r"features\[1\] contains 1 NaN/inf"):
        probe_many_results({1: bad}, y, groups)
    with pytest.raises(ValueError, match=r"dtype='float16'"):
        probe_many_results({1: X}, y, groups, dtype="float16")
    with pytest.raises(ValueError, match=r"multi-label y must hold only 0/1; found values \[0, 2\]"):
        cross_validate_probe(X, np.where(np.eye(30, 4) > 0, 2, 0), groups)


def test_mdl_online_code_known_answers():
    X, y, groups = planted(n=300, d=8, k=3, strength=2.0, seed=12)
    strong = mdl_online_codelength(X, y, groups)
    assert strong["uniform_bits"] == pytest.approx(300 * math.log2(3))
    assert strong["compression"] > 2.0
    noise = mdl_online_codelength(np.random.default_rng(13).normal(size=X.shape), y, groups)
    assert 0.6 < noise["compression"] < 1.1  # overfitting the first small blocks costs a little
    with pytest.raises(ValueError, match=r"fractions=\[0.5, 0.9\]"):
        mdl_online_codelength(X, y, fractions=(0.5, 0.9))


def _leaky(seed: int, n_docs: int = 40, per_doc: int = 8, dim: int = 64):
    """Items of one document share a document-specific vector and the document's label; nothing else
    carries the label. A probe can learn "this document -> its label", which transfers only to items of
    documents it has seen."""
    rng = np.random.default_rng(seed)
    doc = np.repeat(np.arange(n_docs), per_doc)
    y = rng.permutation(np.arange(n_docs) % 2)[doc]
    X = 3.0 * rng.normal(size=(n_docs, dim))[doc] + rng.normal(size=(doc.size, dim))
    return X, y, doc


def test_document_grouping_lowers_a_planted_leaky_score():
    from analyses.stats import table_groups

    X, y, doc = _leaky(0)
    by_example = cross_validate_probe(X, y, groups=None, n_splits=5, Cs=(1.0,))
    by_document = cross_validate_probe(X, y, groups=doc, n_splits=5, Cs=(1.0,))
    assert by_example.mean > 0.9  # the leak: documents on both sides of the split
    assert abs(by_document.mean - 0.5) < 0.15 and by_document.ci[0] < 0.5 < by_document.ci[1]
    assert by_document.n_groups == 40 and by_example.n_groups == 320
    groups, grouping = table_groups(pd.DataFrame({"label_doc": doc}))
    assert grouping == "document" and (groups == doc).all()


def test_out_of_fold_items_and_bootstrap_interval():
    X, y, doc = _leaky(1)
    X[:, 0] += 2.0 * y  # a real signal this time
    res = cross_validate_probe(X, y, groups=doc, n_splits=4, Cs=(0.1, 1.0), inner_splits=2,
                               control_types=np.arange(len(y)))
    it = res.items
    assert list(it["item"]) == list(range(len(y)))  # every item tested once
    assert (it.groupby("group")["fold"].nunique() == 1).all()  # a document in one fold
    assert (it["correct"] == (it["y_pred"] == it["y_true"])).all()
    per_fold = it.groupby("fold")["correct"].mean().to_numpy()
    np.testing.assert_allclose(per_fold, res.folds["accuracy"])  # the fold scores come from the same predictions
    value, lo, hi = res.interval()
    assert value == pytest.approx(it["correct"].mean()) and lo < value < hi
    assert res.ci_method() == "cluster_bootstrap"
    # the interval is the cluster bootstrap of the pooled items over documents
    from analyses.stats import bootstrap_ci

    ref = bootstrap_ci(it["correct"].to_numpy(float), it["group"].to_numpy(), n_resamples=1000)
    assert lo == pytest.approx(ref[1], abs=0.03) and hi == pytest.approx(ref[2], abs=0.03)
    sel = res.interval("selectivity")
    assert sel[0] == pytest.approx(it["correct"].mean() - it["control_correct"].mean())
    assert res.mde > 0 and np.isfinite(res.mde)


def test_torch_items_agree_with_reference():
    X, y, doc = _leaky(2, dim=8)
    X[:, 0] += 1.5 * y
    ref = cross_validate_probe(X, y, groups=doc, n_splits=3, Cs=(1.0,))
    fast = probe_many_results({"a": X}, y, doc, n_splits=3, Cs=(1.0,), dtype="float64")["a"]
    assert (fast.items["fold"] == ref.items["fold"]).all()
    assert np.mean(fast.items["y_pred"].to_numpy() == ref.items["y_pred"].to_numpy()) > 0.98
    Y = np.stack([y, 1 - y, (X[:, 1] > 0).astype(int)], axis=1)
    ml = cross_validate_probe(X, Y, groups=doc, n_splits=3, Cs=(1.0,))
    assert ml.interval()[0] == pytest.approx(ml.items["num"].sum() / ml.items["den"].sum())
    assert ml.ci_method("micro_f1") == "cluster_bootstrap" and ml.ci_method("macro_auc") == "cluster_bootstrap"
    assert ml.ci_method("chance_micro_f1") == "t_folds"
    assert ml.interval("macro_auc")[0] == pytest.approx(np.mean(ml.folds["macro_auc"]), abs=1e-12)
    fast_ml = probe_many_results({"a": X}, Y, doc, n_splits=3, Cs=(1.0,), dtype="float64")["a"]
    assert fast_ml.item_truth.tolist() == ml.item_truth.tolist() == (Y == 1).tolist()
    np.testing.assert_allclose(fast_ml.item_scores, ml.item_scores, atol=5e-3)  # two solvers, one tolerance


# --------------------------------------------------------------------------------------------------
# the macro AUC's interval: a cluster bootstrap of the items' scores, on the other metrics' draws


@pytest.fixture(params=["groups", "items"])
def auc_path(request, monkeypatch):
    """fold_macro_auc by either of its two exact ways, in small blocks (several per array)."""
    import analyses.probes._metrics as PM

    monkeypatch.setattr(PM, "_AUC_GROUP_ELEMENTS", 1 << 40 if request.param == "groups" else 0)
    monkeypatch.setattr(PM, "_AUC_BLOCK", 97)
    return request.param


def test_fold_macro_auc_known_answers(auc_path):
    """Unit weights give the mean over folds of each fold's macro AUC; integer weights the same as
    replicating the items (scikit-learn's roc_auc_score), ties counting one half; a label left with
    one value and a fold left empty drop out of the means."""
    from sklearn.metrics import roc_auc_score

    from analyses.probes._metrics import _macro_auc, fold_macro_auc

    rng = np.random.default_rng(0)
    n, L = 90, 6
    Y = (rng.random((n, L)) < 0.3).astype(int)
    Y[:, 3] = 0  # never present: no AUC
    P = np.round(rng.random((n, L)) + 0.5 * Y, 1)  # many ties
    folds = np.repeat(np.arange(3), 30)
    each = np.arange(n)  # every item its own group
    ones = fold_macro_auc(Y, P, folds, each, np.ones((1, n)))[0]
    assert ones == pytest.approx(np.mean([_macro_auc(Y[folds == f], P[folds == f]) for f in range(3)]), abs=1e-12)
    for seed in range(5):
        w = np.random.default_rng(seed).integers(0, 3, size=n)
        w[folds == 2] = 0 if seed == 4 else w[folds == 2]  # a fold with no item drawn
        rep = np.repeat(np.arange(n), w)
        per_fold = []
        for f in np.unique(folds[rep]):
            r = rep[folds[rep] == f]
            per_fold.append(np.mean([roc_auc_score(Y[r, l], P[r, l]) for l in range(L) if len(set(Y[r, l])) == 2]))
        assert fold_macro_auc(Y, P, folds, each, w[None].astype(float))[0] == pytest.approx(np.mean(per_fold),
                                                                                          abs=1e-12)
    # several resamples at once give what each gives alone; groups of items count together
    docs = np.arange(n) // 3
    W = np.random.default_rng(9).integers(0, 3, size=(7, n // 3)).astype(float)
    rows = np.array([fold_macro_auc(Y, P, folds, docs, W[i:i + 1])[0] for i in range(7)])
    np.testing.assert_allclose(fold_macro_auc(Y, P, folds, docs, W), rows, atol=1e-12)
    np.testing.assert_allclose(rows, [fold_macro_auc(Y, P, folds, each, W[i:i + 1][:, docs])[0] for i in range(7)],
                               atol=1e-12)


def test_macro_auc_interval_is_the_items_cluster_bootstrap():
    """The macro AUC's CI: the same document draws as micro-F1's, each item counted as often as its
    document was drawn; an informative feature's lies above 0.5, a noise feature's covers it."""
    from analyses.probes import fold_macro_auc

    rng = np.random.default_rng(3)
    n_docs, per = 60, 4
    doc = np.repeat(np.arange(n_docs), per)
    Y = (rng.random((doc.size, 5)) < 0.3).astype(int)
    X = rng.normal(size=(doc.size, 6))
    signal = cross_validate_probe(X + 1.0 * Y @ rng.normal(size=(5, 6)), Y, groups=doc, n_splits=4, Cs=(1.0,),
                                  n_resamples=300)
    noise = cross_validate_probe(X, Y, groups=doc, n_splits=4, Cs=(1.0,), n_resamples=300)
    v, lo, hi = signal.interval("macro_auc")
    assert 0.5 < lo < v < hi
    v0, lo0, hi0 = noise.interval("macro_auc")
    assert lo0 < 0.5 < hi0
    # the interval is the percentile interval of fold_macro_auc on the draws of the other metrics
    it = signal.items
    _, codes = np.unique(it["group"].to_numpy(), return_inverse=True)
    G = codes.max() + 1
    draws = np.random.default_rng(signal.seed).integers(0, G, size=(signal.n_resamples, G))
    times = np.stack([np.bincount(d, minlength=G) for d in draws]).astype(float)
    boot = fold_macro_auc(signal.item_truth, signal.item_scores, it["fold"].to_numpy(), codes, times)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])), abs=1e-12)


def test_auc_difference_on_the_same_resamples():
    """Two multi-label probes on the same items and folds: the difference of their macro AUCs on the same
    document draws; a probe against itself differs by 0 (p = 1); signal against noise lies above 0 (and its
    p below what counting draws could give), noise against noise does not; probes on other items are
    refused."""
    rng = np.random.default_rng(5)
    doc = np.repeat(np.arange(60), 4)
    Y = (rng.random((doc.size, 5)) < 0.3).astype(int)
    X = rng.normal(size=(doc.size, 6))
    kw = dict(groups=doc, n_splits=4, Cs=(1.0,), n_resamples=300)
    signal = cross_validate_probe(X + 1.0 * Y @ rng.normal(size=(5, 6)), Y, **kw)
    noise = cross_validate_probe(X, Y, **kw)
    d = signal.auc_difference(noise)
    assert d["value"] == pytest.approx(signal.interval("macro_auc")[0] - noise.interval("macro_auc")[0])
    assert (d["value_a"], d["value_b"]) == (signal.interval("macro_auc")[0], noise.interval("macro_auc")[0])
    boot = signal._auc_boot - noise._auc_boot
    assert (d["ci_low"], d["ci_high"]) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])), abs=1e-12)
    assert 0 < d["ci_low"] and d["n_groups"] == 60
    # the p-value is the bootstrap-SE Wald test's, with no floor at 2 / (R + 1) = 0.0066: a planted difference
    # many standard errors from 0 gets a p that Holm over dozens of rows still passes
    from scipy.stats import norm

    assert d["p_value"] == pytest.approx(2 * norm.sf(d["value"] / d["se"])) and d["p_value"] < 1e-4
    # a null difference (two noise probes on independent features) is not found
    null = cross_validate_probe(rng.normal(size=X.shape), Y, **kw).auc_difference(noise)
    assert null["ci_low"] < 0 < null["ci_high"] and null["p_value"] > 0.05
    same = signal.auc_difference(signal)
    assert same["value"] == 0 and same["ci_low"] == same["ci_high"] == 0 and same["p_value"] == 1
    other = cross_validate_probe(X[:-4], Y[:-4], groups=doc[:-4], n_splits=4, Cs=(1.0,), n_resamples=300)
    with pytest.raises(ValueError, match="same items"):
        signal.auc_difference(other)
    single = cross_validate_probe(X, Y[:, 0], groups=doc, n_splits=4, Cs=(1.0,))
    with pytest.raises(ValueError, match="multi-label"):
        single.auc_difference(signal)


def test_probe_rows_report_the_share_of_c_choices_at_the_grids_edge():
    """A grid too narrow for the data shows itself: on separable data the weakest penalty (the largest C) wins
    every fold, so every choice sits at the edge; the share is in every row."""
    from analyses.probes import cross_validate_probe, probe_rows

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    y = (X[:, 0] > 0).astype(int)
    narrow = cross_validate_probe(X, y, np.arange(120) // 2, n_splits=3, Cs=(1e-5, 1e-4, 1e-3), seed=0)
    rows = probe_rows(narrow)
    assert {r["C_edge_share"] for r in rows} == {1.0}
    single = cross_validate_probe(X, y, np.arange(120) // 2, n_splits=3, Cs=(1.0,), seed=0)
    assert all(np.isnan(r["C_edge_share"]) for r in probe_rows(single))
