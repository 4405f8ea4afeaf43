"""``python -m figures KIND TABLE.csv --out PATH [options]``: one entry point for every figure.

KIND is a key of :data:`KINDS`; the rest goes to that module's CLI (``python -m figures KIND --help``).
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

#: Figure kind -> (module, what it draws). Declared once: used for dispatch and the help text.
KINDS: dict[str, tuple[str, str]] = {
    "drift": ("figures.drift", "cosine drift between formats per layer and role group"),
    "cka": ("figures.cka", "CKA per layer (or a layer × layer matrix with --heatmap)"),
    "probes": ("figures.probes", "probe scores per layer (or per sentence position with --position)"),
    "attention": ("figures.attention", "attention mass per layer (or per head with --heads)"),
    "pooling": ("figures.pooling", "fine-tuned vs frozen accuracy per pooling choice"),
    "contextuality": ("figures.contextuality", "self-similarity, intra-similarity, MEV vs anisotropy per layer"),
    "interventions": ("figures.interventions", "knockout vs control effects, or the share a patch reproduces"),
    "change": ("figures.representation_change", "how far representations move under a change of input, per layer"),
}


def usage() -> str:
    lines = ["usage: python -m figures KIND TABLE.csv --out PATH [options]", "", "kinds:"]
    lines += [f"  {k:<10} {desc}" for k, (_, desc) in KINDS.items()]
    lines += ["", "python -m figures KIND --help shows the options of one kind."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    kind, rest = argv[0], argv[1:]
    if kind not in KINDS:
        print(f"error: unknown figure kind {kind!r}; valid: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    return importlib.import_module(KINDS[kind][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
