"""Corpora derived by replacing sentences with sentences of other documents of the same topic.

Two questions need a sentence replaced by one that is as plausible as the original but comes from
elsewhere: the interchange test (replace sentence i; does what is read out of position i follow the new
sentence, and what is read out of the other positions stay?) and the intruder task (k consecutive
sentences of one article, one of them replaced in half the examples: can a model tell?). The
replacement must differ from the original in one property only, where it comes from, so it is a
sentence of the *same topic* (or a probe learns topic mismatch), and it must come from a document that
is *not an item* of the corpus (or the same sentence sits in two examples, which couples them and, in a
train/test split, leaks). So whole documents are first held out as donors
(:func:`hold_out_documents`), stratified by topic, and every replacement is drawn from them.

* :func:`hold_out_documents`: ``(items, donors)``, about ``fraction`` of each topic's documents held out;
* :func:`replace_sentences`: sentence ``positions[j]`` of example ``j`` replaced by a donor sentence of its
  topic (labels ``replaced``, ``replaced_doc``);
* :func:`intruder_examples`: the first k sentences of each example, one at a random position 2..k replaced
  in exactly half of them (label ``intruded``; ``intruder_position``).

Donor sentences are dealt from a seeded permutation per topic and reused only when a topic's pool is
exhausted (then in the same order again), so a donor sentence appears as few times as the pool allows.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Sequence

from probing.examples import DOC_LABEL, Example

__all__ = ["REPLACEMENT_LABELS", "balanced_positions", "hold_out_documents", "intruder_examples", "replace_sentences"]

#: The labels :func:`replace_sentences` and :func:`intruder_examples` add; an example that has one already
#: was derived before and is refused.
REPLACEMENT_LABELS = ("replaced", "replaced_doc", "intruded", "intruder_position")


def _check_labels(examples: Sequence[Example], label: str) -> None:
    for need in (DOC_LABEL, label):
        missing = [e.id for e in examples if need not in e.labels]
        if missing:
            raise ValueError(f"replacing sentences needs a {need!r} label on every example; {len(missing)} lack it, "
                             f"e.g. {missing[:3]}")


def hold_out_documents(examples: Sequence[Example], fraction: float, seed: int = 0,
                       label: str = "topic") -> tuple[list[Example], list[Example]]:
    """``(items, donors)``: the examples of about ``fraction`` of each ``label`` value's documents (at least
    one document per value, and never all of them) become donors; the rest stay items, in corpus order.
    A value with a single document cannot give a donor and keep an item: ValueError naming it.

    >>> ex = [Example(f"{d}:{j}", ("a.", "b."), {"doc": str(d), "topic": "t" if d < 4 else "u"})
    ...       for d in range(8) for j in range(2)]
    >>> items, donors = hold_out_documents(ex, 0.25)
    >>> len(items), len(donors), {e.labels["topic"] for e in donors}
    (12, 4, {'t', 'u'})
    """
    if not 0 < fraction < 1:
        raise ValueError(f"the share of documents held out as donors must lie in (0, 1), got {fraction!r}")
    examples = list(examples)
    _check_labels(examples, label)
    docs: dict[str, list[str]] = defaultdict(list)  # label value -> its documents, in corpus order
    for e in examples:
        doc = str(e.labels[DOC_LABEL])
        value = str(e.labels[label])
        if doc not in docs[value]:
            docs[value].append(doc)
    rng = random.Random(f"donors:{seed}")
    held: set[str] = set()
    for value in sorted(docs):
        found = docs[value]
        if len(found) < 2:
            raise ValueError(f"{label} {value!r} has {len(found)} document; holding donors out of it would leave no "
                             f"item (or no donor) of that {label}: use a corpus with at least 2 documents per {label}")
        n = min(len(found) - 1, max(1, round(fraction * len(found))))
        held.update(rng.sample(found, n))
    items = [e for e in examples if str(e.labels[DOC_LABEL]) not in held]
    donors = [e for e in examples if str(e.labels[DOC_LABEL]) in held]
    return items, donors


class _Dealer:
    """Donor sentences of each topic dealt in a seeded order, again from the start when exhausted."""

    def __init__(self, donors: Sequence[Example], label: str, seed: int, other: bool = False):
        _check_labels(donors, label)
        self.other = other
        self.picker = random.Random(f"dealer-other:{seed}")
        pools: dict[str, list[tuple[str, str]]] = defaultdict(list)
        seen: set[str] = set()
        for e in donors:
            for s in e.sentences:
                if s.strip() and s not in seen:  # a sentence repeated in the donors is one sentence
                    seen.add(s)
                    pools[str(e.labels[label])].append((s, str(e.labels[DOC_LABEL])))
        rng = random.Random(f"dealer:{seed}")
        self.pools = {t: rng.sample(p, len(p)) for t, p in sorted(pools.items())}
        self.next = {t: 0 for t in self.pools}
        self.label = label

    def deal(self, example: Example, avoid: set[str]) -> tuple[str, str]:
        """A donor sentence of ``example``'s topic from another document, not one of ``avoid``; with ``other``, of
        a topic other than ``example``'s, drawn (seeded) among the donors' other topics."""
        topic = str(example.labels[self.label])
        if self.other:
            others = [t for t in self.pools if t != topic]
            if not others:
                raise ValueError(f"no donor sentence of a {self.label} other than {topic!r} (example "
                                 f"{example.id!r}); the donors hold {sorted(self.pools)}")
            topic = self.picker.choice(others)
        pool = self.pools.get(topic)
        if not pool:
            raise ValueError(f"no donor sentence of {self.label} {topic!r} (example {example.id!r}); hold out more "
                             f"documents of every {self.label}")
        doc = str(example.labels[DOC_LABEL])
        for _ in range(len(pool)):
            sentence, donor_doc = pool[self.next[topic] % len(pool)]
            self.next[topic] += 1
            if donor_doc != doc and sentence not in avoid:
                return sentence, donor_doc
        raise ValueError(f"every donor sentence of {self.label} {topic!r} is from example {example.id!r}'s own "
                         "document or already in it")


def _fresh(examples: Sequence[Example]) -> None:
    for e in examples:
        again = [k for k in REPLACEMENT_LABELS if k in e.labels]
        if again:
            raise ValueError(f"example {e.id!r} already has the label(s) {again}: sentences were replaced before")


def replace_sentences(examples: Sequence[Example], positions: Sequence[int], donors: Sequence[Example],
                      seed: int = 0, label: str = "topic", other: bool = False) -> list[Example]:
    """Each example with sentence ``positions[j]`` (1-based; 0: none) replaced by a sentence of a donor document
    of the same ``label`` value (:func:`hold_out_documents`; ``other``: of another value). Ids are kept (so a
    cache of the replaced corpus pairs with the original's item by item); labels ``replaced`` (the position, 0
    for none) and ``replaced_doc`` (the donor's document, "" for none) are added.

    >>> ex = [Example("a", ("one.", "two."), {"doc": "1", "topic": "t"})]
    >>> donor = [Example("b", ("three.",), {"doc": "2", "topic": "t"})]
    >>> out = replace_sentences(ex, [2], donor)
    >>> out[0].sentences, out[0].labels["replaced"], out[0].labels["replaced_doc"]
    (('one.', 'three.'), 2, '2')
    """
    examples = list(examples)
    if len(positions) != len(examples):
        raise ValueError(f"{len(positions)} positions for {len(examples)} examples")
    _check_labels(examples, label)
    _fresh(examples)
    dealer = _Dealer(donors, label, seed, other)
    out = []
    for e, p in zip(examples, positions):
        p = int(p)
        if not 0 <= p <= e.n_sentences:
            raise ValueError(f"example {e.id!r} has {e.n_sentences} sentences; cannot replace sentence {p}")
        sentences, donor_doc = list(e.sentences), ""
        if p:
            sentences[p - 1], donor_doc = dealer.deal(e, set(e.sentences))
        out.append(Example(e.id, tuple(sentences), {**e.labels, **_consistent(e, p, sentences),
                                                     "replaced": p, "replaced_doc": donor_doc}))
    return out


def _consistent(e: Example, p: int, sentences: Sequence[str]) -> dict:
    """The labels that describe the sentences themselves, made true of the new ones: ``n_words`` (sentence 1's
    words) and ``is_next`` (the last sentence follows the one before it: no longer, if either was replaced)."""
    out = {}
    if p == 1 and "n_words" in e.labels:
        out["n_words"] = len(sentences[0].split())
    if p and "is_next" in e.labels and p >= len(sentences) - 1:
        out["is_next"] = 0
    return out


def balanced_positions(n: int, k: int, seed: int = 0, first: int = 1) -> list[int]:
    """``n`` positions in ``first..k``, each as often as possible (their counts differ by at most one), in a
    seeded order.

    >>> sorted(balanced_positions(6, 3))
    [1, 1, 2, 2, 3, 3]
    """
    if not 1 <= first <= k:
        raise ValueError(f"positions {first}..{k} are empty")
    span = list(range(first, k + 1))
    out = [span[j % len(span)] for j in range(n)]
    random.Random(f"positions:{seed}").shuffle(out)
    return out


def intruder_examples(examples: Sequence[Example], k: int, donors: Sequence[Example], seed: int = 0,
                      label: str = "topic", other: bool = False) -> list[Example]:
    """The intruder task: the first ``k`` sentences of each example (consecutive sentences of one article); in
    exactly half of them (seeded) one sentence at a position 2..k (balanced over the positions) is replaced by a
    donor sentence of the same ``label`` value (:func:`replace_sentences`), or with ``other`` of another value (a
    sentence of another topic). Labels ``intruded`` (1/0) and ``intruder_position`` (0 for none) are added; ids
    and the other labels are kept. Sentence 1 is never the intruder: a sentence is an intruder with respect to
    the ones before it."""
    examples = list(examples)
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"the intruder task needs k >= 2 sentences, got k={k!r}")
    short = [e.id for e in examples if e.n_sentences < k]
    if short:
        raise ValueError(f"{len(short)} example(s) have fewer than k={k} sentences, e.g. {short[:3]}")
    _fresh(examples)
    rng = random.Random(f"intruder:{seed}")
    chosen = sorted(rng.sample(range(len(examples)), len(examples) // 2))
    positions = [0] * len(examples)
    for j, p in zip(chosen, balanced_positions(len(chosen), k, seed, first=2)):
        positions[j] = p
    prefixes = [Example(e.id, e.sentences[:k], e.labels) for e in examples]
    out = []
    for e in replace_sentences(prefixes, positions, donors, seed, label, other=other):
        labels = {key: v for key, v in e.labels.items() if key not in ("replaced", "replaced_doc")}
        p = int(e.labels["replaced"])
        out.append(Example(e.id, e.sentences, {**labels, "intruded": int(p > 0), "intruder_position": p}))
    return out
