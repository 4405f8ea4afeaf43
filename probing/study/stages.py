"""Wall time, CPU time and peak memory per stage of a study (extraction, each section's analyses, figures,
report). CPU time (``time.process_time``: every thread of the process, user and system) is less
sensitive than wall time to other jobs on a shared machine; CPU / wall tells how many cores a stage kept busy.

Peak resident memory per stage comes from Linux's high-water mark: writing ``5`` to
``/proc/self/clear_refs`` resets ``VmHWM`` (``/proc/self/status``) to the current RSS (Linux >= 4.0), so
reading ``VmHWM`` at the end of a stage gives that stage's own peak. Where the file cannot be written
(another OS, a sandbox), the fallback is ``resource.getrusage(RUSAGE_SELF).ru_maxrss``: the peak since
the process started, so a stage shows the largest peak so far, not its own. The table says which was
used in its ``rss_method`` column. The reset also lowers what ``getrusage`` reports for the whole
process (the kernel keeps one high-water mark), so the run's peak is the largest stage peak
(:meth:`Stages.run_peak_mb`).

    >>> stages = Stages()
    >>> with stages.stage("sum"):
    ...     _ = sum(range(1000))
    >>> list(stages.table().columns)
    ['stage', 'seconds', 'cpu_seconds', 'peak_rss_mb', 'rss_method']
"""

from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from ..heap import hand_back_freed

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
#: ``rss_method`` values: what ``peak_rss_mb`` means in each row.
PER_STAGE = "VmHWM reset per stage (/proc/self/clear_refs)"
SINCE_START = "ru_maxrss: peak since the process started (clear_refs not writable)"


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark; False where the kernel or sandbox does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return vm_hwm_mb() is not None


def vm_hwm_mb() -> float | None:
    """``VmHWM`` of ``/proc/self/status`` in MiB (None where there is no such file or line)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def max_rss_mb() -> float:
    """Peak RSS since the process started, in MiB (``ru_maxrss`` is kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class Stages:
    """Records one row per stage: ``with stages.stage("figures"): ...``."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    @contextmanager
    def stage(self, name: str):
        # hand the heap pages earlier stages freed back first (glibc and Arrow keep them otherwise, also
        # in the arenas of finished worker threads), so that a stage's peak is its own and not what an
        # earlier stage left behind
        hand_back_freed()
        per_stage = reset_peak_rss()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            peak = vm_hwm_mb() if per_stage else None
            self.rows.append({"stage": name, "seconds": seconds, "cpu_seconds": time.process_time() - cpu,
                              "peak_rss_mb": peak if peak is not None else max_rss_mb(),
                              "rss_method": PER_STAGE if peak is not None else SINCE_START})

    def add(self, name: str, seconds: float, cpu_seconds: float, peak_rss_mb: float, rss_method: str) -> None:
        """A row measured elsewhere (the analyses' worker processes, :mod:`probing.study.parallel`)."""
        self.rows.append({"stage": name, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_mb": peak_rss_mb,
                          "rss_method": rss_method})

    def table(self) -> pd.DataFrame:
        """One row per stage, in the order they ran: ``stage, seconds, cpu_seconds, peak_rss_mb, rss_method``."""
        return pd.DataFrame(self.rows, columns=["stage", "seconds", "cpu_seconds", "peak_rss_mb", "rss_method"])

    def run_peak_mb(self) -> float:
        """The whole run's peak RSS in MiB: the largest stage peak. Not ``ru_maxrss`` once a stage has
        reset the high-water mark: the kernel keeps one mark, which ``getrusage`` also reads, so after
        a reset ``ru_maxrss`` (and ``/usr/bin/time``) no longer report the peak since the start."""
        return max([r["peak_rss_mb"] for r in self.rows] + [0.0]) if self.rows else max_rss_mb()

    def lines(self, total: float | None = None) -> list[str]:
        """The table as aligned text lines (for the log), with a total row when ``total`` is given."""
        width = max([len(r["stage"]) for r in self.rows] + [len("stage"), len("total")])
        out = [f"{'stage':<{width}}  {'wall s':>8}  {'CPU s':>8}  {'peak RSS MiB':>12}"]
        out += [f"{r['stage']:<{width}}  {r['seconds']:8.1f}  {r['cpu_seconds']:8.1f}  {r['peak_rss_mb']:12.0f}"
                for r in self.rows]
        if total is not None:
            cpu = sum(r["cpu_seconds"] for r in self.rows)
            out.append(f"{'total':<{width}}  {total:8.1f}  {cpu:8.1f}  {self.run_peak_mb():12.0f}")
        methods = sorted({r["rss_method"] for r in self.rows})
        out.append("peak RSS: " + "; ".join(methods))
        return out

    def summary(self) -> "StageSummary":
        return StageSummary(self.table())


class StageSummary:
    """The stage table as a report's provenance holds it: a table in Markdown (:meth:`display`), one
    line wherever the report prints a provenance value as text (``str``)."""

    def __init__(self, table: pd.DataFrame) -> None:
        self.table = table

    @property
    def methods(self) -> str:
        return "; ".join(sorted(set(self.table["rss_method"])))

    def display(self) -> pd.DataFrame:
        """The rows with formatted numbers: ``stage``, ``wall time (s)``, ``peak RSS (MiB)``."""
        return pd.DataFrame({"stage": self.table["stage"],
                             "wall time (s)": [f"{v:.1f}" for v in self.table["seconds"]],
                             "peak RSS (MiB)": [f"{v:.0f}" for v in self.table["peak_rss_mb"]]})

    def __str__(self) -> str:
        parts = [f"{r.stage} {r.seconds:.1f} s, {r.peak_rss_mb:.0f} MiB" for r in self.table.itertuples()]
        return "; ".join(parts) + f" (wall time and peak RSS; {self.methods})"
