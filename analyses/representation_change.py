"""How far a representation moves when its input changes, as a share of the way to another input.

"Do the embeddings change a lot?" (Q1) and "does sentence 1 take in more of sentence 2 without [SEP]?" (Q2)
both ask how far the representation of the same item moves between two inputs, and whether that is far.
A raw ``1 − cos`` cannot say: in these models two states of different inputs can lie 0.3 apart ([CLS]) or
0.96 apart (words). So every change here is measured in units of the representation's own **spread**:

    share = (1 − cos(h_ref, h_changed)) / spread,   spread = 1 − mean cos(h_x, h_y), x, y different examples

at the same layer, the spread estimated from random pairs of the reference cache's rows of that
representation in different examples (:func:`analyses.drift.pair_spread`, held fixed in the bootstrap):
0 = unchanged, 1 = as far as another input (the yardstick "another input", 100%).

* A **change** is two caches of the same examples (the same example ids; the same model): a reference
  (``pair``) and the changed input: another format of the same corpus (``concat``), or the same format of
  a corpus derived from it (two adjacent words of sentence 1 swapped, sentence 2 replaced by another
  sentence: :mod:`probing.study.questions._common`).
* A **representation** (:data:`REPRESENTATIONS`) is a group of word tokens (``words``, ``s<i> words``,
  ``s<i> inner words``), each token paired with the token of the same key *and the same token id* in the
  changed cache (so the two swapped words drop out: their keys hold other words after the swap), or one
  vector per example: a token choice of :mod:`analyses.selection` (``cls``, ``mean``, ``mean_s<i>``).
  A token group that a change replaces (sentence 2's words when sentence 2 is replaced) is not measured for
  that change: the caller says which changes each representation is measured for.
* Per example: the mean share over its tokens (the same tokens for every change of the representation:
  the keys paired in all of them), or the share of its one vector.
* Per layer, representation and change, the mean over examples with a cluster bootstrap over documents
  (examples where the corpus has none); between two changes of the same examples (``comparisons``), the
  mean of the per-example differences (paired) and the ratio of the two means, on the same resamples.

:func:`run_representation_change` writes the tidy table ``representation_change`` (docs/TABLES.md). The
statistics are pure functions of arrays (:func:`share_of_spread`, :func:`resampled_means`,
:func:`change_summary`, :func:`change_comparison`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.drift import MIN_SPREAD, pair_spread, rowwise_cosine
from analyses.results import cache_identity, keep_table, make_table, model_label, stored_table
from analyses.selection import item_rows, parse_choice, pool
from analyses.stats import DEFAULT_RESAMPLES, check_resamples, table_groups
from probing.cache import Cache
from probing.layers import resolve_layers

#: The representations, declared once: name pattern -> what it is.
REPRESENTATIONS: dict[str, str] = {
    "words": "every word token of the example, each paired by key and token id",
    "s<i> words": "the word tokens of sentence i",
    "s<i> inner words": "the word tokens of sentence i but its first and last word (both neighbours in it)",
    "<token choice>": "one vector per example: a token choice of analyses.selection (cls, mean, mean_s<i>, ...)",
}
_TOKEN_GROUP = re.compile(r"words|s(\d+) words|s(\d+) inner words")
#: Columns that name a token across caches of the same examples (the example by its id, not its position).
TOKEN_KEY = ("example_id", "role", "sentence", "index", "subword")


# ---------------------------------------------------------------------------------------------------
# Pure functions of arrays


def share_of_spread(A, B, spread: float) -> np.ndarray:
    """``(1 − cos(A_i, B_i)) / spread`` per row: how far each row moved, as a share of the distance between
    two different inputs. A, B: (n, dim) states of the same items in two inputs; spread: > 0.

    >>> share_of_spread([[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], 0.5).tolist()
    [0.0, 2.0]
    """
    if not (np.isfinite(spread) and spread > MIN_SPREAD):
        raise ValueError(f"spread must be a positive number above {MIN_SPREAD}, got {spread!r}")
    return (1.0 - rowwise_cosine(A, B)) / spread


def example_means(values, examples) -> tuple[np.ndarray, np.ndarray]:
    """The mean of ``values (n,)`` per example of ``examples (n,)``: ``(examples (m,), means (m,))``, the
    examples sorted."""
    v = np.asarray(values, dtype=np.float64)
    uniq, codes = np.unique(np.asarray(examples), return_inverse=True)
    codes = codes.reshape(-1)
    return uniq, np.bincount(codes, weights=v, minlength=uniq.size) / np.bincount(codes, minlength=uniq.size)


def resampled_means(values, groups, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """The item-weighted mean of each column of ``values`` (n,) or (n, k) over ``n_resamples`` cluster-bootstrap
    resamples of ``groups`` (n,) (whole groups drawn with replacement, Davison & Hinkley 1997 sec. 3.8):
    ``(n_resamples, k)``. Every column shares each resample, so a difference or ratio of columns is resampled
    as a pair. The draws depend on ``seed`` and the number of groups only."""
    n_resamples = check_resamples(n_resamples)
    v = np.asarray(values, dtype=np.float64)
    v = v[:, None] if v.ndim == 1 else v
    if v.ndim != 2 or v.shape[0] != np.asarray(groups).shape[0]:
        raise ValueError(f"values must be (n,) or (n, k) with one group per row; got {v.shape=} and "
                         f"groups of shape {np.asarray(groups).shape}")
    _, codes = np.unique(np.asarray(groups), return_inverse=True)
    codes = codes.reshape(-1)
    G = int(codes.max()) + 1 if codes.size else 0
    if G == 0:
        raise ValueError("no items to resample")
    sums = np.stack([np.bincount(codes, weights=v[:, j], minlength=G) for j in range(v.shape[1])], axis=1)
    counts = np.bincount(codes, minlength=G).astype(np.float64)
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, v.shape[1]))
    step = max(1, 250_000 // G)  # bounds the (resamples x groups) multiplicity matrix
    for s in range(0, n_resamples, step):
        draws = rng.integers(0, G, size=(min(step, n_resamples - s), G))
        times = np.zeros((draws.shape[0], G))
        np.add.at(times, (np.arange(draws.shape[0])[:, None], draws), 1.0)
        out[s:s + step] = (times @ sums) / (times @ counts)[:, None]
    return out


def _percentile(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    d = draws[np.isfinite(draws)]
    if d.size == 0:
        return float("nan"), float("nan")
    a = (1 - confidence) / 2
    lo, hi = np.quantile(d, [a, 1 - a])
    return float(lo), float(hi)


def change_summary(values, groups, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                   confidence: float = 0.95) -> dict[str, float]:
    """The mean of per-item ``values`` (n,) with its cluster-bootstrap standard error (the standard deviation
    of :func:`resampled_means`) and percentile interval over ``groups``: ``value``, ``se``, ``ci_low``,
    ``ci_high``, ``n``, ``n_groups``, ``n_resamples``. With one group the SE and interval are NaN.

    >>> r = change_summary([0.1, 0.2, 0.3, 0.4], ["a", "a", "b", "b"], n_resamples=200)
    >>> round(r["value"], 2), r["n"], r["n_groups"]
    (0.25, 4, 2)
    """
    v = np.asarray(values, dtype=np.float64)
    n_groups = int(np.unique(np.asarray(groups)).size)
    out = {"value": float(v.mean()), "n": int(v.size), "n_groups": n_groups, "n_resamples": int(n_resamples)}
    if n_groups < 2:
        return {**out, "se": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    draws = resampled_means(v, groups, n_resamples, seed)[:, 0]
    lo, hi = _percentile(draws, confidence)
    return {**out, "se": float(draws.std(ddof=1)), "ci_low": lo, "ci_high": hi}


def change_comparison(a, b, groups, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                      confidence: float = 0.95) -> dict[str, float]:
    """Two changes measured on the same items, paired: ``value`` = mean(a − b) with its bootstrap ``se`` and
    percentile ``ci_low``/``ci_high``; ``value_a``, ``value_b`` the two means; ``ratio`` = mean(a) / mean(b)
    with ``ratio_low``/``ratio_high`` and ``ratio_se`` from the same resamples of ``groups`` (NaN where
    mean(b) is 0); ``n``, ``n_groups``, ``n_resamples``.

    >>> r = change_comparison([0.2, 0.4, 0.2, 0.4], [0.1, 0.2, 0.1, 0.2], [0, 0, 1, 1], n_resamples=200)
    >>> round(r["value"], 2), round(r["ratio"], 2), round(r["ratio_low"], 2)
    (0.15, 2.0, 2.0)
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be paired item by item, (n,) each; got {a.shape=} and {b.shape=}")
    n_groups = int(np.unique(np.asarray(groups)).size)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = float(a.mean() / b.mean()) if b.mean() != 0 else float("nan")
    out = {"value": float((a - b).mean()), "value_a": float(a.mean()), "value_b": float(b.mean()), "ratio": ratio,
           "n": int(a.size), "n_groups": n_groups, "n_resamples": int(n_resamples)}
    nan = float("nan")
    if n_groups < 2:
        return {**out, "se": nan, "ci_low": nan, "ci_high": nan, "ratio_se": nan, "ratio_low": nan, "ratio_high": nan}
    draws = resampled_means(np.stack([a, b], axis=1), groups, n_resamples, seed)
    diff = draws[:, 0] - draws[:, 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.where(draws[:, 1] != 0, draws[:, 0] / draws[:, 1], np.nan)
    lo, hi = _percentile(diff, confidence)
    rlo, rhi = _percentile(ratios, confidence)
    finite = ratios[np.isfinite(ratios)]
    return {**out, "se": float(diff.std(ddof=1)), "ci_low": lo, "ci_high": hi,
            "ratio_se": float(finite.std(ddof=1)) if finite.size > 1 else nan, "ratio_low": rlo, "ratio_high": rhi}


# ---------------------------------------------------------------------------------------------------
# Reading caches


def is_token_group(representation: str) -> bool:
    """Whether ``representation`` is a group of tokens (paired by key) rather than one vector per example."""
    return _TOKEN_GROUP.fullmatch(representation) is not None


def check_representation(representation: str) -> str:
    """``representation`` if it is one of :data:`REPRESENTATIONS`; a ValueError naming the valid ones."""
    if is_token_group(representation):
        return representation
    try:
        parse_choice(representation)
    except ValueError as err:
        raise ValueError(f"unknown representation {representation!r}; valid: {', '.join(REPRESENTATIONS)}") from err
    return representation


def group_mask(tokens: pd.DataFrame, representation: str) -> np.ndarray:
    """(n_tokens,) bool: the rows of a token table in the token group ``representation``."""
    m = _TOKEN_GROUP.fullmatch(representation)
    if m is None:
        raise ValueError(f"{representation!r} is not a token group ({', '.join(list(REPRESENTATIONS)[:3])})")
    mask = tokens["role"].eq("word").to_numpy(dtype=bool, na_value=False, copy=True)
    sentence = m.group(1) or m.group(2)
    if sentence is None:
        return mask
    sent = tokens["sentence"].to_numpy()
    mask &= sent == int(sentence)
    if m.group(2) is not None:
        index = tokens["index"].to_numpy()
        last = np.full(len(tokens), -1)
        last[mask] = tokens[mask].groupby("example", sort=False)["index"].transform("max").to_numpy()
        mask &= (index != 0) & (index != last)
    return mask


def check_same_examples(ref: Cache, other: Cache) -> None:
    """Refuse a change whose two caches are not the same model's states of the same examples: the model
    fingerprints differ, or no example id is in both (a derived corpus may hold a subset of the reference's
    examples, under the same ids)."""
    A, B = ref.manifest["model"], other.manifest["model"]
    problems = []
    if A["fingerprint"] != B["fingerprint"]:
        problems.append(f"different models ({A['name']} [{str(A['fingerprint'])[:12]}] vs {B['name']} "
                        f"[{str(B['fingerprint'])[:12]}])")
    ids_a = set(ref.examples["example_id"].astype(str))
    if not ids_a & set(other.examples["example_id"].astype(str)):
        problems.append("no example id in common: they are not inputs made from the same examples")
    if problems:
        raise ValueError(f"cannot measure the change from {ref.path} to {other.path}: " + "; ".join(problems))


def token_pairs(ref: Cache, other: Cache, representation: str) -> pd.DataFrame:
    """The tokens of ``representation`` in both caches: one row per token key present in both with the same
    token id, columns ``example_id``, ``sentence``, ``index``, ``subword``, ``row_ref``, ``row_other``."""
    ta, tb = ref.tokens, other.tokens
    ra, rb = np.flatnonzero(group_mask(ta, representation)), np.flatnonzero(group_mask(tb, representation))
    on = list(TOKEN_KEY) + ["token_id"]
    left = pd.MultiIndex.from_frame(ta.loc[ra, on].astype({"example_id": str}))
    right = pd.MultiIndex.from_frame(tb.loc[rb, on].astype({"example_id": str}))
    pos = right.get_indexer(left)
    found = pos >= 0
    keys = ta.loc[ra[found], ["example_id", "sentence", "index", "subword"]].astype({"example_id": str})
    return keys.reset_index(drop=True).assign(row_ref=ra[found], row_other=rb[pos[found]])


def _common_tokens(pairs: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each change's token pairs restricted to the keys paired in every change (the same tokens throughout)."""
    key = ["example_id", "sentence", "index", "subword"]
    common = None
    for p in pairs.values():
        idx = pd.MultiIndex.from_frame(p[key])
        common = idx if common is None else common.intersection(idx)
    out = {}
    for name, p in pairs.items():
        keep = pd.MultiIndex.from_frame(p[key]).isin(common)
        out[name] = p[keep].sort_values(key, kind="stable").reset_index(drop=True)
    return out


def _vectors(cache: Cache, choice: str, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(example ids (m,), X (m, n_layers_stored, hidden))`` of a token choice, every stored layer."""
    items = item_rows(cache, choice)
    ex_ids = cache.examples["example_id"].astype(str).to_numpy()[items.examples]
    if ids is not None:
        keep = np.flatnonzero(np.isin(ex_ids, ids))
        items, ex_ids = items.take(keep), ex_ids[keep]
    return ex_ids, pool(cache, None, items)


def _groups(ref: Cache, ids: np.ndarray) -> tuple[np.ndarray, str]:
    table = ref.examples.assign(_id=ref.examples["example_id"].astype(str)).set_index("_id").loc[ids]
    return table_groups(table, str(ref.path))


def _per_layer_shares(ref_states: np.ndarray, other_states: np.ndarray, ids_per_row: np.ndarray,
                      layer_index: Sequence[int], n_pairs: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, float,
                                                                                      np.ndarray]]:
    """Per layer: ``(example ids, per-example mean share, spread, per-example mean raw 1 − cos)``;
    the spread from random pairs of the reference's rows of different examples (NaN share where it is ~0)."""
    out = []
    everything = np.ones(len(ids_per_row), dtype=bool)
    for li in layer_index:
        A, B = ref_states[:, li], other_states[:, li]
        spread = pair_spread([A], ids_per_row, everything, n_pairs, seed)
        drift = 1.0 - rowwise_cosine(A, B)
        ids, d = example_means(drift, ids_per_row)
        if not (np.isfinite(spread) and spread > MIN_SPREAD):
            out.append((ids, np.full(len(ids), np.nan), spread, d))
            continue
        out.append((ids, d / spread, spread, d))
    return out


def run_representation_change(changes: Mapping[str, tuple[Cache, Cache]], representations: Mapping[str, Sequence[str]],
                              comparisons: Sequence[tuple[str, str]] = (), *, layers: Sequence[int] | str | None = None,
                              n_pairs: int = 10000, n_resamples: int = 1000, seed: int = 0,
                              out: str | Path | None = None, force: bool = False) -> pd.DataFrame:
    """How far each representation moves under each change, as a share of its spread (module docstring).

    ``changes``: name -> ``(reference cache, changed cache)``, of one model and the same example ids;
    ``representations``: representation (:data:`REPRESENTATIONS`) -> the names of the changes it is measured
    for; ``comparisons``: ``(a, b)`` pairs of change names, compared on the examples (and tokens) both have,
    for every representation measured for both; ``layers``: a layer spec among the layers every cache
    stores (default: all). Returns the tidy table (``analysis = "representation_change"``): per layer,
    representation and change a ``share`` row, per comparison a ``share_diff`` row (a − b, paired per example)
    and a ``share_ratio`` row (mean a / mean b). With ``out`` the table is stored and reused."""
    n_resamples = check_resamples(n_resamples)
    if not changes:
        raise ValueError("no change to measure")
    if int(n_pairs) != n_pairs or n_pairs < 1:
        raise ValueError(f"n_pairs must be a positive integer, got {n_pairs!r}")
    for rep, names in representations.items():
        check_representation(rep)
        unknown = [c for c in names if c not in changes]
        if unknown or not names:
            raise ValueError(f"representation {rep!r} names changes {list(names)}; changes: {list(changes)}")
    for a, b in comparisons:
        if a not in changes or b not in changes or a == b:
            raise ValueError(f"comparison ({a!r}, {b!r}) must name two different changes of {list(changes)}")
    for ref, other in changes.values():
        check_same_examples(ref, other)
    stored = [set(c.layers) for pair in changes.values() for c in pair]
    common_layers = sorted(set.intersection(*stored))
    first = next(iter(changes.values()))[0]
    layers = resolve_layers(layers, int(first.manifest["model"]["n_layers"]), stored=common_layers)
    config = {"changes": {k: [cache_identity(r), cache_identity(o)] for k, (r, o) in changes.items()},
              "representations": {k: list(v) for k, v in representations.items()},
              "comparisons": [list(c) for c in comparisons], "layers": layers, "n_pairs": int(n_pairs),
              "n_resamples": n_resamples, "seed": seed}
    path, done = stored_table(out, "representation_change", config, force)
    if done is not None:
        return done

    records = []
    for rep, names in representations.items():
        per_change = _measure(rep, {c: changes[c] for c in names}, layers, int(n_pairs), seed)
        for change, per_layer in per_change.items():
            ref, other = changes[change]
            base = _base(ref, other, rep, change, seed)
            for layer, (ids, share, spread, drift) in per_layer.items():
                groups, grouping = _groups(ref, ids)
                ok = np.isfinite(share)
                if not ok.any():
                    records.append({**base, "layer": layer, "metric": "share", "value": np.nan, "spread": spread,
                                    "drift": float(drift.mean()), "n": len(ids), "grouping": grouping})
                    continue
                s = change_summary(share[ok], groups[ok], n_resamples, seed)
                records.append({**base, "layer": layer, "metric": "share", **s, "spread": spread,
                                "drift": float(drift[ok].mean()), "grouping": grouping})
        for a, b in comparisons:
            if a not in per_change or b not in per_change:
                continue
            ref_a = changes[a][0]
            for layer in layers:
                ids_a, sh_a, _, _ = per_change[a][layer]
                ids_b, sh_b, _, _ = per_change[b][layer]
                ids, ia, ib = np.intersect1d(ids_a, ids_b, return_indices=True)
                x, y = sh_a[ia], sh_b[ib]
                ok = np.isfinite(x) & np.isfinite(y)
                if not ok.any():
                    continue
                groups, grouping = _groups(ref_a, ids[ok])
                r = change_comparison(x[ok], y[ok], groups, n_resamples, seed)
                base = {**_base(ref_a, changes[a][1], rep, a, seed), "change_b": b,
                        "format_b": changes[b][1].format_name, "corpus_b": changes[b][1].manifest["corpus"]["name"],
                        "layer": layer, "grouping": grouping}
                ratio = {k: r.pop(k) for k in ("ratio", "ratio_low", "ratio_high", "ratio_se")}
                records.append({**base, "metric": "share_diff", **r})
                records.append({**base, "metric": "share_ratio", "value": ratio["ratio"], "ci_low": ratio["ratio_low"],
                                "ci_high": ratio["ratio_high"], "se": ratio["ratio_se"], "value_a": r["value_a"],
                                "value_b": r["value_b"], "n": r["n"], "n_groups": r["n_groups"],
                                "n_resamples": r["n_resamples"]})
    return keep_table(make_table(records), path)


def _base(ref: Cache, other: Cache, rep: str, change: str, seed: int) -> dict:
    token = is_token_group(rep)
    return {"analysis": "representation_change", "model": model_label(ref), "corpus": ref.manifest["corpus"]["name"],
            "corpus_b": other.manifest["corpus"]["name"], "format": ref.format_name, "format_b": other.format_name,
            "role": rep if token else None, "choice": "" if token else rep, "target": "", "change": change,
            "change_b": "",
            "seed": seed}


def _measure(rep: str, changes: Mapping[str, tuple[Cache, Cache]], layers: Sequence[int], n_pairs: int,
             seed: int) -> dict[str, dict[int, tuple]]:
    """change -> layer -> (example ids, per-example share, spread, per-example raw 1 − cos)."""
    out: dict[str, dict[int, tuple]] = {}
    if is_token_group(rep):
        pairs = _common_tokens({c: token_pairs(ref, other, rep) for c, (ref, other) in changes.items()})
        for c, (ref, other) in changes.items():
            p = pairs[c]
            if p.empty:
                raise ValueError(f"{rep!r}: the change {c!r} ({ref.format_name} -> {other.format_name}) pairs no token "
                                 f"that every change of {list(changes)} pairs")
            A = ref.states(None, p["row_ref"].to_numpy())[:, [ref.layer_index(layer) for layer in layers]]
            B = other.states(None, p["row_other"].to_numpy())[:, [other.layer_index(layer) for layer in layers]]
            shares = _per_layer_shares(A, B, p["example_id"].to_numpy(), range(len(layers)), n_pairs, seed)
            out[c] = dict(zip(layers, shares))
        return out
    ids_all = None
    for ref, other in changes.values():
        ids = np.intersect1d(*(c.examples["example_id"].astype(str).to_numpy() for c in (ref, other)))
        ids_all = ids if ids_all is None else np.intersect1d(ids_all, ids)
    for c, (ref, other) in changes.items():
        ex_a, A = _vectors(ref, rep, ids_all)
        ex_b, B = _vectors(other, rep, ids_all)
        ids, ia, ib = np.intersect1d(ex_a, ex_b, return_indices=True)
        A = A[ia][:, [ref.layer_index(layer) for layer in layers]]
        B = B[ib][:, [other.layer_index(layer) for layer in layers]]
        out[c] = dict(zip(layers, _per_layer_shares(A, B, ids, range(len(layers)), n_pairs, seed)))
    return out
