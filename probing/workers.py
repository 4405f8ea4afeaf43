"""CPU work split across cores as single-threaded workers.

On a CPU with few cores, the operations of probing's work (a probe solver's products of a few
thousand rows, a forward pass over a 2,048-token batch) are too small for torch's intra-op threads to
pay: each parallel region hands work to the other cores and waits for them. Running independent
pieces of work side by side in Python threads, each with one torch thread, keeps every core busy on
its own piece (torch releases the GIL inside its operations). ``benchmarks/probe_speed.py`` and
``benchmarks/extract_throughput.py`` measure both ways.

Each worker sets one torch thread for itself; torch's (process-wide) thread count is restored when
the work ends, and the heap pages the workers freed are handed back (glibc keeps them in each
thread's malloc arena otherwise). Results come back in the order of the inputs, so they do not depend on which worker
ran what.

>>> thread_map(lambda x: x * x, [1, 2, 3], workers=2)
[1, 4, 9]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .heap import HeapTrimmer

T = TypeVar("T")
R = TypeVar("R")


def cpu_workers(num_threads: int | None) -> int:
    """How many single-threaded workers ``num_threads`` asks for: None means torch's own thread count
    (by default the machine's cores); at least 1."""
    import torch

    n = torch.get_num_threads() if num_threads is None else int(num_threads)
    if n < 1:
        raise ValueError(f"num_threads must be >= 1, got num_threads={num_threads!r}")
    return n


def split(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` dealt back and forth into at most ``parts`` non-empty lists: first to last, then last
    to first, and so on. Neighbours, which tend to cost alike, go to different workers, and where the
    cost drifts along the list (a trend over layers, or a repeating pattern such as token choices
    ordered by a cost within each layer) the lists come out closer in total than dealt round-robin.

    >>> split(list(range(8)), 2)
    [[0, 3, 4, 7], [1, 2, 5, 6]]
    """
    parts = max(1, min(parts, len(items)))
    out: list[list[T]] = [[] for _ in range(parts)]
    for i, x in enumerate(items):
        turn, at = divmod(i, parts)
        out[at if turn % 2 == 0 else parts - 1 - at].append(x)
    return out


def thread_map(fn: Callable[[T], R], items: Iterable[T], workers: int | None) -> list[R]:
    """``[fn(x) for x in items]``, computed by ``workers`` threads of one torch thread each (``workers``
    1: in the calling thread, on one torch thread; None: in the calling thread with torch's threads as
    they are, e.g. for work on a GPU or work that cannot be split)."""
    return list(thread_imap(fn, items, workers))


def thread_imap(fn: Callable[[T], R], items: Iterable[T], workers: int | None) -> Iterator[R]:
    """:func:`thread_map` as an iterator: results in input order as they become available; at most
    ``2 * workers`` items are in flight (submitted and not yet consumed), so memory stays bounded
    whatever the number of items."""
    import torch

    items = iter(items)
    if workers is None:
        for x in items:
            yield fn(x)
        return

    def run(x: T) -> R:
        torch.set_num_threads(1)
        return fn(x)

    before = torch.get_num_threads()
    pending = []
    try:
        if workers <= 1:
            for x in items:
                yield run(x)
            return
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for x in items:
                pending.append(pool.submit(run, x))
                if len(pending) >= 2 * workers:
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()
    finally:
        for f in pending:
            f.cancel()
        torch.set_num_threads(before)
        if workers > 1:  # what the workers freed stays in their malloc arenas until trimmed
            HeapTrimmer()()
