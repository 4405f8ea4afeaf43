"""Q5: with several sentences, does [CLS] hold information about all of them?

Three measurements on inputs of k sentences (the largest k of ``[segments] ks``) in ``multi``
(``[CLS] s1 [SEP] s2 [SEP] … sk [SEP]``):

* **content per sentence**: a multi-label probe reads the bag of content words of sentence i from [CLS], scored
  by macro AUC against a probe on the sentences' word counts alone (a longer sentence holds more of any word),
  on the same items, folds and document resamples;
* **interchange**: sentence i is replaced by a same-topic sentence of another article; the readout of position i
  should follow the new sentence (rank its words above the old one's) and the other positions' readouts should
  stay as they were. That is what "holds sentence i" means causally: the readout tracks the sentence, not the
  topic or the neighbours;
* **bertsum's own [CLS]** (``[CLS] s_i [SEP]`` per sentence) for sentence i beside the single [CLS] of ``multi``.

Tables: ``sentence_content`` (shared with Q3) and ``interchange`` (:mod:`probing.study.questions.segments`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.sentence_content import LENGTH_ONLY, OWN_CLS

from ..answers import Answer, not_measured
from ..rules import Rule
from ..sections import Context, Job
from . import segments as seg
from ._base import Question

RULES: dict[str, Rule] = {
    "beyond_length": Rule("macro AUC of sentence i's content words, [CLS] − the sentences' lengths alone",
                          "AUC points", 0.02, direction=1,
                          why="below 2 AUC points [CLS] would add nothing a reader could use over the lengths"),
    "follow": Rule("readout of sentence i after sentence i is replaced: macro AUC against the new sentence's words "
                   "− against the old one's", "AUC points", 0.02, direction=1,
                   why="a readout that moves less than 2 AUC points towards the new sentence does not follow it"),
    "stay": Rule("readout of sentence i after another sentence is replaced − on the clean input (macro AUC)",
                 "AUC points", 0.02, why="a change below 2 AUC points leaves what is read of sentence i as it was"),
    "own_cls": Rule("macro AUC of sentence i's content words, bertsum's own [CLS] − multi's single [CLS]",
                    "AUC points", 0.02, why="the same threshold as every AUC comparison here"),
}


def _jobs(cfg, corpora) -> list[Job]:
    K = seg.largest_k(cfg)
    return [Job(seg.corpus_key(K), "multi"), Job(seg.corpus_key(K), "bertsum"), *seg.interchange_jobs(cfg)]


def analyse(ctx: Context) -> dict[str, pd.DataFrame]:
    return {"sentence_content": ctx.table("sentence_content", seg.content_table),
            "interchange": ctx.table("interchange", seg.interchange_table)}


def _K(T) -> int | None:
    lv = seg.content(T, metric="macro_auc", format="multi", choice="cls")
    return int(lv["k"].max()) if not lv.empty else None


def rows(T) -> pd.DataFrame:
    """Per sentence position at the largest k: [CLS] − length-only; interchange follow and stay; bertsum's own
    [CLS] − multi's [CLS]; one family each."""
    parts = []
    K = _K(T)
    if K is not None:
        d = seg.content(T, k=K, metric="macro_auc_diff", format="multi", choice="cls", choice_b=LENGTH_ONLY)
        parts.append(seg.comparison_rows(d, "beyond_length", "[CLS] − length alone", "[CLS] − length alone"))
        d = seg.content(T, k=K, metric="macro_auc_diff", format="bertsum", choice=OWN_CLS, format_b="multi")
        parts.append(seg.comparison_rows(d, "own_cls", "bertsum's own [CLS] − multi's [CLS]",
                                         "own [CLS] − single [CLS]"))
    ic = T.get("interchange")
    if ic is not None and not ic.empty:
        for metric, measure, label in (("interchange_follow", "follow", "follows the new sentence"),
                                       ("interchange_stay", "stay", "others stay")):
            d = ic[(ic["metric"] == metric) & ic["value"].notna()]
            parts.append(seg.comparison_rows(d, measure, f"interchange: {label}", label))
            d = ic[(ic["metric"] == f"{metric}_mean") & ic["value"].notna()]
            parts.append(seg.comparison_rows(d, measure, f"interchange, mean over sentences: {label}",
                                             f"{label} (mean over sentences)").assign(pooled=True))
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["measure", "family", "value", "se"])


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}–{hi:.2f}"


