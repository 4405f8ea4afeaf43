"""The shape of the code: every static import between the toolkit's modules, read with ``ast``.

The layers, bottom to top: the probing core (``probing/`` except ``probing/study/``: text -> cache),
``analyses/`` (cache -> tables), ``figures/`` (tables -> files) and ``probing.study`` (config -> report,
and the ``probing`` console script). An import may only point down or stay within its layer, and no
two modules may import each other, directly or around a loop. Imports inside functions count: a
lazy import is still an arrow, and so is a module named in a string that is imported later (a lazy
attribute table such as ``probing.API``, ``importlib.import_module("...")``). Nothing is exempt.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("probing", "analyses", "figures")
#: Layer names, bottom first; a module may import from its own layer or any below it.
LAYERS = ("probing core", "analyses", "figures", "probing.study")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def toolkit_modules() -> dict[str, Path]:
    """Every module of the toolkit's packages: dotted name -> file."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def layer(module: str) -> str:
    if module == "probing.study" or module.startswith("probing.study."):
        return "probing.study"
    return "probing core" if module.split(".")[0] == "probing" else module.split(".")[0]


def imported_names(path: Path, module: str) -> set[str]:
    """The dotted names ``path`` imports anywhere in its body (top level, functions, branches), relative
    imports resolved against ``module``; ``from X import y`` yields both ``X`` and ``X.y``."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            # ``from pkg import submodule`` imports the submodule (its package is imported first, as for any
            # submodule, which is not an edge of its own); ``from pkg import name`` reads the package
            folder = ROOT.joinpath(*prefix.split("."))
            if not all((folder / f"{a.name}.py").is_file() or (folder / a.name / "__init__.py").is_file()
                       for a in node.names):
                out.add(prefix)
            out.update(f"{prefix}.{alias.name}" for alias in node.names)
    return out


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The toolkit module ``name`` refers to: itself, or its longest prefix that is a module."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in modules:
            return candidate
    return None


def static_import_graph() -> nx.DiGraph:
    """Module -> module it imports (toolkit modules only; a package's own ``__init__`` is not counted
    as an import of its submodules, since Python runs it first anyway and it is not a choice)."""
    modules = toolkit_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for mod, path in modules.items():
        for name in imported_names(path, mod):
            target = resolve(name, modules)
            if target is not None and target != mod:
                graph.add_edge(mod, target)
    return graph


def docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node (prose may name modules without importing them)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def named_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The toolkit modules ``path`` names in a string, outside docstrings: a lazy reference
    (``{"run": ("probing.study", "run")}`` resolved by ``importlib.import_module``, or a literal
    ``importlib.import_module("probing.study")``) is an arrow the import statements do not show.
    A string counts if it is exactly a module's dotted name or ``module:attribute``."""
    tree = ast.parse(path.read_text(), str(path))
    prose = docstrings(tree)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            name = node.value.split(":", 1)[0]
            if name in modules:
                out.add(name)
    return out


def import_graph(lazy: bool = False) -> nx.DiGraph:
    """:func:`static_import_graph`, with ``lazy`` also the arrows of :func:`named_modules`."""
    graph = static_import_graph()
    if lazy:
        modules = toolkit_modules()
        for mod, path in modules.items():
            graph.add_edges_from((mod, target) for target in named_modules(path, modules) if target != mod)
    return graph


def test_the_walk_sees_the_known_arrows():
    """The walker itself: a top-level import, a relative one and one inside a function are all found."""
    graph = import_graph()
    assert graph.has_edge("analyses.cka._runner", "probing.cache")  # top level, absolute
    assert graph.has_edge("probing.study.__main__", "probing.study.runner")  # relative (from .runner)
    lazy = [(a, b) for a, b in graph.edges if layer(a) == "probing.study" and layer(b) == "figures"]
    assert lazy, "the study draws figures through imports inside functions; the walk must see them"
    assert len(toolkit_modules()) > 40


def test_no_import_cycles():
    graph = import_graph()
    cycles = []
    for scc in nx.strongly_connected_components(graph):
        if len(scc) > 1:
            loop = nx.find_cycle(graph.subgraph(scc))
            cycles.append(" -> ".join([a for a, _ in loop] + [loop[0][0]]))
    assert not cycles, "import cycles:\n  " + "\n  ".join(sorted(cycles))


def upward_arrows(graph: nx.DiGraph) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, b in graph.edges
                  if rank[layer(b)] > rank[layer(a)])


def test_layers_only_point_down():
    """Static imports and lazy string references alike (cycles are judged on static imports only:
    ``probing``'s lazy table names modules that import ``probing.__version__``)."""
    upward = upward_arrows(import_graph(lazy=True))
    assert not upward, "imports that point up a layer:\n  " + "\n  ".join(upward)


