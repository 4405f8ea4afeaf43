"""Q3: does ``[CLS] s1 [SEP] s2 [SEP] s3 [SEP]`` work?

A question about use, answered by use: the same k-sentence task fine-tuned in ``multi`` (a [SEP] after every
sentence, alternating segments), ``concat`` (one [CLS] … [SEP] around all of them) and a control that puts an
ordinary ',' where each inner [SEP] stood (same length, same segments), paired on the same test items with the
seed and the document as units; and, frozen, whether each sentence's content words can still be read from
[CLS] and from mean pooling as k grows, in each format, on the same items. The task, ``intruder``: k
consecutive sentences of one article; in half the examples one sentence (position 2..k) is replaced by a
sentence of a held-out article of another topic (``[segments] intruders``; ``same_topic`` asks for coherence
alone, which the default budget does not teach); is there an intruder?
(:mod:`probing.study.questions.segments`.)
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.sentence_content import SEGMENT_FORMATS

from ..answers import Answer, not_measured
from ..rules import Rule
from ..sections import Context
from . import segments as seg
from ._base import Question

#: The measures of Q3's comparison rows, each judged in its own unit.
RULES: dict[str, Rule] = {
    "finetuned": Rule("fine-tuned accuracy on the intruder task, multi − another format", "accuracy points", 0.02,
                      why="below 2 points practitioners do not change an input format"),
    "content": Rule("macro AUC of sentence i's content words, multi − another format", "AUC points", 0.02,
                    why="2 AUC points is about a tenth of what [CLS] reads beyond sentence length here"),
}
FORMAT_WORDS = {"multi": "`[CLS] s1 [SEP] s2 [SEP] …`", "concat": "`[CLS] s1 s2 … [SEP]`",
                "control": "`[CLS] s1 , s2 , … [SEP]`", "bertsum": "bertsum"}


def _jobs(cfg, corpora) -> list:
    return seg.content_jobs(cfg)


def analyse(ctx: Context) -> dict[str, pd.DataFrame]:
    return {"sentence_content": ctx.table("sentence_content", seg.content_table),
            "q3_intruder": ctx.table("q3_intruder", seg.intruder_table)}


def rows(T) -> pd.DataFrame:
    """Fine-tuned multi − each other format (one family); frozen multi − concat and multi − control per (k,
    sentence position), one family per comparison and pooling."""
    parts = []
    ft = T.get("q3_intruder")
    if ft is not None and not ft.empty:
        d = ft[ft["metric"] == "accuracy_diff"]
        for _, r in d.iterrows():
            parts.append(pd.DataFrame([{"measure": "finetuned", "family": "fine-tuned: multi − other formats",
                                        "label": f"multi − {r['format_b']}", "format_b": r["format_b"],
                                        "value": r["value"], "se": r["se"], "value_a": r["value_a"],
                                        "value_b": r["value_b"], "n_groups": r["n_groups"], "grouping": "document",
                                        "n_resamples": r["n_resamples"]}]))
    for choice, what in (("cls", "[CLS]"), ("mean", "mean pooling")):
        for other in ("concat", "control"):
            d = seg.content(T, metric="macro_auc_diff", format="multi", choice=choice, format_b=other,
                            choice_b=choice)
            if not d.empty:
                parts.append(seg.comparison_rows(d, "content", f"frozen {what}: multi − {other}",
                                                 f"{what}, multi − {other}").assign(format_b=other, pooling=choice))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["measure", "family", "value", "se"])


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _accuracies(T) -> pd.DataFrame:
    ft = T.get("q3_intruder")
    if ft is None or ft.empty:
        return pd.DataFrame(columns=["format", "frozen", "value", "ci_low", "ci_high"])
    return ft[ft["metric"] == "accuracy"]


def _where(df: pd.DataFrame | None, **eq) -> pd.DataFrame:
    """Rows of ``df`` whose columns equal the given values (empty when ``df`` is None or lacks a column)."""
    if df is None or df.empty or any(c not in df.columns for c in eq):
        return pd.DataFrame(columns=list(df.columns) if df is not None else [])
    for c, v in eq.items():
        df = df[df[c] == v]
    return df


def _frozen_sentence(T, decided: pd.DataFrame | None) -> str:
    """One short sentence on the frozen readout: [CLS] of multi against concat over every k and position."""
    d = _where(decided, measure="content", pooling="cls", format_b="concat")
    lv = seg.content(T, metric="macro_auc", format="multi", choice="cls")
    if d.empty or lv.empty:
        return ""
    ks = sorted(lv["k"].unique())
    span = f"k = {ks[0]} to {ks[-1]}" if len(ks) > 1 else f"k = {ks[0]}"
    if d["decision"].isin(["no_difference", "yes_small"]).all():
        return f"Frozen, its [CLS] reads each sentence's content words as well as concat's at {span}."
    worse = (d["decision"] == "yes") & (d["value"] < 0)
    if worse.any():
        return (f"Frozen, its [CLS] reads some sentences' content words less well than concat's ({int(worse.sum())} "
                f"of {len(d)} positions, {span}).")
    better = (d["decision"] == "yes") & (d["value"] > 0)
    if better.any():
        return f"Frozen, its [CLS] reads some sentences' content words better than concat's ({span})."
    return f"Frozen, its [CLS] reads each sentence's content words about as well as concat's ({span}; not all decided)."


def _source(cfg) -> str:
    """Where an intruder comes from, in the answer's words."""
    return "another topic" if cfg.segments.intruders == "other_topic" else "another article"


