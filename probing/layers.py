"""One meaning of a layer spec, for every command and function that takes ``--layers``.

Layers are the model's hidden states: 0 is the embedding output, ``n_layers`` the last encoder layer.
A spec is

* ``all`` (or None): every layer, or every stored layer when ``stored`` is given;
* a comma list of integers, where a negative index counts from the end: ``-1`` is the last layer,
  ``-2`` the one below it (Python's meaning, so ``-1`` is ``n_layers``);
* ``a-b`` ranges inside the list, both ends included (``2-4``, ``0-2,-1``);
* a sequence of integers (the Python API), read the same way.

>>> resolve_layers("0,3,-1", 6)
[0, 3, 6]
>>> resolve_layers("2-4", 6)
[2, 3, 4]
>>> resolve_layer("-1", 12)
12
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence


class LayerSpecError(ValueError):
    """A layer spec that does not name layers of this model (or of this cache)."""


_RANGE = re.compile(r"(-?\d+)\s*-\s*(-?\d+)")


def _describe(n_layers: int) -> str:
    return f"this model has layers 0..{n_layers} (0 = embeddings; -1 = {n_layers}, the last)"


def _items(spec: str | int | Iterable[int]) -> list[str | int]:
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        return [s.strip() for s in spec.split(",") if s.strip()]
    return list(spec)


def resolve_layers(spec: str | int | Sequence[int] | None, n_layers: int, *, stored: Sequence[int] | None = None,
                   option: str = "--layers") -> list[int]:
    """The layers ``spec`` names, as sorted unique indices in ``0..n_layers``.

    ``n_layers``: the model's encoder layers (the hidden states are 0..n_layers). ``stored``: the layers
    a cache holds; ``all``/None then means those, and a layer outside them is an error naming them.
    Raises :class:`LayerSpecError` (a ValueError) naming ``option``, the spec and the valid range.
    """
    if spec is None or (isinstance(spec, str) and spec.strip() == "all"):
        return sorted(stored) if stored is not None else list(range(n_layers + 1))
    shown = spec if isinstance(spec, str) else ",".join(map(str, _items(spec)))
    out: set[int] = set()
    for item in _items(spec):
        text = str(item).strip()
        m = _RANGE.fullmatch(text)
        try:
            ends = [int(m.group(1)), int(m.group(2))] if m else [int(text)]
        except ValueError:
            raise LayerSpecError(f"{option} {shown!r}: {text!r} is not an integer or a range a-b "
                                 f"(give e.g. 'all', '0,3,-1' or '2-4'); {_describe(n_layers)}") from None
        for layer in ends:
            if not -(n_layers + 1) <= layer <= n_layers:
                raise LayerSpecError(f"{option} {shown!r}: layer {layer} is out of range; {_describe(n_layers)}")
        lo, hi = (e + n_layers + 1 if e < 0 else e for e in (ends[0], ends[-1]))
        if lo > hi:
            raise LayerSpecError(f"{option} {shown!r}: range {text!r} runs backwards ({lo} > {hi})")
        out.update(range(lo, hi + 1))
    if not out:
        raise LayerSpecError(f"{option} {shown!r}: no layer given; {_describe(n_layers)}")
    if stored is not None:
        missing = sorted(out - set(stored))
        if missing:
            raise LayerSpecError(f"{option} {shown!r}: layer(s) {missing} are not stored; the cache holds "
                                 f"layers {sorted(stored)}")
    return sorted(out)


def resolve_layer(spec: str | int, n_layers: int, *, stored: Sequence[int] | None = None,
                  option: str = "--layers") -> int:
    """The one layer ``spec`` names (same grammar as :func:`resolve_layers`); several is an error."""
    if isinstance(spec, str) and spec.strip() == "all":
        raise LayerSpecError(f"{option} 'all': this takes one layer, e.g. -1 for the last")
    layers = resolve_layers(spec, n_layers, stored=stored, option=option)
    if len(layers) != 1:
        raise LayerSpecError(f"{option} {spec!r} names {len(layers)} layers {layers}; this takes exactly one")
    return layers[0]


def cache_layers(cache, spec: str | int | Sequence[int] | None, option: str = "--layers") -> list[int]:
    """:func:`resolve_layers` against a cache: its model's layer count and the layers it stores."""
    return resolve_layers(spec, int(cache.manifest["model"]["n_layers"]), stored=cache.layers, option=option)


def cache_layer(cache, spec: str | int, option: str = "--layers") -> int:
    """:func:`resolve_layer` against a cache."""
    return resolve_layer(spec, int(cache.manifest["model"]["n_layers"]), stored=cache.layers, option=option)


def shared_layers(spec: str | int | Sequence[int] | None, *caches, option: str = "--layers") -> list[int]:
    """:func:`resolve_layers` against caches read together (drift, CKA, paired comparisons): the model's
    layer count comes from the first cache, and a layer must be stored in every one of them."""
    first = caches[0]
    stored = [l for l in first.layers if all(l in c.layers for c in caches[1:])]
    if not stored:
        raise LayerSpecError("no layer is stored in every cache: "
                             + "; ".join(f"{c.path.name} holds {c.layers}" for c in caches))
    return resolve_layers(spec, int(first.manifest["model"]["n_layers"]), stored=stored, option=option)
