"""ModernBERT (``modernbert``): blocks at ``layers``; each block's ``attn`` projects queries, keys and values
at once (``Wqkv``: its output is ``(B, T, 3, heads * head_dim)`` flattened, values last), applies rotary
positions and is called with the mask by keyword. Layers alternate global attention and a local window
(``layer_types``); transformers 5 builds each kind's mask (additive under eager, boolean under SDPA,
None for a global layer without padding), with the window inside it, so a knockout added to that mask
is exact for both kinds. Output projection ``attn.Wo``. The last hidden state is the output of
``final_norm`` (transformers records ``last_hidden_state`` there), so that module's output is state
n_layers. No token types; rotary positions need no table (the limit is ``max_position_embeddings``).

Transformers 4 passed local layers a separate ``sliding_window_mask`` (and unpadded sequences for flash
attention): a knockout in ``attention_mask`` would miss those layers, so blocks of that implementation
are refused instead of approximated."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ._base import Adapter, AdapterError, Site, base_model


@dataclass(frozen=True)
class ModernBertAdapter(Adapter):
    def blocks(self, model: torch.nn.Module) -> list[Site]:
        sites = super().blocks(model)
        if sites and "sliding_window_mask" in inspect.signature(sites[0].module.forward).parameters:
            raise AdapterError("the modernbert adapter needs transformers 5's ModernBERT (one attention mask per "
                               "layer kind); this one passes local layers a separate sliding_window_mask")
        return sites

    def values_of(self, output: torch.Tensor) -> torch.Tensor:
        return output.unflatten(-1, (3, -1))[..., 2, :]

    def state_sites(self, model: torch.nn.Module) -> list[Site]:
        return super().state_sites(model)[:-1] + [Site(self._get(base_model(model), "final_norm", "final norm"))]


MODERNBERT = ModernBertAdapter("modernbert", ("modernbert",), layers="layers", attention="attn", value="attn.Wqkv",
                               output="attn.Wo", token_types=False)