def _intruder_words(cfg) -> str:
    if cfg.segments.intruders == "other_topic":
        return ("a sentence of an article of another topic that is no item, as BERT's next-sentence negatives came "
                "from other documents: a sentence never sits in two items; `[segments] intruders = \"same_topic\"` "
                "asks for coherence alone, which one epoch on a few hundred items does not teach")
    return ("a same-topic sentence of an article that is no item, so sentence-level leaks and topic cues are "
            "excluded")


def answer(T, decided: pd.DataFrame, cfg) -> Answer:
    preset = "quick" if getattr(cfg, "quick", False) else cfg.finetune.preset
    acc = _accuracies(T)
    tuned = acc[~acc["frozen"].astype(bool)].set_index("format") if not acc.empty else acc
    ft = _where(decided, measure="finetuned")
    frozen = _frozen_sentence(T, decided)
    k = cfg.segments.finetune_k
    if "multi" not in tuned.index:
        if frozen:
            return Answer(f"Not fine-tuned in this run. {frozen}", "low", preset)
        return not_measured("the fine-tuned intruder task and the content readouts", preset)
    m = tuned.loc["multi"]
    task = f"fine-tuned to tell whether one of {k} sentences comes from {_source(cfg)}"
    if not float(m["ci_low"]) > 0.5:
        text = (f"Cannot tell: {task}, `[CLS] s1 [SEP] s2 [SEP] …` scored {_pct(m['value'])}, no better than "
                f"chance (50%), so this run did not learn the task. {frozen}")
        return Answer(text.strip(), "low", preset)
    vs = _where(ft, format_b="concat")
    if vs.empty or "concat" not in tuned.index:
        return Answer(f"Yes, it works: {task}, `[CLS] s1 [SEP] s2 [SEP] …` scores {_pct(m['value'])} (chance: "
                      f"50%). {frozen}".strip(), "moderate", preset)
    r = vs.iloc[0]
    rule = RULES["finetuned"]
    c = tuned.loc["concat"]
    diff = f"{rule.number(r['value'], signed=True)} points"
    interval = f"CI {rule.number(r['ci_low'], True)} to {rule.number(r['ci_high'], True)}"
    head = {"no_difference": "Yes, it works as well as one long segment",
            "yes_small": "Yes, it works as well as one long segment",
            "inconclusive": "Yes, it works", "not_measured": "Yes, it works",
            "yes": "Yes, and better than one long segment" if r["value"] > 0 else "It works, but worse than one long "
                   "segment"}[r["decision"]]
    tail = {"yes_small": f"{interval}: real but small", "inconclusive": f"{interval}: too uncertain to call",
            "not_measured": "no spread to judge it by"}.get(r["decision"], interval)
    text = (f"{head}: {task}, `[CLS] s1 [SEP] s2 [SEP] …` scores {_pct(m['value'])}, `[CLS] s1 s2 … [SEP]` "
            f"{_pct(c['value'])} ({diff}, {tail}). {frozen}")
    return Answer(text.strip(), r["confidence"], preset)


