"""The examples of the protocol's shared pair tasks, built from a sentence-pair corpus so that a split can keep
every sentence on one side.

A corpus's next-sentence negatives (:mod:`probing.corpus_pairs`) take their second sentence from any other
article of the same topic, and that sentence is often also in one of that article's own examples. Every such
reuse ties two articles together, and on BBC News pairs the ties chain 595 of 1,000 examples into one unit:
no split keeps each sentence on one side (:func:`analyses.finetune.grouped_split` refuses it). The tasks here
redraw only the replacement sentences, inside fixed **units** of two articles (three where the count is odd):
a negative of article A takes its second sentence from A's partner B and the other way round. The partner has
A's topic (``negatives="same_topic"``: the label is coherence) or another topic (``"other_topic"``: BERT's
next-sentence prediction, whose negatives were random sentences of the corpus; a fine-tuned encoder learns it
at a budget where it does not learn coherence). A unit never shares a sentence with another, so a split by
unit is leak-free, and the ``doc`` label becomes the unit (``"business/021+sport/044"``), the cluster of every
split and bootstrap; ``article`` keeps sentence 1's article.

* :func:`next_sentence_examples`: ``is_next`` (coherent pair or not), the negatives the corpus chose, their
  second sentence from the partner article: a pair task where the boundary between the sentences can matter;
* :func:`pair_topic_examples`: ``topic`` of the coherent pairs only, where both sentences come from one
  article and so share its topic (a label defined for the whole input).
"""

from __future__ import annotations

import random
from typing import Sequence

from probing.examples import Example

#: Labels a pair corpus's examples must have for these tasks.
NEEDED = ("doc", "topic", "is_next")


def _check(examples: Sequence[Example]) -> None:
    if not examples:
        raise ValueError("no examples given")
    bad = [e.id for e in examples if e.n_sentences != 2]
    if bad:
        raise ValueError(f"the pair tasks need examples of 2 sentences; {len(bad)} have another number, "
                         f"e.g. {bad[:3]}")
    for label in NEEDED:
        missing = [e.id for e in examples if label not in e.labels]
        if missing:
            raise ValueError(f"label {label!r} is missing from {len(missing)} of {len(examples)} examples, "
                             f"e.g. {missing[:3]}; the pair tasks need {', '.join(NEEDED)}")


#: Where a negative's second sentence comes from (``[finetune] negatives``, the corpus specs' word for the same idea):
#: ``same_topic``, another article of sentence 1's topic (the label is coherence); ``other_topic``, an article of
#: another topic, as next-sentence prediction drew its negatives in BERT's pretraining (Devlin et al. 2019,
#: sec. 3.1: a random sentence of the corpus, so mostly another topic; the label is then learnable from topic).
NEGATIVES = ("same_topic", "other_topic")


