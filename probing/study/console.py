"""``probing`` console script: one entry point for every command (each is also ``python -m MODULE``).

It sits at the top of the layers (it reaches every command), so it lives with the study, not in the
foundation package."""

from __future__ import annotations

import importlib
import sys

#: subcommand -> (module with a ``main(argv)``, one-line description). Declared once: dispatch and help.
#: tests/test_architecture.py finds every module with a ``main`` and fails if one is not reached here.
COMMANDS: dict[str, tuple[str, str]] = {
    "extract": ("probing.extract", "cache hidden states under input formats"),
    "study": ("probing.study", "run a whole study (TOML config): extract, analyse, figures, report"),
    "across": ("probing.study.across", "which answers hold on every model: compare finished studies"),
    "drift": ("analyses.drift", "cosine drift between two formats' caches"),
    "cka": ("analyses.cka", "CKA between formats, layers and token roles"),
    "probes": ("analyses.probes", "linear probes on cached states"),
    "attention": ("analyses.attention", "attention mass to [CLS]/[SEP] and between sentences"),
    "contextuality": ("analyses.contextuality", "self-similarity, intra-sentence similarity, MEV (Ethayarajh 2019)"),
    "neighbours": ("analyses.neighbours", "nearest-neighbour label agreement of pooled vectors"),
    "paired": ("analyses.paired", "paired differences between two conditions on the same items"),
    "interventions": ("analyses.interventions", "effects of knockouts, ablations and patches"),
    "pooling": ("analyses.finetune", "fine-tune with different pooling choices"),
    "pretrain": ("probing.pretrain", "pretrain BERT-architecture encoders from scratch, one choice changed at a time"),
    "why": ("probing.study.why", "the why study: pretrain variants, measure each, answer why [CLS] is first and more"),
    "calibration": ("analyses.calibration", "does a model pretrained here behave like BERT? (MLM, [SEP], anisotropy)"),
    "figures": ("figures.__main__", "draw a figure from a result table"),
}


def module_command(module: str) -> str:
    """How ``python -m`` names a module: a package's ``__main__`` by the package."""
    return module.removesuffix(".__main__")


def usage() -> str:
    width = max(map(len, COMMANDS)) + 2
    lines = ["usage: probing COMMAND [options]   (probing COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<{width}} {desc}   (python -m {module_command(mod)})" for name, (mod, desc) in COMMANDS.items()]
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
