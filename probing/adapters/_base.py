"""The adapter interface: what the toolkit needs to know about one encoder family's insides.

An :class:`Adapter` names, as module paths from the base model, where a family keeps its blocks, the
module whose forward call receives the attention mask, and the value and output projections; it says
how a knockout enters that mask, whether the model takes token types and how far its position ids are
offset. The defaults are BERT's layout; a family that differs overrides a field or a method in its own
module. Module paths are read with ``get_submodule``, so a model that lacks one is a clear
:class:`AdapterError` naming the path, never an ``AttributeError`` deep in a hook.

A layer is a :class:`Site`: a module and which of its calls in one forward pass is that layer's (ALBERT
runs one shared block for every layer, so layer ``l`` is call ``l - 1`` of the same module).
:func:`hook_calls` registers hooks per site, counting each module's calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


class AdapterError(ValueError):
    """A model the toolkit cannot reach into: its family has no adapter, or it lacks a module its
    family's adapter expects."""


@dataclass(frozen=True, eq=False)
class Site:
    """One layer's module and which of its calls in one forward pass belongs to that layer."""

    module: torch.nn.Module
    call: int = 0


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The encoder itself (``AutoModel``'s model) of a model with or without a task head."""
    return getattr(model, "base_model", model)


def model_type(model_or_config) -> str:
    config = getattr(model_or_config, "config", model_or_config)
    return str(getattr(config, "model_type", None) or type(model_or_config).__name__)


@dataclass(frozen=True)
class Adapter:
    """One encoder family. Paths: ``layers`` from the base model to the list of blocks; ``attention``,
    ``value`` and ``output`` from a block to the module called with the attention mask (a forward
    pre-hook there sees the mask), the value projection and the attention's output projection;
    ``embeddings`` from the base model to the module whose output is hidden state 0.
    ``mask_position``: where the attention mask sits among that module's positional arguments when it
    is not passed by keyword. ``token_types``: the model's forward takes ``token_type_ids``."""

    family: str
    model_types: tuple[str, ...]
    layers: str = "encoder.layer"
    attention: str = "attention.self"
    value: str = "attention.self.value"
    output: str = "attention.output.dense"
    embeddings: str = "embeddings"
    token_types: bool = True
    mask_position: int = 1

    # -- positions -------------------------------------------------------------------------------------
    def position_offset(self, config) -> int:
        """How many rows of the position table come before the first token's (0: positions start at 0)."""
        return 0

    # -- modules ---------------------------------------------------------------------------------------
    def _get(self, root: torch.nn.Module, path: str, what: str) -> torch.nn.Module:
        try:
            return root.get_submodule(path)
        except AttributeError:
            raise AdapterError(f"{type(root).__name__} has no {what} at {path!r}, where the {self.family!r} "
                               f"adapter expects it") from None

    def blocks(self, model: torch.nn.Module) -> list[Site]:
        """The encoder's blocks in order, one :class:`Site` per layer 1..n_layers."""
        return [Site(b) for b in self._get(base_model(model), self.layers, "encoder blocks")]

    def _in_blocks(self, model: torch.nn.Module, path: str, what: str) -> list[Site]:
        return [Site(self._get(s.module, path, what), s.call) for s in self.blocks(model)]

    def attention_sites(self, model: torch.nn.Module) -> list[Site]:
        """Per layer, the module whose call receives the attention mask (a knockout's pre-hook goes there)."""
        return self._in_blocks(model, self.attention, "self-attention")

    def value_sites(self, model: torch.nn.Module) -> list[Site]:
        """Per layer, the module whose output holds the value vectors (see :meth:`values_of`)."""
        return self._in_blocks(model, self.value, "value projection")

    def values_of(self, output: torch.Tensor) -> torch.Tensor:
        """The value vectors ``(B, T, heads * head_dim)`` in the output of a value site."""
        return output

    def output_weights(self, model: torch.nn.Module) -> list[torch.Tensor]:
        """Per layer, the attention output projection's weight ``(hidden, heads * head_dim)``."""
        return [s.module.weight for s in self._in_blocks(model, self.output, "attention output projection")]

    def heads(self, model: torch.nn.Module) -> int:
        return int(model.config.num_attention_heads)

    def state_sites(self, model: torch.nn.Module) -> list[Site]:
        """Per hidden state 0..n_layers, the module whose output is that state as the model returns it in
        ``hidden_states`` (a forward hook that replaces the output changes what the model records)."""
        return [Site(self._get(base_model(model), self.embeddings, "embeddings"))] + self.blocks(model)

    # -- the attention mask ------------------------------------------------------------------------------
    def mask_with(self, mask: torch.Tensor | None, knocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The model's own attention mask with the ``knocked`` cells (``(B, 1, T, T)`` bool, True = masked)
        masked as well. ``mask``: None (no padding: an additive mask, which eager and SDPA both take),
        SDPA's boolean mask (True = attend), or an additive mask with the dtype's minimum where masked."""
        if mask is None:
            return torch.zeros(knocked.shape, dtype=dtype, device=knocked.device).masked_fill(
                knocked, torch.finfo(dtype).min)
        if mask.dtype == torch.bool:
            return mask & ~knocked
        return mask.expand(knocked.shape[0], 1, *knocked.shape[-2:]).masked_fill(knocked, torch.finfo(mask.dtype).min)

    def knock_out(self, args: tuple, kwargs: dict, knocked: torch.Tensor) -> tuple[tuple, dict]:
        """A forward pre-hook's ``(args, kwargs)`` with the attention mask replaced by :meth:`mask_with`."""
        hidden = args[0] if args else kwargs["hidden_states"]
        if "attention_mask" in kwargs or len(args) <= self.mask_position:
            kwargs["attention_mask"] = self.mask_with(kwargs.get("attention_mask"), knocked, hidden.dtype)
            return args, kwargs
        p = self.mask_position
        return args[:p] + (self.mask_with(args[p], knocked, hidden.dtype),) + args[p + 1:], kwargs


def hook_calls(hooks: Sequence[tuple[Site, Callable]], *, pre: bool = False) -> list:
    """Register ``hooks`` (site, hook function) and return their handles. One hook per module counts
    its calls from 0 and runs the function of the site whose call it is. ``pre``: forward pre-hooks
    with keyword arguments ``(module, args, kwargs)``; else forward hooks ``(module, args, output)``
    registered before any other (so transformers records what they return)."""
    by_module: dict[int, tuple[torch.nn.Module, dict[int, Callable]]] = {}
    for site, fn in hooks:
        by_module.setdefault(id(site.module), (site.module, {}))[1][site.call] = fn
    handles = []
    for module, fns in by_module.values():
        hook = _counting(fns)
        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True) if pre
                       else module.register_forward_hook(hook, prepend=True))
    return handles


def _counting(fns: dict[int, Callable]) -> Callable:
    """A hook that runs ``fns[c]`` on the module's call c (from 0) and does nothing on other calls."""
    count = itertools.count()

    def hook(module, *rest):
        fn = fns.get(next(count))
        return fn(module, *rest) if fn is not None else None

    return hook
