"""Fine-tuning with different poolings (DESIGN.md Q8): is [CLS] better than mean pooling, and after
fine-tuning would any token do?

Protocol. For each pooling choice and seed, a fresh copy of the encoder plus a linear head on the
pooled last-layer vector is fine-tuned end to end for sequence classification, as in BERT's
fine-tuning recipe (Devlin et al. 2019, sec. 4): cross-entropy on ``softmax(W·pool(h_L) + b)``,
AdamW (Loshchilov & Hutter 2019) with weight decay on everything but biases and LayerNorm weights,
and a learning rate warmed up linearly over the first ``warmup_fraction`` of the steps, then
decayed linearly to 0 (``schedule="linear"``) or held (``"constant"``). Test accuracy on held-out
examples is the score; over seeds the summary is the mean with a 95% t-interval.

Poolings (:data:`POOLINGS`, plus ``pos<k>``) read the *last* hidden layer ``h_L: (batch, pos, dim)``
at positions chosen from the rendered token roles of :func:`probing.formats.render`, never by
searching token ids, so they mean the same thing for BERT's ``[CLS]``/``[SEP]`` and RoBERTa's
``<s>``/``</s>``; padding is never selected. Sentence-BERT (Reimers & Gurevych 2019, table 6)
compared CLS, MEAN and MAX for fine-tuned sentence embeddings; this module asks the same of a
classifier and adds ``[SEP]``, the first word and a fixed position.

The split. Every example goes to the test side when ``u(key) < test_fraction``, where
``u(key) = int(sha256(f"{split_seed}|{key}")[:16], 16) / 2**64`` and ``key`` is the value of the
``split_group`` label (``"id"``: the example id; ``"auto"``: the ``doc`` label when every example
has one, else the id). Examples of one document therefore never straddle train and test (generated
and BBC examples of one document share a protagonist and vocabulary), and the split depends neither
on the pooling, the training seed nor the corpus order. ``max_train`` keeps the training examples with the smallest
``u(id)``. ``test_ids=...`` gives an explicit test set instead. Training never reads test examples
or their labels; the class list comes from the training labels only.

>>> sorted(POOLINGS)
['cls', 'first_word', 'max', 'mean', 'sep']
>>> get_pooling("pos3").position
3
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from analyses.results import make_table, read_table, result_path, write_table
from probing.cli import ArgumentParser, output_dir_arg
from probing.examples import Example, corpus_fingerprint
from probing.formats import Format, Rendered, render, special_token_ids, tokenize_sentences

ANALYSIS = "finetune_pooling"
#: Bump when the protocol changes, so stored results of the old protocol are not reused.
PROTOCOL_VERSION = 1

# --------------------------------------------------------------------------------------------------
# Pooling registry


@dataclass(frozen=True)
class Pooling:
    """A pooling choice: which positions of a rendered example it reads, and how it reduces them.

    ``select(r) -> positions: (n_selected,) int64`` (empty when the example has no such position);
    ``reduce`` is ``"mean"`` or ``"max"`` over the selected positions (one position: either is that
    position's vector).
    """

    name: str
    reduce: Literal["mean", "max"]
    description: str
    select: Callable[[Rendered], np.ndarray] = field(repr=False, compare=False)
    position: int | None = None


def _first(role: str) -> Callable[[Rendered], np.ndarray]:
    def select(r: Rendered) -> np.ndarray:
        hits = [t for t, x in enumerate(r.role) if x == role]
        return np.asarray(hits[:1], dtype=np.int64)

    return select


def _all_words(r: Rendered) -> np.ndarray:
    return np.asarray([t for t, x in enumerate(r.role) if x == "word"], dtype=np.int64)


def _at(k: int) -> Callable[[Rendered], np.ndarray]:
    def select(r: Rendered) -> np.ndarray:
        return np.asarray([k] if k < len(r) else [], dtype=np.int64)

    return select


#: The named poolings, declared once: used for validation, dispatch and the CLI help.
POOLINGS: dict[str, Pooling] = {
    "cls": Pooling("cls", "mean", "the first [CLS] token (role 'cls'; <s> for RoBERTa)", _first("cls")),
    "mean": Pooling("mean", "mean", "mean over word tokens (role 'word': no special tokens, no padding)",
                    _all_words),
    "max": Pooling("max", "max", "element-wise max over word tokens (no special tokens, no padding)", _all_words),
    "sep": Pooling("sep", "mean", "the FIRST [SEP] of the sequence (in 'pair': the one closing sentence 1)",
                   _first("sep")),
    "first_word": Pooling("first_word", "mean", "the first word token (first subword of sentence 1's first word)",
                          _first("word")),
}
_POS_RE = re.compile(r"pos(\d+)")
POS_HELP = "the token at position k, e.g. pos3 (0-based, any role; k < the shortest example's length)"


def get_pooling(name: str) -> Pooling:
    """A pooling by name: a key of :data:`POOLINGS` or ``pos<k>`` (e.g. ``pos3``)."""
    if isinstance(name, Pooling):
        return name
    if name in POOLINGS:
        return POOLINGS[name]
    m = _POS_RE.fullmatch(name) if isinstance(name, str) else None
    if m is not None:
        k = int(m.group(1))
        return Pooling(f"pos{k}", "mean", f"the token at position {k}", _at(k), position=k)
    raise ValueError(f"unknown pooling {name!r}; valid: {', '.join(POOLINGS)} or pos<k> (e.g. 'pos3')")


def pooling_mask(rendered: Sequence[Rendered], pooling: str | Pooling, T: int | None = None) -> np.ndarray:
    """Positions each example's pool reads: ``mask: (batch, T) bool`` (``T`` defaults to the longest).

    Raises ValueError naming the pooling and the first example that has no such position (e.g.
    ``sep`` on a format without ``[SEP]``, ``pos5`` on a 4-token example).
    """
    p = get_pooling(pooling)
    T = max(len(r) for r in rendered) if T is None else T
    mask = np.zeros((len(rendered), T), dtype=bool)
    for b, r in enumerate(rendered):
        pos = p.select(r)
        if pos.size == 0:
            if p.position is not None:
                shortest = min(len(x) for x in rendered)
                raise ValueError(f"pooling {p.name!r} needs position {p.position}, but the shortest example "
                                 f"has {shortest} tokens; use pos<k> with k < {shortest}")
            raise ValueError(f"pooling {p.name!r} selects no position in example {b} (roles {r.role})")
        mask[b, pos] = True
    return mask


def pool(hidden: torch.Tensor, mask: torch.Tensor, reduce: str) -> torch.Tensor:
    """Pool ``hidden: Float[Tensor, "batch pos dim"]`` over ``mask: Bool[Tensor, "batch pos"]``.

    ``"mean"``: ``sum_t m_bt h_bt / sum_t m_bt``; ``"max"``: ``max_{t: m_bt} h_bt`` element-wise.
    Returns ``Float[Tensor, "batch dim"]``. Every row of ``mask`` must select at least one position.
    """
    if hidden.ndim != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(f"hidden must be (batch, pos, dim) and mask (batch, pos); got {tuple(hidden.shape)=} "
                         f"and {tuple(mask.shape)=}")
    counts = mask.sum(dim=1)
    if (counts == 0).any():
        raise ValueError(f"mask rows {torch.nonzero(counts == 0).flatten().tolist()} select no position")
    m = mask.unsqueeze(-1)
    if reduce == "mean":
        return (hidden * m.to(hidden.dtype)).sum(dim=1) / counts.unsqueeze(-1).to(hidden.dtype)
    if reduce == "max":
        return hidden.masked_fill(~m, float("-inf")).amax(dim=1)
    raise ValueError(f"unknown reduce {reduce!r}; valid: 'mean', 'max'")


# --------------------------------------------------------------------------------------------------
# Hyperparameters and presets

SCHEDULES: tuple[str, ...] = ("linear", "constant")
ON_OVERFLOW: tuple[str, ...] = ("error", "skip")


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
        ``n_skipped``). Never truncated.
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
    split_seed: int = 0
    split_group: str = "auto"
    eval_batch_size: int = 64
    length_grouping: int = 8

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size", "length_grouping"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={v!r}")
        for name in ("max_train", "max_length"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be None or an integer >= 1, got {name}={v!r}")
        if not isinstance(self.freeze_embeddings, bool):
            raise ValueError(f"freeze_embeddings must be True or False, got {self.freeze_embeddings!r}")
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

#: Settings declared once: the corpus spec, label, poolings, seeds and training hyperparameters.
#: "quick": a smoke test (2 runs of 4 steps). "default": the whole grid (5 poolings x 3 seeds, 30
#: steps each on 160 training and 56 test examples) with all-MiniLM-L6-v2 on a 2-core CPU: 192 s
#: for the grid (3 min 19 s with model loading) with ``--threads 1`` while another process kept one
#: core busy; the same run with torch's default 2 threads took 883 s, as oversubscribed threads
#: stall each other. "full": for a GPU: BBC News sentence pairs (needs ``probing[corpora]``; 4921
#: training and 1039 test examples after 40 longer than 128 tokens are skipped), 6 poolings x 10
#: seeds, 3 epochs of the whole encoder at BERT's usual learning rate.
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "corpus": "generated:n=120,k=2", "label": "topic", "poolings": ("cls", "mean"), "seeds": (0,),
        "train": {"epochs": 1, "lr": 2e-4, "head_lr": 2e-3, "freeze_embeddings": True, "batch_size": 16,
                  "max_train": 64, "max_length": 64, "on_overflow": "skip"},
    },
    "default": {
        "corpus": "generated:n=260,k=2", "label": "topic",
        "poolings": ("cls", "mean", "max", "sep", "first_word"), "seeds": (0, 1, 2),
        "train": {"epochs": 3, "lr": 2e-4, "head_lr": 3e-3, "freeze_embeddings": True, "batch_size": 16,
                  "max_train": 160, "max_length": 64, "on_overflow": "skip"},
    },
    "full": {
        "corpus": "bbc:k=2,n=6000", "label": "topic",
        "poolings": ("cls", "mean", "max", "sep", "first_word", "pos3"), "seeds": tuple(range(10)),
        "train": {"epochs": 3, "lr": 5e-5, "head_lr": 5e-4, "freeze_embeddings": False, "batch_size": 32,
                  "max_train": None, "max_length": 128, "on_overflow": "skip", "eval_batch_size": 256},
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


# --------------------------------------------------------------------------------------------------
# Data: rendering, labels and the fixed split


def split_unit(key: str, split_seed: int = 0) -> float:
    """``u(key) = int(sha256(f"{split_seed}|{key}")[:16 hex], 16) / 2**64`` in [0, 1)."""
    return int(hashlib.sha256(f"{split_seed}|{key}".encode("utf-8")).hexdigest()[:16], 16) / 2.0 ** 64


def split_group_key(examples: Sequence[Example], split_group: str) -> list[str]:
    """The key each example is split by: its ``split_group`` label, or its id (``"id"``, or ``"auto"``
    when not every example has a ``doc`` label)."""
    if split_group == "auto":
        split_group = "doc" if all("doc" in e.labels for e in examples) else "id"
    if split_group == "id":
        return [f"id={e.id}" for e in examples]
    missing = [e.id for e in examples if split_group not in e.labels]
    if missing:
        raise ValueError(f"split_group {split_group!r} is missing from {len(missing)} example(s), e.g. {missing[:5]}")
    return [f"{split_group}={e.labels[split_group]}" for e in examples]


def train_test_split(examples: Sequence[Example], *, test_fraction: float = 0.2, split_seed: int = 0,
                     split_group: str = "auto", test_ids: Iterable[str] | None = None,
                     max_train: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(train_idx, test_idx)``: sorted indices into ``examples`` (see the module docstring).

    Depends only on the examples' ids / group labels and the arguments, never on a training seed.
    """
    ids = [e.id for e in examples]
    if test_ids is not None:
        test_ids = set(test_ids)
        unknown = sorted(test_ids - set(ids))
        if unknown:
            raise ValueError(f"test_ids names {len(unknown)} id(s) not in the examples, e.g. {unknown[:5]}")
        is_test = np.asarray([i in test_ids for i in ids], dtype=bool)
    else:
        keys = split_group_key(examples, split_group)
        is_test = np.asarray([split_unit(k, split_seed) < test_fraction for k in keys], dtype=bool)
    train = np.flatnonzero(~is_test)
    test = np.flatnonzero(is_test)
    if max_train is not None and len(train) > max_train:
        u = np.asarray([split_unit(ids[i], split_seed) for i in train])
        train = np.sort(train[np.argsort(u, kind="stable")[:max_train]])
    if len(train) == 0 or len(test) == 0:
        raise ValueError(f"the split leaves {len(train)} training and {len(test)} test examples "
                         f"(of {len(examples)}; test_fraction={test_fraction}); both must be non-empty")
    return train, test


@dataclass
class Task:
    """Everything a fine-tuning run needs besides the model, prepared once for all poolings and seeds."""

    rendered: list[Rendered]  # one per kept example
    labels: list[Any]  # one per kept example (raw label values)
    ids: list[str]  # one per kept example
    train: np.ndarray  # indices into the kept examples
    test: np.ndarray
    classes: list[Any]  # sorted training classes
    y: np.ndarray  # (n_kept,) int64 class index, -1 for a test label never seen in training
    skipped: list[str]


def _check_label(examples: Sequence[Example], label: str) -> None:
    if not examples:
        raise ValueError("no examples given")
    missing = [e.id for e in examples if label not in e.labels]
    if missing:
        have = sorted({k for e in examples for k in e.labels})
        raise ValueError(f"label {label!r} is missing from {len(missing)} of {len(examples)} examples "
                         f"(e.g. {missing[:5]}); labels present: {have}")
    values = {e.labels[label] for e in examples}
    if len(values) < 2:
        raise ValueError(f"label {label!r} has a single class {sorted(values, key=str)} over all "
                         f"{len(examples)} examples; classification needs at least two")


def prepare_task(examples: Sequence[Example], label: str, tokenizer, fmt: Format, model_config, *,
                 config: TrainConfig, model_max_length: int, test_ids: Iterable[str] | None = None) -> Task:
    """Render every example in ``fmt``, drop or reject overlong ones, and split."""
    examples = list(examples)
    _check_label(examples, label)
    corpus_fingerprint(examples)  # rejects duplicate ids
    specials = special_token_ids(tokenizer, fmt)
    unique = list(dict.fromkeys(s for e in examples for s in e.sentences))
    tokenized = dict(zip(unique, tokenize_sentences(tokenizer, unique)))
    type_vocab = int(getattr(model_config, "type_vocab_size", 0) or 0)
    limit = model_max_length if config.max_length is None else min(config.max_length, model_max_length)
    kept, rendered, skipped = [], [], []
    for i, e in enumerate(examples):
        r = render(fmt, e, [tokenized[s] for s in e.sentences], specials)
        if len(r) > limit:
            if config.on_overflow == "skip":
                skipped.append(e.id)
                continue
            raise ValueError(f"example {e.id!r} is {len(r)} tokens in format {fmt.name!r}, longer than "
                             f"max_length={limit}; it is never truncated (use on_overflow='skip' to leave it out)")
        max_type = int(r.token_type_ids.max())
        if max_type > 0 and type_vocab <= 1:
            r.token_type_ids = np.zeros_like(r.token_type_ids)  # no segment embeddings to speak of
        elif max_type >= type_vocab > 1:
            raise ValueError(f"format {fmt.name!r} uses segment id {max_type} but the model has "
                             f"type_vocab_size={type_vocab}")
        kept.append(i)
        rendered.append(r)
    if not kept:
        raise ValueError(f"every example is longer than max_length={limit} in format {fmt.name!r}")
    kept_ex = [examples[i] for i in kept]
    train, test = train_test_split(kept_ex, test_fraction=config.test_fraction, split_seed=config.split_seed,
                                   split_group=config.split_group, test_ids=test_ids,
                                   max_train=config.max_train)
    labels = [e.labels[label] for e in kept_ex]
    classes = sorted({labels[i] for i in train}, key=lambda v: (str(type(v)), v))
    if len(classes) < 2:
        raise ValueError(f"label {label!r} has a single class {classes} among the {len(train)} training "
                         "examples; classification needs at least two")
    index = {c: j for j, c in enumerate(classes)}
    y = np.asarray([index.get(v, -1) for v in labels], dtype=np.int64)
    return Task(rendered, labels, [e.id for e in kept_ex], train, test, classes, y, skipped)


def check_pooling(task: Task, pooling: str | Pooling) -> Pooling:
    """Validate ``pooling`` against every kept example (a ``pos<k>`` beyond the shortest, a format
    without the token it reads): ValueError naming the pooling."""
    p = get_pooling(pooling)
    pooling_mask(task.rendered, p)
    return p


# --------------------------------------------------------------------------------------------------
# Training


def _accepts_token_types(model: torch.nn.Module) -> bool:
    try:
        return "token_type_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _collate(rendered: Sequence[Rendered], pooling: Pooling, pad_id: int, device: torch.device) -> dict:
    T = max(len(r) for r in rendered)
    ids = np.full((len(rendered), T), pad_id, dtype=np.int64)
    types = np.zeros((len(rendered), T), dtype=np.int64)
    att = np.zeros((len(rendered), T), dtype=np.int64)
    for b, r in enumerate(rendered):
        n = len(r)
        ids[b, :n], types[b, :n], att[b, :n] = r.input_ids, r.token_type_ids, 1
    mask = pooling_mask(rendered, pooling, T)
    return {"input_ids": torch.from_numpy(ids).to(device), "token_type_ids": torch.from_numpy(types).to(device),
            "attention_mask": torch.from_numpy(att).to(device), "pool_mask": torch.from_numpy(mask).to(device)}


class PooledClassifier(torch.nn.Module):
    """Encoder + pooling of the last hidden layer + a linear head: ``logits = W·pool(h_L) + b``."""

    def __init__(self, encoder: torch.nn.Module, pooling: Pooling, n_classes: int, hidden_size: int,
                 init_std: float = 0.02):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.pass_types = _accepts_token_types(encoder)
        self.head = torch.nn.Linear(hidden_size, n_classes)
        torch.nn.init.normal_(self.head.weight, std=init_std)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, token_type_ids, pool_mask) -> torch.Tensor:
        kw = {"token_type_ids": token_type_ids} if self.pass_types else {}
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kw).last_hidden_state
        return self.head(pool(h, pool_mask, self.pooling.reduce))


