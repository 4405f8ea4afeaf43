"""Fine-tuning an encoder plus a linear head on one pooling (DESIGN.md Q8): data, training loop, one run.

Protocol. A fresh copy of the encoder plus a linear head on the pooled last-layer vector is
fine-tuned end to end for sequence classification, as in BERT's fine-tuning recipe (Devlin et al.
2019, sec. 4): cross-entropy on ``softmax(W·pool(h_L) + b)``, AdamW (Loshchilov & Hutter 2019) with
weight decay on everything but biases and LayerNorm weights, and a learning rate warmed up linearly
over the first ``warmup_fraction`` of the steps, then decayed linearly to 0 (``schedule="linear"``)
or held (``"constant"``). Poolings: :mod:`analyses.finetune._poolings`. The experiment over poolings,
folds and seeds, with a frozen probe on the same splits, is :func:`analyses.finetune.run_pooling_experiment`.

No example is dropped silently: the length limit is the model's own unless set, and every example
skipped for length is counted (``n_skipped``).

The single-run split (:func:`finetune`, :func:`train_test_split`). Every example goes to the test
side when ``u(key) < test_fraction``, where ``u(key) = int(sha256(f"{seed}|{key}")[:16], 16) /
2**64`` and ``key`` is the value of the ``split_group`` label (``"id"``: the example id; ``"auto"``:
the ``doc`` label when every example has one, else the id), so documents never straddle train and
test and the split depends neither on the pooling, the training seed nor the corpus order.
``max_train`` keeps the training examples with the smallest ``u(id)``. ``test_ids=...`` gives an
explicit test set instead. Training never reads test examples or their labels; the class list comes
from the training labels only.

Speed (CPU). Evaluation batches are cut from the test items sorted by length, so a batch pads to
its own longest example rather than to the longest of 64 random ones; AdamW runs its fused kernel
(``fused=True``; on CUDA and on CPU since torch 2.4). Neither changes the protocol: the same steps
on the same batches, the same predictions up to float rounding. ``TrainConfig(autocast=True)`` runs
the forward pass and the loss in bfloat16 mixed precision (float32 weights, gradients and AdamW); its
speed and accuracy check: :class:`analyses.finetune.TrainConfig`.

Batches are padded by :func:`probing.forward.collate` and run through :func:`probing.forward.last_hidden`
(the toolkit's one collation and forward pass; :func:`training_inputs` adds the pooling mask), the
model is loaded by :func:`probing.models.load_model` and the device chosen by
:func:`probing.models.pick_device`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from analyses.finetune._config import TrainConfig, preset_config, resolve_autocast
from analyses.finetune._poolings import Pooling, get_pooling, pool, pooling_mask
from probing.examples import Example, corpus_fingerprint
from probing.formats import Format, Rendered, render, resolve_format, special_token_ids, tokenize_sentences
from probing.heap import hand_back_freed
from probing.forward import Inputs, collate, last_hidden, pad_arrays
from probing.models import LoadedModel, load_model, pick_device


def split_unit(key: str, seed: int = 0) -> float:
    """``u(key) = int(sha256(f"{seed}|{key}")[:16 hex], 16) / 2**64`` in [0, 1)."""
    return int(hashlib.sha256(f"{seed}|{key}".encode("utf-8")).hexdigest()[:16], 16) / 2.0 ** 64


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


def train_test_split(examples: Sequence[Example], *, test_fraction: float = 0.2, seed: int = 0,
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
        is_test = np.asarray([split_unit(k, seed) < test_fraction for k in keys], dtype=bool)
    train = np.flatnonzero(~is_test)
    test = np.flatnonzero(is_test)
    if max_train is not None and len(train) > max_train:
        u = np.asarray([split_unit(ids[i], seed) for i in train])
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
    fmt = resolve_format(fmt, tokenizer, min(e.n_sentences for e in examples))  # native: the tokenizer's own
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
    """Render every example in ``fmt`` (:func:`render_examples`), and split by the fixed hash split (or by
    ``test_ids``, less the examples skipped as too long)."""
    kept, rendered, skipped, _ = render_examples(examples, label, tokenizer, fmt, model_config, config=config,
                                                 model_max_length=model_max_length)
    if test_ids is not None:
        test_ids = set(test_ids) - set(skipped)
    train, test = train_test_split(kept, test_fraction=config.test_fraction, seed=config.seed,
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


def training_inputs(rendered: Sequence[Rendered], lm, pooling: Pooling,
                    device: torch.device) -> tuple[Inputs, torch.Tensor]:
    """One batch for :class:`PooledClassifier`: the model inputs of :func:`probing.forward.collate`
    (the toolkit's one collation) and the pooling's ``(B, T)`` mask over the same padded length."""
    inputs = collate(rendered, lm, device)
    return inputs, torch.from_numpy(pooling_mask(rendered, pooling, inputs.T)).to(device)


def _collate(rendered: Sequence[Rendered], pooling: Pooling, pad_id: int, device: torch.device) -> dict:
    """The padded batch as a dict (``input_ids``, ``token_type_ids``, ``attention_mask``, ``pool_mask``),
    for :func:`analyses.finetune._experiment.frozen_features`: :func:`probing.forward.pad_arrays` and
    :func:`analyses.finetune.pooling_mask`; training uses :func:`training_inputs`."""
    T = max(len(r) for r in rendered)
    ids, types, att = pad_arrays(rendered, pad_id, T)
    mask = pooling_mask(rendered, pooling, T)
    return {k: torch.from_numpy(v).to(device) for k, v in
            (("input_ids", ids), ("token_type_ids", types), ("attention_mask", att), ("pool_mask", mask))}


class PooledClassifier(torch.nn.Module):
    """Encoder + pooling of the last hidden layer + a linear head: ``logits = W·pool(h_L) + b``."""

    def __init__(self, encoder: torch.nn.Module, pooling: Pooling, n_classes: int, hidden_size: int,
                 init_std: float = 0.02):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.head = torch.nn.Linear(hidden_size, n_classes)
        torch.nn.init.normal_(self.head.weight, std=init_std)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, inputs: Inputs, pool_mask: torch.Tensor) -> torch.Tensor:
        return self.head(pool(last_hidden(self.encoder, inputs), pool_mask, self.pooling.reduce))


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
    head_lr = config.head_lr if config.head_lr is not None else config.lr
    for module, lr in ((clf.encoder, config.lr), (clf.head, head_lr)):
        decay, no_decay = [], []
        for name, p in module.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
        groups += [{"params": decay, "weight_decay": config.weight_decay, "lr": lr},
                   {"params": no_decay, "weight_decay": 0.0, "lr": lr}]
    return [g for g in groups if g["params"]]


def sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Batches of row numbers into ``lengths: (n,)``, longest first (ties by row), ``batch_size`` each:
    a batch pads only to its own longest example. Every row appears exactly once.

    >>> [b.tolist() for b in sorted_batches(np.array([3, 9, 5, 9]), 3)]
    [[1, 3, 2], [0]]
    """
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]


