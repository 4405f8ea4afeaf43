"""The read side of the on-disk cache of hidden states: :class:`Cache`, and whether two caches may be
combined (:func:`check_comparable`, :func:`align`).

A cache is a directory of ``.npy`` shards (memory-mapped on read, loaded with ``allow_pickle=False``),
Parquet token tables and a JSON manifest; :mod:`probing.cache_layout` describes the layout, names and
checksums, :mod:`probing.cache_writer` writes it (atomically, under a lock). Nothing is pickled.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .cache_layout import (EXAMPLES, MANIFEST, REQUEST, SHARDS, CacheError, read_manifest, remembered_sha256,
                           sha256_file)
from .formats import KEY_COLUMNS

__all__ = ["Cache", "CacheError", "IncomparableCaches", "align", "check_comparable", "check_prefix", "describe_model",
           "find_caches"]


#: Bytes of stored rows read at a time by :meth:`Cache.states` before their pages are dropped again.
READ_CHUNK_BYTES = 8 << 20


def _release_pages(arr: np.ndarray) -> None:
    """Drop the resident pages of a read-only memory map (``madvise(MADV_DONTNEED)``; the data stays in the
    page cache and is faulted back in cheaply when read again). A no-op where that is not available."""
    mm = getattr(arr, "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mm is not None and advice is not None and hasattr(mm, "madvise"):
        mm.madvise(advice)


class LayerRows:
    """Rows of one layer of a cache, read on demand: a read-only ``(n_rows, hidden)`` float32 array-like.
    Indexing by a slice or an integer array returns an ndarray (:meth:`Cache.states` of those rows);
    ``np.asarray`` reads them all. Metrics that read their inputs in row blocks
    (:mod:`analyses.drift._metrics`) accept it as they accept a memory map (``lazy_rows`` says so)."""

    lazy_rows = True
    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, cache: "Cache", layer: int, rows: np.ndarray):
        self.cache, self.layer, self.rows = cache, layer, rows
        self.shape = (len(rows), cache.hidden_size)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            return self.cache.states(self.layer, self.rows[[key]])[0]
        return self.cache.states(self.layer, self.rows[key])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.cache.states(self.layer, self.rows)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"LayerRows(layer={self.layer}, shape={self.shape}, cache='{self.cache.path}')"


class IncomparableCaches(CacheError, ValueError):
    """Two caches cannot be combined in one measurement (see :func:`check_comparable`)."""


# ---------------------------------------------------------------------------------------------------
# Reading


@dataclass
class _Shard:
    record: dict
    start: int  # first global row
    stop: int


class Cache:
    """A complete cache, opened read-only.

    >>> cache = Cache.open("caches/all-MiniLM-L6-v2/pair-0123abcd4567ef89")   # doctest: +SKIP
    >>> cache.tokens.head()                           # one row per stored token   # doctest: +SKIP
    >>> X = cache.states(layer=6, rows=cache.rows(role="cls"))   # (n_examples, 384)  # doctest: +SKIP
    """

    def __init__(self, path: Path, manifest: dict, verify: bool = True):
        self.path = Path(path)
        self.manifest = manifest
        self.verify = verify
        self._arrays: dict[int, np.ndarray] = {}
        shards, start = [], 0
        for rec in manifest["shards"]:
            shards.append(_Shard(rec, start, start + rec["n_tokens"]))
            start += rec["n_tokens"]
        self._shards = shards
        self.n_tokens = start

    @classmethod
    def open(cls, path: str | os.PathLike, verify: bool = True) -> "Cache":
        """Open a complete cache. ``verify`` checks each shard's SHA-256 the first time it is read."""
        path = Path(path)
        mf = path / MANIFEST
        if not mf.exists():
            partial = (path / REQUEST).exists()
            raise CacheError(
                f"{path} is not a complete cache (no {MANIFEST})"
                + ("; an extraction was started there and did not finish: run it again to resume" if partial else "")
            )
        return cls(path, read_manifest(path), verify=verify)

    @classmethod
    def find(cls, root: str | os.PathLike = "caches", *, model: str | None = None, format: str | None = None,
             corpus: str | None = None, random_init: bool | None = False, intervened: bool | None = False,
             attention: bool | None = None, verify: bool = True) -> "Cache":
        """The one complete cache below ``root`` that matches, without copying a hashed directory name.

        ``model``: the model's name as recorded (``all-MiniLM-L6-v2``, a path's last part, or the name
        given to :func:`probing.models.prepare_model`); ``format``: the format's name; ``corpus``: the
        corpus spec or name it was extracted from (``generated:n=50,k=2``). ``random_init`` and
        ``intervened`` (a knockout, patch or ablation) default to False, ``attention`` to either; None
        matches either. No match or several is a :class:`CacheError` listing the caches there.

        >>> Cache.find("caches", model="all-MiniLM-L6-v2", format="pair", corpus="generated:n=50,k=2")  # doctest: +SKIP
        """
        want = {"model": model, "format": format, "corpus": corpus, "random_init": random_init,
                "intervened": intervened, "attention": attention}
        found = []
        for path in find_caches(root):
            facts = _cache_facts(read_manifest(path))
            if all(v is None or facts[k] == v for k, v in want.items()):
                found.append(path)
        if len(found) == 1:
            return cls.open(found[0], verify=verify)
        asked = ", ".join(f"{k}={v!r}" for k, v in want.items() if v is not None)
        if not found:
            present = [_cache_facts(read_manifest(p)) for p in find_caches(root)]
            listing = "; ".join(", ".join(f"{k}={v!r}" for k, v in f.items()) for f in present)
            raise CacheError(f"no cache below {str(root)!r} matches {asked}; "
                             + (f"there are: {listing}" if present else "there is no complete cache there"))
        raise CacheError(f"{len(found)} caches below {str(root)!r} match {asked}: "
                         + ", ".join(str(p) for p in found) + "; narrow it (e.g. corpus=, random_init=, "
                                                              "intervened=, attention=) or open one by path")

    # -- metadata -----------------------------------------------------------------------------------
    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def format_name(self) -> str:
        return self.manifest["format"]["name"]

    @property
    def model_name(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["model"]["hidden_size"])

    def __repr__(self) -> str:
        return (f"Cache({self.model_name!r}, format={self.format_name!r}, tokens={self.n_tokens}, "
                f"layers={self.layers}, path='{self.path}')")

    # -- token table ----------------------------------------------------------------------------------
    def _check(self, shard: _Shard, kind: str, remembered: bool = True) -> Path:
        if kind in ("states", "tokens"):
            fname, digest = shard.record[kind], shard.record[kind + "_sha256"]
        else:
            fname, digest = shard.record["extra"][kind]["file"], shard.record["extra"][kind]["sha256"]
        p = self.path / SHARDS / fname
        if not p.exists():
            raise CacheError(f"{self.path}: shard file {p.name} is missing")
        if self.verify and (remembered_sha256(p) if remembered else sha256_file(p)) != digest:
            raise CacheError(
                f"{self.path}: shard file {p.name} is damaged (SHA-256 does not match the manifest); "
                f"delete the cache or re-run the extraction with --force"
            )
        return p

    @cached_property
    def examples(self) -> pd.DataFrame:
        """The corpus: one row per example (skipped ones included), indexed by corpus position, with
        ``example_id``, ``sentence_<i>`` and ``label_<name>`` columns."""
        p = self.path / EXAMPLES
        if self.verify and remembered_sha256(p) != self.manifest["examples_sha256"]:
            raise CacheError(f"{self.path}: {EXAMPLES} is damaged (SHA-256 does not match the manifest)")
        return pd.read_parquet(p).set_index("example", drop=False)

    def labels(self, name: str, examples: np.ndarray | None = None) -> np.ndarray:
        """Label ``name`` of the given corpus indices (default: all examples)."""
        col = f"label_{name}"
        table = self.examples
        if col not in table.columns:
            have = [c[len("label_"):] for c in table.columns if c.startswith("label_")]
            raise KeyError(f"no label {name!r} in {self.path.name}; labels: {have}")
        values = table[col].to_numpy()
        return values if examples is None else values[np.asarray(examples)]

    @cached_property
    def tokens(self) -> pd.DataFrame:
        """One row per stored token, in storage order: key columns, position, token text, ...; the
        DataFrame index is the global row number used by :meth:`states`."""
        frames = [pd.read_parquet(self._check(s, "tokens")) for s in self._shards]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(KEY_COLUMNS))
        if len(df) != self.n_tokens:
            raise CacheError(f"{self.path}: token tables hold {len(df)} rows, manifest says {self.n_tokens}")
        return df

    def rows(self, **where: Any) -> np.ndarray:
        """Global row numbers of tokens matching every ``column=value`` (a value may be a list).

        >>> cache.rows(role="sep", occurrence=0)   # doctest: +SKIP
        """
        df = self.tokens
        mask = np.ones(len(df), dtype=bool)
        for col, val in where.items():
            if col not in df.columns:
                raise KeyError(f"no column {col!r} in the token table; columns: {list(df.columns)}")
            if isinstance(val, (list, tuple, set, np.ndarray)):
                mask &= df[col].isin(list(val)).to_numpy()
            else:
                mask &= (df[col] == val).to_numpy()
        return np.flatnonzero(mask)

    # -- states ----------------------------------------------------------------------------------------
    def _array(self, i: int) -> np.ndarray:
        if i not in self._arrays:
            p = self._check(self._shards[i], "states")
            self._arrays[i] = np.load(p, mmap_mode="r", allow_pickle=False)
        return self._arrays[i]

    def layer_index(self, layer: int) -> int:
        """Position of model layer ``layer`` (0 = embeddings; negative counts from the last) in storage."""
        n_model = int(self.manifest["model"]["n_layers"])
        if layer < 0:
            layer += n_model + 1
        try:
            return self.layers.index(layer)
        except ValueError:
            raise KeyError(f"layer {layer} is not in this cache; stored layers: {self.layers}") from None

    def states(self, layer: int | None = None, rows: Sequence[int] | np.ndarray | None = None,
               dtype=np.float32) -> np.ndarray:
        """States of ``rows`` (default: all) at model layer ``layer``: (n_rows, hidden).
        With ``layer=None``: every stored layer, (n_rows, n_layers_stored, hidden)."""
        li = None if layer is None else self.layer_index(layer)
        rows = np.arange(self.n_tokens) if rows is None else np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_tokens):
            raise IndexError(f"rows out of range [0, {self.n_tokens}): min {rows.min()}, max {rows.max()}")
        shape = (len(rows), self.hidden_size) if li is not None else (len(rows), len(self.layers), self.hidden_size)
        out = np.empty(shape, dtype=dtype)
        starts = np.asarray([s.start for s in self._shards], dtype=np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        for i in np.unique(which):
            sel = np.flatnonzero(which == i)
            local = rows[sel] - self._shards[i].start
            arr = self._array(int(i))
            # a stored row holds every layer, so reading one layer touches every page of the rows read, and the kernel
            # maps pages around each fault too (fault-around): read the rows that lie in one READ_CHUNK_BYTES window
            # of the shard at a time and drop those pages from this process afterwards (they stay in the page cache),
            # so the resident size stays bounded by the window however scattered the rows, instead of growing to the
            # size of every shard read
            order = np.argsort(local, kind="stable")
            window = local[order] // max(1, READ_CHUNK_BYTES // arr.strides[0])
            cuts = np.flatnonzero(np.r_[True, window[1:] != window[:-1], True])
            for c0, c1 in zip(cuts[:-1], cuts[1:]):
                part = order[c0:c1]
                out[sel[part]] = arr[local[part], li] if li is not None else arr[local[part]]
                _release_pages(arr)
        return out

    def layer_rows(self, layer: int, rows: Sequence[int] | np.ndarray | None = None) -> "LayerRows":
        """The states of ``rows`` at ``layer`` as a lazy (n_rows, hidden) float32 array-like (:class:`LayerRows`):
        nothing is read until it is indexed, so a metric that works in row blocks holds one block at a time."""
        self.layer_index(layer)
        rows = np.arange(self.n_tokens) if rows is None else np.asarray(rows, dtype=np.int64)
        return LayerRows(self, layer, rows)

    def iter_states(self, layer: int, rows: np.ndarray | None = None, batch_rows: int = 65536,
                    dtype=np.float32) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(rows_batch, states_batch)`` in order, a batch at a time, for analyses that stream."""
        rows = np.arange(self.n_tokens) if rows is None else np.asarray(rows, dtype=np.int64)
        for start in range(0, len(rows), batch_rows):
            r = rows[start:start + batch_rows]
            yield r, self.states(layer, r, dtype=dtype)

    def verify_all(self) -> None:
        """Check every shard file's checksum now, hashing each file again (raises :class:`CacheError`
        naming a damaged file)."""
        for s in self._shards:
            for kind in ["tokens", "states", *s.record.get("extra", {})]:
                self._check(s, kind, remembered=False)

    @property
    def has_attention(self) -> bool:
        return bool(self.manifest.get("attention"))

    def attention(self, weighting: str = "raw") -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Attention summaries recorded at extraction (``--attention``): ``(examples, mass, groups)``
        where ``mass[e, layer, head, a, b]`` is the attention mass from the tokens of group ``a`` to
        those of group ``b`` (summed over b's tokens, averaged over a's tokens; NaN where example e has
        no token in group a). ``examples`` holds corpus indices; layers are the model's layers 1..L.
        ``weighting="norm"``: the norm-based weights of ``--attention-norm`` (probing.attention_norm).
        All of it in memory: :meth:`attention_chunks` reads it a few examples at a time."""
        examples, groups, maps = self._attention_maps(weighting)
        # filled shard by shard from their memory maps: one copy of the summaries, not the shards plus their
        # concatenation
        out = np.empty((len(examples),) + maps[0].shape[1:], dtype=np.result_type(*maps))
        k = 0
        for m in maps:
            out[k:k + len(m)] = m
            k += len(m)
            _release_pages(m)
        return examples, out, groups

    def attention_chunks(self, weighting: str = "raw", examples_per_chunk: int = 256):
        """:meth:`attention` read ``examples_per_chunk`` examples at a time: ``(examples, groups,
        chunks)`` where ``chunks()`` yields ``(start, mass[start:start + m])`` over all examples in
        order (call it again for another pass); only one chunk is in memory at a time."""
        examples, groups, maps = self._attention_maps(weighting)
        dtype = np.result_type(*maps)

        def chunks():
            start = 0
            for m in maps:
                for k in range(0, len(m), examples_per_chunk):
                    part = np.array(m[k:k + examples_per_chunk], dtype=dtype)
                    _release_pages(m)  # the pages just read, so that a shard is never resident as a whole
                    yield start + k, part
                start += len(m)

        return examples, groups, chunks

    def _attention_maps(self, weighting: str) -> tuple[np.ndarray, list[str], list[np.ndarray]]:
        if not self.has_attention:
            raise CacheError(f"{self.path} holds no attention summaries; extract with --attention")
        if weighting not in ("raw", "norm"):
            raise ValueError(f"weighting must be 'raw' or 'norm', got {weighting!r}")
        if weighting == "norm" and not self.manifest.get("attention_norm"):
            raise CacheError(f"{self.path} holds no norm-based attention; extract with --attention-norm")
        kind = "attention" if weighting == "raw" else "attention_norm"
        ex = [e for s in self._shards for e in s.record["attention_examples"]]
        maps = [np.load(self._check(s, kind), mmap_mode="r", allow_pickle=False) for s in self._shards]
        if not maps:
            raise CacheError(f"{self.path} holds no shards")
        return np.asarray(ex, dtype=np.int64), list(self.manifest["attention"]["groups"]), maps


