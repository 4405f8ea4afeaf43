"""The on-disk cache of hidden states: layout, atomic writes, checksums, and the read API.

Layout of one cache (one model x format x corpus x options)::

    <root>/<model-slug>/<format>-<key>/
        request.json                 what is being extracted (written first)
        shards/00000.npy             states of shard 0: (n_tokens, n_layers_stored, hidden), .npy
        shards/00000.tokens.parquet  its token table: one row per stored token, with its key
        shards/00000.json            its record: example range, row count, SHA-256 of both files
                                     (written last: a shard is complete iff its record exists)
        examples.parquet             the corpus: example index, id, sentences, label_<name> columns
        manifest.json                written when every shard is complete: the cache is complete

Every file is written to a temporary name and renamed into place, so an interrupted run leaves only
complete shards; the next run of the same request skips them and ends with the same bytes. Several
processes may write disjoint shards of one cache at once (one extractor per GPU); the manifest is
written once all are there. Nothing is pickled: states are ``.npy`` (memory-mapped on read, loaded
with ``allow_pickle=False``), tables are Parquet, metadata JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .formats import KEY_COLUMNS

MANIFEST = "manifest.json"
EXAMPLES = "examples.parquet"
REQUEST = "request.json"
SHARDS = "shards"
CACHE_VERSION = 1


class CacheError(RuntimeError):
    """A cache is incomplete, damaged, or does not match what was asked for."""


# ---------------------------------------------------------------------------------------------------
# Paths and keys


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def cache_key(request: Mapping[str, Any]) -> str:
    """Content hash of everything that determines a cache's contents (16 hex digits)."""
    return hashlib.sha256(_canonical(request)).hexdigest()[:16]


def slug(text: str) -> str:
    """A file-name-safe version of a model name: ``bert-base-uncased``, ``org--model``."""
    text = text.rstrip("/").replace("/", "--")
    text = re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)
    return text[-80:] or "model"


def cache_path(root: str | os.PathLike, request: Mapping[str, Any]) -> Path:
    """The one function that maps a request to its cache directory."""
    model = request["model"]
    name = model["name"] + ("-random-init-seed%s" % model["seed"] if model.get("random_init") else "")
    return Path(root) / slug(name) / f"{request['format']['name']}-{cache_key(request)}"


# ---------------------------------------------------------------------------------------------------
# Atomic writes


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename onto ``path``: readers see the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _write_npy(tmp: str, array: np.ndarray) -> None:
    with open(tmp, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def _write_parquet(tmp: str, df: pd.DataFrame) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp)


def shard_name(index: int) -> str:
    return f"{index:05d}"


def write_shard(cache_dir: Path, index: int, states: np.ndarray, tokens: pd.DataFrame,
                info: Mapping[str, Any], extra: Mapping[str, np.ndarray] | None = None) -> dict:
    """Write one shard's states, token table and ``extra`` arrays (e.g. attention summaries), then
    its record (last). Returns the record."""
    if len(tokens) != states.shape[0]:
        raise CacheError(f"shard {index}: {len(tokens)=} rows but {states.shape=}")
    d = Path(cache_dir) / SHARDS
    name = shard_name(index)
    atomic_write(d / f"{name}.npy", lambda tmp: _write_npy(tmp, states))
    atomic_write(d / f"{name}.tokens.parquet", lambda tmp: _write_parquet(tmp, tokens))
    extras = {}
    for key, arr in sorted((extra or {}).items()):
        fname = f"{name}.{key}.npy"
        atomic_write(d / fname, lambda tmp, arr=arr: _write_npy(tmp, arr))
        extras[key] = {"file": fname, "sha256": _sha256_file(d / fname)}
    record = dict(info)
    record["extra"] = extras
    record.update({
        "shard": index,
        "n_tokens": int(states.shape[0]),
        "states": f"{name}.npy",
        "tokens": f"{name}.tokens.parquet",
        "states_sha256": _sha256_file(d / f"{name}.npy"),
        "tokens_sha256": _sha256_file(d / f"{name}.tokens.parquet"),
    })
    write_json(d / f"{name}.json", record)
    return record


