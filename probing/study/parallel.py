"""The sections' analyses side by side in worker processes, one core each (the scale issue's goal 3).

The analyses of different questions are independent: each reads the caches and the fine-tuning predictions
and writes its tables to the study's result store (:func:`analyses.results.result_path`). On a CPU with
several cores, :func:`analyse_in_workers` forks one process per group of sections (sections that share a
table, such as Q3 and Q5's ``sentence_content``, form one group), at most ``workers`` at a time, longest
first, each with one torch and one BLAS thread. A worker only fills the result store; the runner's usual pass
over the sections then reads every table back from it, decides the rows and writes the named tables. So the
tables are the same whether the workers ran or not, a worker that fails costs its time and nothing else (its
sections are computed again in the runner's pass, and the failure is logged), and one worker (``threads = 1``)
is exactly the serial run.

The work is forked, not spawned: a worker starts with the runner's corpora, caches, model and fine-tuning
predictions already in memory (shared with the runner until written), and nothing is pickled. Forking is done on
Linux only, and not where CUDA is in use (a forked process cannot use it).

Memory: the processes share the pages they inherit, so their summed RSS counts those pages several times.
While the workers run, a thread samples the proportional set size (Pss, ``/proc/<pid>/smaps_rollup``, Linux
>= 4.14) of the runner and its workers every ``SAMPLE_SECONDS`` and keeps the largest sum; where that file
cannot be read, the sum of the runner's peak and the peaks of the workers running at once is kept, an upper
bound. The stage row says which (:data:`PSS_SAMPLED`, :data:`RSS_BOUND`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

#: How often the memory of the runner and its workers is sampled, seconds.
SAMPLE_SECONDS = 0.2
#: ``rss_method`` of the workers' stage row: how its peak memory was measured.
PSS_SAMPLED = f"sum of the runner's and the workers' Pss (/proc/<pid>/smaps_rollup), sampled every {SAMPLE_SECONDS} s"
RSS_BOUND = ("the runner's peak plus the peaks of the workers running at once: an upper bound (shared pages counted "
             "in each)")
#: ``rss_method`` of a worker's own row.
WORKER_RSS = "the worker's ru_maxrss (pages shared with the runner included)"
#: The suffix of a worker's row in the stage table: ``analyses Q3+Q5 (worker)``.
WORKER_SUFFIX = " (worker)"


@dataclass
class WorkerRun:
    """One forked worker: the sections it computed, its wall and CPU seconds, peak RSS and exit status."""

    keys: tuple[str, ...]
    seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    status: int

    @property
    def stage(self) -> str:
        return "analyses " + "+".join(self.keys) + WORKER_SUFFIX


def can_fork(device: str) -> bool:
    """Whether the analyses may be forked: on Linux (macOS's system libraries are not safe to use in a forked
    child of a threaded process, and Windows has no fork), and not where CUDA is in use."""
    if not (sys.platform.startswith("linux") and hasattr(os, "fork")):
        return False
    if device != "cpu":
        return False
    import torch

    return not torch.cuda.is_initialized()


def default_workers() -> int:
    """One worker per core this process may use (its CPU affinity), at most torch's thread count (which
    ``OMP_NUM_THREADS`` sets): the cores the analyses would otherwise have had."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, torch.get_num_threads()))


def groups(sections: Sequence, preset: Sequence[str] = ()) -> list[list]:
    """``sections`` in groups that share no table: two sections that declare the same table (in their
    ``tables``, other than those already in ``preset``) go to one group, so a shared table is computed once.
    Groups keep the sections' order.

    >>> from types import SimpleNamespace as S
    >>> [[s.key for s in g] for g in groups([S(key="Q3", tables=("a", "b")), S(key="Q4", tables=("c",)),
    ...                                      S(key="Q5", tables=("a", "d"))])]
    [['Q3', 'Q5'], ['Q4']]
    """
    out: list[list] = []
    owner: dict[str, int] = {}
    for s in sections:
        shared = {owner[t] for t in s.tables if t not in preset and t in owner}
        if not shared:
            out.append([s])
            at = len(out) - 1
        else:
            at = min(shared)
            for other in sorted(shared - {at}, reverse=True):  # a section that joins two groups merges them
                out[at] += out.pop(other)
                owner = {t: (at if g == other else g - (g > other)) for t, g in owner.items()}
            out[at].append(s)
        for t in s.tables:
            if t not in preset:
                owner[t] = at
    order = {id(s): i for i, s in enumerate(sections)}
    return [sorted(g, key=lambda s: order[id(s)]) for g in out]


def previous_costs(stages_csv: Path) -> dict[str, float]:
    """``{section key: seconds}`` from an earlier run's stage table: its workers' rows where it had them,
    else its per-section rows (``analyses Q4``). Empty when there is no readable table."""
    try:
        table = pd.read_csv(stages_csv)
    except (OSError, ValueError):
        return {}
    costs: dict[str, float] = {}
    for stage, seconds in zip(table["stage"], table["seconds"]):
        stage = str(stage)
        if not stage.startswith("analyses "):
            continue
        name = stage[len("analyses "):]
        worker = name.endswith(WORKER_SUFFIX)
        keys = name[:-len(WORKER_SUFFIX)].split("+") if worker else [name]
        for k in keys:  # a worker's time is shared out evenly over its sections
            if worker or k not in costs:
                costs[k] = float(seconds) / len(keys)
    return costs


def longest_first(jobs: list[list], costs: dict[str, float]) -> list[list]:
    """``jobs`` ordered by their cost in ``costs`` (unknown sections count as the longest known one, so new
    work starts early), longest first; ties keep their order."""
    top = max(costs.values(), default=0.0)
    cost = [sum(costs.get(s.key, top) for s in job) for job in jobs]
    return [jobs[i] for i in sorted(range(len(jobs)), key=lambda i: -cost[i])]


