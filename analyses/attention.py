"""Attention to special tokens and between sentences (Clark et al. 2019, "What Does BERT Look At?").

Reads the attention summaries a cache recorded at extraction (``python -m probing.extract
--attention``): for each example, layer and head, the attention mass flowing from each token group
(``[CLS]``, each ``[SEP]``, the words of each sentence) to each other group. This module turns them
into a tidy table: mass from each source group (and from all tokens together, weighted by group size)
to ``[CLS]``, to each ``[SEP]``, to all ``[SEP]``s, to its own sentence, to other sentences and to
each sentence, per layer (averaged over heads, with a 95%
cluster-bootstrap CI over documents, or examples when the corpus has no ``doc`` label; columns
``grouping`` and ``n_groups``) and per head (mean only).

    python -m analyses.attention caches/MODEL/pair-... --out results
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses.results import (CLI_ERRORS, add_output_options, cache_identity, cli_error, keep_table, make_table,
                              model_label, stored_table, table_lines)
from analyses.stats import bootstrap_ci, cache_groups, check_resamples
from analyses.selection import attention_group_names, is_role
from probing.cache import Cache
from probing.cli import ArgumentParser


#: Targets that sum over groups (beside each group's own name): every [SEP], own and other sentences.
ALL_SEP, OWN_SENTENCE, OTHER_SENTENCES, ALL_TOKENS = "all [SEP]", "own sentence", "other sentences", "all tokens"
_TOKENS_PER_BLOCK = 16384  # tokens per block of group_counts's per-token scratch
_EXAMPLES_PER_CHUNK = 128  # examples per chunk of from_all_tokens's float64 products (about 4 MB for MiniLM)


def _is_sep(name: str) -> bool:
    return re.fullmatch(r"sep\d+(_\d+)?", name) is not None


def source_masses(mass: np.ndarray, names: list[str], a: int) -> dict[str, np.ndarray]:
    """The entries of :func:`target_masses` whose source is group ``a``: target -> ``(n_examples,
    layers, heads)``, in the same order."""
    out: dict[str, np.ndarray] = {}
    seps = [j for j, g in enumerate(names) if _is_sep(g)]
    sents = [j for j, g in enumerate(names) if g.endswith(" words")]
    for b, tgt in enumerate(names):
        out[tgt] = mass[..., a, b]
    if seps:
        out[ALL_SEP] = np.nansum(mass[..., a, seps], axis=-1)
    if a in sents:
        out[OWN_SENTENCE] = mass[..., a, a]
        others = [j for j in sents if j != a]
        if others:
            out[OTHER_SENTENCES] = mass[..., a, others].sum(-1)
    return out


def target_masses(mass: np.ndarray, names: list[str]) -> dict[tuple[str, str], np.ndarray]:
    """From ``mass (n_examples, layers, heads, G, G)`` to named (source, target) arrays of shape
    (n_examples, layers, heads). ``names``: the G groups in the token-choice grammar
    (:func:`analyses.selection.attention_group_names`: ``cls``, ``sep1``, ``s1 words``, ...).
    Targets: each group, all [SEP]s, own sentence, other sentences."""
    return {(src, tgt): arr for a, src in enumerate(names) for tgt, arr in source_masses(mass, names, a).items()}


def group_counts(cache: Cache, examples: np.ndarray, groups: list[str]) -> np.ndarray | None:
    """Tokens per attention group for each example, ``(n_examples, G)``, from the token table; None
    when the cache does not store every token (then the group sizes are unknown)."""
    stored = set(cache.manifest.get("roles") or [])
    if not {g.rstrip("0123456789") for g in groups if not re.fullmatch(r"s\d+", g)} <= stored or "word" not in stored:
        return None
    tok = cache.tokens
    # group name s<sentence> for words, <role><occurrence> otherwise, assigned per distinct (role, number) with
    # masks: no string or tuple per token; a block of tokens at a time, so the per-token scratch is bounded
    index = {g: i for i, g in enumerate(groups)}
    where = pd.Index(examples)
    counts = np.zeros((len(examples), len(groups)))
    for start in range(0, len(tok), _TOKENS_PER_BLOCK):
        part = tok.iloc[start:start + _TOKENS_PER_BLOCK]
        gid = np.full(len(part), -1, dtype=np.int64)
        sentence, occurrence = part["sentence"].to_numpy(), part["occurrence"].to_numpy()
        for role in part["role"].dropna().unique():
            is_r = is_role(part, role)
            values = sentence if role == "word" else occurrence
            for v in np.unique(values[is_r]):
                g = index.get(f"s{v}" if role == "word" else f"{role}{v}", -1)
                if g >= 0:
                    gid[is_r & (values == v)] = g
        rows = where.get_indexer(part["example"].to_numpy())
        ok = (gid >= 0) & (rows >= 0)
        np.add.at(counts, (rows[ok], gid[ok]), 1.0)
    return counts


def from_all_tokens(mass: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Mass from every token of an example to each group (Clark et al.'s per-head average over all
    query tokens): ``sum_a n_a mass[a, b] / sum_a n_a`` -> ``(n_examples, layers, heads, G)``."""
    out = np.empty(mass.shape[:3] + mass.shape[4:])
    for k in range(0, len(mass), _EXAMPLES_PER_CHUNK):  # float64 products of a chunk of examples, not of all
        part, c = mass[k:k + _EXAMPLES_PER_CHUNK], counts[k:k + _EXAMPLES_PER_CHUNK]
        out[k:k + len(part)] = np.nansum(np.nan_to_num(part) * c[:, None, None, :, None], axis=3) \
            / c.sum(1)[:, None, None, None]
    return out


