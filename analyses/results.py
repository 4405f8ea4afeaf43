"""Tidy result tables: one row per measurement, the same columns for every analysis.

Every runner returns a ``pandas.DataFrame`` made by :func:`make_table` and writes it with
:func:`write_table` (CSV always, Parquet beside it, never an index column). Extra columns are allowed
after the standard ones. Every column of every table the study writes is defined in ``docs/TABLES.md``;
whole-number columns (:data:`INTEGER_COLUMNS`) are written as integers (:func:`typed`).
A stored table is found again by :func:`result_key`: a hash of the runner's config (every option, each
input cache as :func:`cache_identity`) and :func:`code_version`, so only the same options on the same
caches with the same code return it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import pandas as pd

from probing.cache_writer import atomic_write
from probing.cli import int_at_least, positive_floats

#: The standard columns, in order. ``format_b`` is the second format of a comparison (empty otherwise).
RESULT_COLUMNS: tuple[str, ...] = (
    "analysis", "model", "corpus", "format", "format_b", "layer", "role", "target", "metric",
    "value", "ci_low", "ci_high", "n", "seed",
)

#: Columns that hold whole numbers wherever they appear (counts, indices, seeds, layers). :func:`typed`
#: writes them as integers, nullable (``Int64``, an empty CSV cell) where some rows have none.
INTEGER_COLUMNS: frozenset[str] = frozenset({
    "layer", "layer_b", "patch_layer", "head", "k", "k_b", "n", "n_examples", "n_groups", "n_clusters", "n_folds",
    "n_skipped", "n_train", "n_runs", "groups_needed", "seed", "pretrain_seed", "repeat", "fold", "epoch", "ci_seeds",
    "n_resamples", "n_seeds", "m", "epochs", "steps", "position",
})
#: The standard columns holding real numbers.
FLOAT_COLUMNS: tuple[str, ...] = ("value", "ci_low", "ci_high")


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its :data:`INTEGER_COLUMNS` as integers (``int64``, or nullable ``Int64`` where some
    values are missing) and its :data:`FLOAT_COLUMNS` as float64. A column whose values are not all whole
    numbers (e.g. attention's ``head`` = ``"mean"``) is left as it is. Returns a new frame.

    >>> typed(pd.DataFrame({"seed": [0.0, float("nan")], "layer": [1.0, 2.0]})).dtypes.astype(str).tolist()
    ['Int64', 'int64']
    """
    df = df.copy()
    for col in df.columns:
        if col not in INTEGER_COLUMNS and col not in FLOAT_COLUMNS:
            continue
        if pd.api.types.is_integer_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            continue
        num = pd.to_numeric(df[col], errors="coerce")
        if not (num.isna() == df[col].isna()).all():  # some value is not a number: leave the column alone
            continue
        if col in FLOAT_COLUMNS:
            df[col] = num.astype("float64")
        elif (num.dropna() % 1 == 0).all():
            df[col] = num.astype("Int64" if num.isna().any() else "int64")
    return df


def make_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows (dicts) -> a DataFrame with the standard columns first, missing ones filled with NA, and the
    column types of :func:`typed`."""
    df = pd.DataFrame(list(rows))
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = pd.NA
    extra = [c for c in df.columns if c not in RESULT_COLUMNS]
    return typed(df[list(RESULT_COLUMNS) + extra])


def write_table(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` (as :func:`typed`, without its index) to ``path`` (``.csv``) and a ``.parquet`` beside
    it, each atomically (:func:`probing.cache_writer.atomic_write`: the whole file or none, fsynced). Returns the
    CSV path."""
    path = Path(path)
    df = typed(df)
    df.attrs = {}  # run notes (e.g. a runner's "reused") are not table content: Parquet would store them
    if path.suffix != ".csv":
        path = path.with_suffix(".csv")
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return path
    atomic_write(path.with_suffix(".parquet"), lambda tmp: df.to_parquet(tmp, index=False))
    return path


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a result table written by :func:`write_table` (Parquet if present, else CSV)."""
    path = Path(path)
    pq = path.with_suffix(".parquet")
    if pq.exists():
        return pd.read_parquet(pq)
    return pd.read_csv(path.with_suffix(".csv"))


def source_files(root: Path) -> list[Path]:
    """Every ``.py`` file under ``root``, in every subpackage (each family of :mod:`analyses`), sorted by
    its path relative to ``root``."""
    return sorted(root.rglob("*.py"), key=lambda f: f.relative_to(root).as_posix())


def source_sha256(root: Path, extra: Iterable[Path] = ()) -> str:
    """SHA-256 over the relative path and the bytes of each of :func:`source_files` of ``root``, then of
    each file of ``extra`` (named by its file name)."""
    h = hashlib.sha256()
    named = [(f.relative_to(root).as_posix(), f) for f in source_files(root)] + [(f.name, f) for f in extra]
    for name, f in named:
        h.update(name.encode("utf-8") + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def code_version() -> dict[str, str]:
    """What decides the numbers besides the options: the toolkit version and a SHA-256 over the source
    of every module of :mod:`analyses`, its families' subpackages included (:func:`source_sha256`), and of
    the read path (:mod:`probing.cache`, :mod:`probing.cache_layout`), computed once per process. A code
    change gives new result keys, so a table computed by old code is not reused."""
    import probing

    here = Path(__file__).resolve().parent
    read_path = [Path(probing.__file__).resolve().parent / f for f in ("cache.py", "cache_layout.py")]
    return {"toolkit": probing.__version__, "code_sha256": source_sha256(here, read_path)}


def cache_identity(cache) -> dict[str, Any]:
    """A cache as a result key sees it: its directory name and its manifest's checksum, which covers
    the model and corpus fingerprints and every shard's SHA-256 (a rebuilt cache gets a new key)."""
    return {"name": cache.path.name, "manifest_sha256": cache.manifest.get("manifest_sha256")}


