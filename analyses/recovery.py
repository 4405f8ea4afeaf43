"""Reading a sentence back from one vector: its content words, the order of its words, and which of two word
orders is the original.

Each measure is a decoder trained on some documents and scored on sentences of other documents
(cross-fitted: every sentence is scored once, by a decoder that saw none of its document's sentences). A
decoder is a lower bound on what the vector holds: what it recovers is "at least", and what it misses may
be there for a better decoder. Three measures (:func:`run_recovery`):

* **Content words.** The vector -> the indicator vector of the ``V`` most frequent content words
  (:func:`analyses.probes.content_vocabulary`), a ridge regression (multi-output, L2 strength chosen by
  grouped inner cross-validation). Scored per sentence by R-precision (:func:`r_precision`): of the ``c``
  vocabulary words the sentence holds, the share among the decoder's top ``c``. Its yardstick is the
  frequency-only decoder, which ranks the words by their training frequency whatever the sentence. (On the
  default model and BBC sentences an MLP on the indicator matrix, scikit-learn's ``MLPClassifier`` with
  256 hidden units, recovered fewer words than the ridge decoder, 0.14-0.19 against 0.22-0.24 at the last
  layer, at 40 times the cost, and kernel ridge with an RBF kernel no more, 0.22-0.26; with about 800
  training sentences the linear decoder is the strongest tried.)
* **Word order.** For adjacent word pairs of a sentence (letters only, two different words): which of
  the two comes first, given the vector and the two words' static input embeddings (the trained model's
  embedding matrix, rows averaged over a word's subwords, reduced by PCA). The decoder is bilinear and
  antisymmetric (:func:`pair_features`): showing the pair the other way round flips its score, so it cannot
  use which word it is shown first (chance 50%). Against the same decoder given no vector, which knows
  only word-pair priors ("the" before a noun): what the vector adds. The decoder given the vector contains the
  one without it, and its inner cross-validation may choose that one (:func:`fit_decoder`'s ``nested``), so
  features that only add noise do not push it below the words alone.
* **Minimal pairs.** The vectors of a sentence and of the same sentence with two adjacent words swapped,
  in either order: which is the original? A linear decoder on the difference of the two vectors
  (antisymmetric: no intercept), chance 50%. Beside it the same vectors asked the way of BShift (Conneau
  et al. 2018; Jawahar et al. 2019): one sentence, original for half the sentences and swapped for the
  others, is it swapped? (``bshift``): the paired task holds the sentence's content fixed, BShift does not.

Every row's interval is a bootstrap over documents of the scored items (examples where the corpus has
no documents), with its standard error (``se``): :func:`analyses.finetune.seed_document_ci`, the bootstrap
the fine-tuned comparisons use. Differences (``metric = difference``) are paired per item.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from analyses.results import (
    cache_identity,
    keep_table,
    make_table,
    model_label,
    stored_table,
)
from analyses.selection import pooled
from analyses.stats import cache_groups, check_resamples
from probing.cache import Cache, check_comparable, describe_model
from probing.workers import cpu_workers, thread_map

#: The L2 strengths tried, per training item (the features are standardised, so ``alpha / n`` is on a fixed
#: scale); the inner cross-validation picks one per decoder and outer fold, and the table reports how often
#: it picked an end of the grid.
ALPHAS: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
#: Dimensions the word-order decoder keeps of the words' static embeddings and of the sentence vector.
WORD_DIMS = 16
VECTOR_DIMS = 8
#: The measures, by ``target``: what each row of the table is about.
TARGETS: dict[str, str] = {
    "content_words": "the sentence's in-vocabulary content words (R-precision)",
    "word_order": "which of two adjacent words comes first (accuracy over word pairs)",
    "minimal_pairs": "which of a sentence and its two-words-swapped copy is the original (accuracy)",
    "bshift": "whether one sentence has two adjacent words swapped (accuracy, BShift)",
}
_LETTERS = re.compile(r"[^\W\d_]+")
#: Pooled vectors of the run in progress (:func:`run_recovery` empties it when done), by (cache path, layer, choice):
#: the content and minimal-pair decoders read the same ones.
_POOLED: dict = {}


# ---------------------------------------------------------------------------------------------------
# Scores


def r_precision(Y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per row: of the ``c`` words present (``Y: (n, V)`` 0/1), the share among the ``c`` highest ``scores:
    (n, V)`` (ties broken by column order); NaN where ``c = 0``. R-precision (Manning, Raghavan & Schütze
    2008, "Introduction to Information Retrieval", sec. 8.4).

    >>> r_precision(np.array([[1, 0, 1], [0, 0, 0]]), np.array([[0.9, 0.8, 0.1], [1.0, 0.0, 0.0]])).tolist()
    [0.5, nan]
    """
    Y = np.asarray(Y, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if Y.shape != scores.shape:
        raise ValueError(f"{Y.shape=} and {scores.shape=} differ")
    c = Y.sum(axis=1)
    rank = np.empty_like(scores, dtype=np.int64)
    order = np.argsort(-scores, axis=1, kind="stable")
    np.put_along_axis(rank, order, np.arange(scores.shape[1])[None, :].repeat(len(scores), axis=0), axis=1)
    hits = (Y * (rank < c[:, None])).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c > 0, hits / c, np.nan)


