"""One shard of an extraction through the model: its examples rendered and batched by length, the batches
run (on the CPU side by side in single-threaded workers, :mod:`probing.workers`, each on its own model
replica where per-batch hooks are installed), the stored positions gathered on the device and copied
to the host once per batch, attention summaries, and the shard's token table. The loop over shards,
writing and resuming are :mod:`probing.extract`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import queue
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from .examples import Example
from .formats import Layout, Rendered, ranges
from .forward import collate, forward, length_batches
from .models import LoadedModel
from .planning import STORAGE_DTYPES, Plan, group_ids, layout_shard
from .workers import thread_imap


def token_table(examples: Sequence[Example], idx: Sequence[int], layout: Layout, at: np.ndarray,
                tokenizer) -> pd.DataFrame:
    """One row per stored position (``at``: flat positions of ``layout``, ascending), in corpus order then
    position order."""
    local = np.searchsorted(layout.bounds, at, side="right") - 1  # example of each row, within the layout
    df = pd.DataFrame({
        "example": np.asarray(idx, dtype=np.int64)[local],
        "example_id": np.asarray([examples[e].id for e in idx], dtype=object)[local].tolist(),
        "role": layout.role_names(at),
        "sentence": layout.sentence[at], "index": layout.index[at], "subword": layout.subword[at],
        "occurrence": layout.occurrence[at],
        "position": (at - layout.bounds[local]).astype(np.int32),
        "segment": layout.token_type_ids[at].astype(np.int8),
        "token_id": layout.input_ids[at],
        "word_text": layout.word_texts(at),
    })
    df["token"] = tokenizer.convert_ids_to_tokens(df["token_id"].tolist())
    return df


class Replicas:
    """The CPU workers of one format's extraction (:mod:`probing.workers`; ``workers`` None: one batch at a
    time on torch's threads) and the models they run on: the caller's model, and where hooks are installed
    for each batch (interventions, value-norm recording) one copy per further worker, so that concurrent
    batches never hook the same modules. Made once per extraction, not per shard."""

    def __init__(self, lm: LoadedModel, plan_: Plan, workers: int | None) -> None:
        self.workers = workers
        self.models: queue.SimpleQueue = queue.SimpleQueue()
        self.models.put((lm, plan_.intervention))
        hooked = plan_.intervention is not None or bool(plan_.request.get("attention_norm"))
        for _ in range(1, workers or 1):
            copy_ = dataclasses.replace(lm, model=copy.deepcopy(lm.model)) if hooked else lm
            self.models.put((copy_, plan_.intervention.on(copy_.model) if plan_.intervention is not None else None))
        self.staging = HostStaging()


class HostStaging:
    """Page-locked host memory, allocated once and grown as needed, that a batch's gathered states are
    copied into from a GPU. ``.cpu()`` would allocate new pageable memory for every batch, and the copy
    into it runs at a fraction of the bus rate (page faults, and the driver's staging through its own
    pinned buffer): 1.5 GB/s for all tokens of bert-base on an H200 (56b7e45, 2026-11-26). The returned
    array is a view of the buffer, valid until the next call, so the caller copies it out first (one batch
    at a time on a GPU: :func:`run_shard` scatters it into the shard before the next batch runs).
    On the CPU (or without CUDA) it is the tensor's own memory, as ``.cpu()`` gives."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def take(self, t: torch.Tensor) -> np.ndarray:
        if t.device.type != "cuda":
            return t.cpu().numpy()
        n = t.numel()
        if self.buffer is None or self.buffer.dtype != t.dtype or self.buffer.numel() < n:
            grow = self.buffer.numel() * 5 // 4 if self.buffer is not None and self.buffer.dtype == t.dtype else 0
            self.buffer = None  # the old buffer is freed before the larger one is pinned
            self.buffer = torch.empty(max(n, grow), dtype=t.dtype, pin_memory=True)
        view = self.buffer[:n].view(t.shape)
        view.copy_(t)  # synchronous: the view holds the batch when this returns
        return view.numpy()


