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
            raise TypeError(f"example {self.id!r}: sentences must be a sequence of strings, "
                            f"got {type(self.sentences).__name__}")
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


#: What :func:`as_examples` takes, for its messages.
AS_EXAMPLES_HELP = ("a list of probing.Example objects, of strings (one one-sentence example each), or of tuples or "
                    "lists of strings (one example each: sentence 1, sentence 2, ...), one kind for the whole list")


def _kind(item: Any) -> str:
    if isinstance(item, Example):
        return "Example"
    if isinstance(item, str):
        return "string"
    if isinstance(item, (tuple, list)):
        return "tuple of strings"
    return type(item).__name__


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def as_examples(items: Iterable[Any]) -> list[Example]:
    """The examples a notebook has at hand, as :class:`Example` objects: a list of examples as it is; a
    list of strings, one one-sentence example each; a list of tuples (or lists) of strings, one example
    each with the tuple's strings as sentences 1, 2, .... Made examples have no labels and the ids
    ``"0", "1", ...`` (their positions, as :func:`probing.corpus_files.read_table` numbers rows without an
    id column). Anything else, a list mixing these kinds, an empty string or a non-string in a tuple is
    a TypeError or ValueError naming the item and saying what to pass.

    >>> [(e.id, e.sentences) for e in as_examples(["One.", "Two."])]
    [('0', ('One.',)), ('1', ('Two.',))]
    >>> as_examples([("A.", "B.")])[0].sentences
    ('A.', 'B.')
    """
    if isinstance(items, (str, bytes, Example, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"examples: got {_a(type(items).__name__)}; pass {AS_EXAMPLES_HELP}")
    items = list(items)
    if not items:
        raise ValueError(f"examples: the list is empty; pass {AS_EXAMPLES_HELP}")
    kinds = [_kind(item) for item in items]
    for i, (item, kind) in enumerate(zip(items, kinds)):
        if kind not in ("Example", "string", "tuple of strings"):
            raise TypeError(f"examples: item {i} is {_a(kind)} ({item!r:.60}); pass {AS_EXAMPLES_HELP}")
    if len(set(kinds)) > 1:
        j = next(j for j, k in enumerate(kinds) if k != kinds[0])
        raise TypeError(f"examples: the list mixes kinds (item 0 is {_a(kinds[0])}, item {j} {_a(kinds[j])}); pass "
                        f"{AS_EXAMPLES_HELP}")
    if kinds[0] == "Example":
        return items
    out = []
    for i, item in enumerate(items):
        sentences = (item,) if isinstance(item, str) else tuple(item)
        if not sentences:
            raise ValueError(f"examples: item {i} is an empty {type(item).__name__}; an example needs at least one "
                             f"sentence")
        for j, s in enumerate(sentences):
            where = f"item {i}" + (f", sentence {j + 1}," if not isinstance(item, str) else "")
            if not isinstance(s, str):
                raise TypeError(f"examples: {where} is {_a(type(s).__name__)} ({s!r:.60}), not a string; pass "
                                f"{AS_EXAMPLES_HELP} (for labels, build probing.Example(id, sentences, labels))")
            if not s.strip():
                raise ValueError(f"examples: {where} is an empty string; every sentence needs text")
        out.append(Example(str(i), sentences))
    return out
