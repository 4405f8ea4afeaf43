"""``python -m`` of a module that is not a command: an error that names the command to run instead.

``python -m analyses.cka`` used to import the module and exit 0, having done nothing. Each toolkit package's
``__init__`` runs first when Python locates a module to run (``sys.argv[0]`` is ``"-m"`` then, as the Python
documentation says), and calls :func:`refuse_library_run`: a module that is a command (an
``if __name__ == "__main__":`` block, or a package's ``__main__.py``) runs as before; any other module, or a
package without ``__main__.py``, prints ``error: NAME is a library module ...`` naming the commands that use it,
and exits with status 2.

The commands are found by reading the sources, not by importing them (the core may not import the study,
whose ``probing.study.console.COMMANDS`` gives their short names: it is read as a literal from its file).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections import deque
from pathlib import Path

__all__ = ["library_message", "module_to_run", "refuse_library_run"]

#: The directory holding the toolkit's packages (this file is ``<root>/probing/module_guard.py``).
ROOT = Path(__file__).resolve().parents[1]
#: Python's command-line flags that take no argument and may be bundled before ``m`` (``-Bm NAME``).
_FLAGS = "bBdEhiIOPqRsSuvVx"
_MAIN_BLOCK = re.compile(r"^if __name__ == [\"']__main__[\"']\s*:", re.MULTILINE)


def module_to_run(orig_argv: list[str]) -> str | None:
    """The module named by ``-m`` in a Python command line (``sys.orig_argv``), or None.

    >>> module_to_run(["python", "-u", "-m", "analyses.cka", "--help"])
    'analyses.cka'
    >>> module_to_run(["python", "-Bmanalyses.cka"]), module_to_run(["python", "-c", "pass"])
    ('analyses.cka', None)
    """
    args = iter(orig_argv[1:])
    for arg in args:
        if arg in ("-c", "-") or not arg.startswith("-") or arg.startswith("--"):
            return None  # the script, -c code or stdin comes first: no -m
        m = re.fullmatch(rf"-[{_FLAGS}]*m(.*)", arg)
        if m:
            return m.group(1) or next(args, None)
        if re.fullmatch(r"-[WX]", arg):
            next(args, None)  # -W / -X take the next argument
    return None


def _file(module: str) -> Path | None:
    """The source file of a toolkit module (a package's ``__init__.py``), or None."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_command(module: str, path: Path) -> bool:
    if path.name == "__init__.py":
        return (path.parent / "__main__.py").is_file()
    return path.name == "__main__.py" or bool(_MAIN_BLOCK.search(path.read_text(encoding="utf-8")))


def _imports(module: str, path: Path) -> set[str]:
    """The dotted names a module imports anywhere (relative imports resolved; ``from X import y``: X and X.y)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")
            if node.level:
                base = base[: len(base) - node.level + (path.name == "__init__.py")]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            out.add(prefix)
            out.update(f"{prefix}.{a.name}" for a in node.names)
    return out


@functools.cache
def _console_commands() -> dict[str, str]:
    """Command module -> its ``probing`` subcommand, from the ``COMMANDS`` literal of the console script's file."""
    path = Path(__file__).resolve().parent / "study" / "console.py"
    try:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(getattr(t, "id", None) == "COMMANDS"
                                                                      for t in targets):
                return {module: name for name, (module, _) in ast.literal_eval(node.value).items()}
    except (OSError, SyntaxError, ValueError, TypeError):
        pass
    return {}


def _packages() -> set[str]:
    """The toolkit's packages: this one and those the console script's commands live in."""
    return {m.split(".")[0] for m in _console_commands()} | {__name__.split(".")[0]}


@functools.cache
def _importers() -> tuple[dict[str, Path], dict[str, set[str]]]:
    """The toolkit's modules and, for each, the modules that import it."""
    files = {}
    for pkg in sorted(_packages()):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    users: dict[str, set[str]] = {m: set() for m in files}
    for m, path in files.items():
        for name in _imports(m, path):
            parts = name.split(".")
            target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in files), None)
            if target is not None and target != m:
                users[target].add(m)
    return files, users


def _commands_using(module: str) -> tuple[str, ...]:
    """The nearest command modules that import ``module``, directly or through other modules (breadth first
    over the toolkit's imports); those with a ``probing`` subcommand where there are any."""
    files, users = _importers()

    def entry(command: str) -> str:  # a command its package's __main__ hands over to runs as the package
        package_main = command.rsplit(".", 1)[0] + ".__main__"
        return package_main if package_main in users[command] else command

    seen, level = {module}, deque([module])
    while level:
        found, nxt = set(), deque()
        for m in level:
            for u in sorted(users.get(m, ())):
                if u not in seen:
                    seen.add(u)
                    if _is_command(u, files[u]):
                        found.add(entry(u))
                    else:
                        nxt.append(u)
        named = {c for c in found if _short_name(c)}
        if found:
            return tuple(sorted(named or found))
        level = nxt
    return ()


def _short_name(command_module: str) -> str | None:
    """Its ``probing`` subcommand (a package's ``__main__`` is listed as the package or as itself), or None."""
    console = _console_commands()
    return console.get(command_module) or console.get(command_module.removesuffix(".__main__"))


def _how_to_run(command_module: str) -> str:
    run = f"python -m {command_module.removesuffix('.__main__')}"
    name = _short_name(command_module)
    return f"{run} / probing {name}" if name else run


def library_message(module: str) -> str | None:
    """The error for ``python -m module`` when ``module`` is a toolkit module that is not a command; None for a
    command, or a name that is not a toolkit module (Python reports that itself; another package may import
    this one while Python locates its module)."""
    path = _file(module) if module.split(".")[0] in _packages() else None
    if path is None or _is_command(module, path):
        return None
    kind = "package" if path.name == "__init__.py" else "module"
    users = _commands_using(module)[:3] if kind == "module" else ()
    run = "; run: " + " or ".join(_how_to_run(u) for u in users) if users else ""
    return f"error: {module} is a library {kind}, not a command{run} (probing --help lists every command)"


def refuse_library_run() -> None:
    """Called from each toolkit package's ``__init__`` while Python locates a ``-m`` module: exit with status 2
    and :func:`library_message` if that module is not a command; return otherwise."""
    module = module_to_run(list(getattr(sys, "orig_argv", [])))
    message = library_message(module) if module else None
    if message is not None:
        print(message, file=sys.stderr)
        raise SystemExit(2)
