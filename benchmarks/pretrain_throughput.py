"""Pretraining throughput: tokens per second of :mod:`probing.pretrain`'s training step, and its share of the
machine's float32 matrix-product rate measured in the same run.

The step is the one the runs take (``probing.pretrain._train.train_step``: batch layout and masking, forward,
MLM and pair losses, backward, gradient clipping, AdamW, the schedule) on a preset's model, its batch size and
full-length pairs of random tokens (BERT packs its sequences to the length limit), after ``--warmup`` steps.
Model FLOPs per step, from the config (L layers, hidden d, intermediate i, vocabulary V, n tokens a sequence,
m masked tokens):

    forward: n x 2L(4d² + 2di) + 4Ln²d per sequence (projections, feed-forward, QKᵀ and attention x V)
             + m x 2(d² + dV) (the MLM head, on the masked positions only) + the pair head (negligible)
    training = 3 x forward (the backward pass costs twice the forward)

Embeddings, biases, layer norms, softmax, GELU and the optimizer are left out.

The step alone leaves out what a run does around it. ``--loop-steps N`` (default 10; 0 leaves it out) also times
the runs' own loop (``probing.pretrain._train.train_run``: each epoch's pairs, the batches laid out and masked,
copied to the device, the steps, the losses) on a synthetic corpus of random words: two runs of N and 2N steps,
the difference of their recorded wall times over N steps, so what a run pays once (the first epoch's pairs)
cancels. Checkpoints are left out of these runs: a fsync'd write of the model and optimizer, once every
``checkpoint_every`` steps (500 in the `small` preset), whose time varies with the disk by seconds. It prints the
loop's time a step against the step's alone.

On the CPU the reference is a
float32 ``--matmul-size``³ product on the same threads, timed before and after the steps (their mean); on a GPU
a float32 8192³ product, and a bfloat16 one beside it when the step runs under bfloat16 autocast.

    python benchmarks/pretrain_throughput.py                         # tiny preset, CPU
    python benchmarks/pretrain_throughput.py --preset small --device cuda
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark (another package is "benchmarks")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from extract_throughput import matmul_gflops  # noqa: E402


def synthetic_tokenizer(vocab_size: int, max_length: int):
    """A fast BERT tokenizer with the preset's vocabulary size (five specials, then ``w0``, ``w1``, ...): the model
    and its MLM head get the preset's exact shape without training a vocabulary first."""
    from transformers import BertTokenizerFast

    from probing.pretrain._tokenizer import SPECIAL_TOKENS, _backend

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *(f"w{k}" for k in range(vocab_size - len(SPECIAL_TOKENS)))])}
    return BertTokenizerFast(tokenizer_object=_backend(vocab), do_lower_case=True, model_max_length=max_length)


def step_flops(config, lengths: np.ndarray, n_masked: int) -> float:
    L, d, i, V = config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size
    n = lengths.astype(np.float64)
    forward = n.sum() * 2 * L * (4 * d * d + 2 * d * i) + (4 * L * d * n ** 2).sum() + n_masked * 2 * (d * d + d * V)
    return 3.0 * forward


def loop_seconds_per_step(preset: str, objective: str, train_over: dict, device, n: int) -> float:
    """Seconds a step of ``train_run``'s loop takes (module docstring): runs of ``n`` and ``2n`` steps on random
    words, the difference of their walls over ``n``."""
    import json
    import tempfile
    from unittest import mock

    from probing.pretrain import parse_config
    from probing.pretrain._data import Corpus, Document, tokenize_documents
    from probing.pretrain._train import train_run
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per saved model directory
    rng = np.random.default_rng(1)
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for steps in (n, 2 * n):
            cfg = parse_config({"run": {"preset": preset, "out": f"{tmp}/{steps}", "device": str(device)},
                                "train": {**train_over, "steps": steps, "checkpoint_every": steps,
                                          "log_every": min(steps, 25), "eval_pairs": 8},
                                "variant": {"objective": objective}})
            tok = synthetic_tokenizer(cfg.model.vocab_size, cfg.model.max_length)
            tok.save_pretrained(f"{tmp}/{steps}/tokenizer")
            n_docs = max(4 * cfg.train.batch_size, 400)
            docs = tuple(Document(f"d{d}", tuple(" ".join(f"w{k}" for k in rng.integers(0, 1000, rng.integers(10, 21)))
                                                   for _ in range(12))) for d in range(n_docs))
            corpus = Corpus(docs[:-20], docs[-20:], "synthetic")
            tokens, heldout = tokenize_documents(tok, corpus.train), tokenize_documents(tok, corpus.heldout)
            with mock.patch("probing.pretrain._train.save_checkpoint"):  # module docstring: no checkpoints
                run = train_run(cfg, cfg.variants[0], 0, corpus, tok, tokens, heldout, device=device,
                                progress=False, log=lambda *a: None)
            walls.append(json.loads((run / "training.json").read_text(encoding="utf-8"))["wall_seconds"])
    return (walls[1] - walls[0]) / n