def sign_correct(scores: np.ndarray) -> np.ndarray:
    """Per item: 1 where the decoder's score for the true answer is positive, 0 where negative, 0.5 at 0 (a
    tie is a coin flip: a vector that does not change under a swap scores chance, not 0)."""
    s = np.asarray(scores, dtype=np.float64)
    return np.where(s > 0, 1.0, np.where(s < 0, 0.0, 0.5))


# ---------------------------------------------------------------------------------------------------
# The decoder: ridge regression, its L2 strength chosen by grouped inner cross-validation


def _scaled(X_train: np.ndarray, X_other: np.ndarray, center: bool) -> tuple[np.ndarray, np.ndarray]:
    """Both standardised by the training rows (``center=False``: scaled by their root mean square only, which
    keeps antisymmetric features antisymmetric); a constant column stays 0."""
    mu = X_train.mean(axis=0) if center else np.zeros(X_train.shape[1])
    sd = (X_train.std(axis=0) if center else np.sqrt((X_train ** 2).mean(axis=0)))
    sd = np.where(sd > 1e-12, sd, 1.0)
    return (X_train - mu) / sd, (X_other - mu) / sd


def ridge_predictions(X_train: np.ndarray, Y_train: np.ndarray, X_test: np.ndarray, alphas: Sequence[float],
                      intercept: bool = True) -> np.ndarray:
    """Ridge regression ``min ||Y − X W||² + alpha ||W||²`` for every ``alpha`` (per training row, ``alphas``
    × n), from one eigendecomposition of the standardised training features' Gram matrix (``XᵀX``, or ``XXᵀ``
    where there are fewer rows than features: the same fit in its dual form; three to five times faster than
    an SVD of ``X`` at these sizes): ``(n_alphas, n_test, n_targets)`` predictions.
    ``intercept``: features centred and the targets' training mean added back; without it the features
    are only scaled and the fit has no constant, so an antisymmetric feature map gives an antisymmetric
    decoder. ``X_train: (n, p)``, ``Y_train: (n, t)`` or ``(n,)``, ``X_test: (m, p)``.

    >>> X, Y = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), np.array([1.0, 2.0, 3.0])
    >>> np.round(ridge_predictions(X, Y, X, [1e-9]), 6)[0, :, 0].tolist()
    [1.0, 2.0, 3.0]
    """
    X_train = np.asarray(X_train, dtype=np.float64)
    Y = np.asarray(Y_train, dtype=np.float64)
    Y = Y[:, None] if Y.ndim == 1 else Y
    if len(X_train) != len(Y):
        raise ValueError(f"{X_train.shape=} and {Y.shape=} differ in rows")
    Xs, Xt = _scaled(X_train, np.asarray(X_test, dtype=np.float64), intercept)
    y_mean = Y.mean(axis=0) if intercept else np.zeros(Y.shape[1])
    Yc = Y - y_mean
    n, p = Xs.shape
    out = []
    if n >= p:  # primal: W = V diag(1 / (lambda + a n)) Vᵀ XᵀY
        lam, V = np.linalg.eigh(Xs.T @ Xs)
        XtY, XtV = V.T @ (Xs.T @ Yc), Xt @ V
        for a in alphas:
            out.append(XtV @ (XtY / np.maximum(lam + a * n, 1e-300)[:, None]) + y_mean)
    else:  # dual: W = Xᵀ (XXᵀ + a n I)⁻¹ Y
        lam, U = np.linalg.eigh(Xs @ Xs.T)
        UtY, KU = U.T @ Yc, (Xt @ Xs.T) @ U
        for a in alphas:
            out.append(KU @ (UtY / np.maximum(lam + a * n, 1e-300)[:, None]) + y_mean)
    return np.stack(out)