def run_shard(lm: LoadedModel, plan_: Plan, examples: Sequence[Example], start: int, stop: int, *,
               device: torch.device, batch_tokens: int, max_batch: int, progress=None,
               trim=None, replicas: "Replicas | None" = None,
               tokens=None) -> tuple[np.ndarray, pd.DataFrame, dict, list[int]]:
    """States of the shard's stored positions (rows in corpus order), its token table, extra arrays.
    ``replicas`` (:class:`Replicas`): the workers that run batches side by side on the CPU, and the model
    replica each runs on; None: one batch at a time on torch's threads.
    ``tokens``: the corpus's sentences tokenized while planning (:class:`probing.planning.SentenceTokens`);
    None: the shard's sentences are tokenized here.
    ``trim`` (a :class:`probing.heap.HeapTrimmer`) is called after every batch: glibc otherwise keeps
    the freed temporaries of each new batch shape, and the resident size grows with the number of batches."""
    layers = plan_.request["layers"]
    storage = STORAGE_DTYPES[plan_.request["storage_dtype"]]
    idx, layout = layout_shard(lm, plan_, examples, start, stop, tokens)
    at = layout.positions_of(plan_.request["roles"])  # the stored positions: row r of ``out`` is at[r]
    rows_of = np.searchsorted(at, layout.bounds)  # example i's rows: rows_of[i]:rows_of[i + 1]
    out = np.empty((len(at), len(layers), lm.hidden_size), dtype=storage)
    attention = plan_.request["attention"]
    groups = plan_.groups
    att = (np.full((len(idx), lm.n_layers, lm.config.num_attention_heads, len(groups), len(groups)),
                   np.nan, dtype=np.float32) if attention else None)
    att_norm = att.copy() if plan_.request.get("attention_norm") else None
    per_example = attention or plan_.intervention is not None  # hooks and summaries read Rendered examples
    H = lm.hidden_size
    host_dtype = torch.float32 if storage == np.float32 else torch.float16

    def run_batch(batch: list[int]):
        """One batch through the model: its rows of ``out``, their states on the host ``(rows, layers,
        hidden)`` and attention summaries."""
        rep, bound = pool.get()
        try:
            inputs = collate((layout, batch), rep, device)
            T = inputs.T
            rows, n = ranges(rows_of, batch)
            flat = at[rows] - np.repeat(layout.bounds[batch] - np.arange(len(batch)) * T, n)
            flat_t = torch.from_numpy(flat).to(device, non_blocking=True)
            part = layout.rendered(batch) if per_example else None
            with _batch_hooks(rep, bound, plan_, part, [idx[i] for i in batch], examples, T, device) as norms:
                o = forward(rep, inputs, attentions=attention)
        finally:
            pool.put((rep, bound))
        summary = summary_norm = None
        with torch.inference_mode():
            hs = o.hidden_states
            gathered = torch.stack([hs[l].reshape(-1, H).index_select(0, flat_t) for l in layers], dim=1)
            gathered = gathered.to(dtype=host_dtype)  # converted where computed: fewer bytes to copy
            host = staging.take(gathered) if staging is not None else gathered.cpu().numpy()
            if attention:
                summary = _attention_summary(o.attentions, part, groups, T, device)
            if norms is not None:
                from .attention_norm import norm_weighted

                summary_norm = _attention_summary(norm_weighted(o.attentions, norms), part, groups, T, device)
        return batch, rows, host, summary, summary_norm

    if replicas is None:
        replicas = Replicas(lm, plan_, None)
    pool = replicas.models
    # one batch at a time (a GPU): one reused buffer; concurrent CPU workers: each its own tensor
    staging = replicas.staging if replicas.workers is None else None
    for batch, rows, host, summary, summary_norm in thread_imap(
            run_batch, length_batches(layout.lengths.tolist(), batch_tokens, max_batch), replicas.workers):
        out[rows] = host
        if summary is not None:
            att[batch] = summary
        if summary_norm is not None:
            att_norm[batch] = summary_norm
        del host, summary, summary_norm
        if trim is not None:
            trim()
        if progress is not None:
            progress.update(len(batch))
    tokens = token_table(examples, idx, layout, at, lm.tokenizer)
    extra = {"attention": att} if attention else {}
    if att_norm is not None:
        extra["attention_norm"] = att_norm
    return out, tokens, extra, idx


@contextlib.contextmanager
def _batch_hooks(lm: LoadedModel, bound, plan_: Plan, rendered: Sequence[Rendered], corpus_index: Sequence[int],
                 examples: Sequence[Example], T: int, device: torch.device):
    """The intervention hooks (``bound``, the plan's intervention on ``lm``'s model) for one batch, and
    the value-norm recorder of ``--attention-norm`` (yields its per-layer list, or None)."""
    with contextlib.ExitStack() as stack:
        if bound is not None:
            stack.enter_context(bound.batch(rendered, corpus_index, [examples[e].id for e in corpus_index], T, device))
        norms = None
        if plan_.request.get("attention_norm"):
            from .attention_norm import recording_value_norms

            norms = stack.enter_context(recording_value_norms(lm.model, lm.n_layers))
        yield norms


def _attention_summary(attentions, rendered: Sequence[Rendered], groups: list[str], T: int,
                       device: torch.device) -> np.ndarray:
    """Attention mass between token groups (Clark et al. 2019, "What Does BERT Look At?"): for each
    layer and head, ``mass[a, b]`` = mean over query tokens q in group a of sum over key tokens k in
    group b of attention(q -> k). Returns (batch, layers, heads, G, G); NaN where a group is empty."""
    gid = torch.full((len(rendered), T), -1, dtype=torch.long)
    for b, r in enumerate(rendered):
        g = group_ids(r, groups)
        gid[b, :len(g)] = torch.from_numpy(g)
    onehot = torch.zeros(len(rendered), T, len(groups), dtype=torch.float32)
    valid = gid >= 0
    onehot[valid.nonzero(as_tuple=True) + (gid[valid],)] = 1.0
    onehot = onehot.to(device)
    counts = onehot.sum(1)  # (B, G)
    per_layer = []
    for a in attentions:  # (B, heads, T, T)
        to_group = torch.einsum("bhqk,bkg->bhqg", a.float(), onehot)
        mass = torch.einsum("bqa,bhqg->bhag", onehot, to_group)
        per_layer.append(mass / counts[:, None, :, None])
    return torch.stack(per_layer, dim=1).cpu().numpy()
