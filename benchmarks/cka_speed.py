"""Speed of linear CKA: the toolkit's feature-space path against the Gram form, and streaming memory.

1. In memory: ``linear_cka_matrix`` on L x L layer pairs (n items, d features per layer) against a
   Gram-form implementation (two n x n float64 Gram matrices per pair, centred, Frobenius inner
   product: Kornblith et al. 2019, eq. 3). The Gram form is timed on ``--gram-pairs`` pairs and
   extrapolated to L*L (printed as EXTRAPOLATED); the two are checked to agree on those pairs.
2. Streaming: ``StreamingCKAMatrix`` over ``--stream-n`` items generated batch by batch from a seeded
   generator (Y = X A + noise), in a worker process started before anything large is allocated, so
   that its peak RSS (resource.getrusage) is its own; reported after imports, after 10% of the
   batches and at the end.

Full size (the defaults) takes a few minutes on 2 cores and ~10 GB RAM (the Gram form needs two
3.2 GB matrices at n=20,000). Smoke test:
``python benchmarks/cka_speed.py --n 2000 --d 64 --layers 3 --stream-n 50000 --stream-batch 5000``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEVICES = ("numpy", "cpu", "cuda")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--n", type=int, default=20_000, help="items for the in-memory comparison (default 20000)")
    p.add_argument("--d", type=int, default=768, help="features per layer (default 768)")
    p.add_argument("--layers", type=int, default=7, help="layers per side: layers x layers pairs (default 7)")
    p.add_argument("--gram-pairs", type=int, default=2, help="pairs to time in Gram form, then extrapolate (default 2)")
    p.add_argument("--stream-n", type=int, default=1_000_000, help="items for the streaming run (default 1000000)")
    p.add_argument("--stream-batch", type=int, default=10_000, help="streaming batch size (default 10000)")
    p.add_argument("--stream-layers", type=int, default=1, help="layers per side in the streaming run (default 1)")
    p.add_argument("--metrics", choices=("linear_cka", "linear_cka_debiased"), default="linear_cka",
                   help="linear_cka (default) or linear_cka_debiased (U-statistic HSIC) everywhere")
    p.add_argument("--device", choices=DEVICES, default="numpy",
                   help="numpy arrays, or torch tensors on cpu/cuda (default numpy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-memory", action="store_true", help="skip the in-memory comparison")
    p.add_argument("--skip-stream", action="store_true", help="skip the streaming run")
    args = p.parse_args(argv)
    args.debiased = args.metrics == "linear_cka_debiased"
    for name in ("n", "d", "layers", "stream_n", "stream_batch", "stream_layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.gram_pairs < 0:
        p.error(f"--gram-pairs must be >= 0, got {args.gram_pairs}")
    return args


def _sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def _backend(arrays, device: str):
    if device == "numpy":
        return arrays
    import torch
    return [torch.from_numpy(a).to(device) for a in arrays]


def make_layers(n: int, d: int, layers: int, rng: np.random.Generator) -> tuple[list, list]:
    """Two 'networks' of ``layers`` float32 layers (n, d): each layer a noisy linear map of the last."""
    Z = rng.standard_normal((n, d), dtype=np.float32)
    out = []
    for _ in range(2):
        H, chain = Z, []
        for _ in range(layers):
            A = (rng.standard_normal((d, d), dtype=np.float32) / np.float32(math.sqrt(d)))
            H = H @ A + np.float32(0.5) * rng.standard_normal((n, d), dtype=np.float32)
            chain.append(H)
        out.append(chain)
    return out[0], out[1]


def outer_self_blocked(A: np.ndarray, G: np.ndarray, block: int = 4096) -> None:
    """G = A Aᵀ for A (n, d): upper-triangle row blocks by gemm, mirrored (half the flops).

    A plain ``np.matmul(A, A.T)`` goes to OpenBLAS syrk, which segfaults at n ~ 16,000 (numpy issue
    #19685); each syrk/gemm call here sees at most ``block`` rows on the left.
    """
    n = A.shape[0]
    for s in range(0, n, block):
        e = min(s + block, n)
        np.matmul(A[s:e], A[s:].T, out=G[s:e, s:])
        G[e:, s:e] = G[s:e, e:].T


def gram_form_cka(X, Y, K, L, debiased: bool) -> float:
    """Linear CKA via n x n Gram matrices written into preallocated float64 buffers ``K``, ``L``.

    Kornblith et al. (2019) eq. 3-4: <HKH, HLH>_F / (||HKH||_F ||HLH||_F); debiased: U-centring
    (Székely & Rizzo 2014) as in their ``center_gram``. Works on numpy arrays and torch tensors.
    """
    is_torch = not isinstance(X, np.ndarray)
    for A, G in ((X, K), (Y, L)):
        A = A.double() if is_torch else A.astype(np.float64)
        if is_torch:
            import torch
            torch.matmul(A, A.T, out=G)
        else:
            outer_self_blocked(A, G)
        n = G.shape[0]
        zero_diag = (lambda M: M.fill_diagonal_(0)) if is_torch else (lambda M: np.fill_diagonal(M, 0))
        if debiased:
            zero_diag(G)
            means = G.sum(0) / (n - 2)
            means = means - means.sum() / (2 * (n - 1))
        else:
            means = G.mean(0)
            means = means - means.mean() / 2
        G -= means[:, None]
        G -= means[None, :]
        if debiased:
            zero_diag(G)
    if is_torch:
        import torch

        def dot(a, b):
            return float(torch.dot(a.reshape(-1), b.reshape(-1)))
    else:
        def dot(a, b):
            return float(np.dot(a.ravel(), b.ravel()))
    return dot(K, L) / math.sqrt(dot(K, K) * dot(L, L))


def run_in_memory(args) -> None:
    from analyses.cka import linear_cka_matrix

    rng = np.random.default_rng(args.seed)
    L = args.layers
    print(f"== in memory: linear CKA{' (debiased)' if args.debiased else ''}, n={args.n:,}, d={args.d}, "
          f"{L} x {L} = {L * L} layer pairs, float64, backend={args.device}", flush=True)
    t0 = time.perf_counter()
    Xs, Ys = make_layers(args.n, args.d, L, rng)
    Xs, Ys = _backend(Xs, args.device), _backend(Ys, args.device)
    print(f"data: 2 x {L} float32 layers generated in {time.perf_counter() - t0:.1f} s", flush=True)

    _sync(args.device)
    t0 = time.perf_counter()
    M = linear_cka_matrix(Xs, Ys, debiased=args.debiased)
    _sync(args.device)
    t_fast = time.perf_counter() - t0
    print(f"toolkit linear_cka_matrix (feature space, all {L * L} pairs): {t_fast:.2f} s", flush=True)
    print(f"  CKA[0, :] = {np.array2string(M[0], precision=4)}", flush=True)

    pairs = [(i, j) for i in range(L) for j in range(L)][: args.gram_pairs]
    if not pairs:
        print("Gram form: skipped (--gram-pairs 0)")
        return
    gb = args.n * args.n * 8 / 1e9
    if args.device == "numpy":
        K, Lg = np.empty((args.n, args.n)), np.empty((args.n, args.n))
    else:
        import torch
        K = torch.empty((args.n, args.n), dtype=torch.float64, device=args.device)
        Lg = torch.empty_like(K)
    diffs, times = [], []
    for i, j in pairs:
        _sync(args.device)
        t0 = time.perf_counter()
        v = gram_form_cka(Xs[i], Ys[j], K, Lg, args.debiased)
        _sync(args.device)
        times.append(time.perf_counter() - t0)
        diffs.append(abs(v - M[i, j]))
        print(f"  Gram form pair ({i}, {j}): {times[-1]:.2f} s, CKA {v:.10f} vs toolkit {M[i, j]:.10f}", flush=True)
    per_pair = float(np.mean(times))
    t_gram = per_pair * L * L
    print(f"Gram form ({gb:.1f} GB per n x n Gram matrix, 2 per pair): {per_pair:.2f} s/pair measured on "
          f"{len(pairs)} pair(s) -> {t_gram:.1f} s for {L * L} pairs (EXTRAPOLATED, not run)")
    print(f"speed-up, Gram form / toolkit: {t_gram / t_fast:.1f}x (Gram time extrapolated)")
    print(f"agreement on the {len(pairs)} computed pair(s): max |Gram - toolkit| = {max(diffs):.2e}", flush=True)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def stream_worker(n_total: int, batch: int, d: int, layers: int, debiased: bool, device: str, seed: int) -> dict:
    """Runs in a fresh process: generate batches, accumulate, return timings and peak RSS."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from analyses.cka import StreamingCKAMatrix

    rss_start = _rss_mb()
    rng = np.random.default_rng(seed)
    noise = 1.0
    Rx = [np.eye(d, dtype=np.float32)] + [
        rng.standard_normal((d, d), dtype=np.float32) / np.float32(math.sqrt(d)) for _ in range(layers - 1)]
    Ay = [rng.standard_normal((d, d), dtype=np.float32) / np.float32(math.sqrt(d)) for _ in range(layers)]
    acc = StreamingCKAMatrix(debiased=debiased, device=None if device == "numpy" else device)
    t_gen = t_acc = 0.0
    done, rss_10 = 0, None
    n_batches = math.ceil(n_total / batch)
    for b in range(n_batches):
        m = min(batch, n_total - done)
        t0 = time.perf_counter()
        Z = rng.standard_normal((m, d), dtype=np.float32)
        Xs = [Z @ R for R in Rx]
        Ys = [Z @ A + np.float32(noise) * rng.standard_normal((m, d), dtype=np.float32) for A in Ay]
        Xs, Ys = _backend(Xs, device), _backend(Ys, device)
        _sync(device)
        t1 = time.perf_counter()
        acc.update(Xs, Ys)
        _sync(device)
        t_acc += time.perf_counter() - t1
        t_gen += t1 - t0
        done += m
        if rss_10 is None and done >= n_total / 10:
            rss_10 = (done, _rss_mb())
    t0 = time.perf_counter()
    R = acc.result()
    t_res = time.perf_counter() - t0
    # population linear CKA of X = Z, Y = Z A + noise: ||A||² / (||I||_F ||AᵀA + σ²I||_F)
    A = Ay[0].astype(np.float64)
    pop = float((A * A).sum() / (math.sqrt(d) * np.linalg.norm(A.T @ A + noise**2 * np.eye(d))))
    return {"n": acc.n_items, "batches": n_batches, "t_gen": t_gen, "t_acc": t_acc, "t_res": t_res,
            "cka": R, "pop": pop, "rss_start": rss_start, "rss_10": rss_10, "rss_end": _rss_mb()}


def _noop() -> None:
    return None


def run_stream(args, executor) -> None:
    L = args.stream_layers
    print(f"== streaming: {args.stream_n:,} items in batches of {args.stream_batch:,}, d={args.d}, "
          f"{L} x {L} layer pair(s), {'debiased, ' if args.debiased else ''}backend={args.device}, "
          "fresh process", flush=True)
    r = executor.submit(stream_worker, args.stream_n, args.stream_batch, args.d, L, args.debiased,
                        args.device, args.seed).result()
    data_mb = r["n"] * args.d * L * 2 * 4 / 2**20
    print(f"accumulate (update): {r['t_acc']:.1f} s ({r['t_acc'] / r['batches'] * 1e3:.0f} ms/batch); "
          f"data generation: {r['t_gen']:.1f} s; result(): {r['t_res']:.2f} s; items: {r['n']:,}")
    print(f"CKA[0, 0] = {r['cka'][0, 0]:.6f} (population value for this generator: {r['pop']:.6f})")
    if L > 1:
        print(f"CKA matrix:\n{np.array2string(r['cka'], precision=4)}")
    n10, rss10 = r["rss_10"]
    print(f"peak RSS: {r['rss_start']:.0f} MB after imports, {rss10:.0f} MB after {n10:,} items, "
          f"{r['rss_end']:.0f} MB after {r['n']:,} items (the float32 data streamed: {data_mb:,.0f} MB)",
          flush=True)


def _load() -> str:
    return "load average %.1f %.1f %.1f (1/5/15 min)" % os.getloadavg()


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"machine: {os.cpu_count()} cpus, {_load()}: timings are only comparable on an idle machine")
    t0 = time.perf_counter()
    executor = None
    if not args.skip_stream:
        # Start the streaming worker now, while this process is small: Linux carries a process's peak
        # RSS (ru_maxrss) over fork+exec, so a worker started after the in-memory part would inherit it.
        ctx = multiprocessing.get_context("spawn")
        executor = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
        executor.submit(_noop).result()
    try:
        if not args.skip_memory:
            run_in_memory(args)
        if executor is not None:
            run_stream(args, executor)
    finally:
        if executor is not None:
            executor.shutdown()
    print(f"total wall time {time.perf_counter() - t0:.0f} s; {_load()}")


if __name__ == "__main__":
    main()
