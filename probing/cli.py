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


def check_output_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Refuse, before anything is written, an output directory that cannot be created or written: a path
    through a file, an existing file, or a directory without write permission. Nothing is created here.
    Returns the path; raises ValueError naming the option and the path."""
    out = Path(path)
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "is a file" if probe == out else f"goes through {str(probe)!r}, which is a file"
        raise ValueError(f"{option} {str(out)!r} {where}; give a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {str(out)!r}: {str(probe)!r} is not writable")
    return out


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
