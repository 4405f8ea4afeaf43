"""One notion of a group: the unit that is resampled, split or cross-validated together.

Sentences of one article share names and vocabulary, so their measurements are correlated: a
bootstrap or a split that treats them as independent gives intervals that are too narrow and scores
that leak (DESIGN.md, "Group by the unit that leaks"). The rule, declared once here and used by the
probes, fine-tuning, drift, attention, neighbour and intervention runners: group by the ``doc`` label
when the corpus has one, by the example when it has none; a ``doc`` label that some examples lack is an
error, never a silent fall back to examples. Every table that carries a CI records the
grouping used (``grouping``: one of :data:`GROUPINGS`) and ``n_groups``.

>>> from probing.examples import Example
>>> exs = [Example("a", ("x.",), {"doc": "d1"}), Example("b", ("y.",), {"doc": "d1"})]
>>> example_groups(exs)
(array(['d1', 'd1'], dtype=object), 'document')
>>> example_groups([Example("a", ("x.",))])
(array(['a'], dtype=object), 'example')
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from probing.cache import Cache
from probing.examples import DOC_LABEL, Example, first_few, missing_label

#: The grouping names a table may record, declared once.
GROUPINGS: tuple[str, ...] = ("document", "example")


def table_groups(examples: pd.DataFrame, name: str = "the corpus") -> tuple[np.ndarray, str]:
    """``(groups (n,), grouping)`` for rows of an example table (``cache.examples``, or rows of it in
    the order of the items, indexed by example): the ``doc`` label of every row (column ``label_doc``,
    as a cache stores it, or ``doc``) and ``"document"`` when the table has one; without that column the
    index (one group per example) and ``"example"``. A ``doc`` column with a missing value (NaN, or the
    empty text a cache stores for an example without the label) is a ValueError naming ``name`` (the
    cache) and the examples: grouping them by example would ignore the declared documents unnoticed.
    Feed ``groups`` to :func:`analyses.probes.make_splits`: its outer splits are a pure function of
    ``(y, groups, n_splits, seed)``, so any model evaluated on them (frozen probes, fine-tuning) sees the
    same test items.

    >>> table_groups(pd.DataFrame({"doc": ["a", "a", "b"]}, index=[4, 5, 6]))
    (array(['a', 'a', 'b'], dtype=object), 'document')
    >>> table_groups(pd.DataFrame({"topic": ["x", "y"]}, index=[4, 5]))
    (array([4, 5]), 'example')
    """
    col = next((c for c in (f"label_{DOC_LABEL}", DOC_LABEL) if c in examples.columns), None)
    if col is not None and len(examples):
        docs = examples[col]
        # a cache stores a text label an example lacks as "" and a numeric one as NaN
        missing = docs.isna().to_numpy() | docs.astype(str).str.strip().eq("").to_numpy()
        if missing.any():
            ids = examples["example_id"] if "example_id" in examples.columns else examples.index
            raise ValueError(
                f"{name}: the {DOC_LABEL!r} label is missing for {int(missing.sum())} of {len(examples)} examples "
                f"({first_few(repr(i) for i in ids[missing])}): every split and bootstrap groups by document, "
                f"and examples without one cannot be placed; give every example its document, or leave the "
                f"{DOC_LABEL!r} label out of the corpus to group by example")
        return docs.to_numpy(dtype=object), "document"
    return examples.index.to_numpy(), "example"


def example_groups(examples: Sequence[Example], name: str = "the corpus") -> tuple[np.ndarray, str]:
    """``(groups (n,) object, grouping)`` for a list of examples, by the rule of :func:`table_groups`:
    each example's ``doc`` label and ``"document"`` when the examples have one, its id and ``"example"``
    when none has; some with and some without is a ValueError naming ``name`` and the examples."""
    docs = [e.labels.get(DOC_LABEL) for e in examples]
    if all(d is None for d in docs):
        return np.asarray([e.id for e in examples], dtype=object), "example"
    missing = [e.id for e, d in zip(examples, docs) if missing_label(d) or (isinstance(d, str) and not d.strip())]
    if missing:
        raise ValueError(f"{name}: the {DOC_LABEL!r} label is missing for {len(missing)} of {len(examples)} examples "
                         f"({first_few(repr(i) for i in missing)}): every split and bootstrap groups by document; "
                         f"give every example its document, or leave the label out to group by example")
    return np.asarray(docs, dtype=object), "document"


def cache_groups(cache: Cache, examples: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """``(groups, grouping)`` for corpus indices ``examples: (n,)`` of a cache (default: all of its
    examples), by the rule of :func:`table_groups`, read from the cache's stored corpus."""
    table = cache.examples
    if examples is None:
        return table_groups(table, str(cache.path))
    # examples may repeat (one per token): look each up once rather than copying a table row per token
    uniq, inverse = np.unique(np.asarray(examples), return_inverse=True)
    groups, grouping = table_groups(table.iloc[uniq], str(cache.path))
    return groups[inverse.reshape(-1)], grouping


def group_info(groups: np.ndarray, grouping: str) -> dict:
    """The columns every table with a CI records: ``{"grouping": ..., "n_groups": ...}``."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; valid: {', '.join(GROUPINGS)}")
    return {"grouping": grouping, "n_groups": int(np.unique(np.asarray(groups)).size)}
