"""Planning an extraction: options, every example checked against a format, the corpus cut into shards.

Everything here happens before the first forward pass, so bad input fails before anything is written.
A :class:`Plan` holds a few integers per example, not the rendered inputs: shards are rendered
(:func:`render_shard`) only when they are computed, and planning tokenizes the corpus ``_CHUNK``
examples at a time, so memory does not grow with the corpus beyond the corpus itself.
Used by :mod:`probing.extract` (caches) and :mod:`analyses.drift._streaming` (no cache).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .cache_layout import CACHE_VERSION, CacheError, cache_path
from .examples import Example
from .formats import (ROLE_NAMES, SPECIAL_TOKENS, Format, FormatError, Layout, Rendered, TokenizedFlat, count_tokens,
                      render_many, role_of, special_token_ids, tokenize_flat)
from .heap import HeapTrimmer
from .layers import LayerSpecError, resolve_layers
from .models import LoadedModel

#: Roles a cache can store: words, every special token the template language knows, and literal tokens (``lit``).
ROLES: tuple[str, ...] = ROLE_NAMES
DEFAULT_ROLES: tuple[str, ...] = ("cls", "sep", "word")
STORAGE_DTYPES: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
ON_OVERFLOW = ("error", "skip")
_CHUNK = 1024  # examples tokenized at a time while planning


class ExtractError(ValueError):
    """The request cannot be carried out (bad option, overlong example, unsupported model)."""


# ---------------------------------------------------------------------------------------------------
# Options


def parse_layers(spec: str | Sequence[int] | None, n_layers: int) -> list[int]:
    """``"all"``/None -> [0..n_layers]; ``"0,3,-1"`` -> [0, 3, n_layers] (0 is the embedding layer):
    :func:`probing.layers.resolve_layers`, the one layer-spec grammar."""
    try:
        return resolve_layers(spec, n_layers)
    except LayerSpecError as err:
        raise ExtractError(str(err)) from None


def parse_roles(spec: str | Sequence[str] | None) -> list[str]:
    if spec is None:
        return list(DEFAULT_ROLES)
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    if items == ["all"]:
        return list(ROLES)
    bad = [r for r in items if r not in ROLES]
    if bad or not items:
        raise ExtractError(f"--roles: unknown role(s) {bad}; choose from {', '.join(ROLES)} or 'all'")
    return sorted(set(items), key=ROLES.index)


# ---------------------------------------------------------------------------------------------------
# Planning: render every example, check it, cut shards


@dataclass
class Plan:
    """Everything decided before the first forward pass, for one format. It holds a few integers per
    example, not the rendered inputs: shards are rendered when they are computed, so memory does not
    grow with the corpus beyond the corpus itself."""

    fmt: Format
    request: dict
    path: Path
    lengths: np.ndarray  # (n_examples,) tokens of each example in this format; 0 if skipped
    n_stored: np.ndarray  # (n_examples,) positions stored per example
    shards: list[tuple[int, int]]  # [start, stop) example ranges
    skipped: list[str]
    groups: list[str]  # attention groups (empty unless attention is on)
    specials: dict[str, int]
    zero_types: bool
    intervention: Any = None  # probing.interventions.Bound, or None for a clean extraction

    def kept(self, start: int, stop: int) -> list[int]:
        return [e for e in range(start, stop) if self.lengths[e] > 0]


def _request(lm: LoadedModel, fmt: Format, corpus: dict, layers: list[int], roles: list[str],
             dtype: str, storage_dtype: str, on_overflow: str, shard_mb: float, attention: bool,
             extra: Mapping[str, Any] | None = None) -> dict:
    """The cache request; ``extra`` (interventions, norm-based attention) adds keys only when given, so
    a clean request, and its cache directory, stay as they were."""
    return {
        "cache_version": CACHE_VERSION,
        "model": lm.describe(),
        "format": fmt.to_json(),
        "corpus": corpus,
        "layers": layers,
        "roles": roles,
        "dtype": dtype,
        "storage_dtype": storage_dtype,
        "on_overflow": on_overflow,
        "shard_mb": shard_mb,
        "attention": attention,
        **(extra or {}),
    }


def _cut_shards(stored_counts: Sequence[int], bytes_per_row: int, shard_mb: float) -> list[tuple[int, int]]:
    """Contiguous example ranges whose stored states stay under ``shard_mb`` (at least one example)."""
    limit = max(1, int(shard_mb * 2**20 // max(bytes_per_row, 1)))
    shards, start, rows = [], 0, 0
    for i, n in enumerate(stored_counts):
        if rows and rows + n > limit:
            shards.append((start, i))
            start, rows = i, 0
        rows += n
    if start < len(stored_counts) or not shards:
        shards.append((start, len(stored_counts)))
    return shards


def attention_groups(fmt: Format, sentence_counts: Iterable[int]) -> list[str]:
    """Group names for attention summaries: each special token by role and occurrence (``cls0``,
    ``sep0``, ``sep1``, ...) and the words of each sentence (``s1``, ``s2``, ...)."""
    specials, sentences = set(), set()
    for k in set(sentence_counts):
        count: dict[str, int] = {}
        for kind, value, _ in fmt.expand(k):
            if kind == "sentence":
                sentences.add(int(value))
            else:
                role = str(value).lower()
                specials.add((role, count.get(role, 0)))
                count[role] = count.get(role, 0) + 1
    order = [n.lower() for n in SPECIAL_TOKENS]
    names = [f"{role}{o}" for role, o in sorted(specials, key=lambda x: (order.index(x[0]), x[1]))]
    return names + [f"s{s}" for s in sorted(sentences)]


def group_ids(r: Rendered, groups: list[str]) -> np.ndarray:
    index = {g: i for i, g in enumerate(groups)}
    return np.asarray([index[f"s{s}"] if role == "word" else index[f"{role}{o}"]
                       for role, s, o in zip(r.role, r.sentence, r.occurrence)], dtype=np.int64)


def sentence_lengths(tokenizer, sentences: Sequence[str], chunk: int = 4096) -> dict[str, int]:
    """Tokens per sentence (tokenized on its own), tokenizing in chunks to keep memory small."""
    out: dict[str, int] = {}
    for i in range(0, len(sentences), chunk):
        part = list(sentences[i:i + chunk])
        out.update(zip(part, count_tokens(tokenizer, part)))
    return out


_TOKEN_DIR_PREFIX = "probing-tokens-"


def _remove_stale_token_dirs(parent: Path) -> None:
    """Remove :class:`SentenceTokens` directories under ``parent`` whose process no longer runs (a killed
    extraction cannot remove its own)."""
    for d in parent.glob(f"{_TOKEN_DIR_PREFIX}*-*"):
        pid = d.name[len(_TOKEN_DIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (PermissionError, OSError):
            pass  # alive (another user's), or cannot tell: left alone


class SentenceTokens:
    """Every example's sentences tokenized once, while planning, and read back shard by shard: planning needs
    each sentence's token count and rendering its tokens, and tokenizing twice (counts, then each shard; again
    for each further format) was a third of the host's time in an extraction whose model costs little (the
    GPU case: ``benchmarks/RESULTS.md``, "The host path").

    The corpus is tokenized ``chunk`` (default :data:`_CHUNK`) examples at a time, each chunk's distinct
    sentences in one call. Each chunk's :class:`~probing.formats.TokenizedFlat` arrays go to a
    temporary directory (``dir``; the system's by default) and out of memory, so memory does not grow with the
    corpus: what stays is ``counts`` (``(n_examples, most sentences)`` int32: the tokens of sentence ``j + 1``
    of each example, tokenized on its own, 0 past its last sentence) and each example's sentence rows
    within its chunk, a few integers per example. :meth:`shard` loads the chunks a shard's examples lie in.
    Use as a context manager (the directory is removed on exit). The directory's name carries the process id:
    one left behind by a process that was killed is removed by the next extraction on this machine."""

    def __init__(self, tokenizer, examples: Sequence[Example], chunk: int | None = None, dir: str | None = None):
        self.examples, self.chunk = examples, chunk or _CHUNK
        n = len(examples)
        k = max((e.n_sentences for e in examples), default=0)
        self.counts = np.zeros((n, k), dtype=np.int32)
        self.rows = np.full((n, k), -1, dtype=np.int32)  # example i's sentence j: a row of its chunk's arrays
        self.n_sentences = np.fromiter((e.n_sentences for e in examples), dtype=np.int64, count=n)
        _remove_stale_token_dirs(Path(dir or tempfile.gettempdir()))
        self.dir = Path(tempfile.mkdtemp(prefix=f"{_TOKEN_DIR_PREFIX}{os.getpid()}-", dir=dir))
        trim = HeapTrimmer()
        try:
            for c, start in enumerate(range(0, n, self.chunk)):
                stop = min(start + self.chunk, n)
                unique: dict[str, int] = {}
                first: list[tuple[int, int]] = []  # each distinct sentence's first (example, position)
                for i in range(start, stop):
                    for j, text in enumerate(examples[i].sentences):
                        r = unique.setdefault(text, len(unique))
                        if r == len(first):
                            first.append((i, j))
                        self.rows[i, j] = r
                flat = tokenize_flat(tokenizer, list(unique))
                sizes = np.diff(flat.bounds).astype(np.int32)
                got = self.rows[start:stop]
                self.counts[start:stop] = np.where(got >= 0, sizes[np.maximum(got, 0)], 0)
                arrays = {f: getattr(flat, f) for f in self._ARRAYS}
                arrays["first"] = np.asarray(first, dtype=np.int64).reshape(-1, 2)
                for name, a in arrays.items():
                    np.save(self.dir / f"{c}-{name}.npy", a)
                del unique, first, flat, arrays
                trim()
        except BaseException:
            self.close()
            raise

    _ARRAYS = ("ids", "word", "subword", "bounds", "word_start", "word_end", "word_bounds")

    def __enter__(self) -> "SentenceTokens":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def shard(self, idx: Sequence[int]) -> tuple[np.ndarray, TokenizedFlat]:
        """For examples ``idx`` (ascending corpus indices): the row of each of their sentences, example after
        example, in a :class:`~probing.formats.TokenizedFlat` of the chunks they lie in (what
        :func:`~probing.formats.render_many` takes)."""
        idx = np.asarray(idx, dtype=np.int64)
        chunks = np.unique(idx // self.chunk).tolist()
        parts = {name: [] for name in (*self._ARRAYS, "first")}
        offset = {}  # chunk -> its first row in the concatenation
        n_rows = n_tokens = n_words = 0
        for c in chunks:
            got = {name: np.load(self.dir / f"{c}-{name}.npy") for name in parts}
            offset[c] = n_rows
            parts["bounds"].append(got["bounds"][:-1] + n_tokens)
            parts["word_bounds"].append(got["word_bounds"][:-1] + n_words)
            for name in ("ids", "word", "subword", "word_start", "word_end", "first"):
                parts[name].append(got[name])
            n_rows += len(got["bounds"]) - 1
            n_tokens += int(got["bounds"][-1])
            n_words += int(got["word_bounds"][-1])
        cat = {name: np.concatenate(a) if a else np.zeros(0, np.int32 if name in ("word", "subword") else np.int64)
               for name, a in parts.items()}
        first = cat["first"].reshape(-1, 2)
        texts = [self.examples[int(i)].sentences[int(j)] for i, j in first.tolist()]
        flat = TokenizedFlat(cat["ids"], cat["word"], cat["subword"], np.append(cat["bounds"], n_tokens), texts,
                             cat["word_start"], cat["word_end"], np.append(cat["word_bounds"], n_words))
        base = np.asarray([offset[c] for c in (idx // self.chunk).tolist()], dtype=np.int64)
        local = self.rows[idx]
        keep = np.arange(local.shape[1])[None, :] < self.n_sentences[idx][:, None]
        rows = (local + base[:, None])[keep]  # row-major: example after example, sentences in order
        return rows, flat


def _fill_token_counts(out: np.ndarray, examples: Sequence[Example], lengths_of: Mapping[str, int]) -> None:
    for i, e in enumerate(examples):
        out[i, :e.n_sentences] = [lengths_of[s] for s in e.sentences]


def plan(lm: LoadedModel, fmt: Format, examples: Sequence[Example], lengths_of: Mapping[str, int] | np.ndarray, *,
         corpus: dict, root: Path, layers: list[int], roles: list[str], dtype: str, storage_dtype: str,
         on_overflow: str, shard_mb: float, attention: bool, attention_norm: bool = False,
         intervention=None) -> Plan:
    """Check every example against the format and the model, and cut the work into shards.

    ``lengths_of`` gives the tokens of each sentence: the array of :attr:`SentenceTokens.counts` (one
    row per example), or a dict sentence -> tokens (:func:`sentence_lengths`) covering ``examples``.
    Lengths are computed per sentence count with array operations, so the plan holds a few integers
    per example and no Python object per example."""
    specials = special_token_ids(lm.tokenizer, fmt)
    n = len(examples)
    if isinstance(lengths_of, np.ndarray):
        tokens = lengths_of
        if tokens.shape[0] != n:
            raise ValueError(f"sentence token counts hold {tokens.shape[0]} rows for {n} examples")
    else:
        tokens = np.zeros((n, max((e.n_sentences for e in examples), default=0)), dtype=np.int32)
        _fill_token_counts(tokens, examples, lengths_of)
    n_sentences = np.fromiter((e.n_sentences for e in examples), dtype=np.int64, count=n)
    counts = np.unique(n_sentences).tolist()  # sorted sentence counts present
    expansions = {k: fmt.expand(k) for k in counts}
    max_type = max(seg for seq in expansions.values() for _, _, seg in seq)
    zero_types = False
    if max_type > 0:
        if lm.type_vocab_size <= 1:
            zero_types = True  # no segment embeddings to speak of: every type id must be 0
        elif max_type >= lm.type_vocab_size:
            raise ExtractError(
                f"format {fmt.name!r} uses segment id {max_type} but model {lm.name!r} has "
                f"type_vocab_size={lm.type_vocab_size}"
            )
    limit = lm.max_length
    role_set = set(roles)
    lengths = np.zeros(n, dtype=np.int64)
    n_stored = np.zeros(n, dtype=np.int64)
    for k, seq in expansions.items():
        rows = np.flatnonzero(n_sentences == k)
        n_special = sum(1 for kind, _, _ in seq if kind == "special")
        n_special_stored = sum(1 for kind, v, _ in seq if kind == "special" and role_of(str(v)) in role_set)
        refs = [int(v) - 1 for kind, v, _ in seq if kind == "sentence"]
        if any(r >= k for r in refs):
            raise FormatError(f"format {fmt.name!r} ({fmt.template}) names sentence {max(refs) + 1} but example "
                              f"{examples[int(rows[0])].id!r} has {k}")
        n_words = tokens[rows][:, refs].sum(1, dtype=np.int64) if refs else np.zeros(len(rows), np.int64)
        lengths[rows] = n_special + n_words
        n_stored[rows] = n_special_stored + (n_words if "word" in role_set else 0)
    over = np.flatnonzero(lengths > limit)
    skipped: list[str] = []
    if over.size:
        if on_overflow != "skip":
            i = int(over[0])
            raise ExtractError(
                f"example {examples[i].id!r} is {int(lengths[i])} tokens in format {fmt.name!r}, longer than the "
                f"model's limit of {limit}; it is never truncated (keys would no longer align across formats). "
                f"Use --on-overflow skip to leave such examples out (their ids are recorded in the manifest)."
            )
        skipped = [examples[int(i)].id for i in over]
        lengths[over] = 0
        n_stored[over] = 0
    if len(skipped) == n:
        raise ExtractError(f"format {fmt.name!r}: every example is longer than the model's limit of {limit}")
    if zero_types:
        print(f"note: model {lm.name!r} has no segment embeddings (type_vocab_size="
              f"{lm.type_vocab_size}); format {fmt.name!r}'s segment ids are all set to 0", file=sys.stderr)
    bound, extra = None, {}
    if intervention is not None:
        from .interventions import Bound

        bound = Bound(intervention, lm.model, lm.n_layers, fmt, corpus["fingerprint"], lm.fingerprint, counts)
        extra["intervention"] = bound.request
    if attention_norm:
        from .attention_norm import value_sites

        value_sites(lm.model, lm.n_layers)  # a family without an adapter is refused before anything is written
        extra["attention_norm"] = True
    request = _request(lm, fmt, corpus, layers, roles, dtype, storage_dtype, on_overflow, shard_mb, attention, extra)
    bytes_per_row = len(layers) * lm.hidden_size * STORAGE_DTYPES[storage_dtype].itemsize
    shards = _cut_shards(n_stored, bytes_per_row, shard_mb)
    groups = attention_groups(fmt, counts) if attention else []
    return Plan(fmt, request, cache_path(root, request), lengths, n_stored, shards, skipped, groups,
                specials, zero_types, bound)


def assign_shards(plan_: Plan, world_size: int) -> list[list[int]]:
    """Split shards among ``world_size`` processes, balanced by forward-pass tokens (largest first to
    the least loaded process; ties by shard number), deterministically."""
    costs = [int(plan_.lengths[a:b].sum()) for a, b in plan_.shards]
    owners: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for shard in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[rank].append(shard)
        load[rank] += costs[shard]
    return [sorted(o) for o in owners]


def layout_shard(lm: LoadedModel, plan_: Plan, examples: Sequence[Example], start: int,
                 stop: int, tokens: SentenceTokens | None = None) -> tuple[list[int], Layout]:
    """The kept examples of one shard rendered: (corpus indices, their :class:`Layout`). The shard's
    sentences come tokenized from planning (``tokens``, a :class:`SentenceTokens` of ``examples``) or, without
    it, are tokenized in one call; they are laid out with array operations (:func:`render_many`), and every
    example's length is checked against the plan."""
    idx = plan_.kept(start, stop)
    kept = [examples[e] for e in idx]
    if tokens is not None:
        rows, tokenized = tokens.shard(idx)
    else:
        unique: dict[str, int] = {}
        rows = np.fromiter((unique.setdefault(s, len(unique)) for ex in kept for s in ex.sentences), dtype=np.int64)
        tokenized = tokenize_flat(lm.tokenizer, list(unique))
    layout = render_many(plan_.fmt, kept, rows, tokenized, plan_.specials)
    bad = np.flatnonzero(layout.lengths != plan_.lengths[idx]) if idx else []
    if len(bad):
        i = int(bad[0])
        raise CacheError(f"example {kept[i].id!r} rendered to {int(layout.lengths[i])} tokens, "
                         f"planned {plan_.lengths[idx[i]]}")
    if plan_.zero_types:
        layout.token_type_ids[:] = 0
    return idx, layout


def render_shard(lm: LoadedModel, plan_: Plan, examples: Sequence[Example], start: int,
                 stop: int) -> tuple[list[int], list[Rendered], list[np.ndarray]]:
    """Render the kept examples of one shard: (corpus indices, renders, stored positions of each)."""
    idx, layout = layout_shard(lm, plan_, examples, start, stop)
    return idx, layout.rendered(), layout.split(layout.positions_of(plan_.request["roles"]))
