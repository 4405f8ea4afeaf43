"""Your own corpus file: :func:`read_table` reads ``.csv``, ``.tsv`` or ``.jsonl``, one example a row."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Sequence

from probing.examples import DOC_LABEL, MISSING_TEXT, Example, Label, first_few, missing_label

__all__ = ["INT_TEXT", "TABLE_SUFFIXES", "read_table"]

#: The suffixes :func:`read_table` reads.
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")
#: An integer as text (a CSV/TSV label cell, a spec value).
INT_TEXT = re.compile(r"[+-]?\d+")


def _check_field_counts(path: Path, sep: str) -> None:
    """Every non-blank row has as many fields as the header. pandas would otherwise read rows with one
    field more (a trailing delimiter) with the first column as the index, shifting every column, and
    pad rows with fewer fields, moving their cells into the wrong columns."""
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=sep)
        header = next(reader, None)
        if header is None:
            return
        for row, fields in enumerate(reader):
            if fields and len(fields) != len(header):
                extra = " (a trailing delimiter?)" if len(fields) > len(header) else ""
                raise ValueError(
                    f"{path}: row {row} (line {reader.line_num}) has {len(fields)} fields but the header has "
                    f"{len(header)}{extra}; every row needs one field per header column (quote a cell that "
                    f"contains {sep!r})")


def _read_delimited(path: Path, sep: str) -> tuple[list[str], list[dict[str, Any]]]:
    import pandas as pd

    try:
        _check_field_counts(path, sep)
        # every cell as text, empty cells as "" (not NaN), so "NA" or "1" stay sentences as written;
        # blank lines are rows (an empty one-column sentence is an error, not silently dropped)
        frame = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, na_filter=False,
                            skip_blank_lines=False, index_col=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot parse as {'TSV' if sep == chr(9) else 'CSV'}: {e}") from e
    columns = [str(c) for c in frame.columns]
    return columns, [dict(zip(columns, values)) for values in frame.itertuples(index=False, name=None)]


def _read_jsonl(path: Path) -> tuple[list[str], list[dict[str, Any]], list[int]]:
    columns: dict[str, None] = {}
    rows, line_numbers = [], []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no} is not valid JSON ({e.msg}): {line.strip()[:80]!r}") from e
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {line_no} is a JSON {type(record).__name__}, not an object")
            columns.update(dict.fromkeys(record))
            rows.append(record)
            line_numbers.append(line_no)
    return list(columns), rows, line_numbers


def _typed_text_labels(values: list[str]) -> list[Label]:
    """A CSV/TSV label column as int if every cell is an integer, else float if every cell is a number, else str."""
    if all(INT_TEXT.fullmatch(v.strip()) for v in values):
        return [int(v) for v in values]
    try:
        return [float(v) for v in values]
    except ValueError:
        return list(values)


def _refuse_missing(path: Path, column: str, values: list[Any], where: list[str], ids: list[str], *,
                    text: bool) -> None:
    """Refuse a label column with missing cells, naming the first few rows and their count. ``text``: CSV/TSV
    cells, where an empty cell or a spelling in :data:`probing.examples.MISSING_TEXT` (``NA``, ``nan``,
    ``null``, ...) is missing: pandas, R and spreadsheets write those for "no value", and ``nan`` in a number
    column would otherwise become a float NaN label, ``NA`` in a text column a class or document of its own.
    In JSONL null, NaN and empty strings are missing; a quoted string such as ``"NA"`` is kept as written, so
    a label that really is ``NA`` can be given there."""
    if text:
        bad = [i for i, v in enumerate(values) if v.strip() in MISSING_TEXT]
    else:
        bad = [i for i, v in enumerate(values) if missing_label(v) or (isinstance(v, str) and not v.strip())]
    if not bad:
        return
    listed = first_few(f"{where[i]} (id {ids[i]!r}) {values[i]!r}" for i in bad)
    why = (" (the document id that every split and bootstrap groups by: an example without one would "
           "silently be a group of its own)" if column == DOC_LABEL else "")
    keep = ("; to keep such text as a label, write the corpus as JSONL, where a quoted string such as \"NA\" "
            "stays as written" if text and any(values[i].strip() for i in bad) else "")
    raise ValueError(f"{path}: label column {column!r}{why} is missing in {len(bad)} of {len(values)} rows: "
                     f"{listed}; fill these cells in or drop the rows{keep}")


def read_table(path: str | Path, sentence_columns: Sequence[str] | str, label_columns: Sequence[str] | str = (),
               id_column: str | None = None) -> list[Example]:
    """Read examples from a ``.csv``, ``.tsv`` or ``.jsonl`` file (chosen by suffix), one example a row.

    ``sentence_columns`` name sentences 1..k in order; every cell must be a non-empty string.
    ``label_columns`` become labels: in CSV/TSV a column whose cells are all integers is read as int,
    all numbers as float, else str; in JSONL the JSON types are kept (str, int, float, bool). Missing label
    cells are errors naming every column's first few such rows and their count: in CSV/TSV an empty cell
    or one that pandas reads as missing (``NA``, ``nan``, ``null``, ``None``, ``N/A``, ...:
    :data:`probing.examples.MISSING_TEXT`), in JSONL null, NaN or an empty string (a quoted ``"NA"`` stays a
    label there). Ids come from ``id_column`` (as str, must be unique and non-empty) or
    default to the row number ``"0", "1", ...`` (rows count from 0, header and blank JSONL lines
    excluded; blank CSV/TSV lines count as rows). CSV/TSV are read with pandas, every cell as text (so
    ``NA`` stays a word); JSONL is
    read line by line with :mod:`json` so errors can name the line and JSON types are kept exactly.

    Raises FileNotFoundError for a missing file and ValueError naming the file and the offending
    row/column for: an unsupported suffix, unparsable content, missing columns (the available ones are
    listed), no rows, empty or non-string sentence cells, bad label cells, duplicate ids.
    """
    path = Path(path)
    sentence_columns = (sentence_columns,) if isinstance(sentence_columns, str) else tuple(sentence_columns)
    label_columns = (label_columns,) if isinstance(label_columns, str) else tuple(label_columns)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; supported: {', '.join(TABLE_SUFFIXES)}")
    if not sentence_columns:
        raise ValueError(f"{path}: sentence_columns is empty; name at least one column holding sentences")
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")

    if suffix == ".jsonl":
        columns, rows, line_numbers = _read_jsonl(path)
        where = [f"row {i} (line {n})" for i, n in enumerate(line_numbers)]
    else:
        columns, rows = _read_delimited(path, "\t" if suffix == ".tsv" else ",")
        where = [f"row {i}" for i in range(len(rows))]
    wanted = list(dict.fromkeys([*sentence_columns, *label_columns] + ([id_column] if id_column is not None else [])))
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; available columns: {columns}")
    if not rows:
        raise ValueError(f"{path}: no data rows")

    def cell(i: int, column: str) -> Any:
        if column not in rows[i]:  # JSONL rows may lack keys that other rows have
            raise ValueError(f"{path}: {where[i]} has no value for column {column!r}")
        return rows[i][column]

    ids: list[str] = []
    first_row_of: dict[str, int] = {}
    for i in range(len(rows)):
        if id_column is None:
            ids.append(str(i))
            continue
        value = cell(i, id_column)
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
            raise ValueError(f"{path}: {where[i]}, id column {id_column!r}: id must be a non-empty string or "
                             f"integer, got {value!r}")
        ids.append(str(value).strip())
        if ids[-1] in first_row_of:
            raise ValueError(f"{path}: duplicate id {ids[-1]!r} in column {id_column!r} at rows "
                             f"{first_row_of[ids[-1]]} and {i}")
        first_row_of[ids[-1]] = i

    sentences: list[list[str]] = [[] for _ in rows]
    for column in sentence_columns:
        for i in range(len(rows)):
            value = cell(i, column)
            if not isinstance(value, str):
                raise ValueError(f"{path}: {where[i]} (id {ids[i]!r}), sentence column {column!r}: expected a "
                                 f"string, got {type(value).__name__} {value!r}")
            if not value.strip():
                raise ValueError(f"{path}: {where[i]} (id {ids[i]!r}), sentence column {column!r} is empty")
            sentences[i].append(value)

    labels: list[dict[str, Label]] = [{} for _ in rows]
    for column in label_columns:
        values = [cell(i, column) for i in range(len(rows))]
        _refuse_missing(path, column, values, where, ids, text=suffix != ".jsonl")
        for i, value in enumerate(values):
            if isinstance(value, (list, dict)):
                raise ValueError(f"{path}: {where[i]} (id {ids[i]!r}), label column {column!r}: unsupported label "
                                 f"value {value!r} (a label is a string, a number or a boolean)")
        if suffix != ".jsonl":
            values = _typed_text_labels(values)
        for i, value in enumerate(values):
            labels[i][column] = value
    return [Example(ids[i], tuple(sentences[i]), labels[i]) for i in range(len(rows))]
