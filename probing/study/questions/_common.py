"""What several questions share: corpora derived from the sentence pairs, and the shared fine-tuning
protocol's tasks, seeds and preset, with the words that state its budget.

Derived corpora keep every example's id, document and topic, so that a cache of one is paired with the
reference cache of the pairs example by example (:mod:`analyses.representation_change`):

* :data:`SWAPPED`: two adjacent words of sentence 1 swapped, in every example that has two different adjacent
  words (:func:`swap_in_every_example`; Q1's yardstick "swapping two words", Q7's minimal pairs);
* :data:`REPLACED`: sentence 2 replaced by a sentence of the same topic from an article the pairs corpus does
  not hold (:func:`replace_second`; Q1's yardstick "another sentence 2", Q2's interchange). Drawing from
  other articles keeps every sentence of the derived corpus in one document only.

Both are made from a seeded subset of whole documents of the pairs corpus (``[corpus] derived_examples``),
so that their caches cost less than the pairs' own.

The protocol (:mod:`analyses.finetune`) fine-tunes one encoder per run on a task's fixed split. Two tasks are
built here from the config's ``pairs`` corpus, the same for every question that declares them (Q4 reads
``next``; Q1, Q6 and Q8 both, ``[finetune] format_tasks`` and ``pooling_tasks``):

* ``next`` (:func:`next_task`): is sentence 2 the sentence that follows sentence 1 in its article? Negatives
  take sentence 2 from an article of another topic (``[finetune] negatives = "other_topic"``, as BERT's
  next-sentence prediction did) or of the same topic (``"same_topic"``: coherence alone;
  :func:`analyses.finetune.next_sentence_examples`): a pair task where the boundary between the sentences can
  matter. At the default preset's budget on BBC pairs the same-topic task is not learnt (55-57% against 50%
  chance, :data:`analyses.finetune.PROTOCOL_PRESETS`) and the other-topic task is (66-69%);
* ``topic`` (:func:`topic_task`): the topic of a coherent pair, whose two sentences come from one article and
  so share it.

Both are split once (:func:`analyses.finetune.make_task`: grouped by the units of two articles the negatives
draw from, stratified by the label, the preset's test share, seeded by ``[study] seed``), so every run of a
task predicts the same test items.
"""


from __future__ import annotations

import random
import re
from typing import Any, Sequence

import pandas as pd

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



NEXT, TOPIC = "next", "topic"
#: The label each shared task predicts.
TASK_LABELS = {NEXT: "is_next", TOPIC: "topic"}
#: What each shared task is, in words (notes and evidence).
TASK_WORDS = {NEXT: "is sentence 2 the next sentence of sentence 1's article (negatives: a sentence of another "
                    "article of the same topic)",
              TOPIC: "the topic of a coherent pair (both sentences from one article)"}
#: The ``next`` task's negatives in words, by ``[finetune] negatives``.
NEGATIVE_WORDS = {"same_topic": "a sentence of another article of the same topic",
                  "other_topic": "a sentence of an article of another topic, as in BERT's next-sentence prediction"}


def unit_words(cfg) -> str:
    """How the shared tasks' split groups the items, in words (:func:`analyses.finetune.article_units`)."""
    kind = "one topic" if cfg.finetune.negatives == "same_topic" else "two topics"
    return (f"grouped by units of two articles of {kind} (a negative's sentence 2 comes from the other article of "
            f"its unit)")


def task_words(cfg, task: str) -> str:
    """What shared task ``task`` is, in words, with the ``next`` task's negatives as configured."""
    if task == NEXT:
        return (f"is sentence 2 the next sentence of sentence 1's article (negatives: "
                f"{NEGATIVE_WORDS[cfg.finetune.negatives]})")
    return TASK_WORDS[task]


def protocol_preset(cfg) -> str:
    """The protocol preset of the study (``[finetune] preset``: :data:`analyses.finetune.PROTOCOL_PRESETS`)."""
    return cfg.finetune.preset


def protocol_seeds(cfg) -> tuple[int, ...]:
    """The training seeds of every fine-tuned run (``[finetune] seeds``)."""
    return tuple(cfg.finetune.seeds)


def task_test_fraction(cfg) -> float:
    from analyses.finetune import PROTOCOL_PRESETS

    return float(PROTOCOL_PRESETS[protocol_preset(cfg)]["test_fraction"])


def next_task(cfg, corpora: dict):
    """The ``next`` task on the ``pairs`` corpus (module docstring)."""
    from analyses.finetune import make_task, next_sentence_examples

    examples = next_sentence_examples(corpora["pairs"], seed=cfg.study.seed, negatives=cfg.finetune.negatives)
    return make_task(examples, TASK_LABELS[NEXT], task_test_fraction(cfg), cfg.study.seed)