# ---------------------------------------------------------------------------------------------------
# Comparability: the one place that decides whether two caches may be combined

#: Model fields that describe the architecture, for caches written before ``architecture`` was recorded.
_ARCH_FIELDS = ("model_type", "n_layers", "hidden_size", "type_vocab_size")


def describe_model(model: Mapping[str, Any], fingerprint: bool = True) -> str:
    """``name (random init, seed s) [fingerprint]`` of a manifest's ``model`` entry (the label of result
    tables is the same without the fingerprint)."""
    return (model["name"] + (f" (random init, seed {model.get('seed')})" if model.get("random_init") else "")
            + (f" [{str(model.get('fingerprint', ''))[:12]}]" if fingerprint else ""))


def _architecture(model: Mapping[str, Any]) -> Any:
    return model.get("architecture") or {k: model.get(k) for k in _ARCH_FIELDS}


def check_comparable(a: "Cache", b: "Cache", *, same_model: bool = True, random_baseline: bool = False,
                     roles: Iterable[str] = (), same_format: bool = False) -> None:
    """Refuse to combine caches ``a`` and ``b`` whose tokens cannot be paired or whose comparison
    would not mean what the caller's table says. Raises :class:`IncomparableCaches` (a
    :class:`CacheError` and a ``ValueError``) naming both caches and every difference.

    Always: the same corpus (fingerprint), and every role in ``roles`` stored in both.
    ``same_model``: the same weights (model fingerprint), e.g. drift between two formats of one model.
    ``random_baseline``: ``b`` is the random-init baseline of ``a``: ``b`` has random weights and ``a``
    does not (by the manifests, and ``b``'s weights fingerprint is not ``a``'s: a trained cache whose
    manifest says random init is refused), the same architecture (``architecture`` hash of the config, or
    for older caches model type, layers, hidden size and token types), the same format (template and
    segments), and every layer and role ``a`` stores. Same model is not asked then (the weights differ by design).
    ``same_format``: the same format (name, template and segments), e.g. a run and its intervened run.
    """
    diffs = comparable_differences(a, b, same_model=same_model, random_baseline=random_baseline, roles=roles,
                                   same_format=same_format)
    if diffs:
        raise IncomparableCaches(f"cannot combine caches {a.path} and {b.path}: " + "; ".join(diffs))


