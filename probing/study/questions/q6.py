"""Q6: "Why is [CLS] always the first token? Why not the last?"

A model pretrained with [CLS] first and probed frozen with [CLS] moved cannot say why first: it only shows that
the weights expect it there. What a practitioner can test is whether another position would do once the model
is trained for it: the shared ``next`` task (:mod:`probing.study.questions._common`) is fine-tuned with the
classification token first (``pair``: ``[CLS] s1 [SEP] s2 [SEP]``), between the sentences (``cls_mid``:
``s1 [SEP] [CLS] s2 [SEP]``) and last (``cls_last``: ``s1 [SEP] s2 [SEP] [CLS]``), every weight trained, on the
same split with the same seeds (and so the same batches), a head on the classification token's last-layer
state; ``[finetune] positions`` says which of the three run (the packaged study: first and last, what the
asker named, for its time). The rows are fine-tuned accuracy middle − first and last − first, paired per test
item with a two-stage bootstrap (seeds, then documents), judged against 2 accuracy points. Frozen probes at the
same positions on the same split stand beside them. Why [CLS] came to be first in pretraining is a question for
the pretraining study (encoders pretrained with [CLS] last, ``probing.pretrain``); the mechanical convenience of
a fixed first position is stated as background, not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from ..answers import Answer, not_measured
from ..rules import LABELS, Rule, weakest
from ..sections import Context
from ._base import Question, Tables
from ._common import (NEXT, TASK_NAMES, budget_words, chance, diff_cell, format_tasks, learnt, model_name,
                      preset_words, task_words, unit_words, protocol_preset, protocol_seeds, run_facts, shared_tasks)

#: The classification token's positions: format -> the word for it. The first is the reference.
POSITIONS = {"pair": "first", "cls_mid": "middle", "cls_last": "last"}
REFERENCE = "pair"
TABLE = "q6_position"

RULES = {
    "position_finetuned": Rule("fine-tuned accuracy, classification token moved − first", "accuracy points", 0.02,
                               why="below 2 points practitioners do not change an input format"),
    "position_frozen": Rule("frozen-probe accuracy, classification token moved − first", "accuracy points", 0.02,
                            why="the same yardstick as the fine-tuned rows"),
}
MEASURE = {"fine_tuned": "position_finetuned", "frozen": "position_frozen"}

BACKGROUND = ("Why first is convenient, mechanically: position 0 is the same index in every input whatever its "
              "length and whatever padding a batch adds, so a classifier reads `hidden[:, 0]`; the last token's "
              "index differs per example once a batch is padded, so reading it needs each example's length.")


def positions(cfg) -> dict[str, str]:
    """The positions of ``[finetune] positions``: format -> the word for it, first (the reference) first."""
    return {f: w for f, w in POSITIONS.items() if w in cfg.finetune.positions}


def runs(cfg) -> list:
    """On each task of ``[finetune] format_tasks``: fine-tuned runs at each position of ``[finetune] positions``
    with every seed, and a frozen probe at each."""
    from analyses.finetune import RunSpec

    return [spec for task in format_tasks(cfg) for spec in
            [RunSpec(task, f, "cls", None, s) for f in positions(cfg) for s in protocol_seeds(cfg)]
            + [RunSpec(task, f, "cls", None, frozen=True) for f in positions(cfg)]]


def tasks(cfg, corpora: dict) -> dict:
    return shared_tasks(cfg, corpora, format_tasks(cfg))


def analyse(ctx: Context) -> Tables:
    from analyses.finetune import protocol_table

    T = protocol_table(ctx.tables["finetune_predictions"], runs(ctx.cfg), compare="format", reference=REFERENCE,
                       analysis="finetune_protocol", model=model_name(ctx), corpus=ctx.cfg.corpus.pairs,
                       n_resamples=ctx.cfg.study.bootstrap_resamples, seed=ctx.cfg.study.seed)
    return {TABLE: T}


def rows(T: Tables) -> pd.DataFrame:
    """Moved − first per task and condition (fine-tuned; frozen), each a family of one row per moved position."""
    t = T.get(TABLE)
    if t is None or t.empty:
        return pd.DataFrame()
    d = t[(t["metric"] == "accuracy_diff") & (t["condition_b"] == t["condition"]) & (t["format_b"] == REFERENCE)]
    d = d[d["format"].isin(POSITIONS)]
    out = pd.DataFrame({
        "measure": d["condition"].map(MEASURE),
        "family": "Q6 " + d["target"] + ", " + d["condition"].str.replace("_", "-") + ": " + ", ".join(
            f"{w} − first" for f, w in POSITIONS.items() if f != REFERENCE and f in set(d["format"])),
        "task": d["target"],
        "label": d["format"].map(POSITIONS) + " − first (" + d["condition"].str.replace("_", "-") + ")",
        "cls_position": d["format"].map(POSITIONS), "condition": d["condition"], "value": d["value"], "se": d["se"],
        "value_a": d["value_a"], "value_b": d["value_b"], "n_groups": d["n_groups"], "grouping": d["grouping"],
        "n_resamples": d["n_resamples"],
    })
    return out.reset_index(drop=True)


def _accuracies(T: Tables, condition: str = "fine_tuned", task: str = NEXT) -> dict[str, pd.Series]:
    t = T[TABLE]
    a = t[(t["metric"] == "accuracy") & (t["condition"] == condition) & (t["target"] == task)]
    return {POSITIONS[r["format"]]: r for _, r in a.iterrows() if r["format"] in POSITIONS}


def _tasks_in(T: Tables) -> list[str]:
    """The tasks of the table, ``next`` first."""
    return list(dict.fromkeys(T[TABLE]["target"].dropna().astype(str)))


def _pct(x: float) -> str:
    return f"{100 * float(x):.0f}%"


def answer(T: Tables, decided: pd.DataFrame, cfg) -> Answer:
    preset = protocol_preset(cfg)
    if TABLE not in T or decided is None or decided.empty:
        return not_measured("fine-tuning with the classification token first and moved", preset)
    # the first task (format_tasks' order) on which [CLS] first learnt: positions compared on models at chance say
    # nothing about position
    tasks = [x for x in _tasks_in(T) if "first" in _accuracies(T, task=x)]
    if not tasks:
        return not_measured("fine-tuning with the classification token first and moved", preset)
    learning = [x for x in tasks if learnt(T[TABLE], _accuracies(T, task=x)["first"])]
    task = learning[0] if learning else tasks[0]
    ft = decided[(decided["condition"] == "fine_tuned")
                 & ((decided["task"] == task) if "task" in decided else True)]
    acc = _accuracies(T, task=task)
    rule = RULES["position_finetuned"]
    moved = [w for w in POSITIONS.values() if w != "first" and w in acc]
    name = TASK_NAMES.get(task, task)
    missed = [TASK_NAMES.get(x, x) for x in tasks if x not in learning][:1]
    where = (f"{name} accuracy is {_pct(acc['first']['value'])} with [CLS] first, "
             + ", ".join(f"{_pct(acc[w]['value'])} {w}" for w in moved)
             + (f" ({missed[0]} pairs were not learnt)" if learning and missed else ""))
    decisions = set(ft["decision"])
    confidence = weakest(ft["confidence"])
    floor = chance(T[TABLE], task)
    if not learning:
        return Answer(f"This run cannot tell: fine-tuned at this budget the model did not learn the task ({where}; "
                      f"always guessing the commoner answer scores {_pct(floor)}), so the positions were compared "
                      "on models near chance.", "low", preset)
    if decisions == {"no_difference"}:
        both = "both differences" if len(moved) > 1 else "the difference"
        text = (f"Once fine-tuned, position hardly matters: {where} ({both} within "
                f"±{rule.show(rule.threshold)}).")
    elif "yes" in decisions:
        worst = ft.loc[ft.loc[ft["decision"] == "yes", "value"].abs().idxmax()]
        side = "loses" if worst["value"] < 0 else "gains"
        unlearnt = [pos for pos in ("middle", "last") if pos in acc and not learnt(T[TABLE], acc[pos])]
        if unlearnt and worst["value"] < 0:
            text = (f"At this budget only [CLS] first learnt the task: {where}, with [CLS] "
                    f"{' and '.join(unlearnt)} no better than always guessing ({_pct(floor)}); "
                    f"[CLS] {worst['cls_position']} {side} {rule.show(abs(worst['value']))}.")
        else:
            text = (f"Position matters even after fine-tuning: [CLS] {worst['cls_position']} {side} "
                    f"{rule.show(abs(worst['value']))} against first ({where}).")
    elif decisions <= {"no_difference", "yes_small"}:
        text = (f"Once fine-tuned, position hardly matters: {where}; any difference is below "
                f"{rule.show(rule.threshold)}.")
    else:
        widest = max(abs(ft["ci_low"]).max(), abs(ft["ci_high"]).max())
        text = (f"Cannot tell yet whether position matters once fine-tuned: {where}; differences up to "
                f"{rule.show(widest)} are not ruled out (threshold {rule.number(rule.threshold)}).")
    return Answer(text, confidence, preset)


def evidence(T: Tables, decided: pd.DataFrame, cfg) -> str:
    if TABLE not in T:
        return "Not measured in this run."
    rule = RULES["position_finetuned"]
    lines = []
    for task in _tasks_in(T):
        lines += _evidence_task(T, decided, cfg, task, rule) + [""]
    return "\n".join(lines).rstrip()


def _evidence_task(T: Tables, decided: pd.DataFrame, cfg, task: str, rule: Rule) -> list[str]:
    t = T[TABLE]
    ft, fz = _accuracies(T, task=task), _accuracies(T, "frozen", task=task)
    lines = [f"**{TASK_NAMES.get(task, task).capitalize()}** (`{task}`, {task_words(cfg, task)})."]
    budget = budget_words(run_facts(t, task), cfg)
    if budget:
        lines.append(f"Fine-tuning budget per run: {budget}; the frozen probe is a logistic regression on the "
                     f"frozen encoder's classification-token state, fitted on the same training items.")
    lines += ["", "| position | fine-tuned accuracy (95% CI) | frozen probe (95% CI) | fine-tuned − first "
                  "(simultaneous CI) | decision |", "|---|---|---|---|---|"]
    by_pos = {r["cls_position"]: r for _, r in decided.iterrows() if r["condition"] == "fine_tuned"
              and r.get("task", task) == task} if decided is not None and not decided.empty else {}
    for fmt, pos in positions(cfg).items():
        a, f = ft.get(pos), fz.get(pos)
        cell = lambda r: (f"{_pct(r['value'])} ({_pct(r['ci_low'])} to {_pct(r['ci_high'])})"  # noqa: E731
                          if r is not None else "–")
        d = by_pos.get(pos)
        diff = (diff_cell(rule, d) if d is not None
                else "reference")
        lines.append(f"| {pos} (`{fmt}`) | {cell(a)} | {cell(f)} | {diff} | "
                     f"{LABELS[d['decision']] if d is not None else '–'} |")
    floor = _majority(t, task)
    if floor:
        lines += ["", floor]
    return lines


def _majority(t: pd.DataFrame, task: str) -> str:
    a = t[(t["metric"] == "accuracy") & (t["target"] == task)]
    if a.empty:
        return ""
    n, docs, guess = int(a["n"].iloc[0]), int(a["n_groups"].iloc[0]), chance(t, task)
    what = "half of them coherent" if task == NEXT else "each labelled with its topic"
    return (f"Test items: {n} pairs, {what}" + (f" (always guessing the commoner answer: {_pct(guess)})"
                                                 if guess is not None else "") + f", {docs} article pairs.")


def figures(T: Tables, fig_dir: Path, log: Callable) -> list[Path]:
    from figures.protocol import plot_settings

    from ..sections import safe_plot

    if TABLE not in T:
        return []
    return safe_plot(plot_settings, T[TABLE], fig_dir / "q6_position", by="format", names=POSITIONS,
                     what="next-sentence test accuracy", log=log)


def notes(cfg) -> str:
    return ("Tasks on the `pairs` corpus (" + cfg.corpus.pairs + "): "
            + "; ".join(f"`{t}`, {task_words(cfg, t)}" for t in format_tasks(cfg))
            + " (`[finetune] format_tasks`; the answer reads the first that [CLS] first learnt); one split per "
            f"task for every run, {unit_words(cfg)} and stratified by the label. Each run fine-tunes a fresh copy of "
            f"the encoder, every weight, with a linear head on the classification token's last-layer state "
            f"({preset_words(cfg)}); "
            f"positions: {', '.join(f'{w} (`{f}`)' for f, w in positions(cfg).items())} "
            "(`[finetune] positions`); only the token's position differs between the formats (the same items, seeds "
            "and batch order). Differences are paired per test item, with a two-stage bootstrap over seeds and "
            "documents and a simultaneous (Bonferroni) interval over the comparisons with first. What it does not "
            "show: why [CLS] came "
            "to be first in pretraining. The encoder was pretrained with [CLS] first, so a moved token starts "
            "from weights that never saw it there; fine-tuning shows whether that matters once the model is "
            "trained for the task. Pretraining with [CLS] last is the pretraining study's question "
            "(`probing.pretrain`).")


QUESTION = Question(
    key="Q6",
    asked="Why is [CLS] always the first token? Why not the last?",
    title="[CLS] first, middle or last",
    corpora=("pairs",),
    jobs=lambda cfg, corpora: [],
    analyse=analyse,
    rules=RULES,
    rows=rows,
    answer=answer,
    evidence=evidence,
    figures=figures,
    notes=notes,
    tasks=tasks,
    runs=runs,
    tables=(TABLE,),
    about_cls=True,
    background=BACKGROUND,
)
