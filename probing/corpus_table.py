"""``examples.parquet``: the corpus beside the states (index, id, sentences, labels), so analyses need
nothing else. Written one row group at a time, so its memory does not grow with the corpus."""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from .examples import Example
from .heap import HeapTrimmer, release_arrow_pages

EXAMPLES_ROW_GROUP = 8192  # rows per row group of examples.parquet, written one group at a time


def _label_kinds(examples: Sequence[Example]) -> dict[str, type]:
    """Column type of every label, decided over the whole corpus in one pass (a label column is int
    if every example has an int or bool value, float if every value is a number or missing, else
    str), so that each row group of ``examples.parquet`` gets the same schema."""
    kinds: dict[str, set] = {}
    present: dict[str, int] = {}  # examples with a value that is not None
    for e in examples:
        for name, v in e.labels.items():
            seen = kinds.setdefault(name, set())
            if v is not None:
                seen.add(type(v))
                present[name] = present.get(name, 0) + 1
    out = {}
    for name in sorted(kinds):
        seen = kinds[name]
        if seen <= {int, bool} and present.get(name, 0) == len(examples):
            out[name] = int
        elif seen <= {int, float, bool}:
            out[name] = float
        else:
            out[name] = str
    return out


def examples_table(examples: Sequence[Example], start: int = 0, stop: int | None = None, *,
                   n_sentence_columns: int | None = None, label_kinds: Mapping[str, type] | None = None
                   ) -> pd.DataFrame:
    """The corpus beside the states, so analyses need nothing else: index, id, sentences, labels.
    Rows ``start:stop``; ``n_sentence_columns`` and ``label_kinds`` must be given for the whole corpus
    when only a part is built (:func:`write_examples` builds one row group at a time)."""
    stop = len(examples) if stop is None else stop
    part = [examples[i] for i in range(start, stop)]
    k = max(e.n_sentences for e in examples) if n_sentence_columns is None else n_sentence_columns
    kinds = _label_kinds(examples) if label_kinds is None else label_kinds
    data: dict[str, list] = {"example": list(range(start, stop)), "example_id": [e.id for e in part],
                             "n_sentences": [e.n_sentences for e in part]}
    for i in range(k):
        data[f"sentence_{i + 1}"] = [e.sentences[i] if i < e.n_sentences else "" for e in part]
    for name, kind in kinds.items():
        values = [e.labels.get(name) for e in part]
        if kind is int:
            data[f"label_{name}"] = [int(v) for v in values]
        elif kind is float:
            data[f"label_{name}"] = [float("nan") if v is None else float(v) for v in values]
        else:
            data[f"label_{name}"] = ["" if v is None else str(v) for v in values]
    return pd.DataFrame(data)


def write_examples(tmp: str, examples: Sequence[Example], rows: int | None = None) -> None:
    """Write ``examples.parquet`` one row group of ``rows`` (default :data:`EXAMPLES_ROW_GROUP`)
    examples at a time with ``ParquetWriter``, so its memory does not grow with the corpus. The table
    read back is the same whatever ``rows``; a corpus of at most ``rows`` examples gives the same bytes
    as writing the whole table at once (one row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rows or EXAMPLES_ROW_GROUP
    k = max(e.n_sentences for e in examples)
    kinds = _label_kinds(examples)
    trim = HeapTrimmer()
    writer = None
    try:
        for start in range(0, len(examples), rows):
            df = examples_table(examples, start, min(start + rows, len(examples)), n_sentence_columns=k,
                                label_kinds=kinds)
            table = pa.Table.from_pandas(df, preserve_index=False)
            del df
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            del table
            release_arrow_pages()
            trim()
    finally:
        if writer is not None:
            writer.close()
