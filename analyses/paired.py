"""Paired comparisons on the same items: the difference between two conditions with a CI.

"Is A different from B" is answered by the per-item difference, never by two marginal intervals side
by side (DESIGN.md, "Compare on the same items, paired"):

The statistics are those of :mod:`analyses.stats`: :func:`analyses.stats.paired_difference` (the
mean of ``a − b`` over paired items, a cluster-bootstrap CI over groups, documents when the corpus has
them, and a two-sided cluster sign-flip p-value) and :func:`analyses.stats.holm` (Holm's step-down
adjustment across a family: here the layers of one comparison, per role and metric).

Runners on caches:

* :func:`run_paired_drift` (Q2): three caches of one corpus, a reference format R (``single``) and two
  formats A and B (``pair``, ``concat``); per token key present in all three, ``drift_R→B − drift_R→A``
  with ``drift = 1 − cos``, per layer and role group (and, with ``edges``, each sentence's inner and
  edge words apart): do sentence 1's words move further from their states alone in B than in A?
* :func:`run_role_contrast` (Q1): two caches A and B; per example, the drift A→B of one token
  (``cls``) minus the mean drift of the example's word tokens: does [CLS] change more than the words?
* :func:`run_prefix_drift` (Q3): four caches, formats A and B of a short input (the first k sentences
  of each document) and of a long one (the first K > k sentences of the same documents); per token key
  of the shared sentences (and [CLS]) present in all four, ``drift_long − drift_short`` with
  ``drift = 1 − cos(h_A, h_B)``: does the format effect grow with more sentences?
* :func:`run_paired_attention` (Q2): two caches A and B extracted with ``--attention``; per example
  and layer, the head-mean attention mass from a source group to a target group (``s1 words`` →
  ``s2 words``) in B minus in A.

Both write a tidy table: analysis, model, corpus, format (A), format_b (B), reference, layer, role,
metric, value, ci_low, ci_high, p_value, p_holm, n, n_groups, grouping, and the two means compared
(``value_a``, ``value_b``).

    python -m analyses.paired CACHE_REF CACHE_A CACHE_B --out results        # Q2: B − A drift from R
    python -m analyses.paired --contrast cls CACHE_A CACHE_B --out results   # Q1: [CLS] − words
    python -m analyses.paired --attention CACHE_A CACHE_B --out results      # Q2: attention s1 → s2, B − A
    python -m analyses.paired --prefix SHORT_A SHORT_B LONG_A LONG_B --out results   # Q3: long − short drift
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal, Sequence, get_args

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.drift import MIN_SPREAD, group_labels, pair_spread, paired_rows, rowwise_cosine
from analyses.results import (CLI_ERRORS, add_layers_option, add_output_options, cache_identity, cli_error,
                              keep_table, make_table, model_label, stored_table, table_lines)
from analyses.stats import add_holm, cache_groups, check_resamples, paired_difference, scale_difference
from probing.cli import ArgumentParser
from probing.cache import align, check_comparable, check_prefix
from probing.layers import resolve_layers, shared_layers

Unit = Literal["token", "example"]
#: What one paired item is, declared once: a token key, or an example (mean over its tokens).
UNITS: tuple[str, ...] = get_args(Unit)

def _per_example(values: np.ndarray, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``values`` per example: ``(examples (m,), means (m,))`` in order of first appearance."""
    codes, uniq = pd.factorize(examples)
    return np.asarray(uniq), np.bincount(codes, weights=values) / np.bincount(codes)


def _cells(roles: np.ndarray, overall: str = "all") -> list[tuple[str, np.ndarray]]:
    cells = [(r, roles == r) for r in dict.fromkeys(roles.tolist())]
    return cells + [(overall, np.ones(len(roles), dtype=bool))] if len(cells) > 1 else cells


