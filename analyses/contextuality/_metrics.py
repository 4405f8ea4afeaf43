"""The contextuality measures of Ethayarajh 2019 as pure functions of arrays, and the choice of the
words, types and occurrences they are computed over. The definitions, and the runner that reads a
cache and writes the table, are in :mod:`analyses.contextuality`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy import sparse as _sparse

_BLOCK_ROWS = 8192  # rows per float64 block in group sums
_BATCH_ELEMENTS = 4_000_000  # elements of one (types, n, d) batch in the MEV


# ---------------------------------------------------------------------------------------------------
# Pure metric functions


def _codes(codes, n: int, name: str = "codes") -> tuple[np.ndarray, int]:
    c = np.asarray(codes)
    if c.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one per row), got {name}.shape={c.shape}")
    if n == 0:
        raise ValueError(f"{name} is empty: no rows")
    if not np.issubdtype(c.dtype, np.integer) or c.min() < 0:
        raise ValueError(f"{name} must be non-negative integers (0..n_groups-1), got dtype {c.dtype}")
    return c.astype(np.int64), int(c.max()) + 1


def _matrix(X) -> np.ndarray:
    X = X if isinstance(X, np.ndarray) else np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n, dim), got X.shape={X.shape}")
    return X


def _row_norms(X: np.ndarray) -> np.ndarray:
    out = np.empty(X.shape[0])
    for s in range(0, X.shape[0], _BLOCK_ROWS):
        b = np.asarray(X[s:s + _BLOCK_ROWS], dtype=np.float64)
        out[s:s + _BLOCK_ROWS] = np.sqrt(np.einsum("ij,ij->i", b, b))
    bad = ~(np.isfinite(out) & (out > 0))
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(f"{idx.size} rows have zero norm or non-finite values, so no cosine; "
                         f"first rows {idx[:10].tolist()}")
    return out


def group_sums(X, codes, n_groups: int, scale=None) -> np.ndarray:
    """``out[g] = Σ_{i: codes[i] = g} X[i] * scale[i]``: (n_groups, dim) float64, in row blocks (a
    sparse indicator product per block, so ``X`` is never copied whole)."""
    X = _matrix(X)
    out = np.zeros((n_groups, X.shape[1]))
    for s in range(0, X.shape[0], _BLOCK_ROWS):
        c = codes[s:s + _BLOCK_ROWS]
        w = np.ones(c.size) if scale is None else scale[s:s + _BLOCK_ROWS]
        ind = _sparse.csr_matrix((w, (c, np.arange(c.size))), shape=(n_groups, c.size))
        out += ind @ np.asarray(X[s:s + _BLOCK_ROWS], dtype=np.float64)
    return out


def self_similarity(X, type_codes) -> np.ndarray:
    """Self-similarity of each word type: the mean cosine over ordered pairs j != k of its rows.

    X: (m, dim) occurrence vectors; type_codes: (m,) type of each row, 0..T-1, every type with at
    least 2 rows. Returns (T,) float64: ``(‖Σ_j u_j‖² − Σ_j ‖u_j‖²) / (n(n−1))`` with ``u_j`` the
    unit rows, which equals ``1/(n(n−1)) Σ_j Σ_{k≠j} cos(x_j, x_k)``. Raises ``ValueError`` on a
    zero-norm row or a type with fewer than 2 rows.

    >>> self_similarity([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]], [0, 0, 1, 1]).tolist()
    [1.0, 1.0]
    """
    X = _matrix(X)
    codes, T = _codes(type_codes, X.shape[0], "type_codes")
    n = np.bincount(codes, minlength=T).astype(np.float64)
    if (n < 2).any():
        bad = np.flatnonzero(n < 2)
        raise ValueError(f"self-similarity needs >= 2 occurrences per type; types {bad[:10].tolist()} "
                         f"have {n[bad[:10]].astype(int).tolist()}")
    inv = 1.0 / _row_norms(X)
    S = group_sums(X, codes, T, scale=inv)
    # Σ_j ‖u_j‖² is n up to rounding; computing it keeps identical rows at exactly 1 within ulps.
    sq = np.zeros(T)
    for s in range(0, X.shape[0], _BLOCK_ROWS):
        b = np.asarray(X[s:s + _BLOCK_ROWS], dtype=np.float64) * inv[s:s + _BLOCK_ROWS, None]
        sq += np.bincount(codes[s:s + _BLOCK_ROWS], weights=np.einsum("ij,ij->i", b, b), minlength=T)
    return np.clip((np.einsum("ij,ij->i", S, S) - sq) / (n * (n - 1.0)), -1.0, 1.0)


def max_explainable_variance(X, type_codes, centred: bool = False) -> np.ndarray:
    """Maximum explainable variance of each group of rows: ``σ_1² / Σ_i σ_i²`` of its (n × dim)
    matrix, the largest eigenvalue of its Gram matrix over its trace.

    Uncentred (default) is Ethayarajh's (2019, sec. 3.4) definition: the share of the matrix's squared
    norm one static vector keeps. ``centred=True`` subtracts the group's mean row first, which is what
    the authors' released code computes (``sklearn.decomposition.PCA(n_components=1)
    .explained_variance_ratio_``): the share of the occurrences' variance around their mean on the first
    principal direction.

    X: (m, dim); type_codes: (m,) group of each row, 0..T-1. Returns (T,) float64 in
    [1/min(n, dim), 1]: 1 when all rows are multiples of one vector, 1/n for n orthogonal rows of
    equal norm (centred: in [1/min(n − 1, dim), 1], NaN for a group with one row or identical rows,
    which have no variance). Groups of equal size are batched (``numpy.linalg.eigvalsh`` on stacked
    Gram matrices). Raises ``ValueError`` for a group whose rows are all zero (uncentred).

    >>> max_explainable_variance([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 2.0]], [0, 0, 1, 1]).tolist()
    [0.5, 1.0]
    >>> max_explainable_variance([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 2.0]], [0, 0, 1, 1], centred=True).tolist()
    [1.0, 1.0]
    """
    X = _matrix(X)
    codes, T = _codes(type_codes, X.shape[0], "type_codes")
    sizes = np.bincount(codes, minlength=T)
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    out = np.full(T, np.nan)
    for size in np.unique(sizes[sizes > 0]):
        types = np.flatnonzero(sizes == size)
        step = max(1, _BATCH_ELEMENTS // int(size * max(size, X.shape[1])))
        for b in range(0, types.size, step):
            t = types[b:b + step]
            idx = order[starts[t][:, None] + np.arange(size)]  # (b, size)
            V = np.asarray(X[idx.ravel()], dtype=np.float64).reshape(t.size, size, X.shape[1])
            if centred:
                norm = np.einsum("bij,bij->b", V, V)
                V = V - V.mean(axis=1, keepdims=True)
            G = V @ V.transpose(0, 2, 1)
            trace = np.einsum("bii->b", G)
            top = np.linalg.eigvalsh(G)[:, -1]
            if centred:
                # no variance (one row, or identical rows): no direction explains anything
                ok = trace > 1e-12 * norm
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[t] = np.where(ok, np.clip(top / trace, 0.0, 1.0), np.nan)
                continue
            if not (np.isfinite(trace).all() and (trace > 0).all()):
                bad = t[~(np.isfinite(trace) & (trace > 0))]
                raise ValueError(f"groups {bad[:10].tolist()} have only zero or non-finite rows: MEV undefined")
            out[t] = np.clip(top / trace, 0.0, 1.0)
    return out


def intra_similarity(X, sentence_codes) -> np.ndarray:
    """Intra-sentence similarity of each sentence: ``1/m Σ_i cos(x_i, s)`` with ``s`` the mean of
    its m word vectors.

    X: (n, dim) word vectors; sentence_codes: (n,) sentence of each row, 0..S-1. Returns (S,)
    float64, from two group sums (of the unit rows and of the rows): ``<Σ_i u_i, s> / (m ‖s‖)``. A
    one-word sentence gives 1. Raises ``ValueError`` on a zero-norm row or a zero mean vector.
    """
    X = _matrix(X)
    codes, S = _codes(sentence_codes, X.shape[0], "sentence_codes")
    m = np.bincount(codes, minlength=S).astype(np.float64)
    U = group_sums(X, codes, S, scale=1.0 / _row_norms(X))
    mean = group_sums(X, codes, S) / np.maximum(m, 1.0)[:, None]
    mean_norm = np.sqrt(np.einsum("ij,ij->i", mean, mean))
    bad = (m > 0) & ~(mean_norm > 0)
    if bad.any():
        raise ValueError(f"sentences {np.flatnonzero(bad)[:10].tolist()} have a zero mean word vector")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(np.einsum("ij,ij->i", U, mean) / (m * mean_norm), -1.0, 1.0)


# ---------------------------------------------------------------------------------------------------
# Words, types and the occurrences to use

_MARKERS = r"^(?:Ġ|▁|Ċ)+|</w>$"  # byte-level BPE / SentencePiece word starts, original BPE word ends


def _clean_subwords(tokens: pd.Series, subword_index: np.ndarray) -> pd.Series:
    s = tokens.astype(str).str.replace(_MARKERS, "", regex=True)
    return s.where(np.asarray(subword_index) == 0, s.str.replace(r"^##", "", regex=True))


def join_subwords(tokens: Sequence[str], subword_index: Sequence[int]) -> str:
    """Surface text of one word from its subword tokens (in subword order): WordPiece ``##`` is
    dropped from continuations, ``Ġ`` / ``▁`` from word starts, ``</w>`` from word ends.

    >>> join_subwords(["un", "##believ", "##ably"], [0, 1, 2]), join_subwords(["Ġparrot"], [0])
    ('unbelievably', 'parrot')
    """
    return "".join(_clean_subwords(pd.Series(list(tokens), dtype=object), np.asarray(subword_index)).tolist())


def word_table(tokens: pd.DataFrame, lowercase: bool = True) -> tuple[pd.DataFrame, np.ndarray]:
    """One row per word of the token table, and each word token row's word number.

    Returns ``(words, word_of_row)``: ``words`` has columns ``example``, ``sentence``, ``index``,
    ``first_row`` (global row of the first subword) and ``type`` (surface text, see the module
    docstring), in order of first appearance; ``word_of_row`` (n_word_rows,) gives, for each row of
    ``tokens[role == "word"]`` in order, its word's position in ``words``. Raises ``ValueError`` if
    the table holds no word tokens or a word has no first subword.
    """
    is_word = tokens["role"].to_numpy() == "word"
    if not is_word.any():
        raise ValueError(f"no word tokens (roles stored: {sorted(set(tokens['role']))}); extract the cache "
                         "with --roles word (or cls,sep,word)")
    tw = tokens[is_word]
    rows = np.flatnonzero(is_word)
    word = tw.groupby(["example", "sentence", "index"], sort=False).ngroup().to_numpy()
    sub = tw["subword"].to_numpy()
    n_words = int(word.max()) + 1
    first = np.full(n_words, -1, dtype=np.int64)
    first[word[sub == 0]] = rows[sub == 0]
    if (first < 0).any():
        w = np.flatnonzero(first < 0)[:5]
        raise ValueError(f"{(first < 0).sum()} words have no first subword (subword 0); word numbers {w.tolist()}")
    head = tokens.iloc[first][["example", "sentence", "index"]].reset_index(drop=True)
    text = (tokens["word_text"].iloc[first].astype(str).str.strip().to_numpy(dtype=object)
            if "word_text" in tokens.columns else np.full(n_words, "", dtype=object))
    missing = text == ""
    if missing.any() and "token" in tokens.columns:
        part = pd.DataFrame({"w": word, "sub": sub, "tok": _clean_subwords(tw["token"], sub).to_numpy()})
        part = part[missing[word]].sort_values(["w", "sub"], kind="stable")
        joined = part.groupby("w", sort=True)["tok"].agg("".join)
        text[joined.index.to_numpy()] = joined.to_numpy(dtype=object)
    head["first_row"] = first
    head["type"] = pd.Series(text, dtype=object).str.lower() if lowercase else pd.Series(text, dtype=object)
    return head, word


def choose_contexts(types, examples, min_contexts: int = 5, max_contexts: int = 50, seed: int = 0):
    """The occurrences of each word type to measure: its first occurrence in each example, for types
    seen in at least ``min_contexts`` examples, at most ``max_contexts`` of them (a uniform sample
    without replacement, drawn with ``seed``).

    types, examples: (W,) type and example of each word, in token order. Returns ``(words, codes,
    names, available)``: ``words`` the chosen word positions grouped by type (ascending within a
    type), ``codes`` their type 0..T-1, ``names`` (T,) the type strings (sorted), ``available`` (T,)
    the number of examples each type occurs in before the cap.
    """
    types = np.asarray(types, dtype=object)
    examples = np.asarray(examples)
    first = ~pd.DataFrame({"t": types, "e": examples}).duplicated().to_numpy()
    cand = np.flatnonzero(first & (types != ""))
    codes, names = pd.factorize(types[cand], sort=True)
    counts = np.bincount(codes, minlength=len(names))
    keep_type = counts >= min_contexts
    rank = np.empty(cand.size, dtype=np.int64)
    order = np.lexsort((np.random.default_rng([seed, 1]).random(cand.size), codes))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank[order] = np.arange(cand.size) - starts[codes[order]]
    keep = keep_type[codes] & (rank < max_contexts)
    new = np.cumsum(keep_type) - 1
    words, c = cand[keep], new[codes[keep]]
    o = np.lexsort((words, c))
    return words[o], c[o], np.asarray(names, dtype=object)[keep_type], counts[keep_type]


def random_word_sets(sizes, examples, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """For each size n in ``sizes``, n random words from n different examples: the examples drawn
    without replacement with probability proportional to their number of words, then one word
    uniformly within each. examples: (W,) example of each word. Returns ``(words, codes)``, the
    word positions and their set number 0..len(sizes)-1."""
    sizes = np.asarray(sizes, dtype=np.int64)
    _, ex_code, ex_size = np.unique(np.asarray(examples), return_inverse=True, return_counts=True)
    ex_code = ex_code.reshape(-1)
    if sizes.size and sizes.max() > ex_size.size:
        raise ValueError(f"cannot draw {sizes.max()} words from different examples: only {ex_size.size} examples")
    by_ex = np.argsort(ex_code, kind="stable")
    ex_start = np.concatenate([[0], np.cumsum(ex_size)[:-1]])
    p = ex_size / ex_size.sum()
    rng = np.random.default_rng([seed, 2])
    words, codes = [], []
    for k, n in enumerate(sizes):
        e = rng.choice(ex_size.size, size=int(n), replace=False, p=p)
        words.append(by_ex[ex_start[e] + rng.integers(0, ex_size[e])])
        codes.append(np.full(int(n), k, dtype=np.int64))
    if not words:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(words), np.concatenate(codes)
