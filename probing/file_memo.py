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

    def get(self, path: str | os.PathLike, compute: Callable[[Path], T]) -> T:
        path = Path(path)
        started = time.time_ns()
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if key in self._values:
            return self._values[key]  # type: ignore[return-value]
        value = compute(path)
        if st.st_mtime_ns < started - SETTLED_NS:
            self._values[key] = value
        return value
