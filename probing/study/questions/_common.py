"""What several questions share: corpora derived from the sentence pairs, and the fine-tuning tasks.

Derived corpora keep every example's id, document and topic, so that a cache of one is paired with the
reference cache of the pairs example by example (:mod:`analyses.representation_change`):

* :data:`SWAPPED`: two adjacent words of sentence 1 swapped, in every example that has two different adjacent
  words (:func:`swap_in_every_example`; Q1's yardstick "swapping two words", Q7's minimal pairs);
* :data:`REPLACED`: sentence 2 replaced by a sentence of the same topic from an article the pairs corpus does
  not hold (:func:`replace_second`; Q1's yardstick "another sentence 2", Q2's interchange). Drawing from
  other articles keeps every sentence of the derived corpus in one document only.

Both are made from a seeded subset of whole documents of the pairs corpus (``[corpus] derived_examples``),
so that their caches cost less than the pairs' own.
"""

from __future__ import annotations

import random
import re
from typing import Any, Sequence

from ...examples import DOC_LABEL, Example
from ...corpus_pairs import swap_adjacent_words
from ..sections import Job

#: The derived corpora's keys (the runner extracts their caches like any corpus's).
SWAPPED = "pairs_swapped"
REPLACED = "pairs_s2_replaced"
#: What each derived corpus is, in words (notes and the report's corpus list).
DERIVED = {SWAPPED: "the pairs with two adjacent words of sentence 1 swapped",
           REPLACED: "the pairs with sentence 2 replaced by a same-topic sentence of another article"}

_WORD = re.compile(r"\S+")


def pairs_job(fmt: str) -> Job:
    """The cache of the pairs corpus in format ``fmt``, the same job whichever question asks for it, so that it is
    extracted once: ``pair`` and ``concat`` carry the raw and the norm-based attention summaries (Q2's attention
    from sentence 1 to sentence 2)."""
    with_attention = fmt in ("pair", "concat")
    return Job("pairs", fmt, attention=with_attention, attention_norm=with_attention)


def document_subset(examples: Sequence[Example], n: int | None, seed: int = 0) -> list[Example]:
    """Whole documents of ``examples`` (the ``doc`` label; an example without one is its own document), in a
    seeded random order, until at least ``n`` examples are taken (all when ``n`` is None or not smaller);
    returned in corpus order. Keeping documents whole keeps the bootstrap over documents honest."""
    examples = list(examples)
    if n is None or n >= len(examples):
        return examples
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of examples must be None or an integer >= 1, got {n!r}")
    docs = list(dict.fromkeys(str(e.labels.get(DOC_LABEL, e.id)) for e in examples))
    random.Random(seed).shuffle(docs)
    size: dict[str, int] = {}
    for e in examples:
        d = str(e.labels.get(DOC_LABEL, e.id))
        size[d] = size.get(d, 0) + 1
    chosen, total = set(), 0
    for d in docs:
        if total >= n:
            break
        chosen.add(d)
        total += size[d]
    return [e for e in examples if str(e.labels.get(DOC_LABEL, e.id)) in chosen]


def _swappable(sentence: str) -> bool:
    words = _WORD.findall(sentence)
    return any(a != b for a, b in zip(words, words[1:]))


def swap_in_every_example(examples: Sequence[Example], seed: int = 0) -> list[Example]:
    """The examples whose sentence 1 has two adjacent different words, each with one such pair swapped
    (:func:`probing.corpus_pairs.swap_adjacent_words`: labels ``swapped`` = 1 and ``swap_word``, the index of
    the first swapped word); the others are left out (nothing could be swapped, so nothing is measured)."""
    can = [e for e in examples if _swappable(e.sentences[0])]
    return swap_adjacent_words(can, sentence=1, fraction=1.0, seed=seed)


def _topic(e: Example, sentence: int) -> Any:
    return e.labels.get(f"topic_s{sentence}", e.labels.get("topic")) if sentence > 1 else e.labels.get("topic")


