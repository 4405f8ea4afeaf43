"""Q8: "Is [CLS] better than mean pooling? After fine-tuning, would any token do?"

Real fine-tuning, the way practitioners do it: a fresh copy of the encoder with a linear head on one pooling of its
last layer, every weight trained, on every training item of a task's fixed split, with several seeds (the seed a
unit of the interval), on the shared tasks of ``[finetune] pooling_tasks``
(:mod:`probing.study.questions._common`): ``next`` (a pair task, where reading the boundary token ``sep1`` or one
position can matter) and ``topic`` (a whole-input label), each with the poolings of ``[finetune] poolings`` (cls,
mean, sep1). A learning curve (``[finetune] learning_curve``, empty by default for the study's time) repeats cls
and mean with fewer training items, since the answer may depend on data size. The answer reads the first task on
which fine-tuning cleared chance: at the default budget ``next`` does not (the fine-tuned model memorises its 675
training pairs), ``topic`` does. Beside every fine-tuned setting stands a frozen probe (logistic regression on the
frozen encoder's pooled last layer) fitted on the same training items. Rows, paired per test item with a two-stage
bootstrap over seeds and documents: each pooling − mean after fine-tuning on all items (one family per task), the
same for the frozen probes, and cls − mean at each smaller training size. The budget (items, epochs, steps, what is
trained, seeds) is stated with the answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from ..answers import MAX_WORDS, Answer, not_measured, word_count
from ..rules import LABELS, Rule
from ..sections import Context
from ._base import Question, Tables
from ._common import (NEXT, TASK_NAMES, TOPIC, budget_words, chance, diff_cell, learnt, model_name, preset_words,
                      task_words, unit_words, protocol_preset, protocol_seeds, run_facts, shared_tasks)

REFERENCE = "mean"
#: The poolings of the learning curve: the question's two.
PAIR = ("cls", "mean")
TABLE = "q8_pooling"

RULES = {
    "pooling_finetuned": Rule("fine-tuned accuracy, pooling − mean pooling", "accuracy points", 0.02,
                              why="below 2 points practitioners do not switch pooling"),
    "pooling_frozen": Rule("frozen-probe accuracy, pooling − mean pooling", "accuracy points", 0.02,
                           why="the same yardstick as the fine-tuned rows"),
    "pooling_curve": Rule("fine-tuned accuracy with fewer training items, cls − mean", "accuracy points", 0.02,
                          why="the same yardstick at each training size"),
}


def poolings(cfg, task: str | None = None) -> tuple[str, ...]:
    """The poolings on ``task`` (None: on any task): ``[finetune] poolings``, on ``next`` ``[finetune]
    next_poolings`` where given, with cls and mean always among them."""
    given = (cfg.finetune.next_poolings if task == NEXT and cfg.finetune.next_poolings else
             cfg.finetune.poolings if task is not None else
             [*cfg.finetune.poolings, *(cfg.finetune.next_poolings if NEXT in _tasks(cfg) else ())])
    return tuple(dict.fromkeys([*PAIR, *given]))


def runs(cfg) -> list:
    """Fine-tuned runs (every seed) and frozen probes on each task of ``[finetune] pooling_tasks``: each pooling
    on the whole training split; cls and mean at each learning-curve size."""
    from analyses.finetune import RunSpec

    tasks = _tasks(cfg)
    grid = [(t, p, None) for t in tasks for p in poolings(cfg, t)]
    grid += [(t, p, n) for n in cfg.finetune.learning_curve for t in tasks for p in PAIR]
    return ([RunSpec(t, "pair", p, n, s) for t, p, n in grid for s in protocol_seeds(cfg)]
            + [RunSpec(t, "pair", p, n, frozen=True) for t, p, n in grid])


def _tasks(cfg) -> tuple[str, ...]:
    """The shared tasks Q8 fine-tunes on (``[finetune] pooling_tasks``), ``next`` first."""
    return tuple(t for t in (NEXT, TOPIC) if t in cfg.finetune.pooling_tasks)


def tasks(cfg, corpora: dict) -> dict:
    return shared_tasks(cfg, corpora, _tasks(cfg))


def analyse(ctx: Context) -> Tables:
    from analyses.finetune import protocol_table

    P = ctx.tables["finetune_predictions"]
    return {TABLE: protocol_table(P, _measured(runs(ctx.cfg), P), compare="pooling", reference=REFERENCE,
                                  analysis="finetune_protocol", model=model_name(ctx), corpus=ctx.cfg.corpus.pairs,
                                  n_resamples=ctx.cfg.study.bootstrap_resamples, seed=ctx.cfg.study.seed)}


def _measured(specs: list, P: pd.DataFrame) -> list:
    """``specs`` without the learning-curve runs whose size is not below the whole training split (a split
    smaller than the size asked for): they repeat the whole-split runs."""
    full = P.groupby("task")["n_train"].max()
    return [s for s in specs if s.n_train is None or s.n_train < full.get(s.task, s.n_train + 1)]


def rows(T: Tables) -> pd.DataFrame:
    """Each pooling − mean on the whole split (fine-tuned; frozen), one family per task and condition; cls −
    mean at each smaller training size (fine-tuned), one family per task."""
    t = T.get(TABLE)
    if t is None or t.empty:
        return pd.DataFrame()
    d = t[(t["metric"] == "accuracy_diff") & (t["pooling_b"] == REFERENCE) & (t["condition_b"] == t["condition"])]
    full = d["n_train"] == t.groupby("target")["n_train"].max().reindex(d["target"]).to_numpy()
    out = []
    for (task, cond), g in d[full].groupby(["target", "condition"], sort=False):
        cond_words = cond.replace("_", "-")
        out.append(pd.DataFrame({
            "measure": "pooling_finetuned" if cond == "fine_tuned" else "pooling_frozen",
            "family": f"Q8 {task}, {cond_words} on all {int(g['n_train'].iloc[0])} items: each pooling − mean",
            "label": g["pooling"] + " − mean (" + task + ", " + cond_words + ")",
        }, index=g.index).join(g))
    curve = d[~full & (d["condition"] == "fine_tuned") & (d["pooling"] == "cls")]
    for task, g in curve.groupby("target", sort=False):
        out.append(pd.DataFrame({
            "measure": "pooling_curve", "family": f"Q8 {task}, fine-tuned: cls − mean per training size",
            "label": "cls − mean (" + task + ", " + g["n_train"].astype(int).astype(str) + " items)",
        }, index=g.index).join(g))
    if not out:
        return pd.DataFrame()
    keep = ["measure", "family", "label", "target", "pooling", "condition", "n_train", "value", "se", "value_a",
            "value_b", "n_groups", "grouping", "n_resamples"]
    return pd.concat(out)[keep].rename(columns={"target": "task"}).reset_index(drop=True)


def _acc(t: pd.DataFrame, task: str, pooling: str, condition: str = "fine_tuned", n_train=None):
    a = t[(t["metric"] == "accuracy") & (t["target"] == task) & (t["pooling"] == pooling)
          & (t["condition"] == condition)]
    if a.empty:
        return None
    a = a[a["n_train"] == (a["n_train"].max() if n_train is None else n_train)]
    return a.iloc[0] if len(a) else None


def _pct(r) -> str:
    return f"{100 * float(r['value'] if hasattr(r, 'keys') else r):.0f}%"


def _pts(rule: Rule, value: float) -> str:
    return f"{rule.number(abs(value))} points"


def _verdict(row, rule: Rule) -> str:
    return {"no_difference": f"within ±{rule.number(rule.threshold)}", "yes": f"beyond {rule.number(rule.threshold)}",
            "yes_small": f"real but under {rule.number(rule.threshold)}",
            "inconclusive": f"CI {rule.interval(row['ci_low'], row['ci_high'])}, undecided",
            }.get(row["decision"], "not measured")


def answer(T: Tables, decided: pd.DataFrame, cfg) -> Answer:
    preset = protocol_preset(cfg)
    if TABLE not in T or decided is None or decided.empty:
        return not_measured("fine-tuning with each pooling", preset)
    t = T[TABLE]
    rule = RULES["pooling_finetuned"]
    ft = decided[decided["measure"] == "pooling_finetuned"]
    head = ft[ft["pooling"] == "cls"]
    if head.empty:
        return not_measured("[CLS] against mean pooling after fine-tuning", preset)
    # the first task (next, then topic) on which both compared poolings learnt the task: a comparison with a
    # model at chance says nothing about pooling
    learning = [i for i, r in head.iterrows()
                if all(a is not None and learnt(t, a)
                       for a in (_acc(t, r["task"], "cls"), _acc(t, r["task"], REFERENCE)))]
    h = head.loc[learning[0]] if learning else head.iloc[0]
    unlearnt = [TASK_NAMES.get(r["task"], r["task"]) for i, r in head.iterrows() if i not in learning]
    facts = run_facts(t, h["task"])
    seeds = f"{facts['n_seeds']} seed{'s' if facts['n_seeds'] != 1 else ''}"
    epochs = f"{facts.get('epochs', '?')} epoch{'s' if facts.get('epochs') != 1 else ''}"
    task = f"{TASK_NAMES.get(h['task'], h['task'])} pairs"
    ci = f"CI {rule.interval(h['ci_low'], h['ci_high'])}"
    if h["decision"] in ("yes", "yes_small"):
        lead = "[CLS] leads" if h["value"] > 0 else "mean pooling leads"
        said = f"{lead} on {task} by {_pts(rule, h['value'])} ({ci}; {_verdict(h, rule)})"
    else:
        said = (f"[CLS] and mean pooling differ on {task} by {_pts(rule, h['value'])} ({ci}; "
                f"{_verdict(h, rule) if h['decision'] == 'no_difference' else 'undecided'})")
    parts = [f"After fine-tuning every weight on all {facts['n_train']} items ({seeds}, {epochs}), {said}."]
    if learning and unlearnt:
        parts.append(f"On {' and '.join(unlearnt)} pairs neither learnt the task (near chance).")
    cls_acc, mean_acc = _acc(t, h["task"], "cls"), _acc(t, h["task"], REFERENCE)
    if not learning:
        return Answer(f"This run cannot tell: after fine-tuning every weight on all {facts['n_train']} items ({seeds}, "
                      f"{epochs}), neither [CLS] ({_pct(cls_acc)}) nor mean pooling ({_pct(mean_acc)}) learnt the "
                      f"{task} task (always guessing the commoner answer: {_pct(chance(t, h['task']))}).", "low",
                      preset)
    others = ft[(ft["task"] == h["task"]) & (ft["pooling"] != "cls")]
    if others.empty:  # "would any token do" from the next task that ran other poolings and learnt
        for i in learning:
            o = ft[(ft["task"] == head.loc[i, "task"]) & (ft["pooling"] != "cls")]
            if len(o):
                others = o
                break
    if len(others):
        on = "" if others["task"].iloc[0] == h["task"] else f" on {TASK_NAMES.get(others['task'].iloc[0], '')}"
        far = others[others["decision"] == "yes"]
        if len(far):
            w = far.loc[far["value"].abs().idxmax()]
            parts.append(f"Not any token{on}: {w['pooling']} {'trails' if w['value'] < 0 else 'beats'} mean by "
                         f"{_pts(rule, w['value'])}.")
        elif set(others["decision"]) <= {"no_difference", "yes_small"}:
            parts.append(f"{' and '.join(others['pooling']).capitalize()}{on} {'is' if len(others) == 1 else 'are'}"
                         f" also within {rule.number(rule.threshold)} points of mean.")
        else:
            parts.append(f"{' and '.join(others['pooling'])} against mean{on}: undecided.")
    curve = decided[(decided["measure"] == "pooling_curve") & (decided["task"] == h["task"])]
    if len(curve):
        c = curve.loc[curve["n_train"].astype(int).idxmin()]
        who = "[CLS] leads" if c["value"] > 0 else "mean pooling leads"
        who = who if c["decision"] in ("yes", "yes_small") else "they differ"
        if c["decision"] == "not_measured":
            parts.append(f"With {int(c['n_train'])} items, both predict every test item alike.")
        else:
            parts.append(f"With {int(c['n_train'])} items, {who} by {_pts(rule, c['value'])} "
                         f"({_verdict(c, RULES['pooling_curve'])}).")
    while len(parts) > 1 and word_count(" ".join(parts)) > MAX_WORDS:  # the evidence keeps what is dropped
        parts.pop()
    return Answer(" ".join(parts), h["confidence"], preset)


def _cell(r) -> str:
    if r is None:
        return "–"
    return f"{100 * r['value']:.1f}% ({100 * r['ci_low']:.1f} to {100 * r['ci_high']:.1f})"


def evidence(T: Tables, decided: pd.DataFrame, cfg) -> str:
    if TABLE not in T:
        return "Not measured in this run."
    t = T[TABLE]
    rule = RULES["pooling_finetuned"]
    decided = decided if decided is not None else pd.DataFrame()
    lines = []
    for task in dict.fromkeys(t["target"]):
        facts = run_facts(t, task)
        lines += [f"**{TASK_NAMES.get(task, task)}** ({task_words(cfg, task)}). Fine-tuning budget per run: "
                  f"{budget_words(facts, cfg)}. Frozen probe: logistic regression on the frozen encoder's pooled "
                  "last layer, fitted on the same training items.", "",
                  "| pooling | fine-tuned accuracy (95% CI) | frozen probe (95% CI) | fine-tuned − mean "
                  "(simultaneous CI) | decision | frozen − mean | decision |", "|---|---|---|---|---|---|---|"]
        sub = t[(t["target"] == task) & (t["metric"] == "accuracy")]
        for p in dict.fromkeys(sub["pooling"]):
            cells = []
            for cond in ("fine_tuned", "frozen"):
                d = decided[(decided["task"] == task) & (decided["pooling"] == p) & (decided["condition"] == cond)
                            & (decided["measure"] != "pooling_curve")] if len(decided) else decided
                if len(d):
                    r = d.iloc[0]
                    cells += [diff_cell(rule, r),
                              LABELS[r["decision"]]]
                else:
                    cells += ["reference" if p == REFERENCE else "–", "–"]
            lines.append(f"| {p} | {_cell(_acc(t, task, p))} | {_cell(_acc(t, task, p, 'frozen'))} | {cells[0]} | "
                         f"{cells[1]} | {cells[2]} | {cells[3]} |")
        curve = decided[(decided["measure"] == "pooling_curve") & (decided["task"] == task)] if len(decided) else []
        if len(curve):
            lines += ["", f"Learning curve ({TASK_NAMES.get(task, task)}, fine-tuned, the same test items):", "",
                      "| training items | cls | mean | cls − mean (simultaneous CI) | decision |",
                      "|---|---|---|---|---|"]
            for _, r in curve.sort_values("n_train").iterrows():
                n = int(r["n_train"])
                lines.append(f"| {n} | {_cell(_acc(t, task, 'cls', n_train=n))} | "
                             f"{_cell(_acc(t, task, 'mean', n_train=n))} | {diff_cell(rule, r)} | "
                             f"{LABELS[r['decision']]} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def figures(T: Tables, fig_dir: Path, log: Callable) -> list[Path]:
    from figures.protocol import plot_learning_curve, plot_settings

    from ..sections import safe_plot

    if TABLE not in T:
        return []
    return (safe_plot(plot_settings, T[TABLE], fig_dir / "q8_pooling", by="pooling", log=log)
            + safe_plot(plot_learning_curve, T[TABLE], fig_dir / "q8_learning_curve", log=log))


def notes(cfg) -> str:
    sizes = ", ".join(map(str, cfg.finetune.learning_curve))
    tasks = "; ".join(f"`{t}`, {task_words(cfg, t)}" for t in _tasks(cfg))
    left_out = [w for w, on in (("the `topic` task (`[finetune] pooling_tasks`)", TOPIC not in _tasks(cfg)),
                                ("a learning curve (`[finetune] learning_curve`)", not sizes)) if on]
    name = str(cfg.model.name or "all-MiniLM-L6-v2").lower()  # None: the default model
    mean_trained = "minilm" in name or "sentence-transformers" in name
    return (f"Tasks on the `pairs` corpus ({cfg.corpus.pairs}): {tasks}. One split per task for every run, grouped "
            f"{unit_words(cfg).removeprefix('grouped ')} and stratified by the label. Each run fine-tunes a fresh "
            f"copy of the encoder, every weight, with a linear head on one pooling of the last layer "
            f"({preset_words(cfg)}); the poolings: "
            + "; ".join(f"{', '.join(poolings(cfg, t))} on `{t}`" for t in _tasks(cfg))
            + (f"; the learning curve trains cls and mean on the first {sizes} training items of the same order "
               "(smaller sets are prefixes of larger ones) and tests on the same items" if sizes else "")
            + ". Differences are paired per test item, with a two-stage bootstrap over seeds and documents and a "
            "simultaneous (Bonferroni) interval per family. What it does not show: other learning rates or longer "
            "training (a pooling that learns more slowly may catch up), other tasks"
            + (", or models pretrained with a [CLS] objective (this encoder was tuned for mean pooling)"
               if mean_trained else "")
            + "; the `full` preset (more seeds and epochs, a GPU) narrows the intervals."
            + (f" Left out of this run to keep the study's time: {' and '.join(left_out)}." if left_out else ""))


QUESTION = Question(
    key="Q8",
    asked="Is [CLS] better than mean pooling? After fine-tuning, would any token do?",
    title="[CLS] or mean pooling, frozen and fine-tuned",
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
)
