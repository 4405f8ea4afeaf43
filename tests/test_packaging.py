"""setup.cfg declares what the code imports, and imports what it declares."""

from __future__ import annotations

import ast
import configparser
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OWN = {"probing", "analyses", "figures"}


def _requirements(text: str) -> set[str]:
    names = set()
    for line in text.strip().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)", line)
        if m:
            names.add(m.group(1).lower().replace("_", "-"))
    return names


def _imported_distributions() -> dict[str, set[str]]:
    """distribution name -> files importing it, over the three packages' modules."""
    dists = packages_distributions()
    out: dict[str, set[str]] = {}
    for path in (p for pkg in OWN for p in (REPO / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for top in {m.split(".")[0] for m in modules} - OWN - set(sys.stdlib_module_names):
                for dist in dists.get(top, [top]):
                    out.setdefault(dist.lower().replace("_", "-"), set()).add(str(path.relative_to(REPO)))
    return out


def test_declared_dependencies_match_the_imports():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    required = _requirements(setup["options"]["install_requires"])
    extras = {name: _requirements(text) for name, text in setup["options.extras_require"].items()}
    imported = _imported_distributions()
    optional = set().union(*(reqs for name, reqs in extras.items() if name != "dev"))
    undeclared = {d: sorted(files) for d, files in imported.items() if d not in required | optional}
    assert undeclared == {}, f"imported but not declared: {undeclared}"
    # tokenizers: the fast tokenizers the toolkit requires (word ids, offsets) come from it; tomli: Python 3.10
    unused = required - set(imported) - {"tokenizers", "tomli"}
    assert unused == set(), f"declared but never imported: {unused}"
    assert set(extras) == {"corpora", "dev"}
    assert all(reqs & set(imported) for reqs in extras.values())  # every extra serves an import
    assert 'tomli>=2; python_version<"3.11"' in setup["options"]["install_requires"]