def _lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def _param_groups(clf: "PooledClassifier", config: TrainConfig) -> list[dict]:
    """AdamW groups: (encoder, head) x (decayed, not decayed: biases and LayerNorm weights)."""
    groups = []
    for module, lr in ((clf.encoder, config.lr), (clf.head, config.head_lr if config.head_lr is not None else config.lr)):
        decay, no_decay = [], []
        for name, p in module.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
        groups += [{"params": decay, "weight_decay": config.weight_decay, "lr": lr},
                   {"params": no_decay, "weight_decay": 0.0, "lr": lr}]
    return [g for g in groups if g["params"]]


def epoch_batches(train: np.ndarray, lengths: np.ndarray, batch_size: int, grouping: int,
                  generator: torch.Generator) -> list[np.ndarray]:
    """One epoch's batches: a seeded permutation of ``train`` cut into groups of ``grouping``
    batches, each group sorted by length (longest first, ties by position) and cut into batches.
    Every training index appears exactly once; the order depends only on ``generator``'s seed."""
    perm = train[torch.randperm(len(train), generator=generator).numpy()]
    out = []
    chunk = batch_size * grouping
    for s in range(0, len(perm), chunk):
        part = perm[s:s + chunk]
        part = part[np.argsort(-lengths[part], kind="stable")]
        out += [part[b:b + batch_size] for b in range(0, len(part), batch_size)]
    return out


