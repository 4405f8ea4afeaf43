"""Files others can read, honest reuse counts, and messages that say where things went:

1. every cache, result-table, figure and study file gets 0666 & ~umask (directories 0777 & ~umask), not the
   0600 of a temporary file renamed into place;
2. a study counts as reused only the result tables whose key matched;
3. analysis commands print the actual path of their table; ``python -m`` of a library module says which
   command to run, exit 2;
4. a full disk names the file, exit 2, no temporary left; ``--shard-mb`` must be a positive finite number;
5. a ``.request.json.*.tmp`` left by a killed first write is removed by the next run.
"""

from __future__ import annotations

import ast
import errno
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analyses.results import recording_store_use, stored_table, write_table
from probing.cache import Cache
from probing.cache_layout import MANIFEST, REQUEST
from probing.extract import extract

from .conftest import make_tiny_bert, sample_examples

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, bert_tokenizer) -> Path:
    d = tmp_path_factory.mktemp("tiny-model")
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(d)
    bert_tokenizer.save_pretrained(d)
    return d


@pytest.fixture()
def umask():
    """Restores the process's umask after a test that sets one."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def _extract(model, out: Path, formats=("pair",), **kw) -> list[Path]:
    return extract(sample_examples(12, k=2), list(formats), model=model, out=out, shard_mb=0.002, progress=False,
                   log=lambda *a: None, **kw)


def _wrong_modes(root: Path, mask: int) -> list[str]:
    """Every file and directory under ``root`` (itself included) whose mode is not what ``mask`` gives."""
    wrong = []
    for p in [root, *root.rglob("*")]:
        want = (0o777 if p.is_dir() else 0o666) & ~mask
        got = p.stat().st_mode & 0o777
        if got != want:
            wrong.append(f"{p.relative_to(root.parent)}: {got:o}, want {want:o}")
    return wrong


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --------------------------------------------------------------------------- 1. modes under the umask


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_caches_tables_and_figures_follow_the_umask(mask, tiny_bert, tmp_path, umask):
    """Before: every cache and table file was 0600 whatever the umask (mkstemp's mode, kept by the rename)."""
    from analyses.drift import run_drift
    from figures import style

    os.umask(mask)
    pair, concat = _extract(tiny_bert, tmp_path / "caches", ("pair", "concat"))
    df = run_drift(Cache.open(pair), Cache.open(concat), layers=[0, 2], n_resamples=100, n_pairs=50,
                   out=tmp_path / "results", progress=False)
    fig, axes = style.new_figure()
    axes[0, 0].plot([0, 1], [0, 1])
    pngs = style.save(fig, tmp_path / "figures" / "line")
    assert [p.name for p in pngs] == ["line.png", "line.pdf"] and all(p.exists() for p in pngs)
    assert Path(df.attrs["result_path"]).exists()
    assert len(list((tmp_path / "caches").rglob("*"))) > 10  # shards, records, manifest, examples, locks
    for root in ("caches", "results", "figures"):
        assert _wrong_modes(tmp_path / root, mask) == [], root
    assert (tmp_path / "caches" / "tiny-bert").stat().st_mode & 0o777 == 0o777 & ~mask


@pytest.mark.slow
def test_a_quick_study_output_follows_the_umask(quick_study):
    """The session's --quick study ran under umask 027: its tables, figures, report and caches are 0640,
    their directories 0750 (group-readable, not world-readable)."""
    mask = quick_study["umask"]
    assert mask == 0o027
    out, caches = quick_study["out"], quick_study["caches"]
    assert list(out.glob("figures/*.png")) and (out / "report.html").exists() and list(caches.rglob("*.npy"))
    assert _wrong_modes(out, mask) == []
    assert _wrong_modes(caches, mask) == []


# --------------------------------------------------------------------------- 2. honest reuse counts


def _reuse(line: str) -> tuple[int, int]:
    m = re.search(r"(\d+) of (\d+) result tables", line)
    assert m, line
    return int(m.group(1)), int(m.group(2))


@pytest.mark.slow
def test_a_study_counts_only_tables_whose_key_matched(quick_study):
    """Before: the first run over a store holding a table an older version wrote under another key reported
    'reused 1 of N+1 result tables' (every file older than the run counted). Now 0 of N, then N of N."""
    (first,) = [line for line in quick_study["logs"] if "run time" in line]
    (second,) = [line for line in quick_study["logs_again"] if "run time" in line]
    reused, asked = _reuse(first)
    assert reused == 0 and asked > 5, first
    assert _reuse(second) == (asked, asked), second
    assert quick_study["other_key"].name in quick_study["first"]  # it was there during the first run
    report = (quick_study["first_run"] / "report.md").read_text()
    assert f"0 of {asked} result tables" in report


def test_a_stored_table_under_another_key_is_not_counted_as_reused(tmp_path):
    write_table(pd.DataFrame({"analysis": ["drift"], "value": [0.5]}), tmp_path / "drift-0123456789abcdef.csv")
    with recording_store_use() as use:
        path, done = stored_table(tmp_path, "drift", {"a": 1})
        assert done is None and path != tmp_path / "drift-0123456789abcdef.csv"
        write_table(pd.DataFrame({"analysis": ["drift"], "value": [0.1]}), path)
        assert stored_table(tmp_path, "drift", {"a": 1})[1] is not None  # this run's own table: not from earlier
    assert (use.reused, use.asked) == (0, 1)
    with recording_store_use() as again:
        path2, done = stored_table(tmp_path, "drift", {"a": 1})
    assert path2 == path and done.attrs == {"result_path": str(path), "reused": True}
    assert (again.reused, again.asked) == (1, 1)
    with recording_store_use() as forced:
        assert stored_table(tmp_path, "drift", {"a": 1}, force=True)[1] is None
    assert (forced.reused, forced.asked) == (0, 1)


# --------------------------------------------------------------------------- 3. where the output went


def test_an_analysis_command_prints_its_tables_actual_path(tiny_bert, tmp_path, capsys):
    """Before: ``table: results/drift-*.csv``, a pattern. Now the file written, then the same file reused."""
    from analyses.drift import main

    pair, concat = _extract(tiny_bert, tmp_path / "caches", ("pair", "concat"))
    argv = [str(pair), str(concat), "--layers", "0,2", "--resamples", "100", "--pairs", "50",
            "--out", str(tmp_path / "results"), "--no-progress"]
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    (table,) = (tmp_path / "results").glob("drift-*.csv")
    assert re.fullmatch(r"drift-[0-9a-f]{16}\.csv", table.name)
    assert last == f"table: {table}"
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"table: {table} (reused; --force recomputes)"


def _toolkit_modules() -> dict[str, Path]:
    out = {}
    for pkg in ("probing", "analyses", "figures"):
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _entry_function(module: str, path: Path):
    """The function ``python -m module`` calls (``sys.exit(NAME())`` under ``if __name__ == "__main__"``, or
    in a package's ``__main__.py`` the ``main`` it imports), or None for a library module."""
    text = path.read_text()
    guard = re.search(r'^if __name__ == "__main__":', text, re.MULTILINE)
    if guard:
        name = re.search(r"sys\.exit\((\w+)\(\)\)", text[guard.end():]).group(1)
        return getattr(importlib.import_module(module), name)
    if path.name == "__main__.py":
        (imp,) = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
        source = module.rsplit(".", 1)[0] + "." + imp.module  # from .runner import main
        return getattr(importlib.import_module(source), "main")
    return None


def test_every_module_either_runs_or_names_the_command_to_run(capsys, monkeypatch):
    """Each toolkit module as ``python -m`` would run it: a command shows its usage for ``--help``; any other
    module (or package without ``__main__``) is refused, naming a command that exists."""
    from probing import module_guard

    modules = _toolkit_modules()
    commands = {m for m, p in modules.items() if _entry_function(m, p) is not None}
    assert {"analyses.drift.__main__", "analyses.cka.__main__", "probing.extract", "probing.study.__main__",
            "figures.__main__", "figures.drift"} <= commands
    refused = suggested = 0
    for module, path in modules.items():
        if module in commands:
            try:
                code = _entry_function(module, path)(["--help"])
            except SystemExit as done:  # argparse's --help
                code = done.code
            out = capsys.readouterr().out
            assert code in (0, None), module
            assert out.startswith("usage:"), (module, out[:200])
            monkeypatch.setattr(sys, "orig_argv", ["python", "-m", module.removesuffix(".__main__"), "--help"])
            module_guard.refuse_library_run()  # returns: a command runs
            continue
        if f"{module}.__main__" in commands:  # a package that runs its __main__, tested as that
            assert module_guard.library_message(module) is None
            continue
        message = module_guard.library_message(module) or f"{module}: no message"
        kind = "package" if path.name == "__init__.py" else "module"
        assert message.startswith(f"error: {module} is a library {kind}, not a command"), message
        assert message.endswith("(probing --help lists every command)"), message
        named = re.findall(r"python -m ([\w.]+)", message)
        assert all(n in commands or f"{n}.__main__" in commands for n in named), message
        refused += 1
        suggested += bool(named)
    assert refused > 40 and suggested > 40
    cka = module_guard.library_message("analyses.cka._metrics")
    assert "run: python -m analyses.cka / probing cka" in cka, cka


@pytest.mark.parametrize("module, rc, first", [
    ("analyses.cka._metrics", 2,
     "error: analyses.cka._metrics is a library module, not a command; run: python -m analyses.cka"),
    ("analyses", 2, "error: analyses is a library package, not a command"),
    ("figures", 0, "usage: python -m figures KIND"),
])
def test_python_dash_m_in_a_subprocess(module, rc, first, tmp_path):
    """Before: ``python -m analyses.cka`` exited 0 having done nothing."""
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == rc, proc.stderr
    assert (proc.stderr if rc else proc.stdout).splitlines()[0].startswith(first), proc.stderr + proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_module_to_run_reads_the_dash_m_argument():
    from probing.module_guard import module_to_run

    assert module_to_run(["python", "-m", "analyses.cka"]) == "analyses.cka"
    assert module_to_run(["python", "-X", "dev", "-W", "ignore", "-m", "analyses.cka"]) == "analyses.cka"
    assert module_to_run(["python", "-Bm", "figures.style"]) == "figures.style"
    assert module_to_run(["python", "script.py", "-m", "x"]) is None
    assert module_to_run(["python", "-c", "pass", "-m", "x"]) is None


# --------------------------------------------------------------------------- 4. full disk, --shard-mb


def _no_space(method: bool = False):
    """A writer (a method with ``method``) that writes a few bytes, then fails as a full disk does."""
    def write(*args, **kw):
        Path(args[int(method)]).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write


def test_a_full_disk_during_a_cache_write_names_the_file(model_dir, tmp_path, monkeypatch, capsys):
    from probing import cache_writer
    from probing.extract import main

    monkeypatch.setattr(cache_writer, "_write_npy", _no_space())
    out = tmp_path / "caches"
    code = main(["--model", str(model_dir), "--corpus", "generated:n=12,k=2", "--formats", "pair", "--out", str(out),
                 "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    first = err.splitlines()[0]
    assert re.fullmatch(r"error: cannot write \S+/shards/00000\.npy: no space left on device .*", first), first
    assert "Traceback" not in err
    files = _files(out)
    assert not [f for f in files if f.endswith(".tmp")], files  # the temporary is gone
    assert not [f for f in files if f.endswith((MANIFEST, ".npy", ".parquet"))], files  # nothing half-written


def test_a_full_disk_during_a_table_write_names_the_table(tiny_bert, tmp_path, monkeypatch, capsys):
    from analyses.drift import main

    pair, concat = _extract(tiny_bert, tmp_path / "caches", ("pair", "concat"))
    monkeypatch.setattr(pd.DataFrame, "to_csv", _no_space(method=True))
    out = tmp_path / "results"
    code = main([str(pair), str(concat), "--layers", "0", "--resamples", "100", "--pairs", "50", "--out", str(out),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.fullmatch(rf"error: cannot write {re.escape(str(out))}/drift-[0-9a-f]{{16}}\.csv: no space left on "
                        r"device \(its temporary file was removed\).*", err.splitlines()[0]), err
    assert not out.exists() or list(out.iterdir()) == []


def test_a_full_disk_keeps_the_errno_and_other_errors_pass_unchanged(tmp_path):
    from probing.cache_writer import atomic_write

    with pytest.raises(OSError, match="disk quota exceeded") as err:
        atomic_write(tmp_path / "x.json", lambda tmp: (_ for _ in ()).throw(OSError(errno.EDQUOT, "quota")))
    assert err.value.errno == errno.EDQUOT and str(err.value).startswith(f"cannot write {tmp_path / 'x.json'}: ")
    with pytest.raises(PermissionError, match="denied"):
        atomic_write(tmp_path / "y.json", lambda tmp: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1", "-inf"])
def test_shard_mb_must_be_a_positive_finite_number(value, tmp_path, monkeypatch, capsys):
    from probing.extract import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["--corpus", "generated:n=12,k=2", f"--shard-mb={value}", "--out", str(tmp_path / "caches")])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert err.splitlines()[0] == (f"error: python -m probing.extract: argument --shard-mb: {value!r}: must be a "
                                   f"positive finite number")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0])
def test_extract_refuses_a_shard_size_that_is_not_positive_and_finite(value, tiny_bert, tmp_path):
    from probing.planning import ExtractError

    with pytest.raises(ExtractError, match="shard_mb=.* must be positive"):
        extract(sample_examples(4, k=2), ["pair"], model=tiny_bert, out=tmp_path / "c", shard_mb=value,
                progress=False, log=lambda *a: None)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- 5. request.json's temporary


def test_a_temporary_of_request_json_left_by_a_kill_is_removed(tiny_bert, tmp_path):
    """Before: a run killed while first writing request.json left ``.request.json.<random>.tmp``, and no later
    run removed it (temporaries were cleaned only once shards/ existed)."""
    (path,) = _extract(tiny_bert, tmp_path / "caches")
    complete = {f: (path / f).read_bytes() for f in _files(path) if (path / f).is_file()}
    for p in sorted(path.rglob("*"), reverse=True):  # back to the state of the kill: an empty directory ...
        p.rmdir() if p.is_dir() else p.unlink()
    stray = path / f".{REQUEST}.k9x2abcd.tmp"  # ... holding the half-written request
    stray.write_text('{"mod')
    assert _files(path) == {stray.name}
    (again,) = _extract(tiny_bert, tmp_path / "caches")
    assert again == path and not stray.exists()
    assert {f: (path / f).read_bytes() for f in _files(path) if (path / f).is_file()} == complete
