"""ALBERT (``albert``): one block shared by many layers. ``encoder.albert_layer_groups[g].albert_layers``
holds the blocks of group g, and layer i (0-based) runs group ``int(i / (n_layers / num_hidden_groups))``.
With one group (every released ALBERT) a single module runs n_layers times, so layer l is call l - 1 of
it and every per-layer hook counts calls (:func:`~probing.adapters._base.hook_calls`). Each block's
``attention`` holds ``query``/``key``/``value``/``dense`` and gets the mask as its second positional
argument (additive, SDPA boolean, or None as in BERT). Embeddings of ``embedding_size`` are projected by
``encoder.embedding_hidden_mapping_in``, whose output is hidden state 0. Token types; positions from 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._base import Adapter, AdapterError, Site, base_model


@dataclass(frozen=True)
class AlbertAdapter(Adapter):
    def blocks(self, model: torch.nn.Module) -> list[Site]:
        config = model.config
        if int(getattr(config, "inner_group_num", 1)) != 1:
            # each layer would run several blocks, and hidden_states would hold one state per block
            raise AdapterError(f"the albert adapter needs inner_group_num = 1 (one block per layer); this model "
                               f"has inner_group_num = {config.inner_group_num}")
        groups = self._get(base_model(model), "encoder.albert_layer_groups", "layer groups")
        n, g = int(config.num_hidden_layers), int(config.num_hidden_groups)
        calls: dict[int, int] = {}
        sites = []
        for i in range(n):
            group = int(i / (n / g))  # as AlbertTransformer.forward picks it
            sites.append(Site(groups[group].albert_layers[0], calls.get(group, 0)))
            calls[group] = calls.get(group, 0) + 1
        return sites


ALBERT = AlbertAdapter("albert", ("albert",), attention="attention", value="attention.value",
                       output="attention.dense", embeddings="encoder.embedding_hidden_mapping_in")
