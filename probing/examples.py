"""The unit of data: an example is an id, a tuple of sentences and a dict of labels."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, Union

Label = Union[str, int, float, bool]


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
