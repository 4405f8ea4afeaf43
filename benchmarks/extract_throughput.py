"""Extraction throughput: the toolkit's extractor against a naive loop, measured in the same run.

The naive loop is what people write first: batches of 32 examples in corpus order, padded to the
longest, float32, ``output_hidden_states=True``, every hidden state of every layer copied to the host
as NumPy, on torch's threads. The toolkit's extractor sorts by length inside shards, batches under a
token budget, runs under ``inference_mode`` (on the CPU: batches side by side in one single-threaded
worker per torch thread, :mod:`probing.workers`), gathers only the stored positions on the device and
writes the cache to disk (the naive loop writes nothing, so the comparison is generous to it).

    python benchmarks/extract_throughput.py                       # default model, BBC pairs, CPU
    python benchmarks/extract_throughput.py --corpus generated:n=500 --roles cls,sep,word
    python benchmarks/extract_throughput.py --random-init-size base --device cuda --dtype bfloat16

Tokens/s counts real (unpadded) tokens through the model. The extractor's rate is also given in
GFLOP/s and set against a large matrix product timed in the same run: on the CPU float32
(``--matmul-size``, default 2048 x 2048 x 2048) with the same thread count, timed before and after each of
``--repeats`` extractor runs, each run set against the mean of the two timings around it and the median
of those ratios printed; on a GPU bfloat16 8192 x 8192 x 8192, before and after. The cache's bytes per
second are set against the disk's, measured in the same run and directory the way the cache writer writes
(files of one shard, ``--shard-mb``, each fsynced): with all tokens of every layer stored the disk, not
the model, is the limit. ``--naive-examples`` times the naive loop on the first pairs only (on a GPU it
copies every hidden state of every layer to the host, slow for a large corpus); ``--profile`` prints where
the extractor's main thread spends its time, in a run of its own before the timed ones.
The fast tokenizer's own rate on the same pairs (all cores, in the same run) is the third ceiling: with
``--random-init-size tiny`` the model costs almost nothing, so the extractor's rate against it is the share of
the tokenizer's speed the host path keeps (planning, batching, gathering, hashing and writing).
``benchmarks/gpu_check.sh`` runs the GPU cases. Model FLOPs per example of n real tokens, from the
model's config (L layers, hidden d, intermediate i):

    dense: n x 2L(4d² + 2di)   (Q, K, V and output projections, the two feed-forward matrices)
    attention: 4Ln²d           (QKᵀ and attention x V, n² d multiply-adds each, over real tokens only)

Embeddings, biases, layer norms, softmax, GELU and the pooler are left out (element-wise, a few
percent). For all-MiniLM-L6-v2 (L=6, d=384, i=1536) the dense part is 21.2 MFLOP per token.
Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def naive_loop(lm, examples, batch_size: int, device: torch.device) -> tuple[int, float]:
    """Batches of ``batch_size`` in corpus order; every hidden state copied to the host."""
    tok, model = lm.tokenizer, lm.model
    n_tokens = 0
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for i in range(0, len(examples), batch_size):
        batch = examples[i:i + batch_size]
        enc = tok([e.sentences[0] for e in batch], [e.sentences[1] for e in batch], padding=True,
                  return_tensors="pt")
        n_tokens += int(enc["attention_mask"].sum())
        enc = {k: v.to(device) for k, v in enc.items()}
        with torch.no_grad():
            out = model(**enc, output_hidden_states=True)
        _ = [h.float().cpu().numpy() for h in out.hidden_states]
    sync()
    return n_tokens, time.perf_counter() - t0


def dense_flops_per_token(config) -> float:
    L, d, i = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    return 2.0 * L * (4 * d * d + 2 * d * i)


def model_flops(config, lengths) -> float:
    """FLOPs of one forward pass over examples of the given real lengths (see the module docstring)."""
    n = np.asarray(lengths, dtype=np.float64)
    return float(n.sum() * dense_flops_per_token(config)
                 + (4 * config.num_hidden_layers * config.hidden_size * n ** 2).sum())


def matmul_gflops(size: int, seconds: float = 2.0) -> tuple[float, float]:
    """float32 GFLOP of ``size`` x ``size`` matrix products on the CPU (torch's threads) per second of wall
    time and per second of this process's CPU time, timed for about ``seconds`` after one warm-up."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    reps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)
        reps += 1
    flop = reps * 2 * size ** 3 / 1e9
    return flop / (time.perf_counter() - t0), flop / (time.process_time() - c0)


def gpu_matmul_tflops(device, size: int = 8192, reps: int = 10) -> float:
    """bfloat16 ``size`` x ``size`` x ``size`` matrix products on ``device`` (random data, two warm-ups),
    TFLOP/s: the reference rate for the extractor's model FLOPs on a GPU."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        torch.mm(a, b)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    torch.cuda.synchronize(device)
    return reps * 2 * size ** 3 / (time.perf_counter() - t0) / 1e12


def disk_write_rate(directory: Path, total_bytes: int, file_bytes: int) -> float:
    """Bytes per second written to ``directory`` as the cache writer writes: files of ``file_bytes``
    (one shard), each written from a NumPy buffer of random bytes and fsynced before the next, one
    writer thread. The files are removed afterwards."""
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, size=min(file_bytes, total_bytes), dtype=np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    written, k = 0, 0
    t0 = time.perf_counter()
    while written < total_bytes:
        n = min(len(block), total_bytes - written)
        with open(directory / f"disk-{k}.bin", "wb") as f:
            f.write(memoryview(block)[:n])
            f.flush()
            os.fsync(f.fileno())
        written, k = written + n, k + 1
    rate = written / (time.perf_counter() - t0)
    shutil.rmtree(directory, ignore_errors=True)
    return rate


def tokenizer_rate(tokenizer, examples, batch: int = 1024, repeats: int = 3) -> tuple[float, int]:
    """The fast tokenizer's own rate on the pairs (tokens/s, the median of ``repeats`` passes): batches of
    ``batch`` pairs encoded with the special tokens, no padding, on all cores (the Rust tokenizer's threads;
    ``TOKENIZERS_PARALLELISM`` as set). What no extractor can exceed: each pair is tokenized at least once."""
    firsts = [e.sentences[0] for e in examples]
    seconds = [e.sentences[1] for e in examples]
    times, n = [], 0
    for _ in range(repeats):
        t0, n = time.perf_counter(), 0
        for i in range(0, len(examples), batch):
            enc = tokenizer(firsts[i:i + batch], seconds[i:i + batch], add_special_tokens=True, truncation=False)
            n += sum(len(ids) for ids in enc["input_ids"])
        times.append(time.perf_counter() - t0)
    return n / float(np.median(times)), n


def random_model(size: str, tokenizer, device, dtype):
    """A randomly initialised BERT of a standard size (same code path as any loaded model)."""
    from transformers import BertConfig, BertModel

    from probing.models import prepare_model

    sizes = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
             "mini": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
             # the host path: a model so small that the time left is tokenizing, rendering, batching and writing
             "tiny": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)}
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(tokenizer), **sizes[size]))
    return prepare_model(model, tokenizer, name=f"random-bert-{size}", random_init=True, seed=0,
                         device=device, dtype=dtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model id or path (default: all-MiniLM-L6-v2)")
    p.add_argument("--random-init-size", choices=["base", "mini", "tiny"], default=None,
                   help="use a randomly initialised BERT of this size (tokenizer of --model); 'tiny' (1 layer, "
                        "hidden 32) measures the host path: what a GPU extraction cannot go faster than")
    p.add_argument("--corpus", default="bbc:n=1000,k=2,max_words=60",
                   help="corpus spec of sentence pairs (default: 1,000 BBC News pairs)")
    p.add_argument("--roles", default="cls,sep", help="roles the extractor stores (default cls,sep)")
    p.add_argument("--layers", default="all")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="extractor compute dtype (the naive loop is float32)")
    p.add_argument("--batch-tokens", type=int, default=None, help="extractor token budget per batch")
    p.add_argument("--max-batch", type=int, default=256,
                   help="extractor examples per batch at most (default 256, the extractor's; with a large "
                        "--batch-tokens raise it, or it binds first)")
    p.add_argument("--naive-batch", type=int, default=32)
    p.add_argument("--naive-examples", type=int, default=None,
                   help="time the naive loop on the first N pairs only (default: all; its rate is per token)")
    p.add_argument("--shard-mb", type=float, default=256.0, help="extractor shard size, MiB (default 256)")
    p.add_argument("--profile", action="store_true",
                   help="also print the extractor's top functions (cProfile), "
                        "from a run of its own before the timed ones")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--matmul-size", type=int, default=2048, help="square float32 matmul for the reference rate")
    p.add_argument("--matmul-seconds", type=float, default=2.0,
                   help="how long each CPU matmul timing runs (default 2 s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="extractor runs, each timed between two matmul timings on the CPU; the rate and ratio "
                        "printed are the medians over the runs (default 3: the matmul rate of this 2-core VM "
                        "swings by 10%% between timings a few seconds apart)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if not args.matmul_seconds > 0:
        p.error("--matmul-seconds must be positive")

    from probing.corpora import load_corpus
    from probing.extract import extract
    from probing.models import load_model, pick_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    examples = load_corpus(args.corpus)
    examples = [e for e in examples if e.n_sentences >= 2]
    if args.random_init_size:  # only the tokenizer of --model is needed
        from probing.models import load_tokenizer, resolve_model

        lm = random_model(args.random_init_size, load_tokenizer(resolve_model(args.model)), device, "float32")
    else:
        lm = load_model(args.model, device=device, dtype="float32")
    from probing.extract import BATCH_TOKENS

    batch_tokens = args.batch_tokens or (65536 if device.type == "cuda" else BATCH_TOKENS["cpu"])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, threads {torch.get_num_threads()}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"model: {lm.name} ({lm.n_layers} layers, hidden {lm.hidden_size}); corpus: {args.corpus}, "
          f"{len(examples)} pairs")

    cpu_ref = device.type == "cpu"
    mm_before = matmul_gflops(args.matmul_size, args.matmul_seconds) if cpu_ref else None
    gpu_ref = [gpu_matmul_tflops(device)] if device.type == "cuda" else None
    naive_examples = examples[: args.naive_examples] if args.naive_examples else examples
    naive_loop(lm, examples[: args.naive_batch * 2], args.naive_batch, device)  # warm-up
    n_naive, t_naive = naive_loop(lm, naive_examples, args.naive_batch, device)
    naive_rate = n_naive / t_naive
    print(f"naive loop   : {n_naive} tokens in {t_naive:7.2f}s = {naive_rate:12,.0f} tokens/s"
          + (f" (first {len(naive_examples)} pairs)" if len(naive_examples) < len(examples) else ""))

    root = Path(tempfile.mkdtemp(prefix="probing-bench-"))
    try:
        lm.model.to(dtype={"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype])
        kw = dict(roles=args.roles, layers=args.layers, dtype=args.dtype, device=str(device), batch_tokens=batch_tokens,
                  max_batch=args.max_batch, shard_mb=args.shard_mb, progress=False, log=lambda *a: None)
        extract(examples[:64], ["pair"], model=lm, out=root / "warm", **kw)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        if args.profile:  # a run of its own, left out of the timings (the profiler slows it)
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            extract(examples, ["pair"], model=lm, out=root / "profiled", **kw)
            sync()
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(22)
            shutil.rmtree(root / "profiled", ignore_errors=True)
            if cpu_ref:
                mm_before = matmul_gflops(args.matmul_size, args.matmul_seconds)
        runs, mm_runs = [], [mm_before]  # (wall, CPU) seconds per extractor run; the matmul timings around them
        for r in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            (path,) = extract(examples, ["pair"], model=lm, out=root / f"run{r}", **kw)
            sync()
            runs.append((time.perf_counter() - t0, time.process_time() - c0))
            if r == 0:
                size_mb = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
            shutil.rmtree(path, ignore_errors=True)
            if cpu_ref:
                mm_runs.append(matmul_gflops(args.matmul_size, args.matmul_seconds))
        t_ext, c_ext = sorted(runs)[len(runs) // 2]
        from probing.planning import sentence_lengths

        lengths = sentence_lengths(lm.tokenizer, list({s for e in examples for s in e.sentences[:2]}))
        per_example = [lengths[e.sentences[0]] + lengths[e.sentences[1]] + 3 for e in examples]
        n_ext = sum(per_example)
        if sum(per_example[:len(naive_examples)]) != n_naive:
            raise SystemExit(f"token counts differ: extractor {sum(per_example[:len(naive_examples)])}, "
                             f"naive {n_naive}")
        # the disk's own rate, measured in the same directory the same way (shard-sized files, fsync each)
        disk = disk_write_rate(root / "disk", max(int(size_mb * 2**20), 2**28), int(args.shard_mb * 2**20))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rate = n_ext / t_ext
    tok_rate, tok_n = tokenizer_rate(lm.tokenizer, examples)
    how = (f"{torch.get_num_threads()} single-threaded workers" if device.type == "cpu" else str(device))
    print(f"extractor    : {n_ext} tokens in {t_ext:7.2f}s = {rate:12,.0f} tokens/s "
          f"(roles {args.roles}, {args.dtype}, batches of {batch_tokens} tokens and at most {args.max_batch} examples, "
          f"{how}, cache {size_mb:.1f} MiB written"
          + (f"; the median of {len(runs)} runs: " + ", ".join(f"{w:.2f}s" for w, _ in runs) if len(runs) > 1 else "")
          + ")")
    print(f"ratio extractor / naive = {rate / naive_rate:.2f}x")
    host = " (the host path: the goal is >= 60% on the CPU's cores)" if args.random_init_size == "tiny" else ""
    print(f"tokenizer alone: {tok_n} tokens at {tok_rate:12,.0f} tokens/s (fast tokenizer, batches of 1,024 pairs, "
          f"all cores); extractor = {rate / tok_rate:.0%} of it{host}")
    print(f"cache written at {size_mb / t_ext:,.0f} MiB/s; the disk in the same run (shard-sized files, fsync each) "
          f"{disk / 2**20:,.0f} MiB/s: {size_mb * 2**20 / t_ext / disk:.0%} of the disk's rate")
    flops = model_flops(lm.config, per_example)
    naive_flops = model_flops(lm.config, per_example[:len(naive_examples)])
    dense = dense_flops_per_token(lm.config)
    print(f"model FLOPs: {flops / n_ext / 1e6:.2f} MFLOP per real token (dense {dense / 1e6:.2f}"
          f" + attention), {flops / 1e12:.3f} TFLOP in all; extractor CPU time {c_ext:.1f}s of {t_ext:.1f}s wall")
    gflops = flops / t_ext / 1e9
    if cpu_ref:
        # each run against the mean of the matmul timings just before and just after it; medians over the runs
        shares = [(flops / w / 1e9 / ((a[0] + b[0]) / 2), flops / c / 1e9 / ((a[1] + b[1]) / 2))
                  for (w, c), a, b in zip(runs, mm_runs, mm_runs[1:])]
        share, share_cpu = (float(np.median([x[i] for x in shares])) for i in (0, 1))
        mm = float(np.median([(a[0] + b[0]) / 2 for a, b in zip(mm_runs, mm_runs[1:])]))
        print(f"matmul {args.matmul_size}^3 float32, {torch.get_num_threads()} threads, before and after each "
              f"extractor run: " + ", ".join(f"{m[0]:.1f}" for m in mm_runs) + " GFLOP/s")
        print(f"extractor {gflops:.1f} GFLOP/s = {share:.0%} of the matmul rate (target >= 70%; "
              f"the median over the runs of each against its own matmul timings"
              + (": " + ", ".join(f"{x[0]:.0%}" for x in shares) if len(shares) > 1 else "")
              + f"); naive loop {naive_flops / t_naive / 1e9:.1f} GFLOP/s = {naive_flops / t_naive / 1e9 / mm:.0%}")
        print(f"per CPU-second (less sensitive to other jobs on the machine): extractor {flops / c_ext / 1e9:.1f} "
              f"GFLOP = {share_cpu:.0%} of the matmul's"
              + (" (" + ", ".join(f"{x[1]:.0%}" for x in shares) + ")" if len(shares) > 1 else ""))
    else:
        gpu_ref.append(gpu_matmul_tflops(device))
        ref = sum(gpu_ref) / 2
        print(f"matmul 8192^3 bfloat16 on the GPU: {gpu_ref[0]:.0f} TFLOP/s before, {gpu_ref[1]:.0f} after")
        print(f"extractor {gflops / 1e3:.1f} TFLOP/s = {gflops / 1e3 / ref:.0%} of the matmul rate; "
              f"naive loop {naive_flops / t_naive / 1e12:.1f} TFLOP/s (float32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