def comparable_differences(a: "Cache", b: "Cache", *, same_model: bool = True, random_baseline: bool = False,
                           roles: Iterable[str] = (), same_format: bool = False) -> list[str]:
    """What :func:`check_comparable` refuses, as a list of differences (empty: comparable), for a check
    that reports them together with its own (:func:`probing.interventions.check_intervention`)."""
    ma, mb = a.manifest, b.manifest
    diffs = []
    ca, cb = ma["corpus"], mb["corpus"]
    if ca["fingerprint"] != cb["fingerprint"]:
        diffs.append(f"different corpora ({ca['name']!r}, {ca.get('n_examples')} examples, "
                     f"{ca['fingerprint'][:12]} vs {cb['name']!r}, {cb.get('n_examples')} examples, "
                     f"{cb['fingerprint'][:12]}): their examples cannot be paired")
    A, B = ma["model"], mb["model"]
    if random_baseline:
        if A.get("random_init"):
            diffs.append(f"the first cache is itself a random-init model ({describe_model(A)})")
        if not B.get("random_init"):
            diffs.append(f"the baseline cache holds trained weights ({describe_model(B)}), not a randomly "
                         f"initialised model (extract it with --random-init)")
        elif A["fingerprint"] == B["fingerprint"]:
            diffs.append(f"the baseline cache's manifest says random init, but its weights are the first cache's "
                         f"(fingerprint {str(A['fingerprint'])[:12]} in both): it is not a random-init baseline "
                         f"(extract one with --random-init)")
        if _architecture(A) != _architecture(B):
            diffs.append(f"different architectures ({_architecture(A)} vs {_architecture(B)})")
        if ma["format"] != mb["format"]:
            diffs.append(f"different formats ({ma['format'].get('name')!r} vs {mb['format'].get('name')!r})")
        missing = [l for l in ma["layers"] if l not in mb["layers"]]
        if missing:
            diffs.append(f"layers {missing} are not in the baseline cache (it stores {mb['layers']})")
        roles = [*roles, *ma.get("roles", ())]
    elif same_model and A["fingerprint"] != B["fingerprint"]:
        diffs.append(f"different models ({describe_model(A)} vs {describe_model(B)})")
    if same_format and not random_baseline and ma["format"] != mb["format"]:
        diffs.append(f"different formats ({ma['format'].get('name')!r} vs {mb['format'].get('name')!r})")
    for name, m in (("first", ma), ("second", mb)):
        lacking = sorted({r for r in roles if r not in m.get("roles", ())})
        if lacking:
            diffs.append(f"the {name} cache stores no {lacking} tokens (it stores {m.get('roles')})")
    return diffs


