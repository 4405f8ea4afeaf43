"""The unit of data: an example is an id, a tuple of sentences and a dict of labels."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

Label = Union[str, int, float, bool]
#: The label that names an example's document: the unit every split, cross-validation and bootstrap groups by.
DOC_LABEL = "doc"

#: Text that pandas (``read_csv``'s default ``na_values``), spreadsheets and R write for a missing cell.
#: A CSV/TSV label cell spelled so is refused rather than read as a label: in a table file it almost always
#: means "no value" (tests check this set against pandas' own).
MISSING_TEXT = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                          "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})


def missing_label(value: Any) -> bool:
    """Whether a label value stands for "no value": None, or NaN of any kind (float, numpy, ``pandas.NA``).
    Such a label would make an example its own document or its own class without anyone noticing."""
    if value is None or type(value).__name__ == "NAType":  # pandas.NA, without importing pandas
        return True
    return isinstance(value, numbers.Real) and math.isnan(value)


def first_few(items: Iterable[Any], n: int = 5) -> str:
    """The first ``n`` of ``items`` for a message, then how many more: ``1, 4, 7`` or ``1, 2, 3, 4, 5 and 9 more``.

    >>> first_few(range(8), 3)
    '0, 1, 2 and 5 more'
    """
    items = [str(i) for i in items]
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


@dataclass(frozen=True)
class Example:
    """One input: ``sentences[i]`` is sentence ``i + 1`` of a template (``{1}`` is the first).

    >>> Example("a", ("One.", "Two."), {"topic": "x"}).n_sentences
    2
    """

    id: str
    sentences: tuple[str, ...]
    labels: Mapping[str, Label] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"example id must be a non-empty string, got {self.id!r}")
        if isinstance(self.sentences, str) or not isinstance(self.sentences, Sequence):
            raise TypeError(f"example {self.id!r}: sentences must be a sequence of strings, got {type(self.sentences).__name__}")
        object.__setattr__(self, "sentences", tuple(self.sentences))
        if not self.sentences:
            raise ValueError(f"example {self.id!r} has no sentences")
        for i, s in enumerate(self.sentences):
            if not isinstance(s, str):
                raise TypeError(f"example {self.id!r}: sentence {i + 1} is {type(s).__name__}, not str")
            if not s.strip():
                raise ValueError(f"example {self.id!r}: sentence {i + 1} is empty")
        object.__setattr__(self, "labels", dict(self.labels))
        missing = [name for name, value in self.labels.items() if missing_label(value)]
        if missing:
            raise ValueError(f"example {self.id!r}: label(s) {missing} have no value "
                             f"({', '.join(repr(self.labels[m]) for m in missing)}); leave a label out of an "
                             f"example rather than set it to None or NaN, or drop the example")

    @property
    def n_sentences(self) -> int:
        return len(self.sentences)

    def to_json(self) -> dict:
        return {"id": self.id, "sentences": list(self.sentences), "labels": dict(sorted(self.labels.items()))}


def corpus_fingerprint(examples: Iterable[Example]) -> str:
    """SHA-256 of the canonical JSON lines of the examples, in order (order matters: it is the cache's row order)."""
    h = hashlib.sha256()
    seen: set[str] = set()
    for ex in examples:
        if ex.id in seen:
            raise ValueError(f"duplicate example id {ex.id!r}: ids must be unique within a corpus")
        seen.add(ex.id)
        h.update(json.dumps(ex.to_json(), sort_keys=True, ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()