def replace_second(examples: Sequence[Example], pool: Sequence[Example], seed: int = 0,
                   pool_name: str = "the replacement corpus") -> list[Example]:
    """Sentence 2 of every example replaced by a sentence of ``pool`` of the same topic as the sentence it
    replaces (``topic_s2``, else ``topic``; any topic where the examples have none), from a document that
    none of ``examples`` comes from and not itself a sentence of ``examples``. Drawn with ``random.Random(seed)``
    without replacement while the topic's candidates last (then each is used again in turn). Labels: the
    example's, with ``topic_s2`` the replacement's topic, ``s2_doc`` its document and ``is_next`` removed (the
    pair is no longer a document's two sentences). A topic without a candidate is a ValueError naming it."""
    examples = list(examples)
    docs = {str(e.labels.get(DOC_LABEL, e.id)) for e in examples}
    own = {s.strip() for e in examples for s in e.sentences}
    by_topic: dict[Any, list[tuple[str, str, Any]]] = {}
    seen = set()
    for p in pool:
        doc = str(p.labels.get(DOC_LABEL, p.id))
        for s in p.sentences:
            text = s.strip()
            if doc in docs or text in own or text in seen:
                continue
            seen.add(text)
            by_topic.setdefault(p.labels.get("topic"), []).append((s, doc, p.labels.get("topic")))
    any_topic = all(_topic(e, 2) is None for e in examples)
    rng = random.Random(seed)
    queues: dict[Any, list] = {}
    out = []
    for e in examples:
        if e.n_sentences < 2:
            raise ValueError(f"example {e.id!r} has {e.n_sentences} sentence(s): there is no sentence 2 to replace")
        topic = None if any_topic else _topic(e, 2)
        cands = [c for cs in by_topic.values() for c in cs] if any_topic else by_topic.get(topic, [])
        if not cands:
            have = sorted(str(t) for t in by_topic)
            raise ValueError(f"{pool_name} has no sentence of topic {topic!r} outside the pairs' documents to "
                             f"replace sentence 2 of example {e.id!r} with (its topics there: {have}); give it more "
                             f"articles of that topic")
        queue = queues.get(topic)
        if not queue:
            queue = queues[topic] = rng.sample(cands, len(cands))
        sentence, doc, t = queue.pop()
        labels = {k: v for k, v in e.labels.items() if k != "is_next"}
        labels["s2_doc"] = doc
        if t is not None:
            labels["topic_s2"] = t
        out.append(Example(e.id, (e.sentences[0], sentence, *e.sentences[2:]), labels))
    return out


def derived_pairs(cfg, corpora: dict) -> dict[str, list[Example]]:
    """The derived corpora (module docstring) from ``corpora["pairs"]`` and, for :data:`REPLACED`,
    ``corpora["replacements"]``: ``{SWAPPED: ..., REPLACED: ...}``."""
    base = document_subset(corpora["pairs"], cfg.corpus.derived_examples, cfg.study.seed)
    return {SWAPPED: swap_in_every_example(base, cfg.study.seed),
            REPLACED: replace_second(base, corpora["replacements"], cfg.study.seed,
                                     f"corpus.replacements ({cfg.corpus.replacements})")}


# ---------------------------------------------------------------------------------------------------
# Fine-tuning: the shared protocol's tasks and seeds


def protocol_seeds(cfg) -> tuple[int, ...]:
    """The training seeds of every fine-tuned run (``[finetune] seeds``)."""
    return tuple(cfg.finetune.seeds)


def next_task(cfg, corpora: dict):
    """The ``next`` task: is_next on the pairs corpus (same-topic negatives), one document-grouped split.

    TODO(lead): placeholder with the Q6/Q8 module's name and signature; its definition replaces this one."""
    from analyses.finetune import PROTOCOL_PRESETS, make_task

    settings = PROTOCOL_PRESETS[cfg.finetune.preset]
    return make_task(corpora["pairs"], "is_next", test_fraction=settings["test_fraction"], seed=cfg.study.seed)
