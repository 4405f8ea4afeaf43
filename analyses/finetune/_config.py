"""Fine-tuning hyperparameters (:class:`TrainConfig`) and the presets of the Q8 experiment.

>>> preset_config("quick", epochs=1).epochs
1
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from analyses.probes import DEFAULT_CS
from probing.models import native_bfloat16

SCHEDULES: tuple[str, ...] = ("linear", "constant")
ON_OVERFLOW: tuple[str, ...] = ("error", "skip")


def resolve_autocast(config: "TrainConfig", device: torch.device | str) -> "TrainConfig":
    """``config`` with ``autocast="auto"`` decided for ``device`` (:func:`probing.models.native_bfloat16`): True or
    False, so that the result's key and table record what ran. Any other config is returned as it is."""
    if config.autocast != "auto":
        return config
    return replace(config, autocast=native_bfloat16(device))


def _is_int(v: Any, low: int = 1) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= low


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning hyperparameters (the result cache key includes all of them).

    lr, head_lr: peak learning rates of the encoder and of the head (``head_lr=None``: ``lr``). A larger
        head rate lets a freshly initialised head catch up within the few steps of a CPU run.
    freeze_embeddings: keep the word-embedding table fixed (position, segment and LayerNorm
        embeddings still train): less time per CPU step, since neither backward nor AdamW touch
        the 11.7M-entry table, half of MiniLM's parameters. Every transformer layer is fine-tuned.
    max_train: at most this many training examples (those with the smallest ``u(id)``); None: all.
    length_grouping: batches are cut from seeded groups of ``length_grouping`` batches sorted by
        length (less padding, as Hugging Face's ``group_by_length``); 1 gives plain random batches.
    max_length: longest rendered example kept, in tokens (None: the model's limit); longer ones are an
        error (``on_overflow="error"``) or left out of train and test alike (``"skip"``, counted in
        ``n_skipped``: a row of the experiment's table and its ``attrs``). Never truncated.
    folds, run_folds, repeats, seed: the experiment's splits: ``repeats`` stratified, document-grouped
        ``folds``-fold partitions (:func:`analyses.probes.make_splits`, seeds ``seed + r``), of which
        the first ``run_folds`` folds are run (None: all). Every test item of a run fold is predicted
        once per repeat by the fine-tuned models (each training seed) and the frozen probe. ``seed``
        also seeds the frozen probe's inner CV (``seed + r``), the table's bootstrap intervals and the
        single-run hash split (:func:`analyses.finetune.train_test_split`).
    frozen_Cs: C grid of the frozen probe (:class:`analyses.probes.LinearProbe`, chosen by grouped
        inner CV on the training items); default :data:`analyses.probes.DEFAULT_CS`, the probes' own
        default grid (one place). The seed-questions study's narrower ``[probes] Cs`` (0.003, 0.01,
        0.1) is not passed here: on its Q8 splits the frozen probe then chose the top edge 0.1 in 15 of
        15 fits (with 0.01-10 it chose 1 or 10 for cls, mean, max, sep1), and frozen cls - mean moved
        from -0.035 to -0.009.
    autocast: forward pass and loss (training and evaluation) under ``torch.autocast(device, bfloat16)``;
        weights, gradients and AdamW stay float32. On by default in the "default" preset only. Check
        (``run_pooling_experiment(load_corpus("bbc:n=1000,k=2,max_words=40"), "topic", model=load_model(),
        preset="default", device="cpu", with_predictions=True, autocast=False|True)``, one torch thread,
        this 2-core avx512_bf16 CPU, load 6-10): fine-tuned accuracy per pooling fp32 -> bf16 cls 0.920
        -> 0.920, mean 0.915 -> 0.915, max 0.910 -> 0.907, sep1 0.918 -> 0.918, first_word 0.889 -> 0.887
        (CI half-widths 0.026-0.034); every fine-tuned - frozen and pooling - mean difference keeps its
        sign and moves by at most 0.0033 (half-widths >= 0.015); 99.7% of the 3065 fine-tuned test
        predictions are the same. The frozen side does not use it. ``"auto"`` (the "default" preset): on where
        the device computes bfloat16 in hardware (:func:`probing.models.native_bfloat16`), off elsewhere, where
        bfloat16 is slower than float32 (14x per training step on an AVX2-only CPU); decided before a run
        (:func:`resolve_autocast`), so the result key holds True or False.
    checkpoint_every: activation checkpointing of every n-th encoder layer (0: none): such a layer keeps
        only its input during the forward pass and is recomputed in the backward pass (non-reentrant;
        dropout replays the draws of the forward pass), so the same gradients, the same run, with less
        memory and more time. Above 1 it needs transformers' ``activation_checkpointing_enable``
        (transformers >= 5; older versions checkpoint every layer, with a warning). 0 in every preset since
        afc0a39, 2026-11-27 (2 in "default" from 7bc1802): ``run_pooling_experiment(load_corpus("bbc:n=1000,k=2,
        max_words=40"), "topic", ["cls", "mean", "max"], [0], model=load_model(), preset="default",
        run_folds=1, checkpoint_every=0|1|2)`` (2-core VM, two torch threads, alternated): peak RSS
        1,413 / 1,421 MiB with none, 1,177 / 1,163 MiB with every layer, 1,283 / 1,311 MiB with every
        second; 24.3-26.6 s, 35.8-36.3 s and 28.3-32.1 s; the table (but its ``seconds``) and the
        predictions byte-identical. Each fine-tuning run held about 650 MiB above the process before it
        with none, and the study's peak is Q8's fine-tuning; every layer cost the study 40-50 s, every
        second layer half of that for half the memory. On the AVX2-only VM of 2026-11-27 (f02dfc7 on; float32
        training, no autocast) every second layer cost more: the same call, alternated, took 64.6 / 67.2 s
        with none against 77.7 / 81.4 s (peak 1,413 / 1,416 against 1,252 / 1,256 MiB), the tables equal
        but for ``seconds``. There the study missed its 10 minutes by 320 s while its peak stayed 375 MiB
        under 2 GB, so "default" keeps every activation.
    """

    epochs: int = 1
    lr: float = 1e-4
    head_lr: float | None = None
    freeze_embeddings: bool = False
    batch_size: int = 16
    max_train: int | None = None
    max_length: int | None = None
    on_overflow: str = "error"
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    schedule: str = "linear"
    test_fraction: float = 0.2
    seed: int = 0
    split_group: str = "auto"
    eval_batch_size: int = 64
    length_grouping: int = 8
    folds: int = 5
    run_folds: int | None = None
    repeats: int = 1
    frozen_Cs: tuple[float, ...] = DEFAULT_CS
    autocast: bool | str = False
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_Cs", tuple(float(c) for c in self.frozen_Cs))
        if not self.frozen_Cs or not all(c > 0 and math.isfinite(c) for c in self.frozen_Cs):
            raise ValueError(f"frozen_Cs must be positive numbers, got frozen_Cs={self.frozen_Cs!r}")
        if not _is_int(self.folds, 2):
            raise ValueError(f"folds must be an integer >= 2, got folds={self.folds!r}")
        if self.run_folds is not None and not (_is_int(self.run_folds) and self.run_folds <= self.folds):
            raise ValueError(f"run_folds must be None or an integer in [1, folds={self.folds}], "
                             f"got run_folds={self.run_folds!r}")
        for name in ("epochs", "batch_size", "eval_batch_size", "length_grouping", "repeats"):
            v = getattr(self, name)
            if not _is_int(v):
                raise ValueError(f"{name} must be an integer >= 1, got {name}={v!r}")
        for name in ("max_train", "max_length"):
            v = getattr(self, name)
            if v is not None and not _is_int(v):
                raise ValueError(f"{name} must be None or an integer >= 1, got {name}={v!r}")
        if not _is_int(self.seed, 0):
            raise ValueError(f"seed must be an integer >= 0, got seed={self.seed!r}")
        if not _is_int(self.checkpoint_every, 0):
            raise ValueError(f"checkpoint_every must be an integer >= 0 (0: no checkpointing), "
                             f"got checkpoint_every={self.checkpoint_every!r}")
        if not isinstance(self.freeze_embeddings, bool):
            raise ValueError(f"freeze_embeddings must be True or False, "
                             f"got freeze_embeddings={self.freeze_embeddings!r}")
        if not (isinstance(self.autocast, bool) or self.autocast == "auto"):
            raise ValueError(f"autocast must be True, False or 'auto', got autocast={self.autocast!r}")
        if not isinstance(self.split_group, str) or not self.split_group:
            raise ValueError(f"split_group must be 'auto', 'id' or a label name, got {self.split_group!r}")
        for name in ("lr", "head_lr"):
            v = getattr(self, name)
            if name == "head_lr" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive number, got {name}={v!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got test_fraction={self.test_fraction!r}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must lie in [0, 1), got warmup_fraction={self.warmup_fraction!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got weight_decay={self.weight_decay!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if self.on_overflow not in ON_OVERFLOW:
            raise ValueError(f"unknown on_overflow {self.on_overflow!r}; valid: {', '.join(ON_OVERFLOW)}")


TRAIN_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TrainConfig))

#: Settings declared once: the corpus spec, target label, poolings, training seeds and training
#: hyperparameters. Every preset runs poolings x run folds x seeds fine-tuning runs (plus one frozen
#: probe per pooling and fold) on the model's own length limit (``max_length=None``: nothing skipped
#: on BBC pairs, whose longest is 101 tokens in ``pair``; anything longer is skipped and counted).
#:
#: Cost of "default" on the study's corpus (bbc:n=1000,k=2,max_words=40, target topic,
#: all-MiniLM-L6-v2, 2-core CPU). Measured:
#:
#: * the whole stage took 299 s in the last full study on the idle machine (before the length-sorted
#:   evaluation and fused AdamW of :mod:`analyses.finetune`);
#: * CPU seconds of ``run_pooling_experiment(load_corpus(...), "topic", ["mean", "first_word"], [0],
#:   model=load_model(), preset="default", run_folds=1)`` with ``torch.set_num_threads(1)``
#:   (``time.process_time()``; both versions run side by side at load average 12-16 on 2 cores, so
#:   the wall times, 826 s and 716 s, say nothing): 81.4 s before, 65.1 s after (-20%); the
#:   predictions are identical. The same call with ``["cls"]``, old and new interleaved at load
#:   2.3-6.5: 48.4 and 48.5 CPU s before, 35.7 and 32.1 after; the fine-tuning run itself 43.0 s
#:   before and 25.5 s after (wall, the last pair; the new one had a core to itself). A training step
#:   (16 pairs of ~53 tokens, forward and backward) is
#:   about 1.07 CPU s on one thread, about 52 GFLOP/s, so the 15 runs x 24 steps need about 385 CPU
#:   s of training alone: about 200 s on two idle cores whatever the implementation. Scaled from
#:   the 299 s, the stage now takes about 240 s idle (an estimate from the ratio, not a timed run).
#:   Reaching 90 s needs a protocol change (fewer runs or fewer fine-tuned layers), not code;
#: * bf16 autocast (``autocast="auto"`` in "default": on where the CPU has AVX512-BF16 or AMX, as the
#:   machine of these measurements had; off on an AVX2-only CPU, where it would be 14x slower per step):
#:   the whole "default" experiment (the call in
#:   TrainConfig's ``autocast`` entry, one torch thread, fp32 and bf16 side by side at load 6-10)
#:   took 418.9 CPU s in fp32 and 271.4 CPU s in bf16 (-35%); one training step (16 x 53 tokens,
#:   one thread, load 2.5) 0.90-1.02 CPU s fp32 vs 0.52-0.56 bf16 (1.8x). Scaled from the 248 s the
#:   stage took in the last full study, it should take about 160 s idle (an estimate, not a timed run);
#:   not reached: 100-120 s (the frozen features, the probes and model copies are unchanged);
#: * measured in the timed full study of 2026-11-25 (idle, fresh clone): 151 s wall, 294 CPU s, the runs
#:   one at a time on two torch threads; with ``num_threads=2`` (two single-threaded workers, the same
#:   results) an earlier full study took 131 s, but each run in flight holds about 650 MB, which took the
#:   study's peak to 2.7 GB (docs/CHANGES.md, 2026-11-25, "Single-threaded workers");
#: * on an AMD EPYC VM with AVX2 only (f02dfc7, 2026-11-27; 2-thread 2048^3 matmul 129-145 GFLOP/s), where "auto"
#:   leaves autocast off: 365 s wall, 710 CPU s in the full study (fresh clone, no other job);
#: * peak RSS of ``/usr/bin/time -v python -m analyses.finetune --corpus bbc:n=1000,k=2,max_words=40
#:   --targets topic --poolings cls,max --run-folds 1 --no-progress --force``: 1,432,736 kB
#:   (595 MB of it imports, corpus and model; it does not grow from run to run).
#:
#: "quick": 2 poolings x 2 of 3 folds x 1 seed, 48 training examples x 2 epochs on the quick corpus
#: (120 generated pairs): 21 s of CPU measured at load 6 (before this version). "full" is for a GPU:
#: BBC News pairs, 6 poolings x 5 folds x 2 repeats x 3 seeds, the whole training side, 3 epochs of
#: the whole encoder at BERT's usual learning rate. Each further training seed multiplies the
#: fine-tuning cost by (seeds + 1) / seeds.
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "corpus": "generated:n=120,k=2", "target": "topic", "poolings": ("cls", "mean"), "train_seeds": (0,),
        "train": {"epochs": 2, "lr": 2e-4, "head_lr": 3e-3, "freeze_embeddings": True, "batch_size": 16,
                  "max_train": 48, "max_length": None, "on_overflow": "skip", "folds": 3, "run_folds": 2},
    },
    "default": {
        "corpus": "generated:n=1000,k=2", "target": "topic",
        "poolings": ("cls", "mean", "max", "sep1", "first_word"), "train_seeds": (0,),
        "train": {"epochs": 3, "lr": 2e-4, "head_lr": 3e-3, "freeze_embeddings": True, "batch_size": 16,
                  "max_train": 128, "max_length": None, "on_overflow": "skip", "folds": 5, "run_folds": 3,
                  "autocast": "auto"},
    },
    "full": {
        "corpus": "bbc:k=2,n=6000", "target": "topic",
        "poolings": ("cls", "mean", "max", "sep1", "first_word", "pos3"), "train_seeds": (0, 1, 2),
        "train": {"epochs": 3, "lr": 5e-5, "head_lr": 5e-4, "freeze_embeddings": False, "batch_size": 32,
                  "max_train": None, "max_length": None, "on_overflow": "skip", "eval_batch_size": 256,
                  "folds": 5, "repeats": 2},
    },
}


def preset_config(preset: str, **overrides: Any) -> TrainConfig:
    """The preset's :class:`TrainConfig` with ``overrides`` (keys of TrainConfig; None values ignored)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides) - set(TRAIN_KEYS))
    if unknown:
        raise ValueError(f"unknown training options {unknown}; valid: {', '.join(TRAIN_KEYS)}")
    kw = dict(PRESETS[preset]["train"])
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**kw)


