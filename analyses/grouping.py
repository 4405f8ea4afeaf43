"""One notion of a group: the unit that is resampled, split or cross-validated together.

Sentences of one article share names and vocabulary, so their measurements are correlated: a
bootstrap or a split that treats them as independent gives intervals that are too narrow and scores
that leak (DESIGN.md, "Group by the unit that leaks"). The rule, declared once here: group by the
``doc`` label when every example has one, by the example otherwise. Every table that carries a CI
records the grouping used (``grouping``: one of :data:`GROUPINGS`) and ``n_groups``.

>>> from probing.examples import Example
>>> exs = [Example("a", ("x.",), {"doc": "d1"}), Example("b", ("y.",), {"doc": "d1"})]
>>> example_groups(exs)
(array(['doc=d1', 'doc=d1'], dtype=object), 'document')
>>> example_groups([Example("a", ("x.",))])
(array(['id=a'], dtype=object), 'example')
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from probing.cache import Cache
from probing.examples import Example

#: The grouping names a table may record, declared once.
GROUPINGS: tuple[str, ...] = ("document", "example")
#: The label that names an example's document.
DOC_LABEL = "doc"


def example_groups(examples: Sequence[Example]) -> tuple[np.ndarray, str]:
    """``(groups (n,) object, grouping)`` for a list of examples: ``"doc=<doc>"`` per example and
    ``"document"`` when every example has a ``doc`` label, else ``"id=<id>"`` and ``"example"``."""
    if examples and all(DOC_LABEL in e.labels and e.labels[DOC_LABEL] is not None for e in examples):
        return np.asarray([f"doc={e.labels[DOC_LABEL]}" for e in examples], dtype=object), "document"
    return np.asarray([f"id={e.id}" for e in examples], dtype=object), "example"


def cache_groups(cache: Cache, examples: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """``(groups, grouping)`` for corpus indices ``examples: (n,)`` of a cache (default: all of its
    examples), by the same rule as :func:`example_groups`, read from the cache's stored corpus."""
    table = cache.examples
    idx = np.arange(len(table)) if examples is None else np.asarray(examples)
    col = f"label_{DOC_LABEL}"
    if col in table.columns and table[col].notna().all():
        return np.asarray([f"doc={v}" for v in table[col].to_numpy()[idx]], dtype=object), "document"
    return np.asarray([f"id={v}" for v in table["example_id"].to_numpy()[idx]], dtype=object), "example"


def group_info(groups: np.ndarray, grouping: str) -> dict:
    """The columns every table with a CI records: ``{"grouping": ..., "n_groups": ...}``."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; valid: {', '.join(GROUPINGS)}")
    return {"grouping": grouping, "n_groups": int(np.unique(np.asarray(groups)).size)}
