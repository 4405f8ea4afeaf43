"""What several questions use: the shared fine-tuning protocol's tasks, seeds and preset, and the words that
state its budget.

The protocol (:mod:`analyses.finetune`) fine-tunes one encoder per run on a task's fixed split. Two tasks are
built here from the config's ``pairs`` corpus, the same for every question that declares them (Q1, Q4, Q6 and
Q8 read ``next``; Q8 ``topic``):

* ``next`` (:func:`next_task`): is sentence 2 the sentence that follows sentence 1 in its article? Negatives
  take sentence 2 from another article of the same topic (:func:`analyses.finetune.next_sentence_examples`),
  so the label is coherence, not topic: a pair task where the boundary between the sentences can matter;
* ``topic`` (:func:`topic_task`): the topic of a coherent pair, whose two sentences come from one article and
  so share it.

Both are split once (:func:`analyses.finetune.make_task`: grouped by the units of two articles the negatives
draw from, stratified by the label, the preset's test share, seeded by ``[study] seed``), so every run of a
task predicts the same test items.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

NEXT, TOPIC = "next", "topic"
#: The label each shared task predicts.
TASK_LABELS = {NEXT: "is_next", TOPIC: "topic"}
#: What each shared task is, in words (notes and evidence).
TASK_WORDS = {NEXT: "is sentence 2 the next sentence of sentence 1's article (negatives: a sentence of another "
                    "article of the same topic)",
              TOPIC: "the topic of a coherent pair (both sentences from one article)"}


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

    examples = next_sentence_examples(corpora["pairs"], seed=cfg.study.seed)
    return make_task(examples, TASK_LABELS[NEXT], task_test_fraction(cfg), cfg.study.seed)


def topic_task(cfg, corpora: dict):
    """The ``topic`` task: the coherent pairs of the ``pairs`` corpus (module docstring)."""
    from analyses.finetune import make_task, pair_topic_examples

    examples = pair_topic_examples(corpora["pairs"], seed=cfg.study.seed)
    return make_task(examples, TASK_LABELS[TOPIC], task_test_fraction(cfg), cfg.study.seed)


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
