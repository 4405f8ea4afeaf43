"""The on-disk layout of a hidden-state cache: file names, the key and path of a request, checksums,
and reading and verifying the manifest.

Layout of one cache (one model x format x corpus x options)::

    <root>/<model-slug>/<format>-<key>/
        request.json                 what is being extracted (written first)
        shards/00000.npy             states of shard 0: (n_tokens, n_layers_stored, hidden), .npy
        shards/00000.tokens.parquet  its token table: one row per stored token, with its key
        shards/00000.json            its record: example range, row count, SHA-256 of both files
                                     (written last: a shard is complete iff its record exists)
        examples.parquet             the corpus: example index, id, sentences, label_<name> columns
        manifest.json                written when every shard is complete: the cache is complete;
                                     it holds the SHA-256 of its own canonical content
                                     (``manifest_sha256``), checked on open
    <root>/<model-slug>/.<format>-<key>.lock
                                     the writers' lock (empty at rest; see :class:`~probing.cache_writer.writer_lock`)

Writing lives in :mod:`probing.cache_writer`, reading in :mod:`probing.cache` (:class:`~probing.cache.Cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from .file_memo import FileMemo

__all__ = [
    "CACHE_VERSION", "EXAMPLES", "MANIFEST", "MANIFEST_CHECKSUM", "REQUEST", "SHARDS", "CacheError", "cache_key",
    "cache_path", "manifest_checksum", "read_json", "read_manifest", "sha256_file", "shard_name", "slug",
]

MANIFEST = "manifest.json"
EXAMPLES = "examples.parquet"
REQUEST = "request.json"
SHARDS = "shards"
#: 2: manifest.json carries ``manifest_sha256``, its own checksum (version 1 had none).
CACHE_VERSION = 2
MANIFEST_CHECKSUM = "manifest_sha256"


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
# Checksums and the manifest


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 (hex) of a file's bytes, read ``chunk`` bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


#: SHA-256 of the files this process has already hashed or written (:class:`probing.file_memo.FileMemo`: a
#: changed file, however small the change, is hashed again). Every analysis of a study opens its own
#: :class:`~probing.cache.Cache`, and each used to hash the shards it read again (9 s of a 75 s run of
#: Q1-Q2); the writer's own checksums of the files it has just written are remembered too
#: (:func:`remember_sha256`), so a study does not read back the caches it extracted a minute before
#: (about 11 GB, 11-20 s).
_HASHED = FileMemo()


def remembered_sha256(path: Path) -> str:
    """:func:`sha256_file`, remembered for an unchanged file (:data:`_HASHED`)."""
    return _HASHED.get(path, sha256_file)


def remember_sha256(path: Path, digest: str) -> None:
    """Remember ``digest`` as the SHA-256 of the file just written at ``path`` by this process (under the
    cache's writer lock, renamed into place whole): :func:`remembered_sha256` then answers without
    reading it (:meth:`probing.file_memo.FileMemo.put`)."""
    _HASHED.put(path, digest)


def read_json(path: Path) -> Any:
    """Parse a JSON file; a file that is not valid UTF-8 JSON raises :class:`CacheError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CacheError(f"{path} is damaged (not valid JSON: {err}); delete the cache directory "
                         f"{path.parent} or re-run the extraction with --force") from None


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of a manifest's canonical JSON (sorted keys, compact), its own checksum field left out."""
    return hashlib.sha256(_canonical({k: v for k, v in manifest.items() if k != MANIFEST_CHECKSUM})).hexdigest()


def read_manifest(cache_dir: Path) -> dict:
    """Read and verify ``manifest.json``: a damaged file (invalid JSON, a checksum that does not match
    its content, e.g. one flipped bit that relabels a layer) raises :class:`CacheError` naming it."""
    path = Path(cache_dir) / MANIFEST
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise CacheError(f"{path} is damaged (a JSON {type(manifest).__name__}, not an object)")
    version = manifest.get("cache_version")
    if MANIFEST_CHECKSUM not in manifest:
        if version == 1:
            raise CacheError(f"{path}: cache version 1 (written by an older probing, no manifest checksum) is "
                             f"not {CACHE_VERSION}; extract again (the new cache goes to a new directory)")
        raise CacheError(f"{path} is damaged: it has no {MANIFEST_CHECKSUM}; delete the cache directory or "
                         f"re-run the extraction with --force")
    if manifest_checksum(manifest) != manifest[MANIFEST_CHECKSUM]:
        raise CacheError(f"{path} is damaged (its content does not match its SHA-256 {MANIFEST_CHECKSUM}); "
                         f"delete the cache directory or re-run the extraction with --force")
    if version != CACHE_VERSION:
        raise CacheError(f"{path}: cache version {version} is not {CACHE_VERSION}")
    return manifest


def shard_name(index: int) -> str:
    """The file stem of shard ``index``: ``00000``."""
    return f"{index:05d}"
