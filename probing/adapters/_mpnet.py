"""MPNet (``mpnet``): blocks at ``encoder.layer``; ``attention.attn`` holds ``q``/``k``/``v``/``o`` and adds
a relative position bias and the mask (always eager: additive, or None without padding), which arrives
as its second positional argument. No token types. Position ids start at 2 (``padding_idx`` 1, plus 1),
as in RoBERTa."""

from __future__ import annotations

from dataclasses import dataclass

from ._base import Adapter


@dataclass(frozen=True)
class MPNetAdapter(Adapter):
    def position_offset(self, config) -> int:
        return 2  # MPNetEmbeddings.padding_idx is 1 whatever the config says; positions start after it


MPNET = MPNetAdapter("mpnet", ("mpnet",), attention="attention.attn", value="attention.attn.v",
                     output="attention.attn.o", token_types=False)