def _fused_ok(device: torch.device) -> bool:
    """AdamW's fused kernel: one pass over all parameters instead of about ten small ops per tensor
    (CUDA, and CPU since torch 2.4); the update is the same up to float rounding."""
    return device.type in ("cpu", "cuda")


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


class RngStreams:
    """Concurrent fine-tuning runs (CPU workers, :mod:`probing.workers`) that each draw from torch's
    process-wide CPU generator as if they ran alone.

    Every random draw of a run (the head's initialisation, dropout in each forward pass) happens inside
    :meth:`Stream.turn`, which holds one lock shared by all runs, installs the run's own generator state
    and saves it back afterwards. A run's draws are therefore the sequence a run started from
    ``torch.manual_seed(seed)`` alone would make, whatever the other runs do; backward passes and
    optimiser steps draw nothing and run side by side. The caller's generator state is left as it was.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def stream(self, seed: int) -> "Stream":
        return Stream(self.lock, seed)


class Stream:
    """One run's generator state (see :class:`RngStreams`)."""

    def __init__(self, lock: threading.Lock, seed: int) -> None:
        self.lock = lock
        with lock:
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.state = torch.get_rng_state()
            torch.set_rng_state(saved)

    @contextlib.contextmanager
    def turn(self):
        with self.lock:
            saved = torch.get_rng_state()
            torch.set_rng_state(self.state)
            try:
                yield
            finally:
                self.state = torch.get_rng_state()
                torch.set_rng_state(saved)