def model_label(cache) -> str:
    """The model column of result tables: ``name``, or ``name (random init, seed s)``."""
    from probing.cache import describe_model

    return describe_model(cache.manifest["model"], fingerprint=False)


def result_key(config: Mapping[str, Any]) -> str:
    """A short content hash of an analysis configuration (inputs' identities from
    :func:`cache_identity`, every option) together with :func:`code_version`."""
    blob = json.dumps({"config": config, "code": code_version()}, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def result_path(out_dir: str | os.PathLike, analysis: str, config: Mapping[str, Any]) -> Path:
    """The one place a configuration's result table lives: ``<out_dir>/<analysis>-<hash>.csv``."""
    return Path(out_dir) / f"{analysis}-{result_key(config)}.csv"


class StoreUse:
    """What one run asked of the result store: each table's path, and whether its first lookup found it
    stored (reused) or not (computed by this run). Only a table whose key matched counts as reused: tables
    an older version left under other keys are never looked up."""

    def __init__(self) -> None:
        self.found: dict[Path, bool] = {}

    @property
    def reused(self) -> int:
        return sum(self.found.values())

    @property
    def asked(self) -> int:
        return len(self.found)


_RECORDING: list[StoreUse] = []


@contextlib.contextmanager
def recording_store_use() -> Iterator[StoreUse]:
    """Record every result-store lookup (:func:`note_store_use`) made inside the ``with`` block, e.g. one study
    run's, in the :class:`StoreUse` it yields."""
    use = StoreUse()
    _RECORDING.append(use)
    try:
        yield use
    finally:
        _RECORDING.remove(use)


def note_store_use(path: Path, reused: bool) -> None:
    """Tell every :func:`recording_store_use` that the table at ``path`` was looked up and found stored
    (``reused``) or not; a later lookup of the same path (a table this run computed) changes nothing."""
    for use in _RECORDING:
        use.found.setdefault(Path(path), reused)


def stored_table(out_dir: str | os.PathLike | None, analysis: str, config: Mapping[str, Any],
                 force: bool = False) -> tuple[Path | None, pd.DataFrame | None]:
    """``(path, table)``: where a runner's table for ``config`` lives (None without ``out_dir``) and the
    table already stored there (None if there is none, or ``force``; its ``attrs`` say where it is,
    ``result_path`` and ``reused``). Every runner starts with it::

        path, done = stored_table(out, "knn", config, force)
        if done is not None:
            return done
        ...
        return keep_table(df, path)
    """
    path = result_path(out_dir, analysis, config) if out_dir is not None else None
    if path is None:
        return None, None
    found = path.exists() and not force
    note_store_use(path, found)
    if found:
        df = read_table(path)
        df.attrs.update(result_path=str(path), reused=True)
        return path, df
    return path, None


def keep_table(df: pd.DataFrame, path: Path | None) -> pd.DataFrame:
    """Write a runner's fresh table to the path of :func:`stored_table` (nothing if None); returns it as
    :func:`typed` makes it, so a fresh table has the column types of a stored one, with ``attrs``
    ``result_path`` (None if not written) and ``reused`` = False."""
    df = typed(df)
    if path is not None:
        write_table(df, path)
    df.attrs.update(result_path=str(path) if path is not None else None, reused=False)
    return df


def table_lines(*tables: pd.DataFrame) -> str:
    """``table: PATH`` for each table a runner wrote or found stored (its ``attrs``' ``result_path``; the
    actual file, never a pattern), ``(reused)`` after one an earlier run stored: the last lines of an
    analysis command, which say where its output went. Empty where nothing was written."""
    lines, seen = [], set()
    for df in tables:
        path = df.attrs.get("result_path")
        if path and path not in seen:
            seen.add(path)
            lines.append(f"table: {path}" + (" (reused; --force recomputes)" if df.attrs.get("reused") else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# What every runner's command line shares

#: Errors a runner's command line reports as one ``error: ...`` line with exit status 2.
CLI_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, OSError, RuntimeError)


def resamples_arg(value: str) -> int:
    """An argparse ``type`` for ``--resamples``: a whole number from which a 95% interval can be computed
    (:func:`analyses.stats.check_resamples`), else a usage error naming the value.

    >>> resamples_arg("200")
    200
    """
    import argparse

    from analyses.stats import too_few_resamples

    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    problem = too_few_resamples(number)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem}")
    return number


def add_output_options(parser, *, resamples: bool = False, seed: bool = True, progress: bool = True) -> None:
    """Add the options every analysis command shares, named as docs/CLI.md says: ``--resamples`` (if
    asked), ``--seed`` (splits and resampling; unless the command draws nothing at random), ``--out``,
    ``--force`` and ``--no-progress`` (unless the command does no long work). An ``--out`` that cannot be
    written is a usage error before anything is computed."""
    from probing.cli import output_dir_arg

    if resamples:
        from analyses.stats import DEFAULT_RESAMPLES, MIN_RESAMPLES

        parser.add_argument("--resamples", type=resamples_arg, default=DEFAULT_RESAMPLES,
                            help=f"bootstrap resamples of every interval, at least {MIN_RESAMPLES} "
                                 f"(default {DEFAULT_RESAMPLES})")
    if seed:
        parser.add_argument("--seed", type=int_at_least(0), default=0, help="seed of splits and resampling (default 0)")
    parser.add_argument("--out", default="results", type=output_dir_arg,
                        help="directory for the result table (default results/)")
    parser.add_argument("--force", action="store_true", help="recompute even if the result exists")
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_probe_options(parser, *, default_Cs: Iterable[float], inner_folds: int = 3, what: str = "") -> None:
    """``--folds``, ``--inner-folds`` and ``--Cs``: a cross-validated probe's options, the same in every
    command that fits one (``what`` names the probe in the help: "of the probe")."""
    grid = ",".join(f"{c:g}" for c in default_Cs)
    parser.add_argument("--folds", type=int_at_least(2), default=5,
                        help=f"outer cross-validation folds{what} (default 5)")
    parser.add_argument("--inner-folds", type=int_at_least(2), default=inner_folds,
                        help=f"inner cross-validation folds choosing C (default {inner_folds})")
    parser.add_argument("--Cs", type=positive_floats, nargs="+", default=None,
                        help=f"the C grid, e.g. 0.003,0.01,0.1 (one value: a fixed C, no inner CV; default {grid})")


def add_layers_option(parser, default: str = "every layer stored") -> None:
    """``--layers``: one spec everywhere (:mod:`probing.layers`: ``all``, ``0,3,-1``, ``2-4``; -1 = last)."""
    parser.add_argument("--layers", default=None,
                        help=f"layers: 'all', a comma list or a-b ranges; -1 is the last (default: {default})")


def split_list(value: str | None) -> list[str]:
    """A comma-list option value -> its items, blanks dropped (``"cls, mean"`` -> ``["cls", "mean"]``)."""
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def one_value(value: str, option: str) -> str:
    """The single item of a comma-list option that takes exactly one here; ValueError naming it otherwise."""
    items = split_list(value)
    if len(items) != 1:
        raise ValueError(f"{option} {value!r}: this command takes exactly one value, got {len(items)}")
    return items[0]


def cli_error(err: BaseException) -> int:
    """Print ``error: <message>`` to stderr; the exit status for it (2)."""
    import sys

    message = err.args[0] if isinstance(err, KeyError) and err.args else err  # str(KeyError) adds quotes
    print(f"error: {message}", file=sys.stderr)
    return 2
