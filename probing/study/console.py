"""``probing`` console script: one entry point for every command (each is also ``python -m MODULE``).

It sits at the top of the layers (it reaches every command), so it lives with the study, not in the
foundation package."""

from __future__ import annotations

import importlib
import sys

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
