"""Q1: fine-tuning with or without the middle [SEP]: what is the difference, and do the embeddings change a lot?

Two parts, each as the asker would read it.

* **The embeddings.** At the layers people use (the last layer): each word token of sentence 1 and of sentence 2,
  the mean-pooled words (the sentence-pair vector) and [CLS], how far dropping the middle [SEP] (``pair`` →
  ``concat``) moves them, as a share of the way to another input (1 − cos over the spread between the same
  representation of two different inputs: :mod:`analyses.representation_change`). Beside it, on the same examples
  and the same representations, the yardsticks: two adjacent words of sentence 1 swapped (a small edit), sentence 2
  replaced by a same-topic sentence of another article (another content), another input (100%). The comparison
  rows are (dropping [SEP]) − (swapping two words), and − (replacing sentence 2), paired per example.
* **The fine-tuned model.** The same pair task fine-tuned in ``pair`` and in ``concat`` on the same split with the
  same seeds (:mod:`analyses.finetune`, the shared protocol), and frozen probes in both on the same split: accuracy
  concat − pair, paired per test item, with a two-stage bootstrap over seeds and documents; one family per task of
  ``[finetune] format_tasks`` (``next``: is sentence 2 the next sentence; ``topic``: the pair's topic). The answer
  reads the first task both formats learnt (``next`` needs more than the default preset's one epoch).

The old Q1 compared [CLS]'s normalised drift with the words' and patched [CLS] from ``concat``; neither is what was
asked, and neither is needed for the answer, so this module does not extract those caches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..answers import Answer
from ..rules import Rule, weakest
from ..sections import Context, Job, corpus_text, safe_plot
from ._base import Question
from ._common import (DERIVED, REPLACED, SWAPPED, TASK_NAMES, derived_pairs, format_tasks, pairs_job,
                      protocol_seeds, shared_tasks, task_words)

KEY = "Q1"
ASKED = ("We fine-tune on the same task with `[CLS] s1 [SEP] s2 [SEP]` or `[CLS] s1 s2 [SEP]`: what is the "
         "difference? Will the token embeddings change a lot?")
TABLE, FINETUNE_TABLE = "q1_change", "q1_finetune"
#: The changes measured from the pairs in ``pair``, by name: (corpus, format) of the changed cache.
CHANGES = {"concat": ("pairs", "concat"), "swap_words": (SWAPPED, "pair"), "replace_s2": (REPLACED, "pair")}
#: What each change is, in words.
CHANGE_WORDS = {"concat": "dropping the middle [SEP] (pair → concat)",
                "swap_words": "swapping two adjacent words of sentence 1",
                "replace_s2": "replacing sentence 2 by a same-topic sentence of another article"}
SHORT = {"concat": "dropping [SEP]", "swap_words": "swapping two words", "replace_s2": "replacing sentence 2"}
#: Each representation and the changes it is measured for (sentence 2's own words are not measured when it is
#: replaced: they are other words).
REPRESENTATIONS = {"words": ("concat", "swap_words"), "s1 words": ("concat", "swap_words", "replace_s2"),
                   "s2 words": ("concat", "swap_words"), "mean": ("concat", "swap_words", "replace_s2"),
                   "cls": ("concat", "swap_words", "replace_s2")}
NAMES = {"words": "word vectors (both sentences)", "s1 words": "sentence 1's words", "s2 words": "sentence 2's words",
         "mean": "mean-pooled words (the pair vector)", "cls": "[CLS]"}
COMPARISONS = (("concat", "swap_words"), ("concat", "replace_s2"))
#: Random pairs of different examples behind each spread.
N_PAIRS = 10000
POOLING = "cls"

UNIT = "points of the way to another input"
RULES = {
    "vs_swap": Rule("change of the same vectors, dropping [SEP] − swapping two words", UNIT, 0.05,
                    why="5% of the distance between two different inputs: smaller moves leave a vector far closer to "
                        "its own input than to any other"),
    "vs_replace": Rule("change of the same vectors, dropping [SEP] − replacing sentence 2", UNIT, 0.05,
                       why="the same yardstick unit as the swap"),
    "finetuned": Rule("fine-tuned accuracy, concat − pair", "accuracy points", 0.02,
                      why="below 2 points practitioners do not change an input format"),
    "frozen": Rule("frozen-probe accuracy, concat − pair", "accuracy points", 0.02,
                   why="the same threshold as the fine-tuned models"),
}
FAMILIES = {"vs_swap": "Q1: dropping [SEP] − swapping two words, per representation (last layer)",
            "vs_replace": "Q1: dropping [SEP] − replacing sentence 2, per representation (last layer)",
            "finetuned": "Q1: fine-tuned accuracy on {task}, concat − pair",
            "frozen": "Q1: frozen-probe accuracy on {task}, concat − pair"}


# ---------------------------------------------------------------------------------------------------
# Caches, fine-tuning runs, analyses


def jobs(cfg, corpora: dict) -> list[Job]:
    return [pairs_job("pair"), pairs_job("concat"), Job(SWAPPED, "pair"), Job(REPLACED, "pair")]


def tasks(cfg, corpora: dict) -> dict:
    return shared_tasks(cfg, corpora, format_tasks(cfg))


def runs(cfg) -> list:
    from analyses.finetune import RunSpec

    return [spec for task in format_tasks(cfg) for spec in
            [RunSpec(task, f, POOLING, seed=s) for f in ("pair", "concat") for s in protocol_seeds(cfg)]
            + [RunSpec(task, f, POOLING, frozen=True) for f in ("pair", "concat")]]


def change_table(ctx: Context) -> pd.DataFrame:
    """:func:`analyses.representation_change.run_representation_change` of the changes from ``pair``."""
    from analyses.representation_change import run_representation_change

    ctx.log("analyses: Q1 representation change and its yardsticks")
    ref = ctx.caches.get("pairs", "pair")
    changes = {name: (ref, ctx.caches.get(corpus, fmt)) for name, (corpus, fmt) in CHANGES.items()}
    return run_representation_change(changes, REPRESENTATIONS, COMPARISONS, n_pairs=N_PAIRS,
                                      n_resamples=ctx.cfg.study.bootstrap_resamples, seed=ctx.cfg.study.seed,
                                      out=ctx.out)


def finetune_table(ctx: Context) -> pd.DataFrame:
    """Accuracy concat − pair on the same test items of each task of ``[finetune] format_tasks``, fine-tuned (every
    training item, the seeds) and frozen probes: one ``accuracy_diff`` row each per task
    (:func:`analyses.finetune.compare_runs`)."""
    from analyses.finetune import accuracy, compare_runs, majority
    from analyses.results import make_table

    P = ctx.tables.get("finetune_predictions")
    if P is None or P.empty:
        return pd.DataFrame()
    full = P[P["run"].astype(str).str.contains("/nall/", regex=False)]
    records = []
    for task, frozen in ((t, f) for t in format_tasks(ctx.cfg) for f in (False, True)):
        base = {"task": task, "pooling": POOLING, "condition": "clean"}
        sel = full[(full["frozen"].astype(str).str.lower() == str(frozen).lower()) & (full["task"] == task)]
        if not {"pair", "concat"} <= set(sel["format"].astype(str)):
            continue
        kw = {"n_resamples": ctx.cfg.study.bootstrap_resamples, "seed": ctx.cfg.study.seed}
        r = compare_runs(sel, {**base, "format": "pair"}, {**base, "format": "concat"}, **kw)
        floor = majority(sel, task)["value"]
        learnt = all(accuracy(sel, {**base, "format": f}, **kw)["ci_low"] > floor for f in ("pair", "concat"))
        records.append({"analysis": "finetune_comparison", "model": getattr(ctx.lm, "name", ""),
                        "corpus": ctx.cfg.corpus.pairs, "format": "pair", "format_b": "concat", "layer": pd.NA,
                        "role": None, "target": task, "metric": "accuracy_diff", "value": r["value"],
                        "ci_low": r["ci_low"], "ci_high": r["ci_high"], "n": r["n_items"], "seed": ctx.cfg.study.seed,
                        # value_a: concat, the side the difference starts from
                        "se": r["se"], "value_a": r["value_b"], "value_b": r["value_a"], "pooling": POOLING,
                        "frozen": frozen, "n_seeds": r["n_seeds"], "n_groups": r["n_groups"], "grouping": "document",
                        "n_resamples": r["n_resamples"], "chance": floor, "learnt": learnt,
                        "n_train": int(sel[sel["format"] == "pair"]["n_train"].iloc[0])})
    return make_table(records)


def analyse(ctx: Context) -> dict[str, pd.DataFrame]:
    return {TABLE: ctx.table(TABLE, change_table), FINETUNE_TABLE: ctx.table(FINETUNE_TABLE, finetune_table)}


# ---------------------------------------------------------------------------------------------------
# Rows, answer, evidence


def _rep(df: pd.DataFrame) -> pd.Series:
    return df["role"].fillna("").astype(str).where(df["role"].fillna("").astype(str) != "",
                                                   df["choice"].fillna("").astype(str))


def last_layer(df: pd.DataFrame) -> int:
    return int(pd.to_numeric(df["layer"]).max())


def rows(T: dict) -> pd.DataFrame:
    """The decided comparisons: per representation at the last layer, dropping [SEP] − swapping two words and −
    replacing sentence 2 (paired per example); fine-tuned and frozen-probe accuracy concat − pair."""
    out = []
    df = T[TABLE]
    layer = last_layer(df)
    d = df[(df["metric"] == "share_diff") & (pd.to_numeric(df["layer"]) == layer)].assign(representation=_rep)
    for measure, (a, b) in zip(("vs_swap", "vs_replace"), COMPARISONS):
        for _, r in d[(d["change"] == a) & (d["change_b"] == b)].iterrows():
            rep = r["representation"]
            out.append({"measure": measure, "family": FAMILIES[measure], "layer": layer, "representation": rep,
                        "label": f"{NAMES.get(rep, rep)}: {SHORT[a]} − {SHORT[b]}", "value": r["value"],
                        "se": r["se"], "value_a": r["value_a"], "value_b": r["value_b"], "n": r["n"],
                        "n_groups": r["n_groups"], "grouping": r["grouping"], "n_resamples": r["n_resamples"]})
    ft = T.get(FINETUNE_TABLE)
    if ft is not None and len(ft):
        for _, r in ft.iterrows():
            measure = "frozen" if str(r["frozen"]).lower() == "true" else "finetuned"
            task = str(r.get("target", "next"))
            out.append({"measure": measure, "family": FAMILIES[measure].format(task=task), "task": task,
                        "representation": "[CLS] pooling",
                        "label": f"{'frozen-probe' if measure == 'frozen' else 'fine-tuned'} accuracy on {task}, "
                                 f"concat − pair", "value": r["value"], "se": r["se"], "value_a": r["value_a"],
                        "value_b": r["value_b"], "n": r["n"], "n_groups": r["n_groups"], "grouping": r["grouping"],
                        "n_resamples": r["n_resamples"]})
    out = pd.DataFrame(out)
    if "layer" in out.columns:  # the fine-tuned rows have none: whole numbers, not floats, in the report
        out["layer"] = pd.array(out["layer"], dtype="Int64")
    return out


def _pct(x: float) -> str:
    x = 100 * float(x)
    return f"{x:.1f}%" if abs(x) >= 1 else f"{x:.2f}%"


#: How the fine-tuned difference reads, by decision.
_FT_WORDS = {"yes": "a difference that matters", "yes_small": "real but below 2 points",
             "no_difference": "no difference that matters", "inconclusive": "too uncertain to tell",
             "not_measured": "not measured"}


def _row(decided: pd.DataFrame, measure: str, representation: str | None = None):
    if decided is None or not len(decided):
        return None
    d = decided[decided["measure"] == measure]
    if representation is not None:
        d = d[d["representation"] == representation]
    return d.iloc[0] if len(d) else None


def answer(T: dict, decided: pd.DataFrame, cfg) -> Answer:
    words = _row(decided, "vs_swap", "words")
    if words is None:
        from ..answers import not_measured

        return not_measured("the representation change of Q1")
    x, y, dec, v = words["value_a"], words["value_b"], words["decision"], float(words["value"])
    if dec == "inconclusive":
        lead, cmp = "Cannot tell", "and this sample cannot tell that from swapping two words"
    elif dec == "no_difference":
        lead, cmp = "Not a lot", "about as much as swapping two words does"
    elif v < 0:
        lead, cmp = "Not a lot", "less than swapping two words does"
    elif dec == "yes_small":  # more than a swap, by less than the threshold
        lead, cmp = "Not a lot", "slightly more than swapping two words does"
    else:
        lead, cmp = "Yes", "more than swapping two words does"
    text = (f"{lead}: dropping [SEP] moves last-layer word vectors {_pct(x)} of the way to another input, {cmp} "
            f"({_pct(y)}).")
    conf = [words["confidence"]]
    runs = T.get(FINETUNE_TABLE)
    tuned = runs[runs["frozen"].astype(str).str.lower() == "false"] if runs is not None and len(runs) else None
    if tuned is not None and "target" not in tuned:  # a table from before the tasks were named
        tuned = tuned.assign(target="next")
    ft = None
    if tuned is not None and len(tuned):
        # the first task (format_tasks' order) on which both formats learnt; a comparison of models at chance says
        # nothing about the format
        ok = tuned[tuned["learnt"].astype(bool)] if "learnt" in tuned else tuned
        t = ok.iloc[0] if len(ok) else tuned.iloc[0]
        rows_ = decided[(decided["measure"] == "finetuned")] if decided is not None and len(decided) else None
        if rows_ is not None and "task" in rows_:
            rows_ = rows_[rows_["task"] == t["target"]]
        ft = rows_.iloc[0] if rows_ is not None and len(rows_) else None
    name = TASK_NAMES.get(str(t["target"]), str(t["target"])) if ft is not None else ""
    if ft is not None and not len(ok):
        skipped = " or ".join(f"{TASK_NAMES.get(x, x)}" for x in dict.fromkeys(tuned["target"]))
        text += (f" Fine-tuned on {skipped} pairs, the two formats did not both clear chance ({name}: pair "
                 f"{_pct(t['value_b'])}, concat {_pct(t['value_a'])}, always guessing the commoner answer "
                 f"{_pct(t['chance'])}), so this run cannot compare them.")
        conf.append("low")
    elif ft is not None and np.isfinite(ft["ci_low"]):
        rule = RULES["finetuned"]  # (+ 0.0 turns an equal accuracy's -0.0 into 0.0)
        missed = [TASK_NAMES.get(x, x) for x in dict.fromkeys(tuned["target"]) if x != t["target"]
                  and x not in set(ok["target"])][:1]
        text += (f" Fine-tuned on {name} pairs" + (f" ({missed[0]} pairs were not learnt)" if missed else "")
                 + f", accuracy without [SEP] changes by {rule.number(float(ft['value']) + 0.0, True)} points (CI "
                 f"{rule.number(ft['ci_low'], True)} to {rule.number(ft['ci_high'], True)}): "
                 f"{_FT_WORDS[ft['decision']]}.")
        conf.append(ft["confidence"])
    else:
        text += " Fine-tuned accuracy was not measured in this run."
    return Answer(text, weakest(conf))


def _cell(r) -> str:
    if r is None or not np.isfinite(r["value"]):
        return "–"
    if not np.isfinite(r["ci_low"]):
        return _pct(r["value"])
    return f"{_pct(r['value'])} ({_pct(r['ci_low'])} to {_pct(r['ci_high'])})"


def evidence(T: dict, decided: pd.DataFrame, cfg) -> str:
    df = T[TABLE]
    layer = last_layer(df)
    share = df[df["metric"] == "share"].assign(representation=_rep)
    last = share[pd.to_numeric(share["layer"]) == layer]
    lines = [f"**How far each representation moves at the last layer (layer {layer})**, as a share of the way to "
             f"another input (the mean over examples of 1 − cos / the spread; 95% CI over documents). The same "
             f"representations of the same examples under each change; the spread is 1 − cos between the same "
             f"representation of two different inputs (= 100%).", "",
             "| representation | " + " | ".join(SHORT[c] for c in CHANGES) + " | spread (1 − cos) |",
             "|---" * (len(CHANGES) + 2) + "|"]
    for rep in REPRESENTATIONS:
        cells = []
        spread = "–"
        for c in CHANGES:
            r = last[(last["representation"] == rep) & (last["change"] == c)]
            cells.append(_cell(r.iloc[0]) if len(r) else "–")
            if c == "concat" and len(r):
                spread = f"{float(r['spread'].iloc[0]):.3g}"
        lines.append(f"| {NAMES[rep]} | " + " | ".join(cells) + f" | {spread} |")
    n = last[last["change"] == "concat"]
    if len(n):
        lines += ["", f"Dropping [SEP] is measured on {int(n['n'].max())} examples of the pairs "
                      f"({int(n['n_groups'].max())} {n['grouping'].iloc[0]}s); the yardsticks on the examples of the "
                      f"derived corpora ({DERIVED[SWAPPED]}; {DERIVED[REPLACED]}), and each comparison on the examples "
                      f"both have. The swapped words themselves are left out of the word rows (their keys hold other "
                      f"words after the swap); the pooled vectors and [CLS] are compared whole."]
    per_layer = share[share["change"] == "concat"].pivot_table(index="layer", columns="representation",
                                                                 values="value", sort=True)
    if len(per_layer):
        cols = [r for r in REPRESENTATIONS if r in per_layer.columns]
        lines += ["", "**Dropping [SEP], per layer** (% of the way to another input):", "",
                  "| layer | " + " | ".join(NAMES[c] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for layer_, row in per_layer.iterrows():
            lines.append(f"| {int(layer_)} | " + " | ".join("–" if not np.isfinite(row[c]) else _pct(row[c])
                                                           for c in cols) + " |")
    ft = T.get(FINETUNE_TABLE)
    if ft is not None and len(ft):
        for task, g in (ft if "target" in ft else ft.assign(target="next")).groupby("target", sort=False):
            parts = []
            for _, r in g.iterrows():
                kind = "frozen probes" if str(r["frozen"]).lower() == "true" else (
                    f"fine-tuned models ({int(r['n_seeds'])} seed{'s' if int(r['n_seeds']) != 1 else ''})")
                parts.append(f"{kind}: pair {_pct(r['value_b'])}, concat {_pct(r['value_a'])}")
            r0 = g.iloc[0]
            floor = f", always guessing the commoner answer {_pct(r0['chance'])}" if "chance" in g else ""
            lines += ["", f"**The fine-tuned model, `{task}`.** Accuracy on the same {int(r0['n'])} test items "
                          f"({int(r0['n_groups'])} documents; [CLS] pooling, every weight trained on "
                          f"{int(r0['n_train'])} training items, the `{cfg.finetune.preset}` preset) — "
                          + "; ".join(parts) + floor + "."]
    return "\n".join(lines)


def figures(T: dict, fig_dir, log) -> list:
    from figures.representation_change import plot_change

    return safe_plot(plot_change, T[TABLE], fig_dir / "q1_change", representations=list(REPRESENTATIONS),
                     changes=list(CHANGES), labels=SHORT, names=NAMES,
                     what="Q1: how far each representation moves, beside its yardsticks", log=log)


def notes(cfg) -> str:
    c = cfg.corpus
    subset = (f"{c.derived_examples} examples (whole documents)" if c.derived_examples is not None
              else "every example")
    return (f"Each change is 1 − cos between the same representation of the same example in two inputs, divided by "
            f"the spread of that representation at that layer (1 − the mean cos of {N_PAIRS:,} random pairs of "
            f"different examples in `pair`, held fixed in the bootstrap), averaged per example and then over "
            f"examples; intervals resample documents ({cfg.study.bootstrap_resamples} resamples). Word tokens are "
            f"paired by their key (example, sentence, word, subword) and token id. The yardsticks use {subset} of the "
            f"pairs ({corpus_text(c.pairs)} sentences): sentence 1 with two adjacent words swapped, and sentence 2 "
            f"replaced by a sentence of the same topic from an article the pairs do not hold ({c.replacements}). "
            f"The comparison rows are paired per example and corrected together per family. The fine-tuned part "
            f"trains [CLS] pooling with every weight in each format on "
            + "; ".join(f"`{t}` ({task_words(cfg, t)})" for t in format_tasks(cfg))
            + f", seeds {', '.join(map(str, protocol_seeds(cfg)))}, on one document-grouped split per task, with "
            f"frozen probes on the same split. It does not show how a model fine-tuned in one format would move its "
            f"own vectors, nor other tasks.")


QUESTION = Question(
    key=KEY, asked=ASKED, title="Fine-tuning with or without the middle [SEP]", corpora=("pairs", "replacements"),
    jobs=jobs, analyse=analyse, rules=RULES, rows=rows, answer=answer, evidence=evidence, figures=figures,
    notes=notes, derive=derived_pairs, tasks=tasks, runs=runs, tables=(TABLE, FINETUNE_TABLE), about_cls=True)