def article_units(examples: Sequence[Example], seed: int = 0, negatives: str = "same_topic") -> dict[str, str]:
    """Article -> its unit's name; the name joins the unit's sorted articles with ``+``.

    ``same_topic``: the articles of each topic (sentence 1's topic) in a seeded order, taken two at a time (the
    last three together where the count is odd); a topic with a single article has no partner: ValueError naming
    it. ``other_topic``: all articles ordered by topic (a seeded order within each), article i paired with article
    i + n/2 (the last three together where n is odd), so the two articles of a unit have different topics as long
    as no topic holds half of the articles or more (ValueError otherwise)."""
    _check(examples)
    if negatives not in NEGATIVES:
        raise ValueError(f"unknown negatives {negatives!r}; valid: {', '.join(NEGATIVES)}")
    by_topic: dict[str, list[str]] = {}
    for e in examples:
        docs = by_topic.setdefault(str(e.labels["topic"]), [])
        if str(e.labels["doc"]) not in docs:
            docs.append(str(e.labels["doc"]))
    rng = random.Random(f"article-units:{seed}")
    groups: list[list[str]] = []
    if negatives == "same_topic":
        for topic in sorted(by_topic):
            docs = sorted(by_topic[topic])
            if len(docs) < 2:
                raise ValueError(f"topic {topic!r} has a single article ({docs[0]}); a next-sentence negative needs a "
                                 f"second sentence from another article of the same topic")
            rng.shuffle(docs)
            groups += _twos(docs)
    else:
        ordered = []
        for topic in sorted(by_topic):
            docs = sorted(by_topic[topic])
            rng.shuffle(docs)
            ordered += docs
        topic_of = {d: t for t, docs in by_topic.items() for d in docs}
        biggest = max(by_topic, key=lambda t: len(by_topic[t]))
        half = len(ordered) // 2
        if len(by_topic[biggest]) > half:
            raise ValueError(f"topic {biggest!r} holds {len(by_topic[biggest])} of {len(ordered)} articles; "
                             f"negatives='other_topic' pairs every article with one of another topic, so no topic may "
                             f"hold half of them")
        groups = [[ordered[i], ordered[i + half]] for i in range(half)]
        if len(ordered) % 2:
            groups[-1].append(ordered[-1])
        for group in groups:
            if len({topic_of[d] for d in group}) < 2:  # the checks above exclude it; a guard for the reader
                raise AssertionError(f"unit {group} has a single topic")
    units: dict[str, str] = {}
    for group in groups:
        name = "+".join(sorted(group))
        units.update({d: name for d in group})
    return units


def _twos(docs: list[str]) -> list[list[str]]:
    """``docs`` taken two at a time, the last three together where the count is odd."""
    groups = [docs[i:i + 2] for i in range(0, len(docs) - len(docs) % 2, 2)]
    if len(docs) % 2:
        groups[-1].append(docs[-1])
    return groups


def next_sentence_examples(examples: Sequence[Example], seed: int = 0,
                           negatives: str = "same_topic") -> list[Example]:
    """``examples`` (a pair corpus: labels ``doc``, ``topic``, ``is_next``) with every negative's second sentence
    redrawn from the other article(s) of its unit (:func:`article_units`, by ``negatives``): one of their own
    sentences (sentence 1 of any of their examples, sentence 2 of a coherent one), seeded. Positives are kept as
    they are. Labels: ``doc`` the unit, ``article`` sentence 1's article, ``topic`` sentence 1's topic and
    ``topic_s2`` sentence 2's (another topic in an ``other_topic`` negative), ``is_next`` as given, and the others
    unchanged. Ids and order are kept."""
    units = article_units(examples, seed, negatives)
    own: dict[str, list[str]] = {}
    topic_of: dict[str, str] = {}
    for e in examples:
        sentences = own.setdefault(str(e.labels["doc"]), [])
        topic_of[str(e.labels["doc"])] = e.labels["topic"]
        for s in e.sentences[:1] if int(e.labels["is_next"]) == 0 else e.sentences:
            if s not in sentences:
                sentences.append(s)
    rng = random.Random(f"next-sentence:{seed}")
    out = []
    for e in examples:
        article = str(e.labels["doc"])
        s1, s2 = e.sentences
        topic_s2 = e.labels["topic"]
        if int(e.labels["is_next"]) == 0:
            pool = [(s, d) for d in sorted(units[article].split("+"))
                    if d != article and (negatives == "same_topic" or topic_of[d] != topic_of[article])
                    for s in own[d] if s != s1]
            if not pool:
                raise ValueError(f"example {e.id!r}: the other article(s) of unit {units[article]!r} have no sentence "
                                 f"to pair with its sentence 1")
            s2, donor = rng.choice(pool)
            topic_s2 = topic_of[donor]
        labels = {**e.labels, "doc": units[article], "article": article, "topic_s2": topic_s2}
        out.append(Example(e.id, (s1, s2), labels))
    return out


def pair_topic_examples(examples: Sequence[Example], seed: int = 0) -> list[Example]:
    """The coherent pairs (``is_next == 1``) of :func:`next_sentence_examples`: both sentences from one article,
    so the pair has one topic; ``doc`` is the same unit as in the ``next`` task."""
    return [e for e in next_sentence_examples(examples, seed) if int(e.labels["is_next"]) == 1]