def three_way_rows(ref, a, b, words_only: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the token keys present in all three caches: ``(rows_ref, rows_a, rows_b)``, first
    subwords of words (and special tokens unless ``words_only``)."""
    ra_ref, ra = paired_rows(ref, a, "first", words_only)
    rb_ref, rb = paired_rows(ref, b, "first", words_only)
    common, ia, ib = np.intersect1d(ra_ref, rb_ref, assume_unique=True, return_indices=True)
    if common.size == 0:
        raise ValueError(f"{ref.format_name}, {a.format_name} and {b.format_name} share no token keys")
    return common, ra[ia], rb[ib]


def edge_cells(tokens: pd.DataFrame, roles: np.ndarray, overall: str | None = None,
               inner: str | None = None) -> list[tuple[str, np.ndarray]]:
    """Each sentence's words split by where they sit: ``s<i> edge words`` (its first and last word, whose
    neighbour on one side is a special token or another sentence, and changes when a separator is
    dropped) and ``s<i> inner words`` (the rest: both neighbours are words of the same sentence in every
    format). ``tokens`` are the rows ``roles`` labels; "last" is the last word stored for that example
    and sentence. ``overall`` names one more cell: every row but the edge words (e.g. [CLS] and the inner
    words); ``inner`` names another: the inner words of every sentence together, words only."""
    words = tokens["role"].to_numpy() == "word"
    index = tokens["index"].to_numpy()
    last = np.full(len(tokens), -1)
    last[words] = tokens[words].groupby(["example", "sentence"], sort=False)["index"].transform("max").to_numpy()
    edge = (index == 0) | (index == last)
    cells = []
    for role in dict.fromkeys(roles.tolist()):
        if role.endswith(" words"):
            m = roles == role
            name = role[: -len(" words")]
            cells += [(f"{name} inner words", m & ~edge), (f"{name} edge words", m & edge)]
    if inner is not None:
        cells.append((inner, words & ~edge))
    if overall is not None:
        cells.append((overall, ~(words & edge)))
    return [(r, m) for r, m in cells if m.any()]


def run_paired_drift(ref, a, b, *, layers: Sequence[int] | None = None, words_only: bool = True,
                     unit: Unit = "token", edges: bool = False, n_resamples: int = 1000, seed: int = 0,
                     out: str | Path | None = None, force: bool = False, progress: bool = True) -> pd.DataFrame:
    """Paired drift from a reference format: ``drift_R→B − drift_R→A`` on the same token keys.

    ref, a, b: caches of one model and corpus (e.g. ``single``, ``pair``, ``concat``). For every token
    key stored in all three (first subwords; words only unless ``words_only=False``) and each layer,
    ``d_A = 1 − cos(h_R, h_A)`` and ``d_B = 1 − cos(h_R, h_B)``; per role group (``s1 words``, ...,
    and ``all`` when there are several) one row, ``metric="drift_diff"``, from
    :func:`paired_difference` of ``d_B`` and ``d_A`` (``value`` = mean of ``d_B − d_A``; ``value_a``
    = mean ``d_A``, ``value_b`` = mean ``d_B``). ``unit="example"`` first averages each example's
    tokens. CIs resample documents when the corpus has a ``doc`` label, else examples (``grouping``,
    ``n_groups``); ``p_holm`` adjusts ``p_value`` across layers within each role group.

    ``edges=True`` adds, for each sentence, rows for its inner and its edge words (:func:`edge_cells`):
    dropping a separator changes an edge word's own neighbour, so a drift difference there need not be
    the other sentence's content reaching it.
    """
    n_resamples = check_resamples(n_resamples)
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    check_comparable(ref, a)
    check_comparable(ref, b)
    layers = shared_layers(layers, ref, a, b)
    config = {"ref": cache_identity(ref), "a": cache_identity(a), "b": cache_identity(b), "layers": layers,
              "words_only": words_only, "unit": unit, "n_resamples": n_resamples, "seed": seed}
    if edges:  # only then, so that tables stored before this option keep their key
        config["edges"] = True
    path, done = stored_table(out, "paired_drift", config, force)
    if done is not None:
        return done
    r_rows, a_rows, b_rows = three_way_rows(ref, a, b, words_only)
    tok = ref.tokens.iloc[r_rows]
    roles, examples = group_labels(tok), tok["example"].to_numpy()
    cells = _cells(roles) + (edge_cells(tok, roles) if edges else [])
    base = {"analysis": "paired_drift", "model": model_label(ref), "corpus": ref.manifest["corpus"]["name"],
            "format": a.format_name, "format_b": b.format_name, "reference": ref.format_name,
            "metric": "drift_diff", "target": "", "seed": seed, "unit": unit}
    records = []
    for layer in tqdm(layers, desc=f"paired drift {ref.format_name}→{a.format_name}/{b.format_name}",
                      disable=not progress, file=sys.stderr):
        R = ref.states(layer, r_rows)
        d_a = 1.0 - rowwise_cosine(R, a.states(layer, a_rows))
        d_b = 1.0 - rowwise_cosine(R, b.states(layer, b_rows))
        for role, m in cells:
            ex, va, vb = examples[m], d_a[m], d_b[m]
            if unit == "example":
                ex, va = _per_example(va, examples[m])
                _, vb = _per_example(vb, examples[m])
            groups, grouping = cache_groups(ref, ex)
            r = paired_difference(vb, va, groups, n_resamples=n_resamples, seed=seed)
            r.update(value_a=float(va.mean()), value_b=float(vb.mean()))  # A's and B's drift, in that order
            records.append({**base, "layer": layer, "role": role, **r, "grouping": grouping})
    df = add_holm(make_table(records), ["role", "metric"])
    return keep_table(df, path)


def run_role_contrast(a, b, role: str = "cls", *, versus: str = "words", layers: Sequence[int] | None = None,
                      n_resamples: int = 1000, n_pairs: int = 10000, seed: int = 0, out: str | Path | None = None,
                      force: bool = False, progress: bool = True) -> pd.DataFrame:
    """Does one token change more than the words between formats A and B (Q1), within each example?

    Per example: ``drift(role) − mean drift(words)`` with ``drift = 1 − cos(h_A, h_B)`` of the same
    key, first subwords; ``role`` is a role group of :func:`analyses.drift.group_labels` (``cls``,
    ``sep2``, ...), ``versus`` is ``"words"`` (every word) or a group (``"s1 words"``). Only examples
    having both are used. Per layer two rows, CI, p-value and ``p_holm`` (across the layers of each
    metric) as in :func:`run_paired_drift`, ``role`` = ``role`` minus ``role_b`` = ``versus``:

    - ``metric="drift_diff_roles"``: of the raw drifts; ``value_a`` the role's mean drift and ``value_b``
      the words';
    - ``metric="normalised_drift_diff_roles"``: of the drifts each divided by its own group's spread,
      ``1 −`` the mean cosine of ``n_pairs`` random pairs of that group's tokens from different examples
      (both formats; :func:`analyses.drift.pair_spread`), so 1 = as far as that group's tokens
      in two random inputs. The raw difference compares a token with the words on the words' scale: where
      [CLS] is nearly the same vector for every input (a sentence encoder's middle layers: random pairs
      of [CLS] at 1 − cos ≈ 1e-5) its raw drift is tiny whatever the format does to it. The spreads are
      estimated once per layer and held fixed in the bootstrap; no row at a layer where either spread is
      under :data:`analyses.drift.MIN_SPREAD` (the embedding layer's [CLS]).
    """
    n_resamples = check_resamples(n_resamples)
    check_comparable(a, b)
    layers = shared_layers(layers, a, b)
    config = {"a": cache_identity(a), "b": cache_identity(b), "role": role, "versus": versus, "layers": layers,
              "n_resamples": n_resamples, "n_pairs": n_pairs, "seed": seed}
    path, done = stored_table(out, "role_contrast", config, force)
    if done is not None:
        return done
    rows_a, rows_b = paired_rows(a, b, "first")
    tok = a.tokens.iloc[rows_a]
    groups_all = group_labels(tok)
    is_word = tok["role"].to_numpy() == "word"
    in_role = groups_all == role
    in_versus = is_word if versus == "words" else groups_all == versus
    if not in_role.any() or not in_versus.any():
        raise ValueError(f"{a.format_name} vs {b.format_name}: no token of group {role!r} or {versus!r}; "
                         f"groups present: {sorted(set(groups_all.tolist()))}")
    examples = tok["example"].to_numpy()
    both = np.intersect1d(examples[in_role], examples[in_versus])
    records = []
    base = {"analysis": "role_contrast", "model": model_label(a), "corpus": a.manifest["corpus"]["name"],
            "format": a.format_name, "format_b": b.format_name, "reference": "", "target": "",
            "metric": "drift_diff_roles", "role": role, "role_b": versus, "seed": seed, "unit": "example"}
    groups, grouping = cache_groups(a, both)
    # the rows of each group among both formats' states (A's rows, then B's), for their spreads
    ex2 = np.concatenate([examples, examples])
    keep_role2, keep_versus2 = (np.tile(np.isin(examples, both) & m, 2) for m in (in_role, in_versus))
    for layer in tqdm(layers, desc=f"{role} vs {versus} {a.format_name}→{b.format_name}", disable=not progress,
                      file=sys.stderr):
        A, B = a.states(layer, rows_a), b.states(layer, rows_b)
        d = 1.0 - rowwise_cosine(A, B)
        ex_r, v_r = _per_example(d[in_role], examples[in_role])
        ex_w, v_w = _per_example(d[in_versus], examples[in_versus])
        v_r = pd.Series(v_r, index=ex_r).reindex(both).to_numpy()
        v_w = pd.Series(v_w, index=ex_w).reindex(both).to_numpy()
        r = paired_difference(v_r, v_w, groups, n_resamples=n_resamples, seed=seed)
        records.append({**base, "layer": layer, **r, "grouping": grouping})
        spread = [pair_spread([A, B], ex2, keep, n_pairs, seed) for keep in (keep_role2, keep_versus2)]
        if all(sp >= MIN_SPREAD for sp in spread):  # NaN (one example) compares False
            r = paired_difference(v_r / spread[0], v_w / spread[1], groups, n_resamples=n_resamples, seed=seed)
            records.append({**base, "metric": "normalised_drift_diff_roles", "layer": layer, **r,
                            "spread_a": spread[0], "spread_b": spread[1], "grouping": grouping})
    df = add_holm(make_table(records), ["role", "role_b", "metric"])
    return keep_table(df, path)


def prefix_rows(short_a, short_b, long_a, long_b) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the token keys present in all four caches, among [CLS] and the first subwords of words:
    ``(rows_short_a, rows_short_b, rows_long_a, rows_long_b)``, in ``short_a``'s order. The [SEP]s are
    left out: the [SEP] after sentence i ends the short input but not the long one (the same key, another
    place in the sequence)."""
    sa, sb = paired_rows(short_a, short_b, "first")
    tok = short_a.tokens.iloc[sa]
    keep = group_labels(tok) == "cls"
    keep |= tok["role"].eq("word").to_numpy(dtype=bool, na_value=False)
    sa, sb = sa[keep], sb[keep]
    la, lb = paired_rows(long_a, long_b, "first")
    s_rows, l_rows = align(short_a, long_a, rows_a=sa, prefix=True)
    at = pd.Index(la).get_indexer(l_rows)  # where each long_a row sits among the long A/B pairs
    found = at >= 0
    if not found.any():
        raise ValueError(f"{short_a.format_name}/{short_b.format_name} (short) and {long_a.format_name}/"
                         f"{long_b.format_name} (long) share no [CLS] or word keys")
    in_short = pd.Index(sa).get_indexer(s_rows[found])
    return sa[in_short], sb[in_short], la[at[found]], lb[at[found]]


def run_prefix_drift(short_a, short_b, long_a, long_b, *, layers: Sequence[int] | None = None, edges: bool = False,
                     n_resamples: int = 1000, n_pairs: int = 10000, seed: int = 0, out: str | Path | None = None,
                     force: bool = False, progress: bool = True) -> pd.DataFrame:
    """Does the drift between formats A and B grow when the input holds more sentences (Q3)? Paired on
    the same tokens.

    short_a, short_b: formats A and B (e.g. ``multi``, ``concat``) of a corpus of the first k sentences
    of each document; long_a, long_b: the same formats of the first K > k sentences of the same
    documents (:func:`probing.cache.check_prefix`). For every token key present in all four ([CLS] and
    the first subwords of the words of sentences 1..k) and each layer, ``d_short = 1 − cos(h_A, h_B)``
    in the short inputs and ``d_long`` likewise in the long ones; per role group (``cls``, ``s1 words``,
    ..., ``all``) one row, ``metric="drift_growth"``, from :func:`paired_difference` of ``d_long`` and
    ``d_short`` (``value`` = mean of ``d_long − d_short``; ``value_a`` = mean ``d_short``, ``value_b`` =
    mean ``d_long``); the CI resamples documents when the corpus has a ``doc`` label, else examples;
    ``p_holm`` adjusts ``p_value`` across layers within each role group. ``corpus`` / ``corpus_b`` name
    the short and the long corpus, ``k`` / ``k_b`` their sentences per example.

    ``edges=True`` adds rows for each sentence's inner and edge words (:func:`edge_cells`), for ``inner
    words`` (the inner words of every sentence, Q3's words) and for ``cls and inner words``: the last word
    of sentence k is next to the closing [SEP] in both formats of the short input, but in the long one it
    is next to a [SEP] in one format and to sentence k + 1 in the other, a change of its own neighbour
    rather than of the format's reach.

    Each cell of one kind of token (not ``all`` or ``cls and inner words``, which mix [CLS] with words)
    also has a ``normalised_drift_growth``
    row: the same difference with both drifts divided by the cell's spread in the short inputs (``spread_a``:
    1 − the mean cosine of ``n_pairs`` random pairs of its tokens from different examples, both formats,
    :func:`analyses.drift.pair_spread`), so 1 = as far as another input. One constant divides
    both sides, so the CI scales and the p-value is the raw row's; what changes is the size read against
    a threshold: [CLS], nearly one vector for every input in a sentence encoder's middle layers, has a tiny
    raw drift whatever happens to it. No such row where the spread is under
    :data:`analyses.drift.MIN_SPREAD`.

    The unit is a choice: the cell's spread in the long inputs (``spread_b``, the same estimate over the long
    states of the same tokens) can differ from ``spread_a`` ([CLS]'s does, by up to 2x, in a sentence
    encoder's middle layers). So each such cell also has an ``own_spread_drift_growth`` row: ``d_long /
    spread_b − d_short / spread_a``, paired per token, each input's drift over its own spread, with its own
    CI and p-value (Holm over layers within the cell); none where either spread is under ``MIN_SPREAD``.
    """
    n_resamples = check_resamples(n_resamples)
    check_comparable(short_a, short_b)
    check_comparable(long_a, long_b)
    check_prefix(short_a, long_a)
    layers = shared_layers(layers, short_a, short_b, long_a, long_b)
    config = {"short_a": cache_identity(short_a), "short_b": cache_identity(short_b), "long_a": cache_identity(long_a),
              "long_b": cache_identity(long_b), "layers": layers, "n_resamples": n_resamples, "n_pairs": n_pairs,
              "seed": seed}
    if edges:  # only then, so that tables stored before this option keep their key
        config["edges"] = True
    path, done = stored_table(out, "prefix_drift", config, force)
    if done is not None:
        return done
    sa, sb, la, lb = prefix_rows(short_a, short_b, long_a, long_b)
    tok = short_a.tokens.iloc[sa]
    roles, examples = group_labels(tok), tok["example"].to_numpy()
    groups_all, grouping = cache_groups(short_a, examples)
    pooled = ("all", "cls and inner words")  # the cells that pool several roles: _cells' and edge_cells' overall
    cells = _cells(roles, overall=pooled[0]) + (edge_cells(tok, roles, overall=pooled[1], inner="inner words")
                                                if edges else [])
    ex2 = np.concatenate([examples, examples])  # the example of each row of both formats' states, for spreads
    k = [sum(c.startswith("sentence_") for c in c_.examples.columns) for c_ in (short_a, long_a)]
    base = {"analysis": "prefix_drift", "model": model_label(short_a), "corpus": short_a.manifest["corpus"]["name"],
            "corpus_b": long_a.manifest["corpus"]["name"], "k": k[0], "k_b": k[1], "format": short_a.format_name,
            "format_b": short_b.format_name, "target": "", "metric": "drift_growth", "seed": seed,
            "unit": "token"}
    records = []
    for layer in tqdm(layers, desc=f"drift {short_a.format_name}→{short_b.format_name}, k={k[1]} − k={k[0]}",
                      disable=not progress, file=sys.stderr):
        A, B = short_a.states(layer, sa), short_b.states(layer, sb)
        d_short = 1.0 - rowwise_cosine(A, B)
        LA, LB = long_a.states(layer, la), long_b.states(layer, lb)
        d_long = 1.0 - rowwise_cosine(LA, LB)
        for role, m in cells:
            r = paired_difference(d_long[m], d_short[m], groups_all[m], n_resamples=n_resamples, seed=seed)
            r.update(value_a=float(d_short[m].mean()), value_b=float(d_long[m].mean()))
            records.append({**base, "layer": layer, "role": role, **r, "grouping": grouping})
            if role in pooled:  # [CLS] with words: no one spread to divide by
                continue
            spread = pair_spread([A, B], ex2, np.tile(m, 2), n_pairs, seed)
            if not spread >= MIN_SPREAD:  # NaN too: fewer than two examples
                continue
            # one constant divides both sides: the raw row, rescaled
            records.append({**base, "metric": "normalised_drift_growth", "layer": layer, "role": role,
                            **scale_difference(r, spread), "spread_a": spread, "grouping": grouping})
            spread_b = pair_spread([LA, LB], ex2, np.tile(m, 2), n_pairs, seed)  # the same tokens, long inputs
            if spread_b >= MIN_SPREAD:
                own = paired_difference(d_long[m] / spread_b, d_short[m] / spread, groups_all[m],
                                        n_resamples=n_resamples, seed=seed)
                own.update(value_a=float(d_short[m].mean() / spread), value_b=float(d_long[m].mean() / spread_b))
                records.append({**base, "metric": "own_spread_drift_growth", "layer": layer, "role": role, **own,
                                "spread_a": spread, "spread_b": spread_b, "grouping": grouping})
    df = add_holm(make_table(records), ["role", "metric"])
    return keep_table(df, path)


def run_paired_attention(a, b, *, pairs: Sequence[tuple[str, str]] | None = (("s1 words", "s2 words"),),
                         layers: Sequence[int] | str | None = None, n_resamples: int = 1000, seed: int = 0,
                         out: str | Path | None = None, force: bool = False) -> pd.DataFrame:
    """Attention mass in format B minus format A, paired on the same examples (Q2). ``layers``: a layer
    spec (:mod:`probing.layers`) among the layers both caches recorded attention at (default: all).

    a, b: caches of one model and corpus extracted with ``--attention``. For each (source, target)
    group pair of :func:`analyses.attention.target_masses` named in ``pairs`` (None: every pair
    present in both caches; e.g. ``("s1 words", "s2 words")``: mass from sentence 1's words to sentence
    2's words) and each layer, the head mean per example in B minus in A; one row per pair and layer,
    ``metric="attention_diff"``, ``role`` = source, ``target`` = target, ``value_a``/``value_b`` the
    two means, CI over documents, p-value and ``p_holm`` across layers, as in :func:`run_paired_drift`.
    """
    from analyses.attention import target_masses
    from analyses.selection import attention_group_names

    n_resamples = check_resamples(n_resamples)
    check_comparable(a, b)
    layers_a, layers_b = a.manifest["attention"]["layers"], b.manifest["attention"]["layers"]
    layers = resolve_layers(layers, int(a.manifest["model"]["n_layers"]), stored=[l for l in layers_a if l in layers_b])
    config = {"a": cache_identity(a), "b": cache_identity(b),
              "pairs": None if pairs is None else [list(p) for p in pairs], "n_resamples": n_resamples, "seed": seed}
    if layers != [l for l in layers_a if l in layers_b]:
        config["layers"] = layers
    path, done = stored_table(out, "paired_attention", config, force)
    if done is not None:
        return done
    ex_a, mass_a, groups_a = a.attention()
    ex_b, mass_b, groups_b = b.attention()
    common = np.intersect1d(ex_a, ex_b)
    ia = pd.Series(np.arange(len(ex_a)), index=ex_a).reindex(common).to_numpy()
    ib = pd.Series(np.arange(len(ex_b)), index=ex_b).reindex(common).to_numpy()
    named_a = target_masses(mass_a, attention_group_names(a, groups_a))
    named_b = target_masses(mass_b, attention_group_names(b, groups_b))
    shared = [k for k in named_a if k in named_b]
    if pairs is not None:
        missing = [tuple(p) for p in pairs if tuple(p) not in shared]
        if missing:
            raise ValueError(f"{a.format_name} / {b.format_name}: no attention pair {missing}; "
                             f"pairs in both: {shared}")
        shared = [tuple(p) for p in pairs]
    if not shared or not layers or common.size == 0:
        raise ValueError(f"{a.format_name} and {b.format_name} share no attention groups, layers or examples")
    groups, grouping = cache_groups(a, common)
    base = {"analysis": "paired_attention", "model": model_label(a), "corpus": a.manifest["corpus"]["name"],
            "format": a.format_name, "format_b": b.format_name, "reference": "", "metric": "attention_diff",
            "seed": seed, "unit": "example"}
    records = []
    for src, tgt in shared:
        va_all = named_a[src, tgt].astype(np.float64).mean(axis=2)[ia]  # (n, layers)
        vb_all = named_b[src, tgt].astype(np.float64).mean(axis=2)[ib]
        for layer in layers:
            va, vb = va_all[:, layers_a.index(layer)], vb_all[:, layers_b.index(layer)]
            ok = np.isfinite(va) & np.isfinite(vb)
            if not ok.any():
                continue
            r = paired_difference(vb[ok], va[ok], groups[ok], n_resamples=n_resamples, seed=seed)
            r.update(value_a=float(va[ok].mean()), value_b=float(vb[ok].mean()))
            records.append({**base, "layer": layer, "role": src, "target": tgt, **r, "grouping": grouping})
    df = add_holm(make_table(records), ["role", "target", "metric"])
    return keep_table(df, path)


def main(argv: Sequence[str] | None = None) -> int:
    from probing.cache import Cache

    p = ArgumentParser(
        prog="python -m analyses.paired",
        description="Paired drift comparisons with cluster-bootstrap CIs (documents when the corpus has them), "
                    "sign-flip p-values and Holm adjustment across layers. Three caches R A B: drift R->B minus "
                    "drift R->A per token key (Q2). With --contrast ROLE and two caches A B: drift A->B of ROLE "
                    "minus the words' drift, per example (Q1). With --prefix and four caches: drift A->B of the same "
                    "tokens in the long inputs minus in the short ones (Q3).",
    )
    p.add_argument("caches", nargs="+", help="R A B (paired drift), A B (with --contrast or --attention) or "
                                            "SHORT_A SHORT_B LONG_A LONG_B (with --prefix)")
    p.add_argument("--prefix", action="store_true",
                   help="four caches: formats A and B of the first k sentences of each document, then of the first "
                        "K > k sentences of the same documents; drift A->B in the long inputs minus in the short "
                        "ones, per token key of the shared sentences (Q3)")
    p.add_argument("--attention", action="store_true",
                   help="two caches with attention summaries: mass from s1 words to s2 words, B minus A")
    p.add_argument("--contrast", default=None, help="role group compared with the words, e.g. cls (Q1)")
    p.add_argument("--versus", default="words", help="with --contrast: 'words' or a group such as 's1 words'")
    add_layers_option(p)
    p.add_argument("--all-tokens", action="store_true", help="paired drift: special tokens too, not only words")
    p.add_argument("--unit", default="token", choices=UNITS, help="paired item: token key or example mean")
    p.add_argument("--edges", action="store_true",
                   help="paired drift and --prefix: also rows for each sentence's inner words and its edge words "
                        "(first and last, whose own neighbour changes when a separator is dropped); --prefix also "
                        "for every sentence's inner words together and for [CLS] with them")
    add_output_options(p, resamples=True)
    args = p.parse_args(argv)
    if sum((args.prefix, args.attention, args.contrast is not None)) > 1:
        return cli_error(ValueError("--prefix, --attention and --contrast are separate analyses: give one"))
    want = 4 if args.prefix else 2 if args.contrast is not None or args.attention else 3
    if len(args.caches) != want:
        return cli_error(ValueError(f"expected {want} cache directories, got {len(args.caches)}: {args.caches}"))
    try:
        caches = [Cache.open(c) for c in args.caches]
        kw = dict(layers=args.layers, n_resamples=args.resamples, seed=args.seed, out=args.out,
                  force=args.force)
        if args.attention:
            df = run_paired_attention(*caches, **kw)
        elif args.prefix:
            df = run_prefix_drift(*caches, edges=args.edges, progress=not args.no_progress, **kw)
        elif args.contrast is not None:
            df = run_role_contrast(*caches, role=args.contrast, versus=args.versus, progress=not args.no_progress,
                                   **kw)
        else:
            df = run_paired_drift(*caches, words_only=not args.all_tokens, unit=args.unit, edges=args.edges,
                                  progress=not args.no_progress, **kw)
    except CLI_ERRORS as err:
        return cli_error(err)
    cols = ["layer", "role", "target", "metric", "value", "ci_low", "ci_high", "p_value", "p_holm", "n", "n_groups",
            "grouping"]
    with pd.option_context("display.width", 160, "display.precision", 4):
        print(df[cols].to_string(index=False))
    print(table_lines(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