def topic_task(cfg, corpora: dict):
    """The ``topic`` task: the coherent pairs of the ``pairs`` corpus (module docstring)."""
    from analyses.finetune import make_task, pair_topic_examples

    examples = pair_topic_examples(corpora["pairs"], seed=cfg.study.seed)
    return make_task(examples, TASK_LABELS[TOPIC], task_test_fraction(cfg), cfg.study.seed)


def format_tasks(cfg) -> tuple[str, ...]:
    """The shared tasks Q1 and Q6 fine-tune in each of their formats (``[finetune] format_tasks``), ``next``
    first: their answers read the first task on which every compared format learnt."""
    return tuple(t for t in (NEXT, TOPIC) if t in cfg.finetune.format_tasks)


#: Each shared task's name in an answer.
TASK_NAMES = {NEXT: "next-sentence", TOPIC: "topic"}


def shared_tasks(cfg, corpora: dict, names=(NEXT, TOPIC)) -> dict:
    """``{name: ProtocolTask}`` of the shared tasks ``names``."""
    make = {NEXT: next_task, TOPIC: topic_task}
    return {n: make[n](cfg, corpora) for n in names}


def model_name(ctx) -> str:
    """The encoder's name for a table's ``model`` column."""
    return str(getattr(ctx.lm, "name", "") or "")


def run_facts(table: pd.DataFrame, task: str) -> dict[str, Any]:
    """What the fine-tuned runs of ``task`` on its whole training split were, read from a protocol table
    (:func:`analyses.finetune.protocol_table`): ``n_train``, ``n_seeds``, ``epochs``, ``steps`` (empty where
    there are none)."""
    a = table[(table["metric"] == "accuracy") & (table["condition"] == "fine_tuned") & (table["target"] == task)]
    if a.empty:
        return {}
    r = a.loc[a["n_train"].astype(int).idxmax()]
    out = {"n_train": int(r["n_train"]), "n_seeds": int(r["ci_seeds"]) if pd.notna(r["ci_seeds"]) else 1}
    for col in ("epochs", "steps"):
        if col in a.columns and pd.notna(r[col]):
            out[col] = int(r[col])
    return out


def chance(table: pd.DataFrame, task: str) -> float | None:
    """The accuracy of always guessing ``task``'s most frequent test label (the protocol table's ``majority``
    row), or None where the table has none."""
    m = table[(table["metric"] == "majority") & (table["target"] == task)] if "metric" in table else table.iloc[:0]
    return float(m["value"].iloc[0]) if len(m) else None


def learnt(table: pd.DataFrame, row) -> bool:
    """Whether an ``accuracy`` row of the protocol table clears chance: its 95% interval's lower end lies above
    the accuracy of always guessing the most frequent test label. A fine-tuned comparison between models that
    did not learn the task says nothing about the task."""
    floor = chance(table, row["target"])
    return floor is None or float(row["ci_low"]) > floor


def diff_cell(rule, row) -> str:
    """A decided row's difference and simultaneous interval in the rule's unit; where both sides predicted every
    test item alike (no spread, so no interval), says so."""
    if pd.isna(row["ci_low"]) or pd.isna(row["ci_high"]):
        return f"{rule.number(row['value'], True)} (every test item predicted alike; no interval)"
    return f"{rule.number(row['value'], True)} ({rule.interval(row['ci_low'], row['ci_high'])})"


def budget_words(facts: dict[str, Any], cfg=None) -> str:
    """The fine-tuning budget in words: ``'675 training items, 1 epoch (43 steps of 16), every weight trained,
    2 seeds'``."""
    if not facts:
        return ""
    parts = [f"{facts['n_train']} training items"]
    if "epochs" in facts:
        e = facts["epochs"]
        step = ""
        if cfg is not None:
            from analyses.finetune import PROTOCOL_PRESETS

            step = f" of {PROTOCOL_PRESETS[protocol_preset(cfg)]['train']['batch_size']}"
        parts.append(f"{e} epoch{'s' if e != 1 else ''}" + (f" ({facts['steps']} steps{step})" if "steps" in facts
                                                             else ""))
    parts.append("every weight trained")
    n = facts["n_seeds"]
    parts.append(f"{n} seed{'s' if n != 1 else ''}")
    return ", ".join(parts)


def preset_words(cfg) -> str:
    """The preset's training settings in words, for notes."""
    from analyses.finetune import PROTOCOL_PRESETS

    t = PROTOCOL_PRESETS[protocol_preset(cfg)]["train"]
    return (f"the `{protocol_preset(cfg)}` preset: AdamW, encoder learning rate {t['lr']:g}, head {t['head_lr']:g}, "
            f"linear warm-up over {t['warmup_fraction']:.0%} of the steps then linear decay, batches of "
            f"{t['batch_size']}, {t['epochs']} epoch{'s' if t['epochs'] != 1 else ''}, training seeds "
            f"{', '.join(map(str, protocol_seeds(cfg)))}")
