"""Handing freed memory back to the system, so a long run's resident size stays flat.

glibc keeps the pages of freed temporaries (its mmap threshold rises after the first large free) and
its heap fragments; pyarrow's allocator (mimalloc in its wheels) keeps freed pages per thread, out of
``malloc_trim``'s reach. Without the calls below the resident size of extraction and streaming grows
with the corpus although the live memory is flat (``benchmarks/memory.py``).
"""

from __future__ import annotations

import os
import sys
import time


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc/self/statm``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """A callable that hands freed heap pages back to the system (glibc ``malloc_trim(0)``; a no-op
    elsewhere). A trim costs milliseconds on a large heap, so it runs at most once per 20 times its own
    cost (under 5% of the time). With ``grow_mb`` it also waits until the resident size has grown that
    much since the last trim: pages handed back are faulted in again by the next allocations, a cost
    the trim's own time does not show, so a trim after every small batch would slow the work."""

    def __init__(self, grow_mb: float | None = None) -> None:
        self._grow = None if grow_mb is None else int(grow_mb * 2 ** 20)
        self._after = 0
        self._trim = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                self._trim = ctypes.CDLL("libc.so.6").malloc_trim
            except (OSError, AttributeError):
                pass
        self._last, self._cost = 0.0, 0.0

    def __call__(self) -> None:
        if self._trim is None:
            return
        now = time.perf_counter()
        if now - self._last < 20 * self._cost:
            return
        if self._grow is not None and rss_bytes() - self._after < self._grow:
            return
        self._trim(0)
        self._last = time.perf_counter()
        self._cost = self._last - now
        if self._grow is not None:
            self._after = rss_bytes()


def release_arrow_pages() -> None:
    """Ask Arrow's allocator to hand back the pages it keeps (``MemoryPool.release_unused``). pyarrow's
    default pool keeps freed pages per thread where ``malloc_trim`` cannot reach them; Parquet writing
    and pandas' Arrow-backed strings allocate there, so call it on the thread that allocated."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass


def hand_back_freed() -> None:
    """Hand back what glibc's heap and Arrow's pool keep of freed memory: between the phases of a long
    computation, so that the next phase's large temporaries do not come on top of the last one's
    leftovers (the per-token tables' pandas and Arrow scratch, say)."""
    HeapTrimmer()()
    release_arrow_pages()