def _sentence_columns(examples: pd.DataFrame) -> list[str]:
    return sorted((c for c in examples.columns if c.startswith("sentence_")), key=lambda c: int(c.split("_")[1]))


def check_prefix(short: "Cache", long: "Cache") -> None:
    """Refuse to pair the tokens of ``short`` and ``long`` unless ``long``'s corpus extends ``short``'s:
    one model (fingerprint), the same examples in the same order (ids), and in each example the short
    corpus's sentences, verbatim, as the first sentences of the long one's (e.g. the first 2 and the
    first 5 sentences of the same documents, Q3). Then a token key of a shared sentence names the same
    word in both caches. Raises :class:`IncomparableCaches` naming both caches and what differs."""
    diffs = []
    A, B = short.manifest["model"], long.manifest["model"]
    if A["fingerprint"] != B["fingerprint"]:
        diffs.append(f"different models ({describe_model(A)} vs {describe_model(B)})")
    ea, eb = short.examples, long.examples
    sa, sb = _sentence_columns(ea), _sentence_columns(eb)
    if len(ea) != len(eb) or not np.array_equal(ea["example_id"].astype(str).to_numpy(),
                                                eb["example_id"].astype(str).to_numpy()):
        diffs.append(f"different examples ({len(ea)} vs {len(eb)}, or other ids or order)")
    elif len(sa) > len(sb):
        diffs.append(f"the first cache's examples have more sentences ({len(sa)}) than the second's ({len(sb)})")
    else:
        for c in sa:
            differ = ea[c].fillna("").astype(str).to_numpy() != eb[c].fillna("").astype(str).to_numpy()
            if differ.any():
                i = int(np.flatnonzero(differ)[0])
                diffs.append(f"{c} differs in {int(differ.sum())} examples (first: example "
                             f"{ea['example_id'].iloc[i]!r}: {ea[c].iloc[i]!r} vs {eb[c].iloc[i]!r})")
                break
    if diffs:
        raise IncomparableCaches(f"cannot pair caches {short.path} and {long.path} as a prefix and its "
                                 f"extension: " + "; ".join(diffs))


