"""Values computed from a file, remembered for the rest of the process while the file is unchanged.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"; _ = p.write_text("x")
>>> FileMemo().get(p, lambda path: path.read_text())
'x'
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

#: A value is remembered only once its file's modification time lies this long (1 s) before the read began.
SETTLED_NS = 1_000_000_000


class FileMemo:
    """``memo.get(path, compute)``: ``compute(path)``, remembered by the file's (absolute path, size,
    modification time, inode), so a changed file is computed again. A value is remembered only once the
    file's modification time lies :data:`SETTLED_NS` before the read began: a change within the file
    system's time resolution can leave size and mtime as they were, and is then still seen. Threads may
    share a memo: ``compute`` runs outside any lock (two threads may both compute one new file's value),
    so a ``compute`` that is not thread-safe brings its own lock."""

    def __init__(self) -> None:
        self._values: dict[tuple, object] = {}

    @staticmethod
    def _key(path: Path) -> tuple[tuple, int]:
        st = os.stat(path)
        return (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino), st.st_mtime_ns

    def get(self, path: str | os.PathLike, compute: Callable[[Path], T]) -> T:
        path = Path(path)
        started = time.time_ns()
        key, mtime_ns = self._key(path)
        if key in self._values:
            return self._values[key]  # type: ignore[return-value]
        value = compute(path)
        if mtime_ns < started - SETTLED_NS:
            self._values[key] = value
        return value

    def put(self, path: str | os.PathLike, value: object) -> None:
        """Remember ``value`` for the file as it is now, settled or not: for a value its caller knows from
        the bytes it has just written there itself (a writer's checksum of a file it renamed into place).
        Only a change made in place within the same tick of the file system's clock and keeping the size
        would go unseen, which takes a second writer beside the one holding the file's lock."""
        self._values[self._key(Path(path))[0]] = value