@contextlib.contextmanager
def _alone(seed: int, device: torch.device):
    """A run on its own: torch's generators (the device's too) seeded for the run and restored afterwards;
    yields the context each draw runs in (nothing more to do: the run is the only one drawing)."""
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield contextlib.nullcontext


def _finetune_task(lm, task: Task, pooling: Pooling, seed: int, config: TrainConfig,
                   device: torch.device, streams: RngStreams | None = None) -> dict:
    """One run: fine-tune a fresh copy of ``lm.model`` + head on ``task.train``, score on ``task.test``.
    ``streams`` (CPU only): the run shares torch's generator with concurrent runs (:class:`RngStreams`);
    its draws, and so its result, are those of the run alone. Once the run's model copy, optimizer state
    and activations are freed, the heap's freed pages are handed back (:func:`probing.heap.hand_back_freed`):
    otherwise each of a study's runs leaves pages the next does not reuse (the study's Q8 alone peaked
    80 MiB lower with it, 1,613-1,636 against 1,690-1,730 MiB, at the same speed)."""
    out = _finetune_run(lm, task, pooling, seed, config, device, streams)
    hand_back_freed()
    return out


def _checkpoint(encoder: torch.nn.Module, name: str, every: int) -> None:
    """Activation checkpointing of every ``every``-th layer of a run's own copy of the encoder
    (``TrainConfig.checkpoint_every``)."""
    if not getattr(encoder, "supports_gradient_checkpointing", False):
        raise ValueError(f"model {name!r} ({type(encoder).__name__}) does not support activation checkpointing; "
                         "set checkpoint_every=0")
    if hasattr(encoder.config, "use_cache"):
        encoder.config.use_cache = False  # the copy's config: no past key/values to keep when training
    kwargs = {"use_reentrant": False}
    if hasattr(encoder, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated there)
        encoder.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every)
    else:  # transformers < 5: every layer (the same run; more time, less memory than every n-th)
        if every > 1:
            warnings.warn(f"checkpoint_every={every}: this transformers version checkpoints every layer or none; "
                          "checkpointing every layer (the same results, more time)", RuntimeWarning, stacklevel=2)
        encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _finetune_run(lm, task: Task, pooling: Pooling, seed: int, config: TrainConfig,
                  device: torch.device, streams: RngStreams | None, fmt: Format | None = None,
                  interventions: dict | None = None) -> dict:
    t0 = time.perf_counter()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=resolve_autocast(config, device).autocast)
    if streams is not None and device.type != "cpu":
        raise ValueError(f"concurrent fine-tuning runs share torch's CPU generator only; device is {device}")
    with (_alone(seed, device) if streams is None else contextlib.nullcontext(streams.stream(seed).turn)) as turn:
        with turn():
            encoder = copy.deepcopy(lm.model).to(device=device, dtype=torch.float32)
            if config.freeze_embeddings:
                encoder.get_input_embeddings().weight.requires_grad_(False)
            if config.checkpoint_every:
                _checkpoint(encoder, lm.name, config.checkpoint_every)
            clf = PooledClassifier(encoder, pooling, len(task.classes), int(lm.model.config.hidden_size),
                                   float(getattr(lm.model.config, "initializer_range", 0.02))).to(device)
        order_rng = torch.Generator().manual_seed(seed)
        train = task.train
        steps_per_epoch = math.ceil(len(train) / config.batch_size)
        total = steps_per_epoch * config.epochs
        lengths = np.asarray([len(r) for r in task.rendered])
        opt = torch.optim.AdamW(_param_groups(clf, config), lr=config.lr, fused=_fused_ok(device))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, _lr_lambda(config.schedule, int(config.warmup_fraction * total), total))
        step_losses: list[float] = []
        epoch_losses: list[float] = []
        clf.train()
        for _ in range(config.epochs):
            total_loss, seen, hits = 0.0, 0, 0
            for idx in epoch_batches(train, lengths, config.batch_size, config.length_grouping, order_rng):
                target = torch.from_numpy(task.y[idx]).to(device)
                batch = training_inputs([task.rendered[i] for i in idx], lm, pooling, device)
                with turn(), autocast:  # dropout draws here
                    logits = clf(*batch)
                    loss = torch.nn.functional.cross_entropy(logits, target)
                hits += int((logits.detach().argmax(dim=-1) == target).sum())
                opt.zero_grad(set_to_none=True)
                # checkpointed layers redraw their dropout in the backward pass from the state saved in the
                # forward pass, through torch's global generator: in turn, like every draw of the run
                with turn() if config.checkpoint_every else contextlib.nullcontext():
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
        by_condition = {}
        for condition, intervention in (interventions or {"clean": None}).items():
            by_condition[condition] = _predict(clf, lm, task, pooling, config, device, autocast, lengths, fmt,
                                               intervention)
        test_pred = by_condition.get("clean", next(iter(by_condition.values())))
    return {"test_pred_by_condition": by_condition,
        "pooling": pooling.name, "seed": seed, "test_accuracy": float((test_pred == task.y[task.test]).mean()),
        "test_pred": test_pred, "train_accuracy": hits / seen,
        "train_loss_steps": step_losses, "train_loss_epochs": epoch_losses,
        "n_train": int(len(task.train)), "n_test": int(len(task.test)), "n_skipped": len(task.skipped),
        "classes": list(task.classes), "train_ids": [task.ids[i] for i in task.train],
        "test_ids": [task.ids[i] for i in task.test], "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
    }


