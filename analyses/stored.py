"""Arrays kept in ``.npy`` files and read only when used.

The probes need one pooled vector per example for every (layer, token choice): for 100k examples of a
768-wide model that is 300 MB per feature set, and a study probes dozens of them. Held in memory
together they would make the peak grow with the corpus; :class:`StoredArray` keeps each in a file
and is read (by ``np.asarray``) only while its batch is solved (:func:`analyses.probes.probe_many_results`).
:class:`PooledStore` pools each (layer, choice) of a cache once, into a temporary directory, for all
the targets probed on it.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> a = StoredArray.save(np.arange(6.0).reshape(3, 2), f"{d}/a.npy")
>>> a.shape, np.asarray(a)[2].tolist(), a.take([2, 0]).shape
((3, 2), [4.0, 5.0], (2, 2))
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np


class StoredArray:
    """A 2-D array in a ``.npy`` file (no pickles), optionally a selection of its rows: ``shape`` and
    ``dtype`` without reading it, the array itself through ``np.asarray``. Reading is thread-safe
    (each read opens the file)."""

    def __init__(self, path: str | Path, rows: np.ndarray | None = None):
        self.path = Path(path)
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        header = np.load(self.path, mmap_mode="r", allow_pickle=False)  # reads the header only
        self.dtype = header.dtype
        self.shape = (len(self.rows) if self.rows is not None else header.shape[0],) + header.shape[1:]
        del header

    @classmethod
    def save(cls, array: np.ndarray, path: str | Path) -> "StoredArray":
        np.save(path, np.ascontiguousarray(array), allow_pickle=False)
        return cls(path)

    def take(self, rows: np.ndarray) -> "StoredArray":
        """The same file, rows ``rows`` (of this selection)."""
        rows = np.asarray(rows, dtype=np.int64)
        return StoredArray(self.path, rows if self.rows is None else self.rows[rows])

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = np.load(self.path, allow_pickle=False)
        if self.rows is not None:
            a = a[self.rows]
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"StoredArray({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"


class PooledStore:
    """``store(key)`` -> ``(examples, StoredArray)``: ``compute(key)`` (an ``(examples, X)`` pair)
    run once per key, its ``X`` written to a temporary directory (under ``TMPDIR``) that is removed
    by :meth:`close` (or at the end of a ``with`` block)."""

    def __init__(self, compute: Callable[[Hashable], tuple[np.ndarray, np.ndarray]], prefix: str = "probing-pooled-"):
        self.compute = compute
        self._dir = tempfile.TemporaryDirectory(prefix=prefix)
        self._done: dict[Hashable, tuple[np.ndarray, StoredArray]] = {}

    def __call__(self, key: Hashable) -> tuple[np.ndarray, StoredArray]:
        if key not in self._done:
            examples, X = self.compute(key)
            path = Path(self._dir.name, f"{len(self._done)}.npy")
            self._done[key] = (examples, StoredArray.save(X, path))
        return self._done[key]

    def close(self) -> None:
        self._done.clear()
        self._dir.cleanup()

    def __enter__(self) -> "PooledStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
