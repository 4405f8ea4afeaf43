"""DistilBERT (``distilbert``): blocks at ``transformer.layer``; each block's ``attention`` holds the
projections ``q_lin``/``k_lin``/``v_lin``/``out_lin`` and is called with the mask by keyword (additive,
SDPA boolean, or None as in BERT). No token types, positions from 0."""

from __future__ import annotations

from ._base import Adapter

DISTILBERT = Adapter("distilbert", ("distilbert",), layers="transformer.layer", attention="attention",
                     value="attention.v_lin", output="attention.out_lin", token_types=False)
