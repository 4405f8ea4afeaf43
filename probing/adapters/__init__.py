"""One adapter per encoder family: everything the toolkit knows about a model's insides.

Knockouts, patches, ablations and norm-based attention (:mod:`probing.interventions`,
:mod:`probing.attention_norm`) find blocks, attention, value and output projections and the attention
mask through the model's adapter; collation asks it whether the model takes token types, and the length
limit (:func:`probing.models.max_sequence_length`) its position offset. Each family lives in one private
module, its adapter declared there: BERT (``_bert.py``), RoBERTa / XLM-R / CamemBERT (``_roberta.py``),
DistilBERT, ALBERT, ELECTRA, MPNet, DeBERTa-v2 and ModernBERT. :data:`REGISTRY` maps a config's
``model_type`` to its adapter.

A model whose family has no adapter still extracts hidden states (``output_hidden_states`` is all that
needs); :func:`adapter_for` refuses it for anything that reaches inside, naming the adapter to add.
"""

from __future__ import annotations

import inspect

import torch

from ._albert import ALBERT
from ._base import Adapter, AdapterError, Site, base_model, hook_calls, model_type
from ._bert import BERT
from ._deberta_v2 import DEBERTA_V2
from ._distilbert import DISTILBERT
from ._electra import ELECTRA
from ._modernbert import MODERNBERT
from ._mpnet import MPNET
from ._roberta import ROBERTA

__all__ = ["ADAPTERS", "REGISTRY", "Adapter", "AdapterError", "Site", "adapter_for", "base_model", "find_adapter",
           "hook_calls", "model_type", "position_offset", "takes_token_types"]

#: Every adapter, one per family.
ADAPTERS: tuple[Adapter, ...] = (BERT, ROBERTA, DISTILBERT, ALBERT, ELECTRA, MPNET, DEBERTA_V2, MODERNBERT)

#: ``config.model_type`` -> its family's adapter: the one declaration dispatch and messages use.
REGISTRY: dict[str, Adapter] = {t: a for a in ADAPTERS for t in a.model_types}


def find_adapter(model_or_config) -> Adapter | None:
    """The adapter of a model (or its config) by ``model_type``; None for a family without one."""
    return REGISTRY.get(model_type(model_or_config))


def adapter_for(model: torch.nn.Module, purpose: str = "interventions") -> Adapter:
    """The model's adapter, or an :class:`AdapterError` that names the missing one and what needs it."""
    adapter = find_adapter(model)
    if adapter is None:
        kind = model_type(model)
        module = "_" + kind.replace("-", "_") + ".py"
        raise AdapterError(f"{purpose} need an adapter for model type {kind!r} and there is none: add "
                           f"probing/adapters/{module} (adapters exist for {', '.join(sorted(REGISTRY))}); "
                           f"hidden states extract without one")
    return adapter


def position_offset(config) -> int:
    """Rows of the position table before the first token's: the adapter's, 0 for a family without one."""
    adapter = find_adapter(config)
    return adapter.position_offset(config) if adapter is not None else 0


def takes_token_types(model: torch.nn.Module) -> bool:
    """Whether the model takes ``token_type_ids``: its adapter says; without one, its ``forward``'s signature."""
    adapter = find_adapter(model)
    if adapter is not None:
        return adapter.token_types
    try:
        return "token_type_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