def grouped_folds(groups: np.ndarray, n_splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Folds in which a group (document) is wholly in train or in test (:func:`analyses.probes.make_splits`:
    ``GroupKFold``, shuffled with ``seed``)."""
    from analyses.probes import make_splits

    return make_splits(np.zeros((len(groups), 1)), np.asarray(groups), n_splits, seed)


def fit_decoder(X_train: np.ndarray, Y_train: np.ndarray, groups: np.ndarray, X_test: np.ndarray,
                score: Callable[[np.ndarray, np.ndarray], float], *, intercept: bool = True,
                alphas: Sequence[float] = ALPHAS, inner_splits: int = 3, seed: int = 0,
                nested: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, float]:
    """A ridge decoder trained on ``(X_train, Y_train)``, its L2 strength the one of ``alphas`` whose mean
    ``score(Y_val, predictions)`` over grouped inner folds of ``groups: (n_train,)`` is highest (ties: the
    stronger penalty); returns the predictions for ``X_test`` (``(m, t)``, or ``(m,)`` for a 1-D ``Y_train``)
    and the chosen alpha.

    ``nested``: ``(X_train, X_test)`` of a smaller model the full one contains (the word-order decoder without the
    vector); the inner folds then choose between it and the full model too (ties: the smaller), so adding features
    that only add noise does not cost what a decoder without them would recover: a lower bound stays one."""
    Y = np.asarray(Y_train, dtype=np.float64)
    folds = grouped_folds(groups, inner_splits, seed)
    models = [(X_train, X_test)] if nested is None else [nested, (X_train, X_test)]
    means = np.zeros((len(models), len(alphas)))
    for tr, va in folds:
        Yv = Y[va][:, None] if Y.ndim == 1 else Y[va]
        for m, (Xm, _) in enumerate(models):
            P = ridge_predictions(Xm[tr], Y[tr], Xm[va], alphas, intercept)
            means[m] += [score(Yv, p) for p in P]
    # ties: the smaller model, then the stronger penalty
    order = [(m, a) for m in range(len(models)) for a in reversed(range(len(alphas)))]
    m, best = max(order, key=lambda ma: (means[ma], -ma[0], ma[1]))
    pred = ridge_predictions(models[m][0], Y, models[m][1], [alphas[best]], intercept)[0]
    return (pred[:, 0] if Y.ndim == 1 else pred), float(alphas[best])


def _mean_r_precision(Y: np.ndarray, P: np.ndarray) -> float:
    r = r_precision(Y, P)
    return float(np.nanmean(r)) if np.isfinite(r).any() else 0.0


def _mean_sign(Y: np.ndarray, P: np.ndarray) -> float:
    return float(sign_correct(P[:, 0] * np.sign(Y[:, 0])).mean())


# ---------------------------------------------------------------------------------------------------
# The three measures, as functions of arrays and folds


def content_scores(X: np.ndarray, Y: np.ndarray, groups: np.ndarray, folds, *, inner_splits: int = 3,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Cross-fitted R-precision of the content decoder and of the frequency-only decoder, per sentence:
    ``(decoder (n,), frequency (n,), chosen alphas per fold)``; NaN for a sentence with no vocabulary word.
    ``X: (n, dim)`` vectors, ``Y: (n, V)`` word presence, ``folds``: outer ``[(train, test)]``."""
    dec, freq, chosen = np.full(len(X), np.nan), np.full(len(X), np.nan), []
    for tr, te in folds:
        P, alpha = fit_decoder(X[tr], Y[tr], groups[tr], X[te], _mean_r_precision, inner_splits=inner_splits,
                               seed=seed)
        dec[te] = r_precision(Y[te], P)
        freq[te] = r_precision(Y[te], np.tile(Y[tr].mean(axis=0), (len(te), 1)))
        chosen.append(alpha)
    return dec, freq, chosen


def pair_features(a: np.ndarray, b: np.ndarray, v: np.ndarray | None = None) -> np.ndarray:
    """Features of word pairs shown as (a, b): ``a − b``, the antisymmetric products ``a_i b_j − b_i a_j``
    (i < j: word-pair priors) and, given the sentence vectors ``v: (n, m)``, ``(a − b) ⊗ v`` (the vector
    moving each word's place). Every feature changes sign when a and b swap, so a decoder without a constant
    gives the pair shown the other way round the opposite score. ``a, b: (n, k)``.

    >>> a, b, v = np.array([[1.0, 2.0]]), np.array([[0.5, -1.0]]), np.array([[3.0]])
    >>> bool(np.allclose(pair_features(a, b, v), -pair_features(b, a, v)))
    True
    """
    i, j = np.triu_indices(a.shape[1], 1)
    parts = [a - b, a[:, i] * b[:, j] - b[:, i] * a[:, j]]
    if v is not None:
        parts.append(((a - b)[:, :, None] * v[:, None, :]).reshape(len(a), -1))
    return np.hstack(parts)


def _whitened(train: np.ndarray, other: np.ndarray, dims: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """PCA of ``train`` to ``dims`` whitened components (fewer where the data has fewer), applied to both."""
    from sklearn.decomposition import PCA

    k = max(1, min(dims, train.shape[1], len(train) - 1))
    pca = PCA(k, whiten=True, random_state=seed).fit(train)
    return pca.transform(train), pca.transform(other)


def order_scores(A: np.ndarray, B: np.ndarray, pair_item: np.ndarray, vectors: dict[str, np.ndarray] | None,
                 groups: np.ndarray, folds, *, inner_splits: int = 3, seed: int = 0,
                 word_dims: int = WORD_DIMS, vector_dims: int = VECTOR_DIMS) -> dict[str, tuple[np.ndarray, list]]:
    """Cross-fitted correctness (1, 0, 0.5 for a tie) of the word-order decoder on each adjacent pair.

    ``A, B: (n_pairs, dim)``: the static embeddings of the pair's first and second word (in the sentence's
    order); ``pair_item: (n_pairs,)``: the sentence of each pair (an index into ``groups`` and into each of
    ``vectors``: name -> ``(n_items, dim)`` sentence vectors); ``folds``: outer folds over the sentences. Returns
    ``{"words_only": (correct, alphas), name: (correct, alphas), ...}``: the decoder without a vector and with
    each vector, on the same pairs and folds."""
    sentence_fold = np.full(len(groups), -1)
    for f, (_, te) in enumerate(folds):
        sentence_fold[te] = f
    fold_of = sentence_fold[pair_item]
    names = ["words_only", *(vectors or {})]
    out = {name: (np.full(len(A), np.nan), []) for name in names}
    for f, (tr_items, _) in enumerate(folds):
        tr, te = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
        if len(te) == 0 or len(tr) == 0:
            continue
        words_tr, words_te = _whitened(np.vstack([A[tr], B[tr]]), np.vstack([A[te], B[te]]), word_dims, seed)
        a_tr, b_tr = words_tr[:len(tr)], words_tr[len(tr):]
        a_te, b_te = words_te[:len(te)], words_te[len(te):]
        for name in names:
            v_tr = v_te = None
            if name != "words_only":
                _, v_all = _whitened(vectors[name][tr_items], vectors[name], vector_dims, seed)
                v_tr, v_te = v_all[pair_item[tr]], v_all[pair_item[te]]
            F_tr, F_te = pair_features(a_tr, b_tr, v_tr), pair_features(a_te, b_te, v_te)
            words = (pair_features(a_tr, b_tr), pair_features(a_te, b_te)) if v_tr is not None else None
            pred, alpha = fit_decoder(F_tr, np.ones(len(tr)), groups[pair_item[tr]], F_te, _mean_sign,
                                      intercept=False, inner_splits=inner_splits, seed=seed, nested=words)
            out[name][0][te] = sign_correct(pred)
            out[name][1].append(alpha)
    return out


def minimal_pair_scores(X: np.ndarray, X_swapped: np.ndarray, groups: np.ndarray, folds, *, inner_splits: int = 3,
                        seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """Cross-fitted correctness of telling the original from its swapped copy, per sentence: a ridge decoder
    without a constant on ``X − X_swapped`` (``(n, dim)`` each, row i the same sentence), target +1, so the
    pair shown the other way round gets the opposite score; a sentence whose two vectors are equal scores
    0.5."""
    D = np.asarray(X, dtype=np.float64) - np.asarray(X_swapped, dtype=np.float64)
    correct, chosen = np.full(len(D), np.nan), []
    for tr, te in folds:
        pred, alpha = fit_decoder(D[tr], np.ones(len(tr)), groups[tr], D[te], _mean_sign, intercept=False,
                                  inner_splits=inner_splits, seed=seed)
        correct[te] = sign_correct(pred)
        chosen.append(alpha)
    return correct, chosen


def bshift_scores(X: np.ndarray, X_swapped: np.ndarray, shown_swapped: np.ndarray, groups: np.ndarray, folds, *,
                  inner_splits: int = 3, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """Cross-fitted correctness of BShift on the same sentences: each sentence shown once, swapped where
    ``shown_swapped: (n,)`` bool, else original; a ridge decoder with a constant on the one vector, target ±1."""
    s = np.asarray(shown_swapped, dtype=bool)
    V = np.where(s[:, None], X_swapped, X).astype(np.float64)
    y = np.where(s, -1.0, 1.0)
    correct, chosen = np.full(len(V), np.nan), []
    for tr, te in folds:
        pred, alpha = fit_decoder(V[tr], y[tr], groups[tr], V[te], _mean_sign, inner_splits=inner_splits, seed=seed)
        correct[te] = sign_correct(pred * y[te])
        chosen.append(alpha)
    return correct, chosen


# ---------------------------------------------------------------------------------------------------
# From a cache to the arrays above


def sentence_words(tokens: pd.DataFrame, embeddings: np.ndarray) -> pd.DataFrame:
    """One row per word of sentence 1 (the tokenizer's words, as the cache keys them): ``example``, ``index``
    (its place in the sentence), ``text``, and ``vector``'s row in the returned ``attrs["vectors"]``: the mean of
    its subwords' static input embeddings (``embeddings: (vocab, dim)``, the model's embedding matrix)."""
    w = tokens[tokens["role"].eq("word").to_numpy() & (tokens["sentence"].to_numpy() == 1)]
    if w.empty:
        raise ValueError("the cache stores no word tokens of sentence 1 (extract with roles including 'word')")
    ids = w["token_id"].to_numpy(dtype=np.int64)
    if ids.min() < 0 or ids.max() >= len(embeddings):
        raise ValueError(f"token ids reach {int(ids.max())} but the embedding matrix has {len(embeddings)} rows: "
                         f"it is not this cache's model's")
    ex, idx = w["example"].to_numpy(), w["index"].to_numpy()
    starts = np.flatnonzero(np.r_[True, (ex[1:] != ex[:-1]) | (idx[1:] != idx[:-1])])
    counts = np.diff(np.r_[starts, len(w)])
    vectors = np.add.reduceat(np.asarray(embeddings, dtype=np.float64)[ids], starts, axis=0) / counts[:, None]
    out = pd.DataFrame({"example": ex[starts], "index": idx[starts], "text": w["word_text"].to_numpy()[starts]})
    out.attrs["vectors"] = vectors
    return out


def adjacent_pairs(words: pd.DataFrame, per_sentence: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Adjacent word pairs of :func:`sentence_words`: both words letters only (no punctuation, no numbers) and
    different (ignoring case), at most ``per_sentence`` per sentence, drawn with ``seed``. Returns ``(first,
    second)``: row numbers of ``words`` of each pair's first and second word, sorted by sentence."""
    if per_sentence < 1:
        raise ValueError(f"pairs per sentence must be at least 1, got {per_sentence!r}")
    ex, idx = words["example"].to_numpy(), words["index"].to_numpy()
    text = words["text"].astype(str)
    letters = text.str.fullmatch(_LETTERS.pattern).to_numpy(dtype=bool)
    lower = text.str.lower().to_numpy()
    ok = (ex[1:] == ex[:-1]) & (idx[1:] == idx[:-1] + 1) & letters[1:] & letters[:-1] & (lower[1:] != lower[:-1])
    first = np.flatnonzero(ok)
    key = np.random.default_rng(seed).random(len(first))
    rank = pd.DataFrame({"ex": ex[first], "key": key}).groupby("ex")["key"].rank(method="first").to_numpy()
    first = first[rank <= per_sentence]
    return first, first + 1


def _vectors(cache: Cache, layer: int, choice: str, keep: np.ndarray) -> np.ndarray:
    """The ``choice`` vectors at ``layer`` of the examples ``keep`` (corpus indices, sorted), in that order."""
    key = (str(cache.path), layer, choice)
    if key not in _POOLED:
        _POOLED[key] = pooled(cache, layer, choice)
    ex, X = _POOLED[key]
    at = pd.Series(np.arange(len(ex)), index=np.asarray(ex))
    missing = np.setdiff1d(keep, np.asarray(ex))
    if len(missing):
        raise ValueError(f"{cache.path}: choice {choice!r} gives no vector for {len(missing)} of the {len(keep)} "
                         f"examples read (e.g. example {int(missing[0])})")
    return X[at[keep].to_numpy()]


def _stored(cache: Cache) -> np.ndarray:
    """Corpus indices of the examples a cache holds (sorted): all but those skipped as too long."""
    return np.unique(cache.tokens["example"].to_numpy())


def _interval(values: np.ndarray, groups: np.ndarray, n_resamples: int, seed: int) -> dict:
    """Mean, 95% interval and standard error of ``values`` over a bootstrap of their ``groups``."""
    from analyses.finetune import seed_document_ci

    point, lo, hi, se = seed_document_ci(np.asarray(values, dtype=np.float64)[:, None], None, groups,
                                         n_resamples=n_resamples, seed=seed)
    return {"value": point, "ci_low": lo, "ci_high": hi, "se": se, "n": len(values),
            "n_groups": int(pd.unique(groups).size)}


def _alphas(chosen: Sequence[float]) -> dict:
    edge = [a in (ALPHAS[0], ALPHAS[-1]) for a in chosen]
    return {"chosen_alpha": float(np.median(chosen)), "alpha_edge_share": float(np.mean(edge))}


def _swap_check(cache: Cache, swapped: Cache, name: str) -> np.ndarray:
    """Row of ``cache``'s examples for each of ``swapped``'s (the same model and format, every id in ``cache``
    and its sentence 1 changed); a ValueError naming both caches otherwise."""
    a, b = cache.manifest, swapped.manifest
    problems = []
    if a["model"]["fingerprint"] != b["model"]["fingerprint"]:
        problems.append(f"different models ({describe_model(a['model'])} vs {describe_model(b['model'])})")
    if a["format"] != b["format"]:
        problems.append(f"different formats ({a['format'].get('name')!r} vs {b['format'].get('name')!r})")
    ids = cache.examples["example_id"].astype(str).to_numpy()
    where = pd.Series(np.arange(len(ids)), index=ids)
    sw_ids = swapped.examples["example_id"].astype(str).to_numpy()
    missing = [i for i in sw_ids if i not in where.index]
    if missing:
        problems.append(f"{len(missing)} of its examples are not in the original corpus (e.g. {missing[:3]})")
    if problems:
        raise ValueError(f"{name} cache {swapped.path} is not the swapped copy of {cache.path}: " + "; ".join(problems))
    rows = where[sw_ids].to_numpy()
    same = cache.examples["sentence_1"].to_numpy()[rows] == swapped.examples["sentence_1"].to_numpy()
    if same.any():
        raise ValueError(f"{name} cache {swapped.path}: {int(same.sum())} of its sentences are the original's, "
                         f"unswapped (e.g. {sw_ids[same][:3].tolist()}); a minimal pair needs two word orders")
    return rows


def _embedding_digest(embeddings: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(embeddings, dtype=np.float32).tobytes()).hexdigest()[:16]


def run_recovery(cache: Cache, *, embeddings: np.ndarray, swapped: Cache | None = None,
                 random_cache: Cache | None = None, random_swapped: Cache | None = None,
                 choices: Sequence[str] = ("cls", "mean"), vocab: int = 200, pairs_per_sentence: int = 5,
                 folds: int = 5, inner_splits: int = 3, n_resamples: int = 1000, seed: int = 0,
                 out: str | Path | None = None, force: bool = False, progress: bool = False) -> pd.DataFrame:
    """The recovery table (``analysis="recovery"``; docs/TABLES.md) of one-sentence inputs (``cache``: sentence 1
    of each example, e.g. the ``single`` format), per token choice.

    * ``content_words`` at every stored layer (trained model), and at the last layer on ``random_cache`` (the
      same corpus and format, random weights), against the frequency-only decoder; ``vocab`` words.
    * ``word_order`` at the last layer (trained, and random weights where given): up to ``pairs_per_sentence``
      adjacent pairs per sentence, against the words-only decoder; ``embeddings: (vocab_size, dim)``: the
      trained model's input embedding matrix, the words' features in every condition.
    * ``minimal_pairs`` at every layer (random weights: the last layer), given ``swapped`` (the same sentences
      with two adjacent words swapped, the same model and format) and, for random weights, ``random_swapped``;
      ``bshift`` of [CLS] at every layer (the task of the Jawahar et al. 2019 reproduction).

    Folds: ``folds`` outer folds over documents (examples without them), each decoder's L2 strength chosen by
    ``inner_splits`` grouped inner folds of its training sentences. Intervals: ``n_resamples`` bootstrap resamples
    of documents, ``seed`` for folds, draws and resamples. Stored under ``out`` and reused unless ``force``."""
    n_resamples = check_resamples(n_resamples)
    for name, value, low in (("vocab", vocab, 1), ("folds", folds, 2), ("inner_splits", inner_splits, 2),
                             ("pairs_per_sentence", pairs_per_sentence, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be a (vocab_size, dim) matrix, got shape {embeddings.shape}")
    if random_cache is not None:
        check_comparable(cache, random_cache, random_baseline=True)
    rows_sw = _swap_check(cache, swapped, "swapped") if swapped is not None else None
    if random_swapped is not None:
        if swapped is None or random_cache is None:
            raise ValueError("random_swapped needs swapped and random_cache (the random-init model's originals)")
        check_comparable(swapped, random_swapped, random_baseline=True)
    layers = list(cache.layers)
    last = max(layers)
    config = {"cache": cache_identity(cache), "embeddings": _embedding_digest(embeddings),
              **{k: cache_identity(c) if c is not None else None for k, c in
                 (("swapped", swapped), ("random", random_cache), ("random_swapped", random_swapped))},
              "choices": list(choices), "vocab": vocab, "pairs_per_sentence": pairs_per_sentence, "folds": folds,
              "inner_splits": inner_splits, "alphas": list(ALPHAS), "word_dims": WORD_DIMS,
              "vector_dims": VECTOR_DIMS, "n_resamples": n_resamples, "seed": seed}
    path, done = stored_table(out, "recovery", config, force)
    if done is not None:
        return done
    try:
        with threadpool_limits(limits=1, user_api="blas"):  # small fits: BLAS threads only spin on 2 cores
            rows = _recovery_rows(cache, embeddings, swapped, rows_sw, random_cache, random_swapped, list(choices),
                                  vocab, pairs_per_sentence, folds, inner_splits, n_resamples, seed, layers, last,
                                  progress)
    finally:
        _POOLED.clear()
    return keep_table(make_table(rows), path)


def _restrict(folds, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Outer folds over sentences -> folds over items that each belong to the sentence ``rows[i]``."""
    return [(np.flatnonzero(np.isin(rows, tr)), np.flatnonzero(np.isin(rows, te))) for tr, te in folds]


def _recovery_rows(cache, embeddings, swapped, rows_sw, random_cache, random_swapped, choices, vocab, per_sentence,
                   folds, inner_splits, n_resamples, seed, layers, last, progress) -> list[dict]:
    from analyses.probes import content_vocabulary, presence

    # the examples every model holds (a model with fewer positions than a sentence skips it at extraction)
    keep = _stored(cache)
    if random_cache is not None:
        keep = np.intersect1d(keep, _stored(random_cache))
    if len(keep) < 2:
        raise ValueError(f"{cache.path}: fewer than two sentences stored; nothing to decode")
    n = len(keep)
    pos = np.full(len(cache.examples), -1)
    pos[keep] = np.arange(n)
    groups, grouping = cache_groups(cache)
    groups = groups[keep]
    outer = grouped_folds(groups, folds, seed)
    base = {"analysis": "recovery", "corpus": cache.manifest["corpus"]["name"], "format": cache.format_name,
            "seed": seed, "grouping": grouping, "n_resamples": n_resamples, "n_folds": folds}
    models = {"trained": model_label(cache), "": model_label(cache)}
    if random_cache is not None:
        models["random_init"] = model_label(random_cache)
    rows: list[dict] = []
    fit = {"inner_splits": inner_splits, "seed": seed}

    def add(target, metric, kind, choice, layer, decoder, values, grp, chosen=None, versus="", b=None):
        values = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(values) & (np.isfinite(b) if b is not None else True)
        row = {**base, "model": models[kind], "model_kind": kind, "target": target, "metric": metric,
               "choice": choice, "layer": layer, "decoder": decoder, "versus": versus}
        if b is not None:
            row.update(value_a=float(values[ok].mean()), value_b=float(np.asarray(b)[ok].mean()))
            values = values - b
        rows.append({**row, **_interval(values[ok], grp[ok], n_resamples, seed), **(_alphas(chosen) if chosen else {})})

    bar = tqdm(total=3, desc="recovery", disable=not progress, file=sys.stderr, delay=1)
    # content words
    sentences = cache.examples["sentence_1"].astype(str).to_numpy()[keep].tolist()
    vocabulary = content_vocabulary(sentences, vocab)
    if not vocabulary:
        raise ValueError(f"{cache.path}: its sentences hold no content word (stop words aside) to decode")
    Y = presence(sentences, vocabulary)
    c = Y.sum(axis=1)
    for metric, value, count in (("vocabulary_size", len(vocabulary), n),
                                 ("sentences_with_vocabulary", (c > 0).mean(), n),
                                 ("vocabulary_words_per_sentence", c[c > 0].mean() if (c > 0).any() else np.nan,
                                  int((c > 0).sum()))):
        rows.append({**base, "model": models["trained"], "model_kind": "", "target": "content_words", "metric": metric,
                     "choice": "", "decoder": "", "versus": "", "value": float(value), "n": count, "grouping": "",
                     "n_resamples": pd.NA})  # a count, no interval
    cells = [("trained", cache, ch, layer) for ch in choices for layer in layers]
    cells += [("random_init", random_cache, ch, last) for ch in choices if random_cache is not None]
    got, freq = {}, None
    # the cells' decoders are independent: read their vectors here, fit them side by side on every core (one BLAS
    # thread each, the caller's limit); results come back in the cells' order, so the table does not depend on it
    inputs = [_vectors(source, layer, ch, keep) for _, source, ch, layer in cells]
    scored = thread_map(lambda X: content_scores(X, Y, groups, outer, **fit), inputs, cpu_workers(None))
    for (kind, _, ch, layer), (dec, freq, chosen) in zip(cells, scored):
        got[kind, ch, layer] = dec
        add("content_words", "r_precision", kind, ch, layer, "ridge", dec, groups, chosen)
    add("content_words", "r_precision", "", "", pd.NA, "frequency", freq, groups)
    for (kind, ch, layer), dec in got.items():
        if kind == "trained":
            add("content_words", "difference", kind, ch, layer, "ridge", dec, groups, versus="frequency", b=freq)
        else:
            add("content_words", "difference", "trained", ch, layer, "ridge", got["trained", ch, layer], groups,
                versus="random_init", b=dec)
    if "cls" in choices and "mean" in choices:
        add("content_words", "difference", "trained", "cls", last, "ridge", got["trained", "cls", last], groups,
            versus="mean", b=got["trained", "mean", last])
    bar.update()
    # word order
    words = sentence_words(cache.tokens, embeddings)
    first, second = adjacent_pairs(words, per_sentence, seed)
    item = pos[words["example"].to_numpy()[first]]
    first, second, item = first[item >= 0], second[item >= 0], item[item >= 0]
    if len(first) == 0:
        raise ValueError(f"{cache.path}: no two adjacent words of letters in any sentence: no word order to decode")
    vec = words.attrs["vectors"]
    vectors = {("trained", ch): _vectors(cache, last, ch, keep) for ch in choices}
    if random_cache is not None:
        vectors.update({("random_init", ch): _vectors(random_cache, last, ch, keep) for ch in choices})
    names = {f"{k}/{ch}": (k, ch) for k, ch in vectors}
    res = order_scores(vec[first], vec[second], item, {name: vectors[key] for name, key in names.items()}, groups,
                       outer, **fit)
    g_pairs = groups[item]
    words_only, chosen = res.pop("words_only")
    add("word_order", "pair_order_accuracy", "", "", pd.NA, "words_only", words_only, g_pairs, chosen)
    for name, (correct, chosen) in res.items():
        kind, ch = names[name]
        add("word_order", "pair_order_accuracy", kind, ch, last, "bilinear", correct, g_pairs, chosen)
        add("word_order", "difference", kind, ch, last, "bilinear", correct, g_pairs, versus="words_only",
            b=words_only)
        if kind == "random_init":
            add("word_order", "difference", "trained", ch, last, "bilinear", res[f"trained/{ch}"][0], g_pairs,
                versus="random_init", b=correct)
    bar.update()
    # minimal pairs and BShift
    if swapped is not None:
        shown = np.random.default_rng(seed).random(len(rows_sw)) < 0.5
        sources = [("trained", cache, swapped)]
        if random_swapped is not None:
            sources.append(("random_init", random_cache, random_swapped))
        # the swapped copies every model holds whose original is read too
        held = _stored(swapped)
        if random_swapped is not None:
            held = np.intersect1d(held, _stored(random_swapped))
        held = held[pos[rows_sw[held]] >= 0]
        rows_kept, shown = pos[rows_sw[held]], shown[held]
        g_sw = groups[rows_kept]
        folds_sw = _restrict(outer, rows_kept)
        correct_by = {}
        for kind, orig, sw in sources:
            for ch in choices:
                for layer in (layers if kind == "trained" else [last]):
                    X, Xs = _vectors(orig, layer, ch, keep)[rows_kept], _vectors(sw, layer, ch, held)
                    correct, chosen = minimal_pair_scores(X, Xs, g_sw, folds_sw, **fit)
                    correct_by[kind, ch, layer] = correct
                    add("minimal_pairs", "accuracy", kind, ch, layer, "ridge", correct, g_sw, chosen)
                    add("minimal_pairs", "difference", kind, ch, layer, "ridge", correct, g_sw, versus="chance",
                        b=np.full(len(correct), 0.5))
                    if kind == "random_init":
                        add("minimal_pairs", "difference", "trained", ch, layer, "ridge",
                            correct_by["trained", ch, layer], g_sw, versus="random_init", b=correct)
                    if kind == "trained" and ch == "cls":
                        correct, chosen = bshift_scores(X, Xs, shown, g_sw, folds_sw, **fit)
                        add("bshift", "accuracy", kind, ch, layer, "ridge", correct, g_sw, chosen)
    bar.update()
    bar.close()
    return rows