def complete_shards(cache_dir: Path, verify: bool = True, clean: bool = False) -> dict[int, dict]:
    """Records of shards already written (and, with ``verify``, whose checksums still match; damaged
    shards are dropped so they are written again). ``clean`` removes temporary files an interrupted
    run left behind: only call it when no other process is writing."""
    d = Path(cache_dir) / SHARDS
    if not d.is_dir():
        return {}
    if clean:
        for tmp in d.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
    out: dict[int, dict] = {}
    for rec_path in sorted(d.glob("[0-9]*.json")):
        try:
            rec = json.loads(rec_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if verify:
            files = [(rec[k], rec[k + "_sha256"]) for k in ("states", "tokens")]
            files += [(e["file"], e["sha256"]) for e in rec.get("extra", {}).values()]
            ok = all((d / f).exists() and _sha256_file(d / f) == h for f, h in files)
            if not ok:
                rec_path.unlink(missing_ok=True)
                continue
        out[int(rec["shard"])] = rec
    return out


def clear(cache_dir: Path) -> None:
    if Path(cache_dir).exists():
        shutil.rmtree(cache_dir)


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
        manifest = json.loads(mf.read_text(encoding="utf-8"))
        if manifest.get("cache_version") != CACHE_VERSION:
            raise CacheError(f"{path}: cache version {manifest.get('cache_version')} is not {CACHE_VERSION}")
        return cls(path, manifest, verify=verify)

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
    def _check(self, shard: _Shard, kind: str) -> Path:
        if kind in ("states", "tokens"):
            fname, digest = shard.record[kind], shard.record[kind + "_sha256"]
        else:
            fname, digest = shard.record["extra"][kind]["file"], shard.record["extra"][kind]["sha256"]
        p = self.path / SHARDS / fname
        if not p.exists():
            raise CacheError(f"{self.path}: shard file {p.name} is missing")
        if self.verify and _sha256_file(p) != digest:
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
        if self.verify and _sha256_file(p) != self.manifest["examples_sha256"]:
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
            out[sel] = arr[local, li] if li is not None else arr[local]
        return out

    def iter_states(self, layer: int, rows: np.ndarray | None = None, batch_rows: int = 65536,
                    dtype=np.float32) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(rows_batch, states_batch)`` in order, a batch at a time, for analyses that stream."""
        rows = np.arange(self.n_tokens) if rows is None else np.asarray(rows, dtype=np.int64)
        for start in range(0, len(rows), batch_rows):
            r = rows[start:start + batch_rows]
            yield r, self.states(layer, r, dtype=dtype)

    def verify_all(self) -> None:
        """Check every shard file's checksum now (raises :class:`CacheError` naming a damaged file)."""
        for s in self._shards:
            for kind in ["tokens", "states", *s.record.get("extra", {})]:
                self._check(s, kind)

    @property
    def has_attention(self) -> bool:
        return bool(self.manifest.get("attention"))

    def attention(self, weighting: str = "raw") -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Attention summaries recorded at extraction (``--attention``): ``(examples, mass, groups)``
        where ``mass[e, layer, head, a, b]`` is the attention mass from the tokens of group ``a`` to
        those of group ``b`` (summed over b's tokens, averaged over a's tokens; NaN where example e has
        no token in group a). ``examples`` holds corpus indices; layers are the model's layers 1..L.
        ``weighting="norm"``: the norm-based weights of ``--attention-norm`` (probing.attention_norm)."""
        if not self.has_attention:
            raise CacheError(f"{self.path} holds no attention summaries; extract with --attention")
        if weighting not in ("raw", "norm"):
            raise ValueError(f"weighting must be 'raw' or 'norm', got {weighting!r}")
        if weighting == "norm" and not self.manifest.get("attention_norm"):
            raise CacheError(f"{self.path} holds no norm-based attention; extract with --attention-norm")
        kind = "attention" if weighting == "raw" else "attention_norm"
        ex, arrs = [], []
        for s in self._shards:
            arrs.append(np.load(self._check(s, kind), allow_pickle=False))
            ex.extend(s.record["attention_examples"])
        return np.asarray(ex, dtype=np.int64), np.concatenate(arrs), list(self.manifest["attention"]["groups"])


def align(a: Cache, b: Cache, rows_a: np.ndarray | None = None,
          on: Sequence[str] = KEY_COLUMNS) -> tuple[np.ndarray, np.ndarray]:
    """Pair the tokens of two caches by key: returns ``(rows_a, rows_b)``, equal-length arrays of row
    numbers such that ``a.tokens.iloc[rows_a[i]]`` and ``b.tokens.iloc[rows_b[i]]`` have the same key.
    Only keys present in both are kept, in ``a``'s order. The caches must hold the same corpus."""
    ca, cb = a.manifest["corpus"]["fingerprint"], b.manifest["corpus"]["fingerprint"]
    if ca != cb:
        raise CacheError(f"cannot align caches of different corpora: {a.path} ({ca[:12]}) vs {b.path} ({cb[:12]})")
    ta = a.tokens[list(on)]
    if rows_a is not None:
        ta = ta.iloc[np.asarray(rows_a)]
    left = ta.reset_index(names="_row_a")
    right = b.tokens[list(on)].reset_index(names="_row_b")
    merged = left.merge(right, on=list(on), how="inner", sort=False, validate="one_to_one")
    return merged["_row_a"].to_numpy(np.int64), merged["_row_b"].to_numpy(np.int64)


def find_caches(root: str | os.PathLike) -> list[Path]:
    """Every complete cache below ``root``."""
    return sorted(p.parent for p in Path(root).glob(f"*/*/{MANIFEST}"))
