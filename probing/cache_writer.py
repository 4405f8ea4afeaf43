"""Writing a cache: atomic writes, shards and their records, the manifest, the writers' lock.

Every file is written to a temporary name and renamed into place, so an interrupted run leaves only
complete shards; the next run of the same request skips them and ends with the same bytes. Several
processes may write disjoint shards of one cache at once (one extractor per GPU); the manifest is
written once all are there. One extraction at a time holds a cache's lock (:class:`writer_lock`); an
independent second writer is refused instead of deleting the first one's temporaries. A run that
resumes keeps the shards :func:`complete_shards` finds intact. The layout and names are
:mod:`probing.cache_layout`'s.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from .cache_layout import (MANIFEST, MANIFEST_CHECKSUM, SHARDS, CacheError, manifest_checksum, remember_sha256,
                           sha256_file, shard_name)

__all__ = [
    "atomic_write", "clear", "complete_shards", "lock_path", "remove_temporaries", "write_json", "write_manifest",
    "write_shard", "writer_lock",
]


#: errno -> the words an out-of-space error is reported with (the disk is full, or the user's quota is).
_NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def _create_temporary(path: Path) -> str:
    """Create an empty, unique ``.<name>.<random>.tmp`` beside ``path`` and return its name. Created with mode
    0666 under the process's umask (and a directory's default ACL), as ``open`` creates any file: unlike
    ``tempfile.mkstemp``'s 0600, which the rename would keep, so that nobody else could read a shared cache."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
        except FileExistsError:
            continue
        return str(tmp)
    raise FileExistsError(errno.EEXIST, f"no unused temporary name beside {path}")