def _finetune_task(lm, task: Task, pooling: Pooling, seed: int, config: TrainConfig,
                   device: torch.device) -> dict:
    """One run: fine-tune a fresh copy of ``lm.model`` + head on ``task.train``, score on ``task.test``."""
    t0 = time.perf_counter()
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        encoder = copy.deepcopy(lm.model).to(device=device, dtype=torch.float32)
        if config.freeze_embeddings:
            encoder.get_input_embeddings().weight.requires_grad_(False)
        clf = PooledClassifier(encoder, pooling, len(task.classes), int(lm.model.config.hidden_size),
                               float(getattr(lm.model.config, "initializer_range", 0.02))).to(device)
        order_rng = torch.Generator().manual_seed(seed)
        train = task.train
        steps_per_epoch = math.ceil(len(train) / config.batch_size)
        total = steps_per_epoch * config.epochs
        lengths = np.asarray([len(r) for r in task.rendered])
        opt = torch.optim.AdamW(_param_groups(clf, config), lr=config.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, _lr_lambda(config.schedule, int(config.warmup_fraction * total), total))
        step_losses: list[float] = []
        epoch_losses: list[float] = []
        clf.train()
        for _ in range(config.epochs):
            total_loss, seen = 0.0, 0
            for idx in epoch_batches(train, lengths, config.batch_size, config.length_grouping, order_rng):
                batch = _collate([task.rendered[i] for i in idx], pooling, pad_id, device)
                target = torch.from_numpy(task.y[idx]).to(device)
                loss = torch.nn.functional.cross_entropy(clf(**batch), target)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                step_losses.append(float(loss.detach()))
                total_loss += step_losses[-1] * len(idx)
                seen += len(idx)
            epoch_losses.append(total_loss / seen)
        train_seconds = time.perf_counter() - t0
        # evaluation: only now are test examples read
        clf.eval()
        correct = 0
        with torch.inference_mode():
            for s in range(0, len(task.test), config.eval_batch_size):
                idx = task.test[s:s + config.eval_batch_size]
                batch = _collate([task.rendered[i] for i in idx], pooling, pad_id, device)
                pred = clf(**batch).argmax(dim=-1).cpu().numpy()
                correct += int((pred == task.y[idx]).sum())
    return {
        "pooling": pooling.name, "seed": seed, "test_accuracy": correct / len(task.test),
        "train_loss_steps": step_losses, "train_loss_epochs": epoch_losses,
        "n_train": int(len(task.train)), "n_test": int(len(task.test)), "n_skipped": len(task.skipped),
        "classes": list(task.classes), "train_ids": [task.ids[i] for i in task.train],
        "test_ids": [task.ids[i] for i in task.test], "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
    }