def align(a: Cache, b: Cache, rows_a: np.ndarray | None = None,
          on: Sequence[str] = KEY_COLUMNS, prefix: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pair the tokens of two caches by key: returns ``(rows_a, rows_b)``, equal-length arrays of row
    numbers such that ``a.tokens.iloc[rows_a[i]]`` and ``b.tokens.iloc[rows_b[i]]`` have the same key.
    Only keys present in both are kept, in ``a``'s order. The caches must hold the same corpus
    (:func:`check_comparable` with ``same_model=False``), or with ``prefix`` ``b``'s corpus must extend
    ``a``'s (:func:`check_prefix`)."""
    if prefix:
        check_prefix(a, b)
    else:
        check_comparable(a, b, same_model=False)
    rows = np.arange(a.n_tokens, dtype=np.int64) if rows_a is None else np.asarray(rows_a, dtype=np.int64)
    # keys as a MultiIndex (small integer codes per column) looked up in b's: the same pairs, in a's order, as an
    # inner merge, without a copy of both tables' key columns (a few hundred bytes per token at its peak)
    left = pd.MultiIndex.from_arrays([a.tokens[c].iloc[rows] if rows_a is not None else a.tokens[c] for c in on])
    right = pd.MultiIndex.from_arrays([b.tokens[c] for c in on])
    if not (left.is_unique and right.is_unique):
        raise pd.errors.MergeError("Merge keys are not unique in either left or right dataset; not a one-to-one merge")
    pos = right.get_indexer(left)
    found = pos >= 0
    return rows[found], pos[found].astype(np.int64)


def _cache_facts(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What :meth:`Cache.find` matches on, read from a manifest."""
    return {"model": manifest["model"]["name"], "format": manifest["format"]["name"],
            "corpus": manifest["corpus"]["name"], "random_init": bool(manifest["model"].get("random_init")),
            "intervened": "intervention" in manifest, "attention": bool(manifest.get("attention"))}


def find_caches(root: str | os.PathLike) -> list[Path]:
    """Every complete cache below ``root``."""
    return sorted(p.parent for p in Path(root).glob(f"*/*/{MANIFEST}"))
