"""DeBERTa-v2 and -v3 (``deberta-v2``): blocks at ``encoder.layer``; ``attention.self`` is the disentangled
attention (``query_proj``/``key_proj``/``value_proj``, plus content-to-position and position-to-content
scores from relative positions), called with the mask as its second positional argument. That mask is
not additive: it is 1 where a query may attend a key (``(B, 1, T, T)``, the product of the padding mask
with itself), and the attention fills the scores where it is 0 with the dtype's minimum; a knockout sets
its cells to 0. The output projection is ``attention.output.dense``. A convolution after the first
block (``conv_kernel_size`` > 0) is applied before hidden state 1 is recorded, so its output is that
state. Token types (ignored when ``type_vocab_size`` is 0); absolute positions, where used, from 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._base import Adapter, Site, base_model


@dataclass(frozen=True)
class DebertaV2Adapter(Adapter):
    def mask_with(self, mask: torch.Tensor | None, knocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # DisentangledSelfAttention calls attention_mask.bool() and masks where it is False
        return mask.bool() & ~knocked

    def state_sites(self, model: torch.nn.Module) -> list[Site]:
        sites = super().state_sites(model)
        conv = getattr(base_model(model).encoder, "conv", None)
        return sites[:1] + [Site(conv)] + sites[2:] if conv is not None else sites


DEBERTA_V2 = DebertaV2Adapter("deberta-v2", ("deberta-v2",), value="attention.self.value_proj")
