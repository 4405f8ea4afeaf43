"""ELECTRA (``electra``): BERT's layout, except that embeddings smaller than the hidden size
(``embedding_size``) are projected by ``embeddings_project`` before the first block, and that
projection's output is hidden state 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._base import Adapter, Site, base_model


@dataclass(frozen=True)
class ElectraAdapter(Adapter):
    def state_sites(self, model: torch.nn.Module) -> list[Site]:
        sites = super().state_sites(model)
        project = getattr(base_model(model), "embeddings_project", None)
        return [Site(project)] + sites[1:] if project is not None else sites


ELECTRA = ElectraAdapter("electra", ("electra",))
