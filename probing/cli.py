"""Command-line plumbing shared by every command: the argument parser whose errors read ``error: ...``
and the output-directory check."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors, like every other bad input, print a first line
    ``error: PROG: MESSAGE`` (the message names the option and value) and exit with status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}\n{self.format_usage()}")


def check_output_dir(path: str | os.PathLike, option: str | None = "--out") -> Path:
    """Refuse, before anything is written, an output directory that cannot be created or written: a path
    through a file, an existing file, or a directory without write permission. Nothing is created here.
    Returns the path; raises ValueError naming the option (if given) and the path."""
    out = Path(path)
    name = f"{option} {str(out)!r}" if option else repr(str(out))
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "is a file" if probe == out else f"goes through {str(probe)!r}, which is a file"
        raise ValueError(f"{name} {where}; give a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: {str(probe)!r} is not writable")
    return out


def output_dir_arg(value: str) -> str:
    """argparse ``type=`` for an output directory option: :func:`check_output_dir` at parse time, so a
    command refuses an unwritable ``--out`` before it computes anything."""
    try:
        check_output_dir(value, None)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum``, else a usage error naming the value.

    >>> int_at_least(2)("3")
    3
    """
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r}: must be at least {minimum}")
        return number

    return parse


def positive_floats(value: str) -> list[float]:
    """An argparse ``type``: ``"0.003,0.01"`` -> ``[0.003, 0.01]``, each a positive finite number (with
    ``nargs="+"`` space-separated values work too)."""
    out = []
    for part in (v for v in value.split(",") if v.strip()):
        try:
            number = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number") from None
        if not (math.isfinite(number) and number > 0):
            raise argparse.ArgumentTypeError(f"{part!r}: must be a positive finite number")
        out.append(number)
    if not out:
        raise argparse.ArgumentTypeError(f"{value!r}: no value given")
    return out


def seed_list(value: str) -> list[int]:
    """An argparse ``type``: ``"0,1,2"`` -> ``[0, 1, 2]``, integers >= 0, at least one (``--train-seeds``).

    >>> seed_list("0, 1,2")
    [0, 1, 2]
    """
    try:
        seeds = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of integers") from None
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"{value!r}: give seeds >= 0, e.g. 0,1,2")
    return seeds


def positive_float(value: str) -> float:
    """An argparse ``type``: one positive finite number."""
    numbers = positive_floats(value)
    if len(numbers) != 1:
        raise argparse.ArgumentTypeError(f"{value!r}: one number expected")
    return numbers[0]
