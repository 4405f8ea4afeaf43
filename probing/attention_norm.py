"""Norm-based attention (Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing
Transformers with Vector Norms", EMNLP 2020), recorded at extraction beside the raw weights.

For head h of a layer, the output at query i is ``sum_j alpha_ij f_h(x_j)`` with the transformed value
``f_h(x) = (x W_V^h + b_V^h) W_O^h`` (``W_O^h``: the rows of the output projection that read head h's
slice; its bias is added after the sum over heads and belongs to no key). The norm-based weight of key
j is ``||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)||`` (eq. 5 of the paper). So that it is summarised
exactly like the raw weights, it is normalised per query to sum to one:
``w_ij = alpha_ij ||f_h(x_j)|| / sum_k alpha_ik ||f_h(x_k)||``.

``python -m probing.extract --attention-norm`` stores the group summary of ``w`` as the shard array
``attention_norm``; ``Cache.attention(weighting="norm")`` reads it and ``python -m analyses.attention
CACHE --weighting norm`` reports it.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from .adapters import Adapter, AdapterError, Site, adapter_for, hook_calls


def transformed_norms(v: torch.Tensor, w_out: torch.Tensor, n_heads: int) -> torch.Tensor:
    """v: (B, T, heads * d) value vectors; w_out: (hidden, heads * d) the output projection's weight.
    Returns ``||v_h W_O^h||`` (B, heads, T)."""
    B, T, D = v.shape
    d = D // n_heads
    f = torch.einsum("bthd,ohd->btho", v.reshape(B, T, n_heads, d), w_out.reshape(w_out.shape[0], n_heads, d))
    return torch.linalg.vector_norm(f, dim=-1).transpose(1, 2)


def norm_weighted(attentions: Sequence[torch.Tensor], norms: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer, ``w_ij = alpha_ij n_j / sum_k alpha_ik n_k`` (B, heads, T, T) from the raw weights
    (B, heads, T, T) and the value norms (B, heads, T) of :func:`value_norms`."""
    out = []
    for a, n in zip(attentions, norms):
        w = a.float() * n[:, :, None, :]
        out.append(w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny))
    return out


def value_sites(model: torch.nn.Module, n_layers: int) -> tuple[Adapter, list[Site], list[torch.Tensor]]:
    """The model's adapter, its value sites (one per layer) and output projection weights; a family
    without an adapter, or a model it cannot reach into, is an :class:`~probing.adapters.AdapterError`
    (a ValueError), raised when the extraction is planned, before anything is written."""
    adapter = adapter_for(model, "norm-based attention (--attention-norm)")
    sites, weights = adapter.value_sites(model), adapter.output_weights(model)
    if len(sites) != n_layers:
        raise AdapterError(f"the {adapter.family!r} adapter finds {len(sites)} encoder layers in a model of {n_layers}")
    return adapter, sites, weights


@contextlib.contextmanager
def recording_value_norms(model: torch.nn.Module, n_layers: int):
    """Records ``||f_h(x_j)||`` of every layer during one forward pass: yields a list that holds one
    (B, heads, T) tensor per layer once the pass has run (hooks on each layer's value projection, where
    the model's adapter finds it; a block shared by several layers is told apart by its call)."""
    adapter, sites, weights = value_sites(model, n_layers)
    heads = adapter.heads(model)
    norms: list[torch.Tensor | None] = [None] * n_layers

    def make(i: int):
        def hook(module, args, output):
            norms[i] = transformed_norms(adapter.values_of(output).float(), weights[i].float(), heads)

        return hook

    handles = hook_calls([(site, make(i)) for i, site in enumerate(sites)])
    try:
        yield norms
    finally:
        for h in handles:
            h.remove()
