"""The forward pass shared by extraction (:mod:`probing.extract`) and streaming (:mod:`analyses.drift._streaming`):
model start-up on a device and dtype, batching and collation of rendered examples, and the pass itself.

    with running(model, device="cpu", dtype="float32") as lm:
        for batch in length_batches(lengths, batch_tokens=8192, max_batch=256):
            inputs = collate([rendered[i] for i in batch], lm, device)
            states = forward(lm, inputs).hidden_states  # (n_layers + 1) x (B, T, hidden)

:func:`running` never changes a caller's model: a model already on the device and in the dtype is used
as it is, another one is copied first (casting float32 weights to bfloat16 and back would not give
the same weights). Attention weights need the eager kernel; it is switched on only for the run and
switched back afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .adapters import takes_token_types
from .formats import Layout, Rendered
from .models import LoadedModel, as_torch_dtype, load_model


def accepts_token_types(model: torch.nn.Module) -> bool:
    """Whether the model takes ``token_type_ids`` (DistilBERT, MPNet and ModernBERT do not): its family's
    adapter says (:func:`probing.adapters.takes_token_types`)."""
    return takes_token_types(model)


def length_batches(lengths: Sequence[int], batch_tokens: int, max_batch: int) -> list[list[int]]:
    """Indices sorted by length (ties by index), cut so that batch size x longest stays within
    ``batch_tokens`` (a longer example gets a batch of its own) and a batch has at most ``max_batch``
    examples. Sorting keeps padding to the few tokens between neighbouring lengths."""
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


@dataclass
class Inputs:
    """One padded batch: ``tensors`` for the model (``input_ids``, ``attention_mask``, and
    ``token_type_ids`` where the model takes them), each ``(B, T)`` int64 on the device."""

    tensors: dict[str, torch.Tensor]
    T: int


def pad_token_id(lm: LoadedModel) -> int:
    """The tokenizer's pad id (0 only where it has none)."""
    return lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0


def pad_arrays(rendered: Sequence[Rendered], pad_id: int, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(input_ids, token_type_ids, attention_mask)``, each ``(B, T)`` int64: ``rendered`` padded to
    ``T`` with ``pad_id``; the mask marks the real tokens."""
    B = len(rendered)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    for b, r in enumerate(rendered):
        n = len(r)
        ids[b, :n], types[b, :n], mask[b, :n] = r.input_ids, r.token_type_ids, 1
    return ids, types, mask


def last_hidden(model: torch.nn.Module, inputs: Inputs) -> torch.Tensor:
    """The last layer ``(B, T, hidden)`` of one batch in the caller's grad mode (gradients flow when
    training: fine-tuning, :mod:`analyses.finetune`); unlike :func:`forward`, no other layer is kept."""
    return model(**inputs.tensors, return_dict=True).last_hidden_state


def collate(rendered: Sequence[Rendered] | tuple[Layout, Sequence[int]], lm: LoadedModel,
            device: torch.device) -> Inputs:
    """Pad ``rendered`` examples (or ``(layout, examples)``: those examples of a :class:`Layout`, in one
    gather) to the longest (on a GPU to a multiple of 8, for the tensor cores) with the tokenizer's pad id
    (0 only where it has none); the mask marks the real tokens."""
    pad_multiple = 8 if device.type == "cuda" else 1
    if isinstance(rendered, tuple):
        layout, examples = rendered
        T = int(layout.lengths[list(examples)].max())
    else:
        T = max(len(r) for r in rendered)
    T = -(-T // pad_multiple) * pad_multiple
    ids, types, mask = (layout.padded(examples, pad_token_id(lm), T) if isinstance(rendered, tuple)
                        else pad_arrays(rendered, pad_token_id(lm), T))
    tensors = {"input_ids": ids, "attention_mask": mask}
    if accepts_token_types(lm.model):
        tensors["token_type_ids"] = types
    return Inputs({k: torch.from_numpy(v).to(device) for k, v in tensors.items()}, T)


def forward(lm: LoadedModel, inputs: Inputs, *, attentions: bool = False):
    """The model's output for one batch under ``torch.inference_mode()``: ``hidden_states`` (embeddings
    and every layer, each ``(B, T, hidden)``) and, with ``attentions``, ``attentions`` (each ``(B, heads,
    T, T)``; needs the eager kernel, see :func:`running`). Without attention weights the model's own
    default kernel runs (SDPA for BERT in current transformers)."""
    with torch.inference_mode():
        return lm.model(**inputs.tensors, output_hidden_states=True, output_attentions=attentions,
                        return_dict=True)


def _on(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether every parameter and buffer of ``model`` is on ``device`` and every floating one in ``dtype``."""
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != device.type or (device.index is not None and t.device.index != device.index):
            return False
        if t.is_floating_point() and t.dtype != dtype:
            return False
    return True


@contextlib.contextmanager
def running(model: str | LoadedModel | None, *, device: torch.device, dtype: str = "float32",
            attention: bool = False, random_init: bool = False, seed: int = 0,
            trust_remote_code: bool = False) -> Iterator[LoadedModel]:
    """The model to run, on ``device`` in ``dtype``, for the duration of the block.

    ``model``: a :class:`LoadedModel` (used as it is when already on the device and in the dtype, else
    a copy is moved there, so the caller's model is never changed), or a name or path loaded with
    :func:`probing.models.load_model` (``random_init``, ``seed``, ``trust_remote_code``). With
    ``attention`` the eager attention kernel runs inside the block (attention weights need it) and
    the model's own kernel is restored afterwards."""
    torch_dtype = as_torch_dtype(dtype)
    if isinstance(model, LoadedModel):
        lm = model
        if not _on(lm.model, device, torch_dtype):
            lm = dataclasses.replace(lm, model=copy.deepcopy(lm.model).to(device=device, dtype=torch_dtype))
    else:
        lm = load_model(model, random_init=random_init, seed=seed, device=device, dtype=dtype,
                        trust_remote_code=trust_remote_code, attn_implementation="eager" if attention else None)
    previous = getattr(lm.model.config, "_attn_implementation", "eager")
    switch = attention and previous != "eager"
    if switch:
        lm.model.set_attn_implementation("eager")
    try:
        yield lm
    finally:
        if switch:
            lm.model.set_attn_implementation(previous)