def all_token_masses(mass: np.ndarray, counts: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """Source "all tokens" (:func:`from_all_tokens`): target -> ``(n_examples, layers, heads)`` for
    each group and, where there are [SEP]s, all of them."""
    everyone = from_all_tokens(mass, counts)
    out = {gb: everyone[..., b] for b, gb in enumerate(names)}
    seps = [j for j, g in enumerate(names) if _is_sep(g)]
    if seps:
        out[ALL_SEP] = everyone[..., seps].sum(-1)
    return out


class _PerExample:
    """One source's summaries, accumulated over chunks of examples: per target the head average of
    each example and layer (what the bootstrap resamples: a few numbers per example), and per layer
    and head the sum and count of the examples whose head average is finite (the per-head means).
    The sums run over the examples in order, each chunk's starting from the running total, so they
    are bit for bit those of one sum over all examples (numpy sums over axis 0 row after row)."""

    def __init__(self) -> None:
        self.head_means: dict[str, list[np.ndarray]] = {}
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}

    def add(self, arrays: dict[str, np.ndarray], per_head: bool) -> None:
        for tgt, arr in arrays.items():  # arr: (m, layers, heads)
            head_mean = arr.mean(axis=2)
            self.head_means.setdefault(tgt, []).append(head_mean)
            if not per_head:
                continue
            sums = self.sums.setdefault(tgt, np.zeros(arr.shape[1:], dtype=arr.dtype))
            counts = self.counts.setdefault(tgt, np.zeros(arr.shape[1:], dtype=np.intp))
            for li in range(arr.shape[1]):
                part = arr[np.isfinite(head_mean[:, li]), li, :]
                if len(part):
                    missing = np.isnan(part)
                    sums[li] = np.add.reduce(np.concatenate([sums[li][None], np.where(missing, 0, part)]), axis=0)
                    counts[li] += (~missing).sum(0)

    def head_mean(self, tgt: str) -> np.ndarray:
        return np.concatenate(self.head_means[tgt])

    def per_head(self, tgt: str, li: int) -> np.ndarray:
        """``np.nanmean(arr[ok, li, :], axis=0)`` over all examples (ok: finite head average)."""
        sums = self.sums[tgt][li]
        return np.true_divide(sums, self.counts[tgt][li], out=np.empty_like(sums), casting="unsafe")


WEIGHTINGS = {"raw": "attention_mass", "norm": "attention_norm_mass"}  # weighting -> metric name


