"""BERT (``bert``): the layout every default of :class:`~probing.adapters._base.Adapter` describes.

Blocks at ``encoder.layer``; ``attention.self`` is called with the mask by keyword (an additive mask
under eager attention, SDPA's boolean one, or None without padding); value ``attention.self.value``,
output ``attention.output.dense``; token types; positions from 0.
"""

from __future__ import annotations

from ._base import Adapter

BERT = Adapter("bert", ("bert",))