def no_space_error(err: OSError, path: Path) -> OSError:
    """``err`` as the toolkit reports a full disk (or quota): an ``OSError`` with the same errno whose message
    names ``path``; any other error unchanged."""
    if err.errno not in _NO_SPACE:
        return err
    out = OSError(f"cannot write {path}: {_NO_SPACE[err.errno]} (its temporary file was removed); free some space "
                  f"on that file system or write elsewhere")
    out.errno = err.errno  # (a filename too would make the message "[Errno 28] None: path")
    return out


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename onto ``path``: readers see the whole file or none. The file gets the
    mode any program's new file gets (0666 less the umask). A full disk (``ENOSPC``, or ``EDQUOT``) is an
    ``OSError`` naming ``path`` (:func:`no_space_error`); the temporary file is removed whatever fails."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _create_temporary(path)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            raise no_space_error(err, path) from err
        raise


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_manifest(cache_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` with its checksum (``manifest_sha256``) embedded; atomic."""
    write_json(Path(cache_dir) / MANIFEST, {**manifest, MANIFEST_CHECKSUM: manifest_checksum(manifest)})


def _write_npy(tmp: str, array: np.ndarray) -> None:
    with open(tmp, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def _npy_file_header(path: Path) -> bytes:
    """The header bytes of the ``.npy`` file at ``path`` (magic, version, length, dict, padding)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        read_header(f)
        n = f.tell()
        f.seek(0)
        return f.read(n)


def _npy_digest(header: bytes, array: np.ndarray) -> str:
    """SHA-256 of ``header`` followed by the C-contiguous ``array``'s bytes as they are in memory."""
    h = hashlib.sha256(header)
    h.update(memoryview(array.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def npy_sha256(path: Path, array: np.ndarray) -> str:
    """:func:`sha256_file` of the ``.npy`` file just written from the C-contiguous ``array``, without reading
    its data back: the header is read from the file and the data hashed from memory (a ``.npy`` file is its
    header, then the array's bytes as they are in memory). Falls back to reading the file when the sizes
    do not add up."""
    header = _npy_file_header(path)
    if not array.flags.c_contiguous or os.path.getsize(path) != len(header) + array.nbytes:
        return sha256_file(path)
    return _npy_digest(header, array)


#: Arrays from this size on are hashed on a second thread while the file is written (both release the GIL).
_HASH_ALONGSIDE_BYTES = 1 << 20


def _write_hashed_npy(path: Path, array: np.ndarray) -> str:
    """:func:`atomic_write` of ``array`` as ``.npy``; returns the file's SHA-256, hashed from memory with the
    header the file will have (a large array on another thread while the file is written and fsynced).
    The file's own header and size must then match, else the file itself is hashed (:func:`sha256_file`)."""
    array = np.ascontiguousarray(array)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(array))
    header = buf.getvalue()
    on_disk: list[tuple[bytes, int]] = []

    def write(tmp: str) -> None:
        _write_npy(tmp, array)
        on_disk.append((_npy_file_header(Path(tmp)), os.path.getsize(tmp)))

    if array.nbytes < _HASH_ALONGSIDE_BYTES:
        atomic_write(path, write)
        digest = _npy_digest(header, array)
    else:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(_npy_digest, header, array)
            atomic_write(path, write)
            digest = pending.result()
    if on_disk[0] != (header, len(header) + array.nbytes):
        return sha256_file(path)
    return digest


def _write_parquet(tmp: str, df: pd.DataFrame) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp)


def write_shard(cache_dir: Path, index: int, states: np.ndarray, tokens: pd.DataFrame,
                info: Mapping[str, Any], extra: Mapping[str, np.ndarray] | None = None) -> dict:
    """Write one shard's states, token table and ``extra`` arrays (e.g. attention summaries), then
    its record (last). Returns the record."""
    if len(tokens) != states.shape[0]:
        raise CacheError(f"shard {index}: {len(tokens)=} rows but {states.shape=}")
    d = Path(cache_dir) / SHARDS
    name = shard_name(index)
    digests = {f"{name}.npy": _write_hashed_npy(d / f"{name}.npy", states)}
    atomic_write(d / f"{name}.tokens.parquet", lambda tmp: _write_parquet(tmp, tokens))
    digests[f"{name}.tokens.parquet"] = sha256_file(d / f"{name}.tokens.parquet")
    extras = {}
    for key, arr in sorted((extra or {}).items()):
        fname = f"{name}.{key}.npy"
        digests[fname] = _write_hashed_npy(d / fname, arr)
        extras[key] = {"file": fname, "sha256": digests[fname]}
    # this process's readers (a study's analyses) need not read back what it has just written and hashed
    for fname, digest in digests.items():
        remember_sha256(d / fname, digest)
    record = dict(info)
    record["extra"] = extras
    record.update({
        "shard": index,
        "n_tokens": int(states.shape[0]),
        "states": f"{name}.npy",
        "tokens": f"{name}.tokens.parquet",
        "states_sha256": digests[f"{name}.npy"],
        "tokens_sha256": digests[f"{name}.tokens.parquet"],
    })
    write_json(d / f"{name}.json", record)
    return record


def remove_temporaries(cache_dir: Path) -> list[Path]:
    """Remove the temporary files (``.*.tmp``) an interrupted writer left in the cache directory (among them
    ``request.json``'s, from a run killed while writing it) and its ``shards/``; returns them. Only call it while
    holding :func:`writer_lock` and before this extraction's ranks start writing: then no live writer owns a
    temporary there."""
    d = Path(cache_dir)
    gone = [*d.glob(".*.tmp"), *(d / SHARDS).glob(".*.tmp")]
    for tmp in gone:
        tmp.unlink(missing_ok=True)
    return gone


def lock_path(cache_dir: Path) -> Path:
    """The lock file of a cache directory: beside it (``.<name>.lock``), so clearing the directory
    (``--force``) never removes a lock that is held."""
    cache_dir = Path(cache_dir)
    return cache_dir.parent / f".{cache_dir.name}.lock"


class writer_lock:
    """Exclusive lock of one cache directory for one extraction (``fcntl.flock`` on
    :func:`lock_path`, non-blocking).

    An independent second writer is refused at once with a :class:`CacheError` that names the
    directory and the holder's process id; it never waits and never touches the holder's files. The
    kernel drops the lock when its holder dies, so a killed run leaves no stale lock. Under torchrun
    only rank 0 takes it: the ranks of one extraction write disjoint shards inside it.

    >>> with writer_lock(path):           # doctest: +SKIP
    ...     ...  # clean temporaries, write shards, write the manifest
    """

    def __init__(self, cache_dir: Path):
        self.path = lock_path(cache_dir)
        self.cache_dir = Path(cache_dir)
        self._fd: int | None = None

    def __enter__(self) -> "writer_lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise CacheError(
                f"{self.cache_dir}: another extraction (process {holder}) is writing this cache; this one "
                f"is refused and leaves it alone. Wait for it to finish (then this request is already "
                f"cached), or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # empty at rest: the cache tree is the same bytes after any run
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def complete_shards(cache_dir: Path, verify: bool = True, clean: bool = False) -> dict[int, dict]:
    """Records of shards already written (and, with ``verify``, whose checksums still match; damaged
    shards are dropped so they are written again). ``clean`` removes temporary files an interrupted
    run left behind (:func:`remove_temporaries`): only under :func:`writer_lock`, before writing."""
    d = Path(cache_dir) / SHARDS
    if clean:  # also when there is no shards/ yet: a run killed while writing request.json left its temporary
        remove_temporaries(cache_dir)
    if not d.is_dir():
        return {}
    out: dict[int, dict] = {}
    for rec_path in sorted(d.glob("[0-9]*.json")):
        try:
            rec = json.loads(rec_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if verify:
            files = [(rec[k], rec[k + "_sha256"]) for k in ("states", "tokens")]
            files += [(e["file"], e["sha256"]) for e in rec.get("extra", {}).values()]
            ok = all((d / f).exists() and sha256_file(d / f) == h for f, h in files)
            if not ok:
                rec_path.unlink(missing_ok=True)
                continue
        out[int(rec["shard"])] = rec
    return out


def clear(cache_dir: Path) -> None:
    if Path(cache_dir).exists():
        shutil.rmtree(cache_dir)