def _positions(ps) -> str:
    """``'sentence 2'``, ``'sentences 1 and 3'``, ``'sentences 1, 2 and 4'``."""
    ps = sorted(int(p) for p in ps)
    if len(ps) == 1:
        return f"sentence {ps[0]}"
    return "sentences " + ", ".join(map(str, ps[:-1])) + f" and {ps[-1]}"


def _interchange(decided: pd.DataFrame, measure: str) -> pd.DataFrame:
    """The decided rows of an interchange measure the answer reads: the mean over sentences where there is one
    (its interval pools every sentence's items), else the rows per sentence."""
    d = decided[decided["measure"] == measure]
    if "pooled" in d.columns and (d["pooled"] == True).any():  # noqa: E712 (NaN in the per-sentence rows)
        return d[d["pooled"] == True]  # noqa: E712
    return d


def answer(T, decided: pd.DataFrame, cfg) -> Answer:
    preset = "quick" if getattr(cfg, "quick", False) else cfg.finetune.preset
    K = _K(T)
    if K is None or decided is None or decided.empty:
        return not_measured("the content of each sentence read from [CLS]", preset)
    lv = seg.content(T, k=K, metric="macro_auc", format="multi", choice="cls").set_index("position")["value"]
    ln = seg.length_only(T, K).set_index("position")["value"]
    bl = decided[decided["measure"] == "beyond_length"]
    held = bl[(bl["decision"] == "yes") & (bl["value"] > 0)]["position"]
    if len(held) == len(bl) and len(bl):
        head = f"Yes: [CLS] of a {K}-sentence input holds every sentence's content words"
    elif len(held):
        head = (f"Partly: [CLS] of a {K}-sentence input holds the content words of {_positions(held)}, "
                "not measurably of the others")
    else:
        head = f"Not measurably: [CLS] of a {K}-sentence input reads no sentence's content words beyond their lengths"
    text = f"{head} (macro AUC {_span(lv)} by sentence, where lengths alone give {_span(ln)})."
    fo, st = _interchange(decided, "follow"), _interchange(decided, "stay")
    if len(fo):
        follows = ((fo["decision"] == "yes") & (fo["value"] > 0)).all()
        stays = st["decision"].isin(["no_difference", "yes_small"]).all() if len(st) else False
        moved = st[(st["decision"] == "yes")]
        if follows and stays:
            text += " Replacing sentence i moves only sentence i's readout, towards the new words."
        elif follows and len(moved):
            text += (" Replacing sentence i moves its readout towards the new words, and also changes other "
                     f"sentences' readouts (at {len(moved)} of {len(st)} positions).")
        elif follows:
            text += (" Replacing sentence i moves its readout towards the new words; whether the other sentences' "
                     "readouts stay could not be told.")
        elif (fo["decision"] == "no_difference").any() or ((fo["decision"] == "yes") & (fo["value"] < 0)).any():
            text += " But its readout of a sentence does not follow when that sentence is replaced."
        else:
            n = int(fo["n"].min()) if "n" in fo.columns and fo["n"].notna().any() else None
            pooled = "pooled" in fo.columns and (fo["pooled"] == True).any()  # noqa: E712
            items = f" ({n} items with a sentence replaced)." if pooled else f" ({n} replaced items per sentence)."
            if stays:
                text += " Replacing one sentence leaves what is read of the others as it was"
                text += "; whether the replaced one's readout follows could not be told" + (items if n else ".")
            else:
                text += " Whether that readout follows a replaced sentence could not be told" + (items if n else ".")
    conf = bl["confidence"]
    order = {"low": 0, "moderate": 1, "high": 2}
    confidence = min(conf, key=order.get) if len(conf) else "low"
    return Answer(text, confidence, preset)