def _load(model) -> Any:
    from probing.models import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        return model
    if model is None or isinstance(model, str):
        return load_model(model)
    raise ValueError(f"model must be None, a name/path or a LoadedModel, got {type(model).__name__}")


def _device(device) -> torch.device:
    from probing.models import pick_device

    return pick_device(device)


def _max_length_of(lm) -> int:
    from probing.models import max_sequence_length

    return max_sequence_length(lm.model.config, lm.tokenizer)


def finetune(examples: Sequence[Example], label: str, *, model=None, pooling: str = "cls",
             fmt: str | Format = "pair", seed: int = 0, preset: str = "default",
             test_ids: Iterable[str] | None = None, device: str = "auto", **train: Any) -> dict:
    """Fine-tune a fresh copy of the encoder plus a linear head on one pooling; score on held-out data.

    Args:
        examples: the corpus; each needs ``labels[label]``.
        label: the classification target (e.g. ``"topic"``, ``"is_next"``), at least two classes.
        model: None (the default all-MiniLM-L6-v2), a name or path for :func:`probing.models.load_model`,
            or a :class:`~probing.models.LoadedModel` (never modified: a deep copy is trained).
        pooling: a key of :data:`POOLINGS` or ``pos<k>``.
        fmt: a format name or :class:`~probing.formats.Format` (default ``pair``).
        seed: ``torch.manual_seed(seed)`` for the head, dropout and the data order (the split does not
            depend on it).
        preset: the key of :data:`PRESETS` whose ``train`` settings are the defaults.
        test_ids: an explicit test set (example ids) instead of the hash split.
        device: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda:0"``, ...
        **train: overrides of :class:`TrainConfig` (``epochs``, ``lr``, ``batch_size``, ``max_train``,
            ``test_fraction``, ...).

    Returns a dict: ``test_accuracy``, ``train_loss_steps`` (one per optimiser step),
    ``train_loss_epochs`` (example-weighted mean per epoch), ``n_train``, ``n_test``, ``n_skipped``,
    ``classes``, ``train_ids``, ``test_ids``, ``pooling``, ``seed``, ``seconds``.
    """
    lm = _load(model)
    config = preset_config(preset, **train)
    fmt = fmt if isinstance(fmt, Format) else Format.parse(fmt)
    task = prepare_task(examples, label, lm.tokenizer, fmt, lm.model.config, config=config,
                        model_max_length=_max_length_of(lm), test_ids=test_ids)
    p = check_pooling(task, pooling)
    return _finetune_task(lm, task, p, int(seed), config, _device(device))


