"""Interventions at extraction time: causal tests of what the model uses.

Three kinds, each given on the command line as a ``key=value,...`` spec (repeatable) or in Python as a
dataclass, combined in one :class:`Intervention` passed to ``extract(..., intervention=...)``:

``--knockout from=QUERIES,to=KEYS,layers=L[,control=1,seed=N]``
    Attention knockout: at each encoder layer in ``L`` (``3``, ``2-4`` or ``2;5``; layers 1..n_layers,
    layer l is the block whose output is hidden state l), no query of group ``QUERIES`` may attend to a
    key of group ``KEYS``. The scores are masked before the softmax: the model's own attention mask
    gets the dtype's minimum (eager) or ``False`` (SDPA's boolean mask) at those (query, key) cells,
    through a forward pre-hook on each chosen layer's self-attention module, so eager and SDPA attention
    run the same intervention. A query's own position is never masked (a row with every key masked
    would give NaN): a ``[SEP]`` query under ``to=sep`` still attends to itself.
    ``control=1``: the control of the same size, for each query the same number of keys it would lose,
    drawn at random among the word tokens of its example (never its own position; seeded by ``seed``
    and the example id, so the draw does not depend on batching).
``--patch keys=GROUP,layer=L,source=CACHE``
    State patching: hidden state ``L`` (0 = embeddings, n_layers = last) of the tokens of ``GROUP`` is
    replaced by the state of the same token key in the cache ``CACHE`` (another format of the same
    model and corpus, e.g. ``[CLS]`` of ``concat`` into ``pair``), then the layers above run on it.
``--ablate keys=GROUP,layer=L,value=zero|mean[,source=CACHE]``
    Ablation: hidden state ``L`` of the tokens of ``GROUP`` set to zero, or to the group's corpus mean
    at that layer: the mean over every token of ``GROUP`` stored in ``CACHE``, a clean cache of the
    same model, format and corpus (a first pass of the extractor).

Groups use the project's role names (:mod:`probing.formats` roles, :mod:`analyses.selection` groups):
``all`` every token, ``cls`` the first ``[CLS]``, ``sep`` every ``[SEP]``, ``sep<i>`` the ``[SEP]``
right after sentence i, ``word`` every word token, ``s<i>`` the word tokens of sentence i.

A patched or ablated state is what the cache stores at that layer (the hook runs before the model
records its hidden states). The intervention is part of the cache request (so it has its own cache
directory) and of ``manifest.json``; a clean request is unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import re
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from .adapters import Adapter, AdapterError, Site, adapter_for, hook_calls
from .cache import Cache, CacheError, IncomparableCaches, comparable_differences
from .formats import KEY_COLUMNS, Format, Rendered, render, TokenizedSentence

#: The group grammar, declared once: CLI help, validation and masks use it.
GROUPS: dict[str, str] = {
    "all": "every token",
    "cls": "the first [CLS]",
    "sep": "every [SEP]",
    "sep<i>": "the [SEP] right after sentence i",
    "word": "every word token",
    "s<i>": "the word tokens of sentence i",
}
_GROUP_RE = re.compile(r"all|cls|sep|sep(\d+)|word|s(\d+)")
ABLATE_VALUES = ("zero", "mean")
#: Attention kernels that take the attention mask as a (query, key) matrix, where a knockout goes.
KNOCKOUT_KERNELS = ("eager", "sdpa")


class InterventionError(ValueError):
    """A malformed intervention spec, or one this model or cache cannot carry out."""


def check_group(group: str, what: str = "group") -> str:
    if not _GROUP_RE.fullmatch(group or ""):
        raise InterventionError(f"{what}: unknown group {group!r}; groups: {', '.join(GROUPS)}")
    return group


def group_mask(role: Sequence[str], sentence: np.ndarray, index: np.ndarray, occurrence: np.ndarray,
               group: str) -> np.ndarray:
    """Which tokens belong to ``group``: a bool array over the given positions or token-table rows.
    role/sentence/index/occurrence: (n,) as in :class:`probing.formats.Rendered` or a cache's token
    table (a [SEP]'s ``sentence`` is the sentence before it, ``index`` its count since that sentence)."""
    role = np.asarray(role)
    m = _GROUP_RE.fullmatch(group)
    if m is None:
        check_group(group)
    if group == "all":
        return np.ones(len(role), dtype=bool)
    if group == "cls":
        return (role == "cls") & (np.asarray(occurrence) == 0)
    if group == "sep":
        return role == "sep"
    if group == "word":
        return role == "word"
    if m.group(1) is not None:
        return (role == "sep") & (np.asarray(sentence) == int(m.group(1))) & (np.asarray(index) == 0)
    return (role == "word") & (np.asarray(sentence) == int(m.group(2)))


def rendered_mask(r: Rendered, group: str) -> np.ndarray:
    """(T,) bool: the positions of ``r`` in ``group``."""
    return group_mask(r.role, r.sentence, r.index, r.occurrence, group)


def table_mask(tokens: pd.DataFrame, group: str) -> np.ndarray:
    """(n_rows,) bool: the rows of a cache's token table in ``group``."""
    return group_mask(tokens["role"].to_numpy(), tokens["sentence"].to_numpy(), tokens["index"].to_numpy(),
                      tokens["occurrence"].to_numpy(), group)


# ---------------------------------------------------------------------------------------------------
# Specs


def _parse_spec(spec: str, option: str, allowed: Sequence[str], required: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in [s.strip() for s in str(spec).split(",") if s.strip()]:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise InterventionError(f"{option} {spec!r}: {item!r} is not one of {', '.join(k + '=' for k in allowed)}")
        if key in out:
            raise InterventionError(f"{option} {spec!r}: {key} given twice")
        out[key] = value.strip()
    missing = [k for k in required if k not in out]
    if missing:
        raise InterventionError(f"{option} {spec!r}: missing {', '.join(k + '=' for k in missing)}")
    return out


def _int(value: str, option: str, spec: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InterventionError(f"{option} {spec!r}: {name}={value!r} is not an integer") from None


def parse_layer_list(value: str, option: str = "layers", spec: str = "") -> tuple[int, ...]:
    """``"3"`` -> (3,); ``"2-4"`` -> (2, 3, 4); ``"2;5"`` -> (2, 5)."""
    out: list[int] = []
    for part in [p.strip() for p in value.split(";") if p.strip()]:
        a, dash, b = part.partition("-")
        lo = _int(a, option, spec or value, "layers")
        hi = _int(b, option, spec or value, "layers") if dash else lo
        if hi < lo:
            raise InterventionError(f"{option} {spec or value!r}: empty layer range {part!r}")
        out.extend(range(lo, hi + 1))
    if not out:
        raise InterventionError(f"{option} {spec or value!r}: no layer given")
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class Knockout:
    """Queries of group ``queries`` may not attend to keys of group ``keys`` at encoder ``layers``
    (1..n_layers). ``control``: instead, the same number of keys per query at random among words."""

    queries: str
    keys: str
    layers: tuple[int, ...]
    control: bool = False
    seed: int = 0

    def __post_init__(self):
        check_group(self.queries, "--knockout from")
        check_group(self.keys, "--knockout to")
        if not self.layers:
            raise InterventionError("--knockout: no layer given")

    @classmethod
    def parse(cls, spec: str) -> "Knockout":
        d = _parse_spec(spec, "--knockout", ("from", "to", "layers", "control", "seed"), ("from", "to", "layers"))
        control = d.get("control", "0")
        if control not in ("0", "1"):
            raise InterventionError(f"--knockout {spec!r}: control must be 0 or 1, got {control!r}")
        return cls(d["from"], d["to"], parse_layer_list(d["layers"], "--knockout", spec), control == "1",
                   _int(d.get("seed", "0"), "--knockout", spec, "seed"))

    def to_json(self) -> dict:
        return {"from": self.queries, "to": self.keys, "layers": list(self.layers), "control": self.control,
                "seed": self.seed}


@dataclass(frozen=True)
class Patch:
    """Hidden state ``layer`` (0..n_layers) of the tokens of ``keys`` replaced by the same keys' states
    in cache ``source``."""

    keys: str
    layer: int
    source: str

    def __post_init__(self):
        check_group(self.keys, "--patch keys")

    @classmethod
    def parse(cls, spec: str) -> "Patch":
        d = _parse_spec(spec, "--patch", ("keys", "layer", "source"), ("keys", "layer", "source"))
        return cls(d["keys"], _int(d["layer"], "--patch", spec, "layer"), d["source"])


@dataclass(frozen=True)
class Ablate:
    """Hidden state ``layer`` of the tokens of ``keys`` set to zero or to their mean in cache ``source``."""

    keys: str
    layer: int
    value: Literal["zero", "mean"] = "zero"
    source: str | None = None

    def __post_init__(self):
        check_group(self.keys, "--ablate keys")
        if self.value not in ABLATE_VALUES:
            raise InterventionError(f"--ablate: value must be one of {ABLATE_VALUES}, got {self.value!r}")
        if (self.value == "mean") != (self.source is not None):
            raise InterventionError("--ablate: value=mean needs source=CLEAN_CACHE (the corpus mean comes from "
                                    "it), and value=zero takes no source")

    @classmethod
    def parse(cls, spec: str) -> "Ablate":
        d = _parse_spec(spec, "--ablate", ("keys", "layer", "value", "source"), ("keys", "layer"))
        return cls(d["keys"], _int(d["layer"], "--ablate", spec, "layer"), d.get("value", "zero"), d.get("source"))


def _source_json(path: str) -> dict:
    """A source cache as the request records it: its directory name (format plus the hash of its
    request, so it names the exact states) and its format."""
    cache = _open_source(path)
    return {"cache": cache.path.name, "format": cache.format_name}


@dataclass(frozen=True)
class Intervention:
    """Every intervention of one extraction. Empty lists are allowed; :meth:`to_json` is what the cache
    request and manifest record under ``"intervention"``."""

    knockouts: tuple[Knockout, ...] = ()
    patches: tuple[Patch, ...] = ()
    ablations: tuple[Ablate, ...] = ()

    @classmethod
    def parse(cls, knockout: Sequence[str] = (), patch: Sequence[str] = (),
              ablate: Sequence[str] = ()) -> "Intervention | None":
        """From CLI specs; None when none is given (a clean extraction)."""
        if not (knockout or patch or ablate):
            return None
        return cls(tuple(Knockout.parse(s) for s in knockout or ()), tuple(Patch.parse(s) for s in patch or ()),
                   tuple(Ablate.parse(s) for s in ablate or ()))

    def to_json(self) -> dict:
        out: dict = {}
        if self.knockouts:
            out["knockout"] = [k.to_json() for k in self.knockouts]
        if self.patches:
            out["patch"] = [{"keys": p.keys, "layer": p.layer, "source": _source_json(p.source)} for p in self.patches]
        if self.ablations:
            out["ablate"] = [{"keys": a.keys, "layer": a.layer, "value": a.value,
                              **({"source": _source_json(a.source)} if a.source is not None else {})}
                             for a in self.ablations]
        return out


def layer_span(layers) -> str:
    """Layers as a label: ``3-5`` for consecutive layers, ``3`` for one, ``1,3`` otherwise (a label, never
    a list to parse: the request in the manifest keeps the list)."""
    ls = sorted(int(l) for l in layers)
    if len(ls) > 1 and ls == list(range(ls[0], ls[-1] + 1)):
        return f"{ls[0]}-{ls[-1]}"
    return ",".join(map(str, ls))


def describe(request: Mapping | None) -> str:
    """A short label of an intervention from its request form (:meth:`Intervention.to_json`, as the
    manifest records it), e.g. ``knockout all->sep@3-4``; ``"clean"`` for None or an empty one.

    >>> describe({"knockout": [{"control": False, "from": "all", "to": "sep", "layers": [3, 4, 5]}]})
    'knockout all->sep@3-5'
    """
    if not request:
        return "clean"
    parts = [f"{'control ' if k['control'] else ''}knockout {k['from']}->{k['to']}@{layer_span(k['layers'])}"
             for k in request.get("knockout", [])]
    parts += [f"patch {p['keys']}@{p['layer']} from {p['source']['format']}" for p in request.get("patch", [])]
    parts += [f"ablate {a['keys']}@{a['layer']}={a['value']}" for a in request.get("ablate", [])]
    return "; ".join(parts)


def _without_controls(request: Mapping) -> dict:
    """A request with each knockout's ``control`` flag and ``seed`` left out: what a knockout and its
    control share."""
    return {**request, "knockout": [{k: v for k, v in ko.items() if k not in ("control", "seed")}
                                    for ko in request.get("knockout", [])]}


def check_intervention(clean: Cache, treated: Cache, control: Cache | None = None, *,
                       source: Cache | None = None) -> None:
    """Refuse to read ``treated`` (and ``control``) as intervened runs of ``clean`` unless they are: the one
    check of every runner that sets an intervention against its clean run (:mod:`analyses.interventions`).
    A clean cache of another format passed as the treated one would otherwise give "effects" that are
    format drift, and a control that is not the treated intervention's control a meaningless difference.

    - ``clean`` carries no intervention; ``treated`` and ``control`` carry one (their manifests record it);
    - each is of ``clean``'s model, format and corpus (fingerprints; :func:`probing.cache.comparable_differences`);
    - ``control``: every knockout of it a control (``control=1``), ``treated``'s none, and otherwise the same
      intervention: the same queries, keys and layers (the seed may differ);
    - ``source`` (patching: the format whose states are patched in): every patch of ``treated`` comes from
      a cache of ``source``'s format.

    Raises :class:`probing.cache.IncomparableCaches` (a ``ValueError``) naming the caches and every difference.
    """
    diffs = comparable_differences(clean, treated, same_format=True)
    if control is not None:
        diffs += [f"control {control.path}: {d}" for d in comparable_differences(clean, control, same_format=True)]
    want = clean.manifest.get("intervention")
    if want:
        diffs.append(f"the clean cache {clean.path} is itself intervened ({describe(want)})")
    done = treated.manifest.get("intervention")
    if not done:
        diffs.append(f"the treated cache {treated.path} carries no intervention (a clean run of format "
                     f"{treated.format_name!r}): extract it with --knockout, --patch or --ablate")
    if control is not None:
        ctrl = control.manifest.get("intervention")
        if not ctrl:
            diffs.append(f"the control cache {control.path} carries no intervention (a clean run of format "
                         f"{control.format_name!r}): extract it with --knockout ...,control=1")
        elif done:
            if any(k["control"] for k in done.get("knockout", [])):
                diffs.append(f"the treated cache is itself a control ({describe(done)}): give the knockout first, "
                             f"then its control")
            if not ctrl.get("knockout") or not all(k["control"] for k in ctrl["knockout"]):
                diffs.append(f"the control cache {control.path} is not a control ({describe(ctrl)}): a control "
                             f"knockout has control=1")
            elif _without_controls(ctrl) != _without_controls(done):
                diffs.append(f"the control cache {control.path} ({describe(ctrl)}) is not the control of the treated "
                             f"one ({describe(done)}): a control takes the same queries, keys and layers")
    if source is not None and done:
        for patch in done.get("patch", []):
            if patch["source"]["format"] != source.format_name:
                diffs.append(f"the treated cache patches {patch['keys']}@{patch['layer']} from format "
                             f"{patch['source']['format']!r}, but the source cache {source.path} holds format "
                             f"{source.format_name!r}")
    if diffs:
        raise IncomparableCaches(f"cannot read {treated.path} as an intervention on {clean.path}: " + "; ".join(diffs))


def _open_source(path: str) -> Cache:
    try:
        return Cache.open(path)
    except CacheError as err:
        raise InterventionError(f"intervention source {path!r}: {err}") from None


# ---------------------------------------------------------------------------------------------------
# Binding to a model


def _sites(model: torch.nn.Module, n_layers: int) -> tuple[list[Site], list[Site], Adapter]:
    """Per layer 1..n_layers the module a knockout's pre-hook goes on, and per hidden state 0..n_layers the
    module whose output a patch or ablation replaces, as the model's adapter (:mod:`probing.adapters`)
    finds them; a model it cannot reach into is an :class:`InterventionError`."""
    try:
        adapter = adapter_for(model, "interventions")
        attention, states = adapter.attention_sites(model), adapter.state_sites(model)
    except AdapterError as err:
        raise InterventionError(str(err)) from None
    if len(attention) != n_layers:
        raise InterventionError(f"the {adapter.family!r} adapter finds {len(attention)} encoder layers in a model "
                                f"of {n_layers}")
    return attention, states, adapter


def _example_rng(seed: int, example_id: str) -> np.random.Generator:
    digest = hashlib.sha256(str(example_id).encode("utf-8")).digest()
    return np.random.default_rng([int(seed), int.from_bytes(digest[:8], "little")])


def knockout_mask(r: Rendered, ko: Knockout, example_id: str) -> np.ndarray:
    """(T, T) bool, ``[query, key]`` True where the score is masked. The diagonal is never masked.
    For a control, each query loses as many keys as the knockout would take from it, drawn at random
    among its example's word tokens other than itself (all of them if there are fewer)."""
    q = rendered_mask(r, ko.queries)
    k = rendered_mask(r, ko.keys)
    T = len(r)
    m = q[:, None] & k[None, :]
    np.fill_diagonal(m, False)
    if not ko.control:
        return m
    words = np.flatnonzero(rendered_mask(r, "word"))
    rng = _example_rng(ko.seed, example_id)
    out = np.zeros((T, T), dtype=bool)
    for i in np.flatnonzero(m.any(1)):
        cand = words[words != i]
        out[i, rng.permutation(cand)[:int(m[i].sum())]] = True
    return out


def _skeleton(fmt: Format, k: int) -> Rendered:
    """``fmt`` rendered for a k-sentence example of one-token sentences: enough for special-token keys."""
    from .examples import Example

    one = TokenizedSentence(ids=np.zeros(1, np.int64), word=np.zeros(1, np.int32), subword=np.zeros(1, np.int32),
                            word_text=["x"])
    specials = {v: 0 for kind, v, _ in fmt.expand(k) if kind == "special"}
    return render(fmt, Example("skeleton", tuple("x" for _ in range(k)), {}), [one] * k, specials)


class Bound:
    """An :class:`Intervention` bound to one model, format and corpus: validated, with source states
    loaded; :meth:`batch` registers the hooks for one forward pass."""

    def __init__(self, intervention: Intervention, model: torch.nn.Module, n_layers: int, fmt: Format,
                 corpus_fingerprint: str, model_fingerprint: str, sentence_counts: Sequence[int]):
        self.intervention = intervention
        self.model = model
        self.n_layers = n_layers
        self._attention, self._states, self.adapter = _sites(model, n_layers)
        kernel = getattr(model.config, "_attn_implementation", None) or "eager"
        if intervention.knockouts and kernel not in KNOCKOUT_KERNELS:
            raise InterventionError(f"--knockout masks (query, key) cells of the attention mask, which the {kernel!r} "
                                    f"attention kernel does not take; load the model with attn_implementation="
                                    f"{' or '.join(map(repr, KNOCKOUT_KERNELS))}")
        self.request = intervention.to_json()
        self.label = describe(self.request)
        for ko in intervention.knockouts:
            bad = [l for l in ko.layers if not 1 <= l <= n_layers]
            if bad:
                raise InterventionError(f"--knockout layers {bad} out of range; encoder layers are 1..{n_layers}")
        self._sources: dict[tuple[str, int], tuple[Cache, pd.Index]] = {}
        self._means: dict[int, torch.Tensor] = {}
        for p in intervention.patches:
            self._check_state_layer(p.layer, n_layers, "--patch")
            src = self._source(p.source, p.layer, corpus_fingerprint, model_fingerprint, "--patch")
            self._check_keys(src, fmt, p.keys, sentence_counts)
        for i, a in enumerate(intervention.ablations):
            self._check_state_layer(a.layer, n_layers, "--ablate")
            if a.value == "mean":
                src = self._source(a.source, a.layer, corpus_fingerprint, model_fingerprint, "--ablate")
                if src.format_name != fmt.name:
                    raise InterventionError(f"--ablate value=mean: source {src.path} holds format "
                                            f"{src.format_name!r}, not {fmt.name!r} (the mean comes from a clean "
                                            f"cache of the same format)")
                rows = np.flatnonzero(table_mask(src.tokens, a.keys))
                if rows.size == 0:
                    raise InterventionError(f"--ablate: source {src.path} stores no token of group {a.keys!r}")
                self._means[i] = torch.from_numpy(src.states(a.layer, rows, dtype=np.float64).mean(0))

    @staticmethod
    def _check_state_layer(layer: int, n_layers: int, option: str) -> None:
        if not 0 <= layer <= n_layers:
            raise InterventionError(f"{option} layer {layer} out of range; hidden states are 0..{n_layers}")

    def _source(self, path, layer, corpus_fp, model_fp, option) -> Cache:
        src = _open_source(path)
        if src.manifest["corpus"]["fingerprint"] != corpus_fp:
            raise InterventionError(f"{option} source {src.path} holds another corpus than this extraction")
        if src.manifest["model"]["fingerprint"] != model_fp:
            raise InterventionError(f"{option} source {src.path} holds another model ({src.model_name!r})")
        if layer not in src.layers:
            raise InterventionError(f"{option} source {src.path} does not store layer {layer}; it stores {src.layers}")
        if (path, layer) not in self._sources:
            self._sources[(path, layer)] = (src, pd.MultiIndex.from_frame(src.tokens[list(KEY_COLUMNS)]))
        return src

    @staticmethod
    def _check_keys(src: Cache, fmt: Format, group: str, sentence_counts: Sequence[int]) -> None:
        """Every special-token key of ``group`` in ``fmt`` must exist in the source format; word groups
        need the source to store words of the same sentences."""
        src_fmt = Format(src.manifest["format"]["name"], src.manifest["format"]["template"])
        roles = set(src.manifest.get("roles") or [])
        for k in sorted(set(sentence_counts)):
            r = _skeleton(fmt, k)
            s = _skeleton(src_fmt, k)
            have = set(zip(s.role, s.sentence.tolist(), s.index.tolist()))
            for pos in np.flatnonzero(rendered_mask(r, group)):
                key = (r.role[pos], int(r.sentence[pos]), int(r.index[pos]))
                if r.role[pos] not in roles or key not in have:
                    raise InterventionError(
                        f"--patch keys={group}: token {key[0]} (sentence {key[1]}, index {key[2]}) of format "
                        f"{fmt.name!r} has no counterpart in source {src.path} (format {src.format_name!r}, "
                        f"roles {sorted(roles)})")

    def on(self, model: torch.nn.Module) -> "Bound":
        """The same intervention on ``model``, a copy of the bound model (a CPU worker's replica, so
        that concurrent batches hook their own modules); sources and means are shared, read-only."""
        new = copy.copy(self)
        new.model = model
        new._attention, new._states, new.adapter = _sites(model, self.n_layers)
        return new

    # -- one forward pass ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def batch(self, rendered: Sequence[Rendered], corpus_index: Sequence[int], example_ids: Sequence[str],
              T: int, device: torch.device):
        """Hooks for one padded batch of ``rendered`` examples (``T`` positions each)."""
        handles = []
        try:
            masks = self._knockout_masks(rendered, example_ids, T)
            handles += hook_calls([(self._attention[layer - 1],
                                    _masking_hook(self.adapter, torch.from_numpy(m).to(device)))
                                   for layer, m in masks.items()], pre=True)
            edits = self._state_edits(rendered, corpus_index, T)
            handles += hook_calls([(self._states[layer], _replacing_hook(torch.from_numpy(flat).to(device),
                                                                         values.to(device)))
                                   for layer, (flat, values) in edits.items()])
            yield
        finally:
            for h in handles:
                h.remove()

    def _knockout_masks(self, rendered, example_ids, T) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for ko in self.intervention.knockouts:
            m = np.zeros((len(rendered), T, T), dtype=bool)
            for b, (r, eid) in enumerate(zip(rendered, example_ids)):
                n = len(r)
                m[b, :n, :n] = knockout_mask(r, ko, eid)
            if not m.any():
                continue  # nothing to mask: the forward pass is left exactly as it is
            for layer in ko.layers:
                out[layer] = out[layer] | m if layer in out else m
        return out

    def _state_edits(self, rendered, corpus_index, T) -> dict[int, tuple[np.ndarray, torch.Tensor]]:
        """Per hidden-state layer: flat positions (b * T + t) and their new values (n, hidden), patches
        first, then ablations (a later edit of the same position wins)."""
        edits: dict[int, list[tuple[np.ndarray, torch.Tensor]]] = {}
        for p in self.intervention.patches:
            src, index = self._sources[(p.source, p.layer)]
            flat, keys = [], []
            for b, (r, e) in enumerate(zip(rendered, corpus_index)):
                for t in np.flatnonzero(rendered_mask(r, p.keys)):
                    flat.append(b * T + t)
                    keys.append((e, r.role[t], int(r.sentence[t]), int(r.index[t]), int(r.subword[t])))
            if not flat:
                continue
            rows = index.get_indexer(pd.MultiIndex.from_tuples(keys, names=list(KEY_COLUMNS)))
            if (rows < 0).any():
                miss = keys[int(np.flatnonzero(rows < 0)[0])]
                raise InterventionError(f"--patch: key {miss} is not stored in source {src.path}")
            edits.setdefault(p.layer, []).append((np.asarray(flat), torch.from_numpy(src.states(p.layer, rows))))
        for i, a in enumerate(self.intervention.ablations):
            flat = np.concatenate([b * T + np.flatnonzero(rendered_mask(r, a.keys)) for b, r in enumerate(rendered)])
            if not flat.size:
                continue
            H = self.model.config.hidden_size
            value = self._means[i].float() if a.value == "mean" else torch.zeros(H)
            edits.setdefault(a.layer, []).append((flat, value.expand(len(flat), H)))
        return {layer: (np.concatenate([f for f, _ in parts]), torch.cat([v for _, v in parts]))
                for layer, parts in edits.items()}


def _masking_hook(adapter, mask: torch.Tensor):
    """A forward pre-hook that masks ``mask`` (batch, T, T) cells of the self-attention's scores, in every
    head, where the family's adapter says the mask enters."""
    knocked = mask[:, None]  # (B, 1, T, T): every head

    def hook(module, args, kwargs):
        return adapter.knock_out(args, kwargs, knocked)

    return hook


def _replacing_hook(flat: torch.Tensor, values: torch.Tensor):
    """A forward hook that replaces positions ``flat`` (b * T + t) of the module's output."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        new = hidden.clone()
        new.view(-1, new.shape[-1])[flat] = values.to(new.dtype)
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    return hook
