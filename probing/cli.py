"""``probing`` console script: one entry point for every command (each is also ``python -m MODULE``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

#: subcommand -> (module with a ``main(argv)``, one-line description). Declared once.
COMMANDS: dict[str, tuple[str, str]] = {
    "extract": ("probing.extract", "cache hidden states under input formats"),
    "study": ("probing.study", "run a whole study (TOML config): extract, analyse, figures, report"),
    "drift": ("analyses.drift", "cosine drift between two formats' caches"),
    "cka": ("analyses.cka", "CKA between formats, layers and token roles"),
    "probes": ("analyses.probes", "linear probes on cached states"),
    "attention": ("analyses.attention", "attention mass to [CLS]/[SEP] and between sentences"),
    "pooling": ("analyses.pooling", "fine-tune with different pooling choices"),
}


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


def usage() -> str:
    lines = ["usage: probing COMMAND [options]   (probing COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<10} {desc}   (python -m {mod})" for name, (mod, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