def evidence(T, decided: pd.DataFrame, cfg) -> str:
    out = []
    acc = _accuracies(T)
    if not acc.empty:
        t = acc.assign(kind=acc["frozen"].map({True: "frozen probe", False: "fine-tuned"}),
                       accuracy=[f"{_pct(v)} ({_pct(lo)} to {_pct(hi)})" for v, lo, hi in
                                 zip(acc["value"], acc["ci_low"], acc["ci_high"])])
        t = t[["format", "kind", "accuracy", "n", "n_seeds", "n_groups"]].rename(
            columns={"n": "test items", "n_seeds": "seeds", "n_groups": "documents"})
        out += [f"**The intruder task** ({cfg.segments.finetune_k} sentences; chance 50%): accuracy on the same test "
                "items, 95% CI over training seeds and documents (a frozen probe: documents only).", "",
                seg.md_table(t), ""]
    lv = seg.content(T, metric="macro_auc")
    if not lv.empty:
        lv = lv[lv["choice"].isin(["cls", "mean", "length_only"])]
        piv = lv.assign(what=lv["format"] + " " + lv["choice"]).pivot_table(
            index="what", columns=["k", "position"], values="value").round(3)
        piv.columns = [f"k={k} s{p}" for k, p in piv.columns]
        out += ["**Content words of sentence i** (frozen, last layer read; macro AUC, 0.5 = frequency alone; "
                "`length length_only`: the sentences' word counts alone):", "", seg.md_table(piv.reset_index()), ""]
    return "\n".join(out)


def figures(T, fig_dir: Path, log) -> list[Path]:
    from figures.sentence_content import plot_content_by_k, plot_intruder

    from ..sections import safe_plot

    out = []
    if "sentence_content" in T and not T["sentence_content"].empty:
        out += safe_plot(plot_content_by_k, T["sentence_content"], Path(fig_dir) / "q3_content_by_k", log=log)
    if "q3_intruder" in T and not T["q3_intruder"].empty:
        out += safe_plot(plot_intruder, T["q3_intruder"], Path(fig_dir) / "q3_intruder", log=log)
    return out


def notes(cfg) -> str:
    from analyses.finetune import PROTOCOL_PRESETS

    s = cfg.segments
    p = PROTOCOL_PRESETS[cfg.finetune.preset]
    tr = p["train"]
    kinds = ", ".join(f"`{k}` ({SEGMENT_FORMATS[k]})" for k in seg.finetune_kinds(cfg))
    return (f"Fine-tuning: the intruder task of {s.finetune_k} consecutive sentences from the items of corpus.groups "
            f"({cfg.corpus.groups}), {_pct(s.donor_share)} of each topic's articles held out to supply the intruders "
            f"({_intruder_words(cfg)}); one document-grouped split ({_pct(p['test_fraction'])} of the documents "
            f"tested, no sentence on both sides), every weight trainable, a linear head on [CLS], {tr['epochs']} "
            f"epochs, batch {tr['batch_size']}, learning rate {tr['lr']:g} (head {tr['head_lr']:g}), seeds "
            f"{list(seg.protocol_seeds(cfg))} (`[finetune] seeds`; the `{cfg.finetune.preset}` preset); "
            f"formats {kinds}. "
            "The comparisons are paired "
            "on the same test items; their intervals resample the seeds, then the documents. A frozen logistic "
            "probe on the same split shows what fine-tuning adds. Frozen readouts: a multi-label probe per "
            f"sentence position reads the sentence's {cfg.probes.vocab} most frequent content words from [CLS] and "
            f"from mean pooling at layer {s.layer} (-1: the last) for k = {', '.join(map(str, s.ks))}, each format "
            "on the same items, folds and document resamples, scored by macro AUC beside a probe on the sentences' "
            "word counts alone. Not shown: tasks other than this one, larger k (raise corpus.groups' k and "
            "segments.ks), other models; a frozen probe is a lower bound on what a vector holds.")


QUESTION = Question(
    key="Q3",
    asked="Does `[CLS] s1 [SEP] s2 [SEP] s3 [SEP]` work?",
    title="Three or more segments: [CLS] s1 [SEP] s2 [SEP] s3 [SEP] …",
    corpora=("groups",),
    jobs=_jobs,
    analyse=analyse,
    rules=RULES,
    rows=rows,
    answer=answer,
    evidence=evidence,
    figures=figures,
    notes=notes,
    derive=seg.derive,
    tasks=seg.tasks,
    runs=seg.runs,
    tables=("sentence_content", "q3_intruder"),
    about_cls=True,
)
