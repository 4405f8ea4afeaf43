"""RoBERTa, XLM-R and CamemBERT (``roberta``, ``xlm-roberta``, ``camembert``): BERT's layout, with position
ids that start after the padding index (``create_position_ids_from_input_ids``: ``pad_token_id + 1``), so
the position table holds ``pad_token_id + 1`` rows fewer usable positions. ``<s>`` plays [CLS]'s part and
``</s>`` [SEP]'s; the tokenizer's ``cls_token`` / ``sep_token`` name them (:mod:`probing.formats`)."""

from __future__ import annotations

from dataclasses import dataclass

from ._base import Adapter


@dataclass(frozen=True)
class RobertaAdapter(Adapter):
    def position_offset(self, config) -> int:
        return int(getattr(config, "pad_token_id", 1) or 0) + 1


ROBERTA = RobertaAdapter("roberta", ("roberta", "xlm-roberta", "camembert"))