def gpu_matmul_tflops(device, dtype, size: int = 8192, reps: int = 10) -> float:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    torch.cuda.synchronize(device)
    return reps * 2 * size ** 3 / (time.perf_counter() - t0) / 1e12


def main(argv=None) -> int:
    from probing.models import pick_device
    from probing.pretrain import PRESETS, Variant, parse_config
    from probing.pretrain._data import SPECIALS_BUDGET, Instance, Layout, make_batch
    from probing.pretrain._model import build_model
    from probing.pretrain._train import _autocast, make_optimizer, non_special_ids, train_step

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="tiny")
    p.add_argument("--objective", default="mlm+nsp", choices=["mlm", "mlm+nsp", "mlm+sop"])
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--loop-steps", type=int, default=10,
                   help="also time the runs' own loop: runs of N and 2N steps (0: leave it out)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--autocast", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--matmul-size", type=int, default=2048)
    p.add_argument("--matmul-seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    train_over = {"autocast": {"auto": "auto", "on": True, "off": False}[args.autocast]}
    if args.batch_size is not None:
        train_over["batch_size"] = args.batch_size
    cfg = parse_config({"run": {"preset": args.preset}, "train": train_over,
                        "variant": {"objective": args.objective}})
    arch, train = cfg.model, cfg.train
    variant: Variant = cfg.variants[0]
    tok = synthetic_tokenizer(arch.vocab_size, arch.max_length)
    model = build_model(arch, variant, tok, seed=0).to(device).train()
    optimizer, scheduler = make_optimizer(model, train)
    autocast = _autocast(device, train.autocast)
    layout, ids = Layout(variant, tok), non_special_ids(tok)
    budget = arch.max_length - SPECIALS_BUDGET
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)

    def batch():
        insts = [Instance(rng.choice(ids.numpy(), budget // 2), rng.choice(ids.numpy(), budget - budget // 2),
                          int(rng.integers(2)), 0) for _ in range(train.batch_size)]
        return make_batch(insts, layout, mask_prob=train.mask_prob, mask_id=tok.mask_token_id, random_ids=ids,
                          generator=gen)

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    print(f"preset {args.preset} ({arch.layers} layers, hidden {arch.hidden}, {arch.max_length} tokens, vocabulary "
          f"{arch.vocab_size}), batch {train.batch_size}, {variant.objective}, device {device}, autocast {autocast}, "
          f"torch threads {torch.get_num_threads()}, {platform.machine()}")
    for _ in range(args.warmup):
        train_step(model, batch().to(device), optimizer, scheduler, grad_clip=train.grad_clip, autocast=autocast)
    if device.type == "cpu":
        before = matmul_gflops(args.matmul_size, args.matmul_seconds)[0]
    tokens, flops, seconds = 0, 0.0, 0.0
    for _ in range(args.steps):
        b = batch()  # laid out and masked inside the timed step, as in a run
        sync()
        t0 = time.perf_counter()
        b = b.to(device)
        train_step(model, b, optimizer, scheduler, grad_clip=train.grad_clip, autocast=autocast)
        sync()
        seconds += time.perf_counter() - t0
        tokens += b.n_tokens
        flops += step_flops(model.config, b.attention_mask.sum(1).cpu().numpy(), int((b.labels != -100).sum()))
    rate = flops / seconds / 1e9
    print(f"pretraining: {tokens} tokens in {seconds:.2f}s = {tokens / seconds:,.0f} tokens/s, "
          f"{seconds / args.steps * 1e3:.1f} ms a step, {rate:.1f} GFLOP/s (model FLOPs)")
    if args.loop_steps > 0:
        loop = loop_seconds_per_step(args.preset, args.objective, train_over, device, args.loop_steps)
        print(f"the runs' loop: {loop * 1e3:.1f} ms a step (runs of {args.loop_steps} and {2 * args.loop_steps} "
              f"steps on random words); the step alone is {seconds / args.steps / loop:.0%} of it")
    if device.type == "cpu":
        after = matmul_gflops(args.matmul_size, args.matmul_seconds)[0]
        ref = (before + after) / 2
        print(f"float32 {args.matmul_size}^3 matmul, same threads, before and after: {before:.1f}, {after:.1f} GFLOP/s")
        print(f"pretraining {rate:.1f} GFLOP/s = {rate / ref:.0%} of the float32 matmul rate")
    else:
        f32 = gpu_matmul_tflops(device, torch.float32) * 1e3
        print(f"float32 8192^3 matmul: {f32:.0f} GFLOP/s; pretraining = {rate / f32:.1%} of it")
        if autocast:
            bf16 = gpu_matmul_tflops(device, torch.bfloat16) * 1e3
            print(f"bfloat16 8192^3 matmul: {bf16:.0f} GFLOP/s; pretraining = {rate / bf16:.1%} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