def test_the_walk_sees_lazy_string_references(tmp_path):
    """The notebook API's table is seen as arrows from ``probing``; a table entry or an
    ``import_module`` call naming the study from the core would be an upward arrow, prose would not."""
    modules = toolkit_modules()
    graph = import_graph(lazy=True)
    assert graph.has_edge("probing", "probing.api") and not static_import_graph().has_edge("probing", "probing.api")
    upward = tmp_path / "upward.py"
    upward.write_text('"""Prose may name probing.study."""\nimport importlib\n'
                      'API = {"run_study": ("probing.study", "run")}\n'
                      'figure = importlib.import_module("figures.drift")\n')
    assert named_modules(upward, modules) == {"probing.study", "figures.drift"}
    graph.add_edges_from(("probing", m) for m in named_modules(upward, modules))
    assert upward_arrows(graph) == ["probing (probing core) imports figures.drift (figures)",
                                    "probing (probing core) imports probing.study (probing.study)"]


# ---------------------------------------------------------------------------------- analyses' families


def family(module: str) -> str | None:
    """The family of analyses a module belongs to: ``analyses.<name>``, a subpackage (``analyses.probes``)
    or a top-level module that is a family of one (``analyses.results``); ``analyses`` for the package's
    own ``__init__``; None outside analyses (the probing core, figures and the study belong to none)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "analyses" else None


def is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_in(dotted: str) -> bool:
    """Whether ``dotted`` (a module, or a module's attribute) names a private part of its family: a
    private module (``analyses.probes._solver``) or a private name (``analyses.results._x``)."""
    fam = family(dotted)
    return fam is not None and any(is_private(p) for p in dotted[len(fam):].split(".") if p)


def foreign_private_imports(path: Path, module: str) -> list[str]:
    """Each place ``path`` (the module ``module``) reaches into another family's private part: an import
    of a private module or name (relative imports resolved), or an attribute ``m._x`` of a module it
    imported under a name (``import analyses.stats as st; st._x``)."""
    own = family(module)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    out = []

    def check(dotted: str, node: ast.AST) -> None:
        if family(dotted) not in (None, own) and private_in(dotted):
            out.append(f"{module}:{node.lineno} {dotted}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(alias.name, node)
                if alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            check(prefix, node)
            for alias in node.names:
                check(f"{prefix}.{alias.name}", node)
                bound[alias.asname or alias.name] = f"{prefix}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            check(f"{bound[node.value.id]}.{node.attr}", node)
    return out


def test_no_module_reaches_into_another_familys_private_names():
    """An underscore means "only this family uses it": no module of analyses, the probing core, figures
    or the study imports another family's private module or name (a name another family needs is public,
    exported by its family's ``__init__``)."""
    found = [hit for mod, path in toolkit_modules().items() for hit in foreign_private_imports(path, mod)]
    assert not found, "imports of another family's private names:\n  " + "\n  ".join(found)


def test_the_private_name_check_can_fail(tmp_path):
    """The check above sees a private module, a private name, a relative import and a module attribute,
    and lets a family use its own private modules."""
    probe = tmp_path / "probe.py"
    probe.write_text("from analyses.probes._solver import feature_basis\n"
                     "from analyses.results import _hidden\n"
                     "from .._metrics import subword_pool\n"
                     "import analyses.stats as st\n"
                     "x = st._stats\n"
                     "from analyses.drift._metrics import rowwise_cosine\n"
                     "from analyses.cka import linear_cka\n")
    hits = foreign_private_imports(probe, "analyses.drift._runner")
    assert [h.split(" ")[1] for h in hits] == ["analyses.probes._solver", "analyses.probes._solver.feature_basis",
                                               "analyses.results._hidden", "analyses.stats._stats"]
    study = foreign_private_imports(probe, "probing.study.questions.q1")
    assert "analyses.drift._metrics.rowwise_cosine" in {h.split(" ")[1] for h in study}
    assert family("analyses.probes._solver") == "analyses.probes" and family("figures.drift") is None


def analyses_families() -> list[str]:
    """The subpackages of analyses (each a family with private modules and public names)."""
    return sorted(p.parent.name for p in (ROOT / "analyses").glob("*/__init__.py"))


def test_families_are_the_subpackages_planned():
    assert analyses_families() == ["cka", "contextuality", "drift", "finetune", "probes", "stats"]


@pytest.mark.parametrize("name", analyses_families())
def test_each_family_exports_public_names_only(name):
    """A family's ``__init__`` declares ``__all__``: every name public and defined, and every module of
    the family private (a leading underscore) but ``__init__`` and ``__main__``."""
    package = importlib.import_module(f"analyses.{name}")
    assert package.__all__ and not [n for n in package.__all__ if is_private(n)]
    assert [n for n in package.__all__ if not hasattr(package, n)] == []
    modules = {p.stem for p in (ROOT / "analyses" / name).glob("*.py")} - {"__init__", "__main__"}
    assert modules and all(is_private(m) for m in modules), sorted(modules)


# ---------------------------------------------------------------------------------- result keys


def test_result_keys_hash_every_file_of_every_family(tmp_path):
    """``code_version`` hashes every ``.py`` under ``analyses/``, each family's subpackage included, by
    relative path: a change inside a family, or a file moved between families, gives new result keys."""
    import shutil

    from analyses.results import code_version, source_files, source_sha256

    root = ROOT / "analyses"
    files = [f.relative_to(root).as_posix() for f in source_files(root)]
    assert files == sorted(f.relative_to(root).as_posix() for f in root.rglob("*.py"))
    assert {"results.py", "probes/_solver.py", "cka/_numerics.py", "stats/_intervals.py"} <= set(files)
    read_path = [ROOT / "probing" / "cache.py", ROOT / "probing" / "cache_layout.py"]
    assert code_version()["code_sha256"] == source_sha256(root, read_path)

    copy = tmp_path / "analyses"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_sha256(copy)
    assert before == source_sha256(root)
    solver = copy / "probes" / "_solver.py"
    solver.write_text(solver.read_text() + "\n# one more line\n")
    changed = source_sha256(copy)
    assert changed != before
    (copy / "probes" / "_solver.py").rename(copy / "cka" / "_solver.py")
    assert source_sha256(copy) not in (before, changed)


# ---------------------------------------------------------------------------------- console script


def modules_with_main() -> list[str]:
    """Every toolkit module defining a top-level ``main`` function (a command), found by reading the
    source, so a new command cannot be left out of the console script."""
    out = []
    for mod, path in toolkit_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            out.append(mod)
    return sorted(out)


def command_modules() -> dict[str, str]:
    from probing.study.console import COMMANDS

    return {name: module for name, (module, _) in COMMANDS.items()}


def test_every_command_names_a_module_with_a_main():
    modules = toolkit_modules()
    for name, module in command_modules().items():
        assert module in modules, f"probing {name}: {module} is not a module of the toolkit"
        assert callable(getattr(importlib.import_module(module), "main", None)), f"{module} has no main()"


def mains_imported(module: str) -> set[str]:
    """The modules whose ``main`` ``module`` imports (``from X import main [as y]``, anywhere in it):
    a command whose main hands over to another module's main reaches that module."""
    path = toolkit_modules()[module]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and any(a.name == "main" for a in node.names):
            base = module.split(".")
            if node.level:
                base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
                out.add(".".join(base + ([node.module] if node.module else [])))
            else:
                out.add(node.module)
    return out


def test_the_console_script_reaches_every_command():
    """Every module with a main() (but the console script itself) is a command, or the module a
    command's main hands over to, or a figure kind of ``probing figures``."""
    from figures.__main__ import KINDS

    wanted = set(modules_with_main()) - {"probing.study.console"}
    commands = set(command_modules().values())
    reached = commands | {m for c in commands for m in mains_imported(c)}
    if "figures.__main__" in commands:
        reached |= {module for module, _ in KINDS.values()}
    assert not wanted - reached, f"commands the console script does not reach: {sorted(wanted - reached)}"
    from probing.study.console import module_command, usage

    text = usage()
    for name, module in command_modules().items():
        assert f"  {name} " in text and f"python -m {module_command(module)}" in text, (name, module)


def console(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probing.study.console", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_console_help_lists_every_command():
    done = console("--help")
    assert done.returncode == 0, done.stderr
    for name, module in command_modules().items():
        assert f"python -m {module.removesuffix('.__main__')}" in done.stdout, name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(command_modules()))
def test_console_command_help_exits_0(name):
    done = console(name, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, m in command_modules().items() if m.startswith("analyses")))