def run_attention(cache: Cache, *, n_resamples: int = 1000, seed: int = 0, per_head: bool = True,
                  out: str | Path | None = None, force: bool = False, weighting: str = "raw",
                  progress: bool = False) -> pd.DataFrame:
    """Tidy table of attention mass (metric ``attention_mass``): role = source group, target = target
    group, both named in the token-choice grammar (``cls``, ``sep1`` = the [SEP] after sentence 1,
    ``s1 words``; ``all tokens``, ``all [SEP]``, ``own sentence``, ``other sentences``); ``head``
    column: ``"mean"`` for the head average (with CI) or the head number (no CI).
    ``weighting="norm"``: the norm-based weights ||alpha f(x)|| of Kobayashi et al. 2020, normalised per
    query (:mod:`probing.attention_norm`; extract with ``--attention-norm``), metric ``attention_norm_mass``.
    The CI resamples documents when the corpus has a ``doc`` label, else examples (``grouping``,
    ``n_groups``: :func:`analyses.stats.cache_groups`)."""
    n_resamples = check_resamples(n_resamples)
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}, got {weighting!r}")
    config = {"cache": cache_identity(cache), "n_resamples": n_resamples, "seed": seed, "per_head": per_head,
              "clusters": "doc label, else example", "names": "token-choice grammar"}
    if weighting != "raw":
        config["weighting"] = weighting
    path, done = stored_table(out, "attention", config, force)
    if done is not None:
        return done
    # read a chunk of examples at a time, once per source group: per (source, target) only the examples'
    # head averages are held (a few numbers per example), not the (examples, layers, heads, G, G) summaries
    examples, groups, chunks = cache.attention_chunks(weighting, _EXAMPLES_PER_CHUNK)
    clusters, grouping = cache_groups(cache, examples)
    layers = cache.manifest["attention"]["layers"]
    base = {"analysis": "attention", "model": model_label(cache), "corpus": cache.manifest["corpus"]["name"],
            "format": cache.format_name, "metric": WEIGHTINGS[weighting], "seed": seed}
    names = attention_group_names(cache, groups)
    counts = group_counts(cache, examples, groups)
    sources = [(src, lambda part, k, a=a: source_masses(part, names, a)) for a, src in enumerate(names)]
    if counts is not None:  # source "all tokens": the query-token-weighted average over the groups
        sources.append((ALL_TOKENS, lambda part, k: all_token_masses(part, counts[k:k + len(part)], names)))
    rows = []
    for src, masses in tqdm(sources, desc=f"attention {cache.format_name}", disable=not progress, delay=1,
                            file=sys.stderr):
        summary = _PerExample()
        for k, part in chunks():
            summary.add(masses(part, k), per_head)
        for tgt in summary.head_means:
            head_mean = summary.head_mean(tgt)  # (n_examples, layers)
            for li, layer in enumerate(layers):
                v = head_mean[:, li]
                ok = np.isfinite(v)
                if not ok.any():
                    continue
                point, lo, hi = bootstrap_ci(v[ok], clusters[ok], "mean", n_resamples=n_resamples, seed=seed)
                info = {"grouping": grouping, "n_groups": int(np.unique(clusters[ok]).size)}
                rows.append({**base, "layer": layer, "role": src, "target": tgt, "value": point, "ci_low": lo,
                             "ci_high": hi, "n": int(ok.sum()), "head": "mean", **info, "n_resamples": n_resamples})
                if per_head:
                    for h, val in enumerate(summary.per_head(tgt, li)):
                        rows.append({**base, "layer": layer, "role": src, "target": tgt, "value": float(val),
                                     "ci_low": np.nan, "ci_high": np.nan, "n": int(ok.sum()), "head": str(h), **info})
    df = make_table(rows)
    return keep_table(df, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m analyses.attention",
        description="Attention mass from each token group to [CLS], each [SEP], its own sentence and other "
                    "sentences, per layer (head mean with 95% bootstrap CI over documents, or examples without a "
                    "doc label) and per head. "
                    "Needs a cache extracted with --attention.",
    )
    p.add_argument("cache", help="cache directory extracted with --attention")
    p.add_argument("--no-per-head", action="store_true", help="only the head average")
    p.add_argument("--weighting", choices=list(WEIGHTINGS), default="raw",
                   help="raw attention weights (default), or norm-based ||alpha f(x)|| (Kobayashi et al. 2020; "
                        "needs a cache extracted with --attention-norm)")
    add_output_options(p, resamples=True)
    args = p.parse_args(argv)
    try:
        cache = Cache.open(args.cache)
        df = run_attention(cache, n_resamples=args.resamples, seed=args.seed, per_head=not args.no_per_head,
                           out=args.out, force=args.force, weighting=args.weighting, progress=not args.no_progress)
    except CLI_ERRORS as err:
        return cli_error(err)
    mean = df[(df["head"] == "mean")]
    show = mean[mean["target"].isin(["cls", ALL_SEP, OWN_SENTENCE, OTHER_SENTENCES])]
    with pd.option_context("display.width", 160, "display.precision", 3):
        print(show.pivot_table(index=["role", "target"], columns="layer", values="value", sort=False).to_string())
    print(table_lines(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