def evidence(T, decided: pd.DataFrame, cfg) -> str:
    out = []
    K = _K(T)
    if K is not None:
        lv = seg.content(T, k=K, metric="macro_auc")
        lv = lv[lv["choice"].isin(["cls", "mean", LENGTH_ONLY, OWN_CLS]) & lv["format"].isin(
            ["multi", "bertsum", "length"])]
        piv = lv.assign(what=lv["format"] + " " + lv["choice"]).pivot_table(index="what", columns="position",
                                                                            values="value").round(3)
        piv.columns = [f"sentence {p}" for p in piv.columns]
        out += [f"**Content words of each sentence of a {K}-sentence input** (macro AUC, last layer read; 0.5 = word "
                "frequency alone; `length length_only`: the sentences' word counts alone; `bertsum own_cls`: the "
                "[CLS] before that sentence in bertsum):", "", seg.md_table(piv.reset_index()), ""]
        cos = seg.content(T, k=K, metric="cosine", choice=OWN_CLS)
        if not cos.empty:
            lo, hi = (f"{g:.2g}" for g in (1 - cos["value"].max(), 1 - cos["value"].min()))
            out += [(f"bertsum's own [CLS] of sentences 2–{K} against its first [CLS]: 1 − cosine "
                     f"{lo if lo == hi else f'{lo}–{hi}'} at the layer read (0: the same direction)."), ""]
    ic = T.get("interchange")
    if ic is not None and not ic.empty:
        out += ["**Interchange** (each item has one sentence replaced by a same-topic sentence of an article "
                "that is no item; the probes of each position were fitted on the clean inputs' training folds). "
                "*Follows*: the readout of sentence i on the items where i was replaced, scored against the new "
                "sentence's words − against the old one's. *Stays*: the readout of sentence i on the items where "
                "another sentence was replaced − on the same items clean (macro AUC):", "", seg.md_table(
                    _interchange_display(ic)), ""]
    return "\n".join(out)


def _interchange_display(ic: pd.DataFrame) -> pd.DataFrame:
    """The interchange rows as the evidence prints them: one line per (test, sentence i)."""
    rows = []
    for _, r in ic.sort_values(["metric", "position"]).iterrows():
        follow = r["metric"].startswith("interchange_follow")
        rows.append({"test": "follows" if follow else "stays",
                     "sentence i": int(r["position"]) if pd.notna(r["position"]) else "mean of all",
                     "AUC": (f"{r['value_a']:.3f} (new words) vs {r['value_b']:.3f} (old)" if follow
                             else f"{r['value_a']:.3f} (other replaced) vs {r['value_b']:.3f} (clean)"),
                     "difference (95% CI)": f"{r['value']:+.3f} ({r['ci_low']:+.3f} to {r['ci_high']:+.3f})",
                     "items": int(r["n"]) if pd.notna(r["n"]) else "–"})
    return pd.DataFrame(rows)


def figures(T, fig_dir: Path, log) -> list[Path]:
    from figures.sentence_content import plot_content_by_position, plot_interchange

    from ..sections import safe_plot

    out = []
    if "sentence_content" in T and not T["sentence_content"].empty:
        out += safe_plot(plot_content_by_position, T["sentence_content"], Path(fig_dir) / "q5_content_by_position",
                         log=log)
    if "interchange" in T and not T["interchange"].empty:
        out += safe_plot(plot_interchange, T["interchange"], Path(fig_dir) / "q5_interchange", log=log)
    return out


def notes(cfg) -> str:
    s = cfg.segments
    K = max(s.ks)
    return (f"Inputs: the first {K} consecutive sentences of the items of corpus.groups ({cfg.corpus.groups}), "
            f"{100 * s.donor_share:.0f}% of each topic's articles held out as donors. A multi-label probe per "
            f"sentence position reads the sentence's {cfg.probes.vocab} most frequent content words (stop words and "
            f"the top frequency band out) from the layer {s.layer} state (-1: the last) of [CLS], scored by macro AUC "
            "over out-of-fold items (folds and bootstrap grouped by document), against a probe on the sentences' "
            "word counts alone on the same resamples. Interchange: every item has one sentence replaced (the "
            "position balanced over the items) by a sentence of the same topic from a held-out article; the clean "
            "inputs' probes read the replaced inputs of their test folds. Not shown: a probe is a lower bound (more "
            "may be held non-linearly); what a fine-tuned model's [CLS] holds; other models.")


QUESTION = Question(
    key="Q5",
    asked="With several sentences, does [CLS] hold information about all of them?",
    title="With several sentences, does [CLS] hold all of them?",
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
    tables=("sentence_content", "interchange"),
    about_cls=True,
)