def _pss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class _MemorySampler(threading.Thread):
    """Samples the summed Pss of this process and the live workers until stopped; ``peak`` is the largest sum
    (None when Pss could not be read)."""

    def __init__(self, pids: Callable[[], list[int]]):
        super().__init__(daemon=True)
        self.pids, self.peak, self.stopped = pids, None, threading.Event()

    def run(self) -> None:
        while True:
            values = [_pss_mb(p) for p in [os.getpid(), *self.pids()]]
            if values[0] is not None:
                total = sum(v for v in values if v is not None)
                self.peak = total if self.peak is None else max(self.peak, total)
            if self.stopped.wait(SAMPLE_SECONDS):
                return


def check_shards(cache_dirs, workers: int) -> int:
    """Hash every file of the caches in ``cache_dirs`` (their example tables and shards) once, ``workers`` at a
    time, into this process's memo of checked files (:func:`probing.cache_layout.remembered_sha256`), which the
    forked workers inherit: otherwise each worker that opens a cache checks its shards again (a study one after
    another checks each once). Returns the number of files; a damaged file is left for the analysis that reads it
    to report."""
    from probing.cache_layout import EXAMPLES, SHARDS, read_manifest, remembered_sha256
    from probing.workers import thread_map

    files = []
    for d in dict.fromkeys(Path(p) for p in cache_dirs):
        files.append(d / EXAMPLES)
        for rec in read_manifest(d)["shards"]:
            files += [d / SHARDS / rec["tokens"], d / SHARDS / rec["states"]]
            files += [d / SHARDS / extra["file"] for extra in rec.get("extra", {}).values()]
    thread_map(remembered_sha256, [f for f in files if f.is_file()], workers)
    return len(files)


def _wait_any(running: dict) -> tuple[int, int, "os.struct_rusage"]:
    """The first of the ``running`` workers to end: ``(pid, wait status, its resource usage)``. Only these pids
    are waited for, so a child process that other code of the runner started is left to that code."""
    while True:
        for pid in running:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done == pid:
                return pid, status, usage
        time.sleep(0.05)


def _child(job: list, ctx, log: Callable[[str], None]) -> int:
    """What a forked worker runs: its sections' analyses with one thread of each pool; the exit status."""
    try:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            mine = replace(ctx, tables=dict(ctx.tables), progress=False, log=log)
            for i, s in enumerate(job):
                mine.later = tuple(t for later in job[i + 1:] for t in later.tables)
                s.analyse(mine)
        return 0
    except BaseException:  # noqa: BLE001 - reported, and the runner computes these sections itself
        traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def analyse_in_workers(sections: Sequence, ctx, workers: int, log: Callable[[str], None] = print,
                       costs: dict[str, float] | None = None) -> tuple[list[WorkerRun], dict]:
    """Run the ``sections``' analyses in at most ``workers`` forked processes (see the module docstring), filling
    the result store of ``ctx``, after checking every cache file once here (:func:`check_shards`). Returns each
    worker's :class:`WorkerRun` (in the order they finished) and the stage row of the whole pass (``seconds``,
    ``cpu_seconds``: the workers' and the runner's, ``peak_rss_mb``, ``rss_method``)."""
    jobs = longest_first(groups(sections, preset=tuple(ctx.tables)), costs or {})
    start, cpu = time.perf_counter(), time.process_time()
    checked = check_shards(getattr(ctx.caches, "paths", {}).values(), workers)
    log(f"analyses: checked the checksums of {checked} cache files before forking")
    running: dict[int, tuple[list, float]] = {}
    done: list[WorkerRun] = []
    sampler = _MemorySampler(lambda: list(running))
    intervals: list[tuple[float, float, float]] = []  # (start, end, peak MiB) of each worker, for the bound
    sampler.start()
    try:
        while jobs or running:
            while jobs and len(running) < workers:
                job = jobs.pop(0)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # the worker
                    os._exit(_child(job, ctx, log))
                running[pid] = (job, time.perf_counter())
            pid, status, usage = _wait_any(running)
            job, began = running.pop(pid)
            ended = time.perf_counter()
            peak = usage.ru_maxrss / 1024  # kB on Linux
            run = WorkerRun(tuple(s.key for s in job), ended - began, usage.ru_utime + usage.ru_stime, peak,
                            os.waitstatus_to_exitcode(status))
            intervals.append((began, ended, peak))
            done.append(run)
            if run.status != 0:
                log(f"the worker for {'+'.join(run.keys)} failed (exit status {run.status}); its analyses run in "
                    "the runner instead")
            else:
                log(f"analyses {'+'.join(run.keys)} done in a worker: {run.seconds:.1f} s")
    finally:  # interrupted (Ctrl-C, an error here): no worker outlives the pass
        for pid in running:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass
        sampler.stopped.set()
        sampler.join()
    seconds = time.perf_counter() - start
    runner_cpu = time.process_time() - cpu
    if sampler.peak is not None:
        peak, method = sampler.peak, PSS_SAMPLED
    else:
        from .stages import max_rss_mb, vm_hwm_mb

        at_once = [sum(p for b, e, p in intervals if b <= t < e) for t, _, _ in intervals]
        peak = (vm_hwm_mb() or max_rss_mb()) + max(at_once + [0.0])
        method = RSS_BOUND
    row = {"seconds": seconds, "cpu_seconds": runner_cpu + sum(r.cpu_seconds for r in done),
           "peak_rss_mb": peak, "rss_method": method}
    return done, row