def test_python_m_runs_each_analyses_command(name):
    """``python -m analyses.<family>`` (a family's ``__main__``) or ``python -m analyses.<module>`` is the
    command the console script names."""
    from probing.study.console import module_command

    module = module_command(command_modules()[name])
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: python -m {module} "), done.stdout[:200]


def test_console_unknown_command_is_an_error():
    done = console("sideways")
    assert done.returncode == 2
    assert done.stderr.startswith("error: unknown command 'sideways'")


# ---------------------------------------------------------------------------------- import side effects


def test_importing_the_figures_changes_no_global_state(tmp_path):
    """Importing every figure module leaves matplotlib's backend unchosen, and with no display and no
    MPLBACKEND a figure is still drawn (matplotlib falls back to Agg by itself)."""
    code = (
        "import matplotlib, pkgutil, importlib, figures\n"
        "before = matplotlib.rcParams._get_backend_or_none()\n"
        "for m in pkgutil.iter_modules(figures.__path__): importlib.import_module('figures.' + m.name)\n"
        "after = matplotlib.rcParams._get_backend_or_none()\n"
        "from figures.style import new_figure, save\n"
        "fig, ax = new_figure(); ax[0, 0].plot([0, 1], [1, 0])\n"
        f"paths = save(fig, {str(tmp_path / 'fig')!r})\n"
        "print(before, after, matplotlib.get_backend().lower(), [p.suffix for p in paths])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "DISPLAY", "WAYLAND_DISPLAY")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "None", "agg", "['.png',", "'.pdf']"]
    assert (tmp_path / "fig.png").stat().st_size > 0