def _predict(clf: "PooledClassifier", lm, task: Task, pooling: Pooling, config: TrainConfig, device: torch.device,
             autocast, lengths: np.ndarray, fmt: Format | None, intervention) -> np.ndarray:
    """Class predictions for ``task.test`` by the trained ``clf``; with ``intervention`` (a
    :class:`probing.interventions.Intervention` of knockouts) its hooks are on the classifier's encoder
    while each batch is predicted."""
    bound = None
    if intervention is not None:
        from probing.interventions import Bound

        if fmt is None:
            raise ValueError("an intervention at evaluation needs the run's format")
        bound = Bound(intervention, clf.encoder, int(lm.model.config.num_hidden_layers), fmt, "", "", [])
    pred = np.empty(len(task.test), dtype=np.int64)
    with torch.inference_mode(), autocast:
        for rows in sorted_batches(lengths[task.test], config.eval_batch_size):
            idx = task.test[rows]
            rendered = [task.rendered[i] for i in idx]
            batch = training_inputs(rendered, lm, pooling, device)
            hooks = (bound.batch(rendered, [0] * len(idx), [task.ids[i] for i in idx], batch[0].T, device)
                     if bound is not None else contextlib.nullcontext())
            with hooks:
                pred[rows] = clf(*batch).argmax(dim=-1).cpu().numpy()
    return pred


def run_with_conditions(lm, task: Task, pooling: Pooling, seed: int, config: TrainConfig, device: torch.device,
                        fmt: Format, interventions: dict) -> tuple[dict[str, np.ndarray], dict]:
    """One fine-tuning run (:func:`_finetune_task`) evaluated under each of ``interventions`` (condition ->
    an :class:`probing.interventions.Intervention` or None): ``({condition: test predictions}, run facts)``."""
    out = _finetune_run(lm, task, pooling, seed, config, device, None, fmt, interventions)
    hand_back_freed()
    info = {"epochs": config.epochs, "steps": len(out["train_loss_steps"]),
            "train_loss_first": out["train_loss_steps"][0], "train_loss_last": out["train_loss_epochs"][-1],
            "train_accuracy": out["train_accuracy"], "train_seconds": out["train_seconds"]}
    return out["test_pred_by_condition"], info


def _load(model) -> LoadedModel:
    """``model`` as a :class:`~probing.models.LoadedModel`: as it is, or :func:`probing.models.load_model`
    of a name or path (None: the default model)."""
    if isinstance(model, LoadedModel):
        return model
    if model is None or isinstance(model, str):
        return load_model(model)
    raise ValueError(f"model must be None, a name/path or a LoadedModel, got {type(model).__name__}")


_device = pick_device  # analyses.finetune._experiment's name for probing.models.pick_device


def _max_length_of(lm: LoadedModel) -> int:
    return lm.max_length


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