# --------------------------------------------------------------------------------------------------
# The experiment: poolings x seeds -> tidy table


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """``(mean, sd, low, high)``: sample sd (ddof=1) and the t-interval ``mean ± t_{(1+c)/2, n-1}·sd/√n``.
    With one value, sd and the interval are NaN."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(v.mean())
    if v.size < 2:
        return mean, math.nan, math.nan, math.nan
    sd = float(v.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, v.size - 1)) * sd / math.sqrt(v.size)
    return mean, sd, mean - half, mean + half


def _parse_list(values, what: str, cast=str) -> list:
    if isinstance(values, (str, int)):
        values = [values]
    out = []
    for v in values:
        parts = [x.strip() for x in v.split(",")] if isinstance(v, str) else [v]
        for x in parts:
            if x == "":
                continue
            try:
                out.append(cast(x))
            except ValueError:
                raise ValueError(f"bad {what} value {x!r}") from None
    if not out:
        raise ValueError(f"no {what} given")
    dupes = sorted({str(x) for x in out if out.count(x) > 1})
    if dupes:
        raise ValueError(f"{what} repeated: {dupes}")
    return out


def experiment_config(lm, examples: Sequence[Example], label: str, fmt: Format, poolings: Sequence[str],
                      seeds: Sequence[int], config: TrainConfig, test_ids: Iterable[str] | None) -> dict:
    """What the stored result depends on; hashed by :func:`analyses.results.result_path`."""
    return {
        "analysis": ANALYSIS, "protocol": PROTOCOL_VERSION, "model": lm.fingerprint,
        "corpus": corpus_fingerprint(examples), "label": label, "format": fmt.to_json(),
        "poolings": list(poolings), "seeds": list(seeds), "train": asdict(config),
        "test_ids": sorted(test_ids) if test_ids is not None else None,
    }


def run_pooling_experiment(examples: Sequence[Example], label: str, poolings: Sequence[str] | str | None = None,
                           seeds: Sequence[int] | str | None = None, *, model=None, fmt: str | Format = "pair",
                           preset: str = "default", out: str | None = None, force: bool = False,
                           corpus_name: str | None = None, test_ids: Iterable[str] | None = None,
                           device: str = "auto", progress: bool = True, **train: Any) -> pd.DataFrame:
    """Fine-tune every pooling with every seed on the same split; a tidy table (:func:`make_table`).

    Rows (``analysis="finetune_pooling"``, ``role`` = pooling, ``target`` = label, ``layer`` = the
    last layer, ``n`` = test examples):

    * per run: ``metric="test_accuracy"`` with ``seed``, and extra columns ``n_train``,
      ``first_train_loss`` (first step), ``final_train_loss`` (last epoch's mean), ``seconds``;
    * per run and epoch: ``metric="train_loss_epoch"`` with extra column ``epoch`` (0-based);
    * per pooling: ``metric="test_accuracy_mean"``, ``value`` the mean over seeds, ``ci_low``/``ci_high``
      a 95% t-interval over seeds (:func:`t_interval`, clipped to [0, 1]; NaN for one seed), ``sd``
      the sample sd (ddof=1), ``n`` = seeds;
    * one row ``role="majority"``, ``metric="majority_baseline"``: test accuracy of always predicting
      the most frequent training class; and one ``metric="best_constant"``: the largest class share of
      the test set (the best any constant prediction could score; the document-grouped split can make
      the two differ a lot).

    ``poolings`` / ``seeds`` default to the preset's. With ``out`` the table is written to
    ``result_path(out, "finetune_pooling", config)`` and reused on the next call unless ``force``.
    """
    pre = PRESETS.get(preset)
    if pre is None:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    poolings = _parse_list(poolings if poolings is not None else pre["poolings"], "poolings")
    for p in poolings:
        get_pooling(p)
    seeds = _parse_list(seeds if seeds is not None else pre["seeds"], "seeds", int)
    config = preset_config(preset, **train)
    fmt = fmt if isinstance(fmt, Format) else Format.parse(fmt)
    examples = list(examples)
    _check_label(examples, label)
    lm = _load(model)
    path = None
    if out is not None:
        path = result_path(out, ANALYSIS, experiment_config(lm, examples, label, fmt, poolings, seeds, config, test_ids))
        if path.exists() and not force:
            df = read_table(path)
            df.attrs.update(result_path=str(path), reused=True)
            return df
    task = prepare_task(examples, label, lm.tokenizer, fmt, lm.model.config, config=config,
                        model_max_length=_max_length_of(lm), test_ids=test_ids)
    checked = [check_pooling(task, p) for p in poolings]
    dev = _device(device)
    corpus = corpus_name if corpus_name is not None else "corpus-" + corpus_fingerprint(examples)[:12]
    base = {"analysis": ANALYSIS, "model": lm.name, "corpus": corpus, "format": fmt.name, "format_b": "",
            "layer": int(lm.model.config.num_hidden_layers), "target": label}
    rows: list[dict] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(checked) * len(seeds), desc="fine-tune", disable=not progress)
    accs: dict[str, list[float]] = {p.name: [] for p in checked}
    try:
        for p in checked:
            for seed in seeds:
                bar.set_postfix(pooling=p.name, seed=seed)
                r = _finetune_task(lm, task, p, seed, config, dev)
                accs[p.name].append(r["test_accuracy"])
                rows.append({**base, "role": p.name, "metric": "test_accuracy", "value": r["test_accuracy"],
                             "n": r["n_test"], "seed": seed, "n_train": r["n_train"],
                             "first_train_loss": r["train_loss_steps"][0],
                             "final_train_loss": r["train_loss_epochs"][-1], "seconds": r["seconds"]})
                for e, loss in enumerate(r["train_loss_epochs"]):
                    rows.append({**base, "role": p.name, "metric": "train_loss_epoch", "value": loss,
                                 "n": r["n_train"], "seed": seed, "epoch": e})
                bar.update(1)
    finally:
        bar.close()
    for p in checked:
        mean, sd, lo, hi = t_interval(accs[p.name])
        lo, hi = max(lo, 0.0), min(hi, 1.0)  # an accuracy; NaN (one seed) stays NaN
        rows.append({**base, "role": p.name, "metric": "test_accuracy_mean", "value": mean, "ci_low": lo,
                     "ci_high": hi, "n": len(seeds), "sd": sd})
    train_y = task.y[task.train]
    majority = int(np.bincount(train_y, minlength=len(task.classes)).argmax())
    rows.append({**base, "role": "majority", "metric": "majority_baseline",
                 "value": float((task.y[task.test] == majority).mean()), "n": int(len(task.test))})
    # The split is by document, so class shares differ between train and test: the best any constant
    # prediction could do on this test set is its largest class share.
    rows.append({**base, "role": "majority", "metric": "best_constant",
                 "value": float(np.bincount(task.y[task.test]).max() / len(task.test)), "n": int(len(task.test))})
    df = make_table(rows)
    if path is not None:
        write_table(df, path)
    df.attrs.update(result_path=str(path) if path is not None else None, reused=False)
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """The per-pooling summary rows as a small table: pooling, mean, sd, ci_low, ci_high, seeds."""
    s = df[df["metric"] == "test_accuracy_mean"]
    return pd.DataFrame({"pooling": s["role"].to_numpy(), "mean": s["value"].astype(float).to_numpy(),
                         "sd": s["sd"].astype(float).to_numpy(), "ci_low": s["ci_low"].astype(float).to_numpy(),
                         "ci_high": s["ci_high"].astype(float).to_numpy(), "seeds": s["n"].to_numpy()})


# --------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    from probing.formats import BUILTIN_FORMATS
    from probing.models import DEFAULT_MODEL

    pool_help = "\n".join(f"  {n:<12} {p.description}" for n, p in POOLINGS.items()) + f"\n  {'pos<k>':<12} {POS_HELP}"

    def show(name: str) -> str:
        pre = PRESETS[name]
        train = ", ".join(f"{k}={v}" for k, v in pre["train"].items())
        return (f"  {name:<8} corpus={pre['corpus']} label={pre['label']} poolings={','.join(pre['poolings'])} "
                f"seeds={','.join(map(str, pre['seeds']))}\n           {train}")

    defaults = TrainConfig()
    p = ArgumentParser(
        prog="python -m analyses.pooling",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=("Q8: fine-tune the encoder + a linear head on each pooling of the last layer,\n"
                     "over several seeds, on one fixed train/test split; report test accuracy per\n"
                     "pooling (mean, sd and a 95% t-interval over seeds) and a majority baseline."),
        epilog=("poolings:\n" + pool_help + "\n\npresets (options given on the command line override them):\n"
                + "\n".join(show(n) for n in PRESETS)
                + "\n\nexample:\n  python -m analyses.pooling --corpus generated:n=300,k=2 --label topic "
                  "--poolings cls,mean --seeds 0,1,2 --preset default --out results/"),
    )
    p.add_argument("--preset", default="default", choices=list(PRESETS),
                   help="settings to start from (default: default; 'full' is meant for a GPU)")
    p.add_argument("--corpus", default=None,
                   help="corpus spec, e.g. 'generated:n=500,k=2' or 'bbc:k=2,n=2000' (default: the preset's)")
    p.add_argument("--label", default=None, help="label to classify, e.g. topic or is_next (default: the preset's)")
    p.add_argument("--poolings", default=None,
                   help="comma list of poolings (see below) (default: the preset's)")
    p.add_argument("--seeds", default=None, help="comma list of training seeds, e.g. 0,1,2 (default: the preset's)")
    p.add_argument("--format", default="pair",
                   help=f"input format: one of {', '.join(BUILTIN_FORMATS)} or 'name=TEMPLATE' (default: pair)")
    p.add_argument("--model", default=None,
                   help=f"Hugging Face id or local path (default: {DEFAULT_MODEL}, shipped offline)")
    p.add_argument("--random-init", action="store_true",
                   help="fine-tune the same architecture from seeded random weights (baseline)")
    p.add_argument("--epochs", type=int, default=None, help="passes over the training set (default: the preset's)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate of AdamW (default: the preset's)")
    p.add_argument("--head-lr", type=float, default=None,
                   help="peak learning rate of the linear head (default: the preset's; unset means --lr)")
    p.add_argument("--freeze-embeddings", default=None, action=argparse.BooleanOptionalAction,
                   help="keep the word-embedding table fixed (faster on CPU; default: the preset's)")
    p.add_argument("--batch-size", type=int, default=None, help="training batch size (default: the preset's)")
    p.add_argument("--max-train", type=int, default=None,
                   help="at most this many training examples, chosen by the fixed hash (default: the preset's)")
    p.add_argument("--max-length", type=int, default=None,
                   help="longest example in tokens; longer ones are skipped by the presets, never truncated "
                        "(default: the preset's)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help=f"AdamW weight decay, not on biases/LayerNorm (default {defaults.weight_decay})")
    p.add_argument("--warmup-fraction", type=float, default=None,
                   help=f"share of steps with linear warm-up (default {defaults.warmup_fraction})")
    p.add_argument("--schedule", default=None, choices=list(SCHEDULES),
                   help="after warm-up: linear decay to 0 or constant (default linear)")
    p.add_argument("--test-fraction", type=float, default=None,
                   help=f"expected share of documents in the test split (default {defaults.test_fraction})")
    p.add_argument("--split-seed", type=int, default=None,
                   help="seed of the fixed hash split, independent of --seeds (default 0)")
    p.add_argument("--split-group", default=None,
                   help="label that keeps examples together in the split; 'auto' = doc when present, "
                        "'id' = each example alone (default auto)")
    p.add_argument("--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own choice). On a machine whose cores are busy "
                        "with other work, 1 can be many times faster than oversubscribed threads")
    p.add_argument("--out", default="results", type=output_dir_arg,
                   help="directory of result tables (default: ./results)")
    p.add_argument("--force", action="store_true", help="recompute even if a stored result exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from probing.corpora import load_corpus
    from probing.models import ModelLoadError, load_model

    pre = PRESETS[args.preset]
    corpus = args.corpus if args.corpus is not None else pre["corpus"]
    label = args.label if args.label is not None else pre["label"]
    train = {"epochs": args.epochs, "lr": args.lr, "head_lr": args.head_lr,
             "freeze_embeddings": args.freeze_embeddings, "batch_size": args.batch_size, "max_train": args.max_train,
             "max_length": args.max_length, "weight_decay": args.weight_decay,
             "warmup_fraction": args.warmup_fraction, "schedule": args.schedule,
             "test_fraction": args.test_fraction, "split_seed": args.split_seed,
             "split_group": args.split_group}
    if args.threads is not None:
        if args.threads < 1:
            print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    try:
        examples = load_corpus(corpus)
        lm = load_model(args.model, random_init=args.random_init)
        t0 = time.perf_counter()
        df = run_pooling_experiment(examples, label, args.poolings, args.seeds, model=lm, fmt=args.format,
                                    preset=args.preset, out=args.out, force=args.force, corpus_name=corpus,
                                    device=args.device, progress=not args.no_progress,
                                    **train)
        elapsed = time.perf_counter() - t0
    except (ValueError, ImportError, ModelLoadError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    s = summary(df)
    base = df[df["metric"] == "majority_baseline"]["value"]
    print(f"\n{ANALYSIS}: {label} on {corpus}, format {args.format}, model {lm.name} ({elapsed:.0f} s)")
    print(f"{'pooling':<12} {'mean':>6} {'± sd':>7}   95% t-interval   seeds")
    for _, r in s.iterrows():
        print(f"{r['pooling']:<12} {r['mean']:6.3f} ± {r['sd']:5.3f}   [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
              f"   {int(r['seeds'])}")
    if len(base):
        print(f"{'majority':<12} {float(base.iloc[0]):6.3f}   (the training set's majority class)")
    best = df[df["metric"] == "best_constant"]["value"]
    if len(best):
        print(f"{'constant':<12} {float(best.iloc[0]):6.3f}   (the test set's largest class share)")
    how = "reused" if df.attrs.get("reused") else "written"
    print(f"table {how}: {df.attrs.get('result_path')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
