"""Fine-tuning with different poolings (DESIGN.md Q8): is [CLS] better than mean pooling, and after
fine-tuning would any token do?

Protocol. For each pooling choice and seed, a fresh copy of the encoder plus a linear head on the
pooled last-layer vector is fine-tuned end to end for sequence classification, as in BERT's
fine-tuning recipe (Devlin et al. 2019, sec. 4): cross-entropy on ``softmax(W·pool(h_L) + b)``,
AdamW (Loshchilov & Hutter 2019) with weight decay on everything but biases and LayerNorm weights,
and a learning rate warmed up linearly over the first ``warmup_fraction`` of the steps, then
decayed linearly to 0 (``schedule="linear"``) or held (``"constant"``).

Frozen and fine-tuned on the same items (:func:`run_pooling_experiment`). The examples are split by
stratified, document-grouped k-fold cross-validation (:func:`cv_splits`: groups = the ``doc`` label
when every example has one, else the example, :func:`analyses.grouping.example_groups`; stratified
by the label; several folds and optionally repeated partitions). In every split and for every
pooling, the frozen encoder's pooled last layer is probed by logistic regression
(:class:`analyses.probes.LinearProbe`) fitted on the split's training items, and the encoder is
fine-tuned on the same training items for each seed; both predict the same test items. Per-item
predictions are kept, so accuracies get cluster-bootstrap CIs over documents and the comparisons
(fine-tuned − frozen, each pooling − mean) are paired differences on identical items
(:func:`analyses.paired.paired_difference`, Holm-adjusted). Every split reports its best constant
(largest test-class share), the training majority's test accuracy and chance; a run that scores
below the best constant or did not converge is flagged (logged and in the ``warning`` column). No
example is dropped silently: the length limit is the model's own unless set, and every example
skipped for length is counted (``n_skipped``).

Poolings (:data:`POOLINGS`, plus ``pos<k>``) read the *last* hidden layer ``h_L: (batch, pos, dim)``
at positions chosen from the rendered token roles of :func:`probing.formats.render`, never by
searching token ids, so they mean the same thing for BERT's ``[CLS]``/``[SEP]`` and RoBERTa's
``<s>``/``</s>``; padding is never selected. Sentence-BERT (Reimers & Gurevych 2019, table 6)
compared CLS, MEAN and MAX for fine-tuned sentence embeddings; this module asks the same of a
classifier and adds ``[SEP]``, the first word and a fixed position.

The single-run split (:func:`finetune`, :func:`train_test_split`). Every example goes to the test
side when ``u(key) < test_fraction``, where ``u(key) = int(sha256(f"{split_seed}|{key}")[:16], 16) /
2**64`` and ``key`` is the value of the ``split_group`` label (``"id"``: the example id; ``"auto"``:
the ``doc`` label when every example has one, else the id), so documents never straddle train and
test and the split depends neither on the pooling, the training seed nor the corpus order.
``max_train`` keeps the training examples with the smallest ``u(id)``. ``test_ids=...`` gives an
explicit test set instead. Training never reads test examples or their labels; the class list comes
from the training labels only.

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
PROTOCOL_VERSION = 2

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
        ``n_skipped``: a row of the experiment's table and its ``attrs``). Never truncated.
    n_splits, folds, repeats: the experiment's splits: ``repeats`` stratified, document-grouped
        ``n_splits``-fold partitions (:func:`analyses.probes.make_splits`, seeds ``split_seed + r``),
        of which the first ``folds`` folds are run (None: all). Every test item of a run fold is
        predicted once per repeat by the fine-tuned models (each seed) and the frozen probe.
    frozen_Cs: C grid of the frozen probe (:class:`analyses.probes.LinearProbe`, chosen by grouped
        inner CV on the training items).
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
    n_splits: int = 5
    folds: int | None = None
    repeats: int = 1
    frozen_Cs: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_Cs", tuple(float(c) for c in self.frozen_Cs))
        if not self.frozen_Cs or not all(c > 0 and math.isfinite(c) for c in self.frozen_Cs):
            raise ValueError(f"frozen_Cs must be positive numbers, got frozen_Cs={self.frozen_Cs!r}")
        if isinstance(self.n_splits, bool) or not isinstance(self.n_splits, int) or self.n_splits < 2:
            raise ValueError(f"n_splits must be an integer >= 2, got n_splits={self.n_splits!r}")
        if self.folds is not None and (isinstance(self.folds, bool) or not isinstance(self.folds, int)
                                       or not 1 <= self.folds <= self.n_splits):
            raise ValueError(f"folds must be None or an integer in [1, n_splits={self.n_splits}], got folds={self.folds!r}")
        for name in ("epochs", "batch_size", "eval_batch_size", "length_grouping", "repeats"):
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

#: Settings declared once: the corpus spec, label, poolings, seeds and training hyperparameters. Every
#: preset runs poolings x folds x seeds fine-tuning runs (plus one frozen probe per pooling and fold)
#: on the model's own length limit (``max_length=None``: nothing skipped on BBC pairs, whose longest
#: is 107 tokens; anything longer is skipped and counted). Costs on the 2-core CPU with
#: all-MiniLM-L6-v2, from the protocol-1 timing (15 runs x 160 examples x 3 epochs = 186 s, i.e.
#: about 26 ms per training example and epoch, with ``--threads 1``) and the ratios measured here
#: (an evaluation pass about 0.22 of a training pass, BBC pairs 12% longer on average once nothing is
#: cut at 64 tokens):
#:
#: * "quick": 2 poolings x 2 of 3 folds x 1 seed, 48 training examples x 2 epochs on the quick
#:   corpus (120 generated pairs): measured 21 s of CPU for the whole experiment with the packaged
#:   model while the 2-core machine was shared (load average 6; each run's training steps took
#:   about 2.7 times the idle rate above), so well under 20 s on an idle machine;
#: * "default": 5 poolings x 3 of 5 folds x 1 seed, 128 training examples x 3 epochs, each test fold
#:   (200 of the study's 1,000 BBC pairs) scored whole: about 170 s of training, 20 s of evaluation,
#:   10 s of frozen features and probes, about 3.5 minutes in all (an estimate, not a timed run);
#:   each further seed adds about 1 minute (so keep the study's ``finetune.seeds`` at one seed);
#: * "full": for a GPU: BBC News pairs, 6 poolings x 5 folds x 2 repeats x 3 seeds, the whole
#:   training side, 3 epochs of the whole encoder at BERT's usual learning rate.
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "corpus": "generated:n=120,k=2", "label": "topic", "poolings": ("cls", "mean"), "seeds": (0,),
        "train": {"epochs": 2, "lr": 2e-4, "head_lr": 3e-3, "freeze_embeddings": True, "batch_size": 16,
                  "max_train": 48, "max_length": None, "on_overflow": "skip", "n_splits": 3, "folds": 2},
    },
    "default": {
        "corpus": "generated:n=1000,k=2", "label": "topic",
        "poolings": ("cls", "mean", "max", "sep", "first_word"), "seeds": (0,),
        "train": {"epochs": 3, "lr": 2e-4, "head_lr": 3e-3, "freeze_embeddings": True, "batch_size": 16,
                  "max_train": 128, "max_length": None, "on_overflow": "skip", "n_splits": 5, "folds": 3},
    },
    "full": {
        "corpus": "bbc:k=2,n=6000", "label": "topic",
        "poolings": ("cls", "mean", "max", "sep", "first_word", "pos3"), "seeds": (0, 1, 2),
        "train": {"epochs": 3, "lr": 5e-5, "head_lr": 5e-4, "freeze_embeddings": False, "batch_size": 32,
                  "max_train": None, "max_length": None, "on_overflow": "skip", "eval_batch_size": 256,
                  "n_splits": 5, "repeats": 2},
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


def render_examples(examples: Sequence[Example], label: str, tokenizer, fmt: Format, model_config, *,
                    config: TrainConfig, model_max_length: int) -> tuple[list[Example], list[Rendered], list[str], int]:
    """Render every example in ``fmt``: ``(kept examples, their renderings, skipped ids, length limit)``.

    The limit is ``config.max_length`` capped by the model's (``model_max_length``); a longer example
    is a ValueError naming it (``on_overflow="error"``) or skipped and listed (``"skip"``). Never
    truncated.
    """
    examples = list(examples)
    _check_label(examples, label)
    corpus_fingerprint(examples)  # rejects duplicate ids
    specials = special_token_ids(tokenizer, fmt)
    unique = list(dict.fromkeys(s for e in examples for s in e.sentences))
    tokenized = dict(zip(unique, tokenize_sentences(tokenizer, unique)))
    type_vocab = int(getattr(model_config, "type_vocab_size", 0) or 0)
    limit = model_max_length if config.max_length is None else min(config.max_length, model_max_length)
    kept, rendered, skipped = [], [], []
    for e in examples:
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
        kept.append(e)
        rendered.append(r)
    if not kept:
        raise ValueError(f"every example is longer than max_length={limit} in format {fmt.name!r}")
    return kept, rendered, skipped, limit


def _task(kept: Sequence[Example], rendered: list[Rendered], label: str, train: np.ndarray, test: np.ndarray,
          skipped: list[str]) -> Task:
    """A :class:`Task` for one split; the class list comes from the training labels only."""
    labels = [e.labels[label] for e in kept]
    classes = sorted({labels[i] for i in train}, key=lambda v: (str(type(v)), v))
    if len(classes) < 2:
        raise ValueError(f"label {label!r} has a single class {classes} among the {len(train)} training "
                         "examples; classification needs at least two")
    index = {c: j for j, c in enumerate(classes)}
    y = np.asarray([index.get(v, -1) for v in labels], dtype=np.int64)
    return Task(rendered, labels, [e.id for e in kept], train, test, classes, y, skipped)


def prepare_task(examples: Sequence[Example], label: str, tokenizer, fmt: Format, model_config, *,
                 config: TrainConfig, model_max_length: int, test_ids: Iterable[str] | None = None) -> Task:
    """Render every example in ``fmt`` (:func:`render_examples`), and split by the fixed hash split."""
    kept, rendered, skipped, _ = render_examples(examples, label, tokenizer, fmt, model_config, config=config,
                                                 model_max_length=model_max_length)
    train, test = train_test_split(kept, test_fraction=config.test_fraction, split_seed=config.split_seed,
                                   split_group=config.split_group, test_ids=test_ids,
                                   max_train=config.max_train)
    return _task(kept, rendered, label, train, test, skipped)


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
            total_loss, seen, hits = 0.0, 0, 0
            for idx in epoch_batches(train, lengths, config.batch_size, config.length_grouping, order_rng):
                batch = _collate([task.rendered[i] for i in idx], pooling, pad_id, device)
                target = torch.from_numpy(task.y[idx]).to(device)
                logits = clf(**batch)
                loss = torch.nn.functional.cross_entropy(logits, target)
                hits += int((logits.detach().argmax(dim=-1) == target).sum())
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
        preds = []
        with torch.inference_mode():
            for s in range(0, len(task.test), config.eval_batch_size):
                idx = task.test[s:s + config.eval_batch_size]
                batch = _collate([task.rendered[i] for i in idx], pooling, pad_id, device)
                preds.append(clf(**batch).argmax(dim=-1).cpu().numpy())
        test_pred = np.concatenate(preds)
    return {
        "pooling": pooling.name, "seed": seed, "test_accuracy": float((test_pred == task.y[task.test]).mean()),
        "test_pred": test_pred, "train_accuracy": hits / seen,
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

    Returns a dict: ``test_accuracy``, ``test_pred`` (class index per test example, in ``test_ids``
    order), ``train_accuracy`` (of the last epoch's training batches, dropout on), ``train_loss_steps``
    (one per optimiser step), ``train_loss_epochs`` (example-weighted mean per epoch), ``n_train``,
    ``n_test``, ``n_skipped``, ``classes``, ``train_ids``, ``test_ids``, ``pooling``, ``seed``, ``seconds``.
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
                      seeds: Sequence[int], config: TrainConfig) -> dict:
    """What the stored result depends on; hashed by :func:`analyses.results.result_path`."""
    return {
        "analysis": ANALYSIS, "protocol": PROTOCOL_VERSION, "model": lm.fingerprint,
        "corpus": corpus_fingerprint(examples), "label": label, "format": fmt.to_json(),
        "poolings": list(poolings), "seeds": list(seeds), "train": asdict(config),
    }


@dataclass(frozen=True)
class Split:
    """One train/test split of the experiment: repeat ``repeat``, fold ``fold``; indices into the kept
    examples (``train`` already cut to ``max_train``)."""

    repeat: int
    fold: int
    train: np.ndarray
    test: np.ndarray


def cv_splits(kept: Sequence[Example], y: np.ndarray, groups: np.ndarray, config: TrainConfig) -> list[Split]:
    """The experiment's splits: for ``r < repeats``, :func:`analyses.probes.make_splits` (stratified
    by ``y``, grouped by ``groups``, seed ``split_seed + r``), its first ``folds`` folds; the training
    side keeps the ``max_train`` examples of smallest ``u(id)`` (:func:`split_unit`), so it depends
    neither on the pooling nor on the training seed."""
    from analyses.probes import make_splits

    out = []
    for r in range(config.repeats):
        seed = config.split_seed + r
        folds = make_splits(y, groups, config.n_splits, seed)
        for f, (train, test) in enumerate(folds[:config.folds]):
            if config.max_train is not None and len(train) > config.max_train:
                u = np.asarray([split_unit(kept[i].id, seed) for i in train])
                train = np.sort(train[np.argsort(u, kind="stable")[:config.max_train]])
            out.append(Split(r, f, train, test))
    return out


def frozen_features(lm, rendered: Sequence[Rendered], poolings: Sequence[Pooling], config: TrainConfig,
                    device: torch.device) -> dict[str, np.ndarray]:
    """Each pooling of the frozen encoder's last layer: ``{pooling: (n_examples, hidden) float64}``,
    one eval-mode forward pass per batch shared by all poolings (the encoder is not trained)."""
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    model = lm.model.to(device).eval()
    pass_types = _accepts_token_types(model)
    lengths = np.asarray([len(r) for r in rendered])
    order = np.argsort(-lengths, kind="stable")  # similar lengths together: little padding
    out = {p.name: np.empty((len(rendered), int(lm.model.config.hidden_size))) for p in poolings}
    with torch.inference_mode():
        for s in range(0, len(order), config.eval_batch_size):
            idx = order[s:s + config.eval_batch_size]
            batch = _collate([rendered[i] for i in idx], poolings[0], pad_id, device)
            kw = {"token_type_ids": batch["token_type_ids"]} if pass_types else {}
            h = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], return_dict=True,
                      **kw).last_hidden_state.float()
            for p in poolings:
                mask = torch.from_numpy(pooling_mask([rendered[i] for i in idx], p, h.shape[1])).to(device)
                out[p.name][idx] = pool(h, mask, p.reduce).double().cpu().numpy()
    return out


def _frozen_run(X: np.ndarray, task: Task, groups: np.ndarray, config: TrainConfig, seed: int) -> dict:
    """The frozen probe of one split: :class:`analyses.probes.LinearProbe` on the training items."""
    from analyses.probes import LinearProbe

    t0 = time.perf_counter()
    tr, te = task.train, task.test
    inner = min(3, len(np.unique(groups[tr])))
    probe = LinearProbe(Cs=config.frozen_Cs if inner >= 2 else config.frozen_Cs[-1:], inner_splits=max(inner, 2),
                        seed=seed).fit(X[tr], task.y[tr], groups[tr])
    return {"test_pred": probe.predict(X[te]), "train_accuracy": float((probe.predict(X[tr]) == task.y[tr]).mean()),
            "C": float(probe.C_), "seconds": time.perf_counter() - t0}


def _warn(message: str, log: Callable[[str], None] | None) -> None:
    import warnings

    if log is not None:
        log(f"warning: {message}")
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def run_pooling_experiment(examples: Sequence[Example], label: str, poolings: Sequence[str] | str | None = None,
                           seeds: Sequence[int] | str | None = None, *, model=None, fmt: str | Format = "pair",
                           preset: str = "default", out: str | None = None, force: bool = False,
                           corpus_name: str | None = None, device: str = "auto", progress: bool = True,
                           log: Callable[[str], None] | None = None, with_predictions: bool = False,
                           **train: Any):
    """Fine-tuned and frozen, every pooling, on the same document-grouped splits; a tidy table.

    Splits: :func:`cv_splits` (stratified by the label, grouped by document when every example has a
    ``doc`` label, else by example: :func:`analyses.grouping.example_groups`). In each split, for
    each pooling, the frozen probe (:func:`frozen_features` + :class:`analyses.probes.LinearProbe` on
    the split's training items) and the fine-tuned model for each seed predict the SAME test items.

    Rows of the table (:func:`make_table`; ``role`` = pooling, ``target`` = label, ``layer`` = the
    last layer; extra columns ``condition`` (``fine_tuned`` / ``frozen``), ``repeat``, ``fold``,
    ``grouping``, ``n_groups``, ``n_skipped`` on every row):

    * per fine-tuning run: ``metric="test_accuracy"`` with ``seed``, ``n`` (test items), ``n_train``,
      ``first_train_loss`` (first step), ``final_train_loss`` (last epoch's mean), ``train_accuracy``
      (last epoch's batches), ``converged``, ``warning`` and ``seconds``; per run and epoch
      ``metric="train_loss_epoch"`` with ``epoch``;
    * per frozen run: ``metric="frozen_test_accuracy"`` (``seed`` empty) with ``train_accuracy``,
      ``C``, ``converged``, ``warning``;
    * per split: ``role="baseline"``, ``metric`` ``best_constant`` (the largest class share of the
      test items), ``majority_baseline`` (test accuracy of the training majority class) and
      ``chance`` (1 / number of classes);
    * per pooling: ``test_accuracy_mean`` (fine-tuned) and ``frozen_test_accuracy_mean``:
      ``value`` = accuracy over all out-of-fold test items (each item's correctness averaged over
      seeds and repeats), ``ci_low``/``ci_high`` a cluster bootstrap over documents
      (:func:`analyses.stats.bootstrap_ci`), ``sd`` over runs, ``n_runs``, ``n`` = items, and
      ``warning`` (below the pooled best constant; runs that did not converge);
    * paired, ``metric="accuracy_diff"`` (:func:`analyses.paired.paired_difference` on per-item
      correctness, so both sides are scored on identical items): ``role=<pooling>``,
      ``condition="fine_tuned − frozen"``; and ``role="<pooling> − <ref>"`` per condition, ``ref`` =
      ``mean`` when run (else the first pooling); ``p_value`` and ``p_holm`` (Holm over every
      accuracy_diff row);
    * ``role="baseline"``: pooled ``best_constant`` and ``chance`` over all test items, and
      ``metric="n_skipped"``: examples left out for length (never silently; ids in
      ``attrs["skipped_ids"]``).

    A warning (``log`` and :class:`RuntimeWarning`) is raised and recorded in the ``warning`` column
    when a run scores below its split's best constant, when its final training loss is not below
    its first, or when its training accuracy is not above the training set's largest class share.

    With ``with_predictions`` returns ``(table, predictions)``: one row per repeat x fold x seed x
    pooling x condition x test item with ``repeat, fold, seed, pooling, condition, example, doc
    (its group), y_true, y_pred, correct``. With ``out``, both are written
    (``result_path(out, "finetune_pooling", config)`` and ``....predictions.csv`` beside it) and
    reused unless ``force``. Cost: see :data:`PRESETS`.
    """
    from analyses.grouping import example_groups
    from analyses.paired import add_holm, paired_difference
    from analyses.stats import bootstrap_ci

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
    path = pred_path = None
    if out is not None:
        path = result_path(out, ANALYSIS, experiment_config(lm, examples, label, fmt, poolings, seeds, config))
        pred_path = path.with_name(path.stem + ".predictions.csv")
        if path.exists() and pred_path.exists() and not force:
            df = read_table(path)
            df.attrs.update(result_path=str(path), predictions_path=str(pred_path), reused=True)
            return (df, read_table(pred_path)) if with_predictions else df
    kept, rendered, skipped, limit = render_examples(examples, label, lm.tokenizer, fmt, lm.model.config,
                                                     config=config, model_max_length=_max_length_of(lm))
    if skipped:
        _warn(f"Q8 fine-tuning: {len(skipped)} of {len(examples)} examples are longer than {limit} tokens in "
              f"format {fmt.name!r} and were left out of every split (e.g. {skipped[:3]})", log)
    groups, grouping = example_groups(kept)
    y_all = np.asarray(pd.factorize(pd.Series([e.labels[label] for e in kept], dtype=object))[0])
    splits = cv_splits(kept, y_all, groups, config)
    checked = [get_pooling(p) for p in poolings]
    dummy = _task(kept, rendered, label, splits[0].train, splits[0].test, skipped)
    for p in checked:
        check_pooling(dummy, p)
    dev = _device(device)
    corpus = corpus_name if corpus_name is not None else "corpus-" + corpus_fingerprint(examples)[:12]
    base = {"analysis": ANALYSIS, "model": lm.name, "corpus": corpus, "format": fmt.name, "format_b": "",
            "layer": int(lm.model.config.num_hidden_layers), "target": label, "grouping": grouping,
            "n_skipped": len(skipped)}
    X = frozen_features(lm, rendered, checked, config, dev)
    rows: list[dict] = []
    preds: list[pd.DataFrame] = []
    warned: list[str] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(splits) * len(checked) * len(seeds), desc="fine-tune", disable=not progress)
    try:
        for sp in splits:
            task = _task(kept, rendered, label, sp.train, sp.test, skipped)
            y_tr, y_te = task.y[sp.train], task.y[sp.test]
            where = {"repeat": sp.repeat, "fold": sp.fold}
            split_base = {**base, **where, "n_groups": int(np.unique(groups[sp.test]).size)}
            best = float(np.bincount(y_te[y_te >= 0], minlength=len(task.classes)).max() / len(y_te))
            train_share = float(np.bincount(y_tr).max() / len(y_tr))
            majority = int(np.bincount(y_tr).argmax())
            for metric, value in (("best_constant", best), ("majority_baseline", float((y_te == majority).mean())),
                                  ("chance", 1.0 / len(task.classes))):
                rows.append({**split_base, "role": "baseline", "condition": "", "metric": metric, "value": value,
                             "n": int(len(sp.test))})

            def record(p: Pooling, condition: str, seed, r: dict, extra: dict) -> None:
                acc = float((r["test_pred"] == y_te).mean())
                problems = []
                if acc < best:
                    problems.append(f"test accuracy {acc:.3f} below the best constant {best:.3f}")
                if r["train_accuracy"] <= train_share:
                    problems.append(f"training accuracy {r['train_accuracy']:.3f} not above the training "
                                    f"majority share {train_share:.3f}")
                if "final_train_loss" in extra and not extra["final_train_loss"] < extra["first_train_loss"]:
                    problems.append(f"final training loss {extra['final_train_loss']:.3f} not below the first "
                                    f"{extra['first_train_loss']:.3f}")
                converged = not any("training" in m for m in problems)
                text = "; ".join(problems)
                if text:
                    msg = (f"Q8 {condition} {p.name} (repeat {sp.repeat}, fold {sp.fold}"
                           + (f", seed {seed}" if seed is not None else "") + f"): {text}")
                    warned.append(msg)
                    _warn(msg, log)
                metric = "test_accuracy" if condition == "fine_tuned" else "frozen_test_accuracy"
                rows.append({**split_base, "role": p.name, "condition": condition, "metric": metric, "value": acc,
                             "n": int(len(sp.test)), "seed": seed, "n_train": int(len(sp.train)),
                             "train_accuracy": r["train_accuracy"], "converged": converged, "warning": text,
                             "seconds": r["seconds"], **extra})
                preds.append(pd.DataFrame({
                    "repeat": sp.repeat, "fold": sp.fold, "seed": seed, "pooling": p.name, "condition": condition,
                    "example": [task.ids[i] for i in sp.test], "doc": groups[sp.test], "y_true": y_te,
                    "y_pred": np.asarray(r["test_pred"], dtype=np.int64), "correct": r["test_pred"] == y_te}))

            for p in checked:
                fr = _frozen_run(X[p.name], task, groups, config, sp.repeat)
                record(p, "frozen", None, fr, {"C": fr["C"]})
                for seed in seeds:
                    bar.set_postfix(pooling=p.name, seed=seed, fold=sp.fold)
                    r = _finetune_task(lm, task, p, seed, config, dev)
                    record(p, "fine_tuned", seed, r, {"first_train_loss": r["train_loss_steps"][0],
                                                      "final_train_loss": r["train_loss_epochs"][-1]})
                    for e, loss in enumerate(r["train_loss_epochs"]):
                        rows.append({**split_base, "role": p.name, "condition": "fine_tuned",
                                     "metric": "train_loss_epoch", "value": loss, "n": r["n_train"], "seed": seed,
                                     "epoch": e})
                    bar.update(1)
    finally:
        bar.close()
    P = pd.concat(preds, ignore_index=True)
    P["seed"] = P["seed"].astype("Int64")  # empty for the frozen probe
    P.insert(0, "analysis", ANALYSIS + "_predictions")
    # one value per test item and condition: correctness averaged over seeds and repeats
    item = P.groupby(["pooling", "condition", "example"], sort=False).agg(correct=("correct", "mean"),
                                                                           doc=("doc", "first")).sort_index()
    runs = pd.DataFrame([r for r in rows if r["metric"] in ("test_accuracy", "frozen_test_accuracy")])
    all_test = np.unique(np.concatenate([sp.test for sp in splits]))
    y_pool = y_all[all_test]
    pooled_best = float(np.bincount(y_pool).max() / len(y_pool))
    summary_base = {**base, "n_groups": int(np.unique(groups[all_test]).size)}
    for metric, value in (("best_constant", pooled_best), ("chance", 1.0 / len(np.unique(y_all)))):
        rows.append({**summary_base, "role": "baseline", "condition": "", "metric": metric, "value": value,
                     "n": int(len(all_test))})
    rows.append({**summary_base, "role": "baseline", "condition": "", "metric": "n_skipped",
                 "value": float(len(skipped)), "n": len(examples)})
    for p in checked:
        for condition, metric in (("frozen", "frozen_test_accuracy_mean"), ("fine_tuned", "test_accuracy_mean")):
            it = item.loc[(p.name, condition)]
            point, lo, hi = bootstrap_ci(it["correct"].to_numpy(float), it["doc"].to_numpy(), "mean",
                                         n_resamples=1000, seed=0)
            acc = runs[(runs["role"] == p.name) & (runs["condition"] == condition)]
            problems = [f"{(~acc['converged'].astype(bool)).sum()} of {len(acc)} runs did not converge"] \
                if not acc["converged"].astype(bool).all() else []
            if point < pooled_best:
                problems.insert(0, f"accuracy {point:.3f} below the best constant {pooled_best:.3f}")
                _warn(f"Q8 {condition} {p.name}: {problems[0]}", log)
            rows.append({**summary_base, "role": p.name, "condition": condition, "metric": metric, "value": point,
                         "ci_low": lo, "ci_high": hi, "n": len(it), "n_runs": len(acc),
                         "sd": float(acc["value"].std(ddof=1)) if len(acc) > 1 else math.nan,
                         "warning": "; ".join(problems)})
    diffs = []

    def compare(a: pd.DataFrame, b: pd.DataFrame, role: str, condition: str) -> None:
        j = a.add_suffix("_a").join(b.add_suffix("_b"), how="inner")
        r = paired_difference(j["correct_a"].to_numpy(float), j["correct_b"].to_numpy(float), j["doc_a"].to_numpy(),
                              n_resamples=1000, seed=0)
        diffs.append({**base, "role": role, "condition": condition, "metric": "accuracy_diff", **r})

    for p in checked:
        compare(item.loc[(p.name, "fine_tuned")], item.loc[(p.name, "frozen")], p.name, "fine_tuned − frozen")
    ref = "mean" if "mean" in poolings else poolings[0]
    for condition in ("fine_tuned", "frozen"):
        for p in checked:
            if p.name != ref:
                compare(item.loc[(p.name, condition)], item.loc[(ref, condition)], f"{p.name} − {ref}", condition)
    if diffs:
        d = add_holm(pd.DataFrame(diffs), ["metric"])
        rows += d.to_dict("records")
    df = make_table(rows)
    # stable dtypes, so a stored table reads back equal: NA (not None) where a column does not apply
    df["converged"] = df["converged"].astype("boolean")
    df["warning"] = df["warning"].fillna("").astype(str)
    for col in ("repeat", "fold", "epoch", "n_runs", "n_train"):
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    if path is not None:
        write_table(df, path)
        write_table(P, pred_path)
    df.attrs.update(result_path=str(path) if path is not None else None,
                    predictions_path=str(pred_path) if pred_path is not None else None, reused=False,
                    n_skipped=len(skipped), skipped_ids=list(skipped), warnings=warned)
    return (df, P) if with_predictions else df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """The per-pooling summary rows as a small table: pooling, condition, mean, ci_low, ci_high (cluster
    bootstrap over documents), sd over runs, runs, warning."""
    s = df[df["metric"].isin(["test_accuracy_mean", "frozen_test_accuracy_mean"])]
    return pd.DataFrame({"pooling": s["role"].to_numpy(), "condition": s["condition"].to_numpy(),
                         "mean": s["value"].astype(float).to_numpy(), "ci_low": s["ci_low"].astype(float).to_numpy(),
                         "ci_high": s["ci_high"].astype(float).to_numpy(), "sd": s["sd"].astype(float).to_numpy(),
                         "runs": s["n_runs"].to_numpy(), "warning": s["warning"].fillna("").to_numpy()})


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
        description=("Q8: on the same stratified, document-grouped cross-validation splits, fine-tune\n"
                     "the encoder + a linear head on each pooling of the last layer (each seed) and fit\n"
                     "a frozen probe on the same pooling; report out-of-fold accuracy per pooling with a\n"
                     "cluster-bootstrap CI over documents, paired differences (fine-tuned - frozen,\n"
                     "pooling - mean) on identical test items, the best constant and chance, and a\n"
                     "warning for runs below the best constant or that did not converge."),
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
    p.add_argument("--split-seed", type=int, default=None,
                   help="seed of the cross-validation partition (repeat r uses split-seed + r), independent of "
                        "--seeds (default 0)")
    p.add_argument("--n-splits", type=int, default=None, help="k of the grouped k-fold split (default: the preset's)")
    p.add_argument("--folds", type=int, default=None,
                   help="how many of the k folds are run (default: the preset's; unset means all)")
    p.add_argument("--repeats", type=int, default=None, help="repeated k-fold partitions (default: the preset's)")
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
             "split_seed": args.split_seed, "n_splits": args.n_splits, "folds": args.folds,
             "repeats": args.repeats}
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
    pooled = df[(df["role"] == "baseline") & df["fold"].isna()].set_index("metric")["value"]
    print(f"\n{ANALYSIS}: {label} on {corpus}, format {args.format}, model {lm.name} ({elapsed:.0f} s)")
    print(f"{'pooling':<12} {'condition':<11} {'accuracy':>8}   95% CI (documents)   runs")
    for _, r in s.iterrows():
        print(f"{r['pooling']:<12} {r['condition']:<11} {r['mean']:8.3f}   [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
              f"     {int(r['runs'])}" + (f"   WARNING: {r['warning']}" if r["warning"] else ""))
    for _, r in df[df["metric"] == "accuracy_diff"].iterrows():
        print(f"{r['role']:<12} {r['condition']:<22} {r['value']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
              f"  p_holm={r['p_holm']:.3g}")
    print(f"{'constant':<12} {float(pooled['best_constant']):6.3f}   (the test items' largest class share); "
          f"chance {float(pooled['chance']):.3f}; {int(pooled['n_skipped'])} example(s) skipped as too long")
    how = "reused" if df.attrs.get("reused") else "written"
    print(f"table {how}: {df.attrs.get('result_path')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
