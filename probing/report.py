"""The study report: one section per question, each opening with a sentence generated from the
numbers of that run's tables, then its figures and a table, then what the measurement does and does
not show; provenance at the end. Written as Markdown and as HTML with the figures inline."""

from __future__ import annotations

import base64
import html
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd


# ---------------------------------------------------------------------------------------------------
# Reading numbers out of tidy tables


def pick(df: pd.DataFrame | None, **where: Any) -> pd.DataFrame:
    if df is None or df.empty:
        return pd.DataFrame()
    m = np.ones(len(df), dtype=bool)
    for k, v in where.items():
        if k not in df.columns:
            return df.iloc[0:0]
        m &= (df[k] == v).to_numpy()
    return df[m]


def one(df: pd.DataFrame | None, **where: Any) -> tuple[float, float, float] | None:
    """``(value, ci_low, ci_high)`` of the single row matching ``where`` (None if there is none)."""
    r = pick(df, **where)
    if r.empty:
        return None
    r = r.iloc[0]
    num = lambda v: float("nan") if v is None or pd.isna(v) else float(v)  # noqa: E731
    return num(r["value"]), num(r["ci_low"]), num(r["ci_high"])


def fmt(v: tuple[float, float, float] | float | None, digits: int = 3) -> str:
    """``0.123 (95% CI 0.110–0.131)``; ``n/a`` for missing values; NaN says undefined."""
    if v is None:
        return "n/a"
    if isinstance(v, tuple):
        value, lo, hi = v
        if math.isnan(value):
            return "undefined"
        if math.isnan(lo) or math.isnan(hi):
            return f"{value:.{digits}f}"
        return f"{value:.{digits}f} (95% CI {lo:.{digits}f}–{hi:.{digits}f})"
    return "undefined" if math.isnan(v) else f"{v:.{digits}f}"


def last_layer(df: pd.DataFrame) -> int:
    return int(pd.to_numeric(df["layer"]).max())


def best_layer(df: pd.DataFrame, **where: Any) -> int | None:
    r = pick(df, **where)
    r = r[~r["value"].isna()] if not r.empty else r
    if r.empty:
        return None
    return int(r.loc[r["value"].idxmax(), "layer"])


# ---------------------------------------------------------------------------------------------------
# Document model, rendered to Markdown and HTML


@dataclass
class Section:
    title: str
    answer: str = ""
    figures: list[Path] = field(default_factory=list)
    table: pd.DataFrame | None = None
    table_caption: str = ""
    notes: str = ""


def _md_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("–" if math.isnan(v) else f"{v:.3f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_markdown(title: str, intro: str, sections: list[Section], provenance: dict, out: Path) -> str:
    parts = [f"# {title}", "", intro, ""]
    for s in sections:
        parts += [f"## {s.title}", "", f"**Answer.** {s.answer}", ""]
        for f in s.figures:
            parts += [f"![{f.stem}]({f.relative_to(out).as_posix()})", ""]
        if s.table is not None and not s.table.empty:
            if s.table_caption:
                parts += [f"*{s.table_caption}*", ""]
            parts += [_md_table(s.table), ""]
        if s.notes:
            parts += [f"**What this shows and does not show.** {s.notes}", ""]
    parts += ["## Provenance", ""]
    parts += [f"- **{k}**: {v}" for k, v in provenance.items()]
    return "\n".join(parts) + "\n"


def render_html(title: str, intro: str, sections: list[Section], provenance: dict) -> str:
    e = html.escape
    body = [f"<h1>{e(title)}</h1>", f"<p>{e(intro)}</p>"]
    for s in sections:
        body += [f"<h2>{e(s.title)}</h2>", f"<p><b>Answer.</b> {e(s.answer)}</p>"]
        for f in s.figures:
            data = base64.b64encode(f.read_bytes()).decode("ascii")
            body.append(f'<figure><img alt="{e(f.stem)}" src="data:image/png;base64,{data}" style="max-width:100%">'
                        f"<figcaption>{e(f.stem)}</figcaption></figure>")
        if s.table is not None and not s.table.empty:
            if s.table_caption:
                body.append(f"<p><i>{e(s.table_caption)}</i></p>")
            body.append(s.table.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–", border=0))
        if s.notes:
            body.append(f"<p><b>What this shows and does not show.</b> {e(s.notes)}</p>")
    body += ["<h2>Provenance</h2>", "<ul>"] + [f"<li><b>{e(k)}</b>: {e(str(v))}</li>" for k, v in provenance.items()]
    body.append("</ul>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.45}"
             "table{border-collapse:collapse;font-size:90%}td,th{padding:2px 8px;border-bottom:1px solid #ddd}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


# ---------------------------------------------------------------------------------------------------
# The questions


NOTES = {
    "Q1": "Drift is 1 − cos between the same token key (same example, sentence, word, subword) in two formats, "
          "averaged per role group, with a cluster bootstrap over examples. Raw cosines are high for any two "
          "tokens in these models, so each drift is shown beside the random-pair baseline of its layer and "
          "normalised by it (0 = unchanged, 1 = as far as two random tokens). `pair` → `concat_segments` "
          "removes only the [SEP] token; `concat_segments` → `concat` removes only the segment embedding. It "
          "does not say whether the change matters for a downstream task (see Q4/Q8 for probes).",
    "Q2": "Context effect: sentence i's words alone (`single`/`single2`) against the same words inside "
          "`pair` and `concat`; a larger drift means the sentence took in more of its neighbour. Attention "
          "mass from sentence 1's words to sentence 2's words is a second, mechanistic view (Clark et al. "
          "2019); attention weights are not explanations and mass to special tokens is often a no-op.",
    "Q3": "For k consecutive sentences of one article, `multi` ([SEP] after every sentence, alternating "
          "segments) against `concat` (one [CLS] … [SEP]); the model was pre-trained with two segments "
          "only, so growth with k shows the format moving away from what it saw in training. It does not "
          "measure task accuracy with k segments.",
    "Q4": "Probes read what is linearly decodable from the [SEP] state (topic, is_next, the bag of words of "
          "the sentence before/after it), against the majority baseline, a control task and a randomly "
          "initialised model; CKA compares [SEP] with [CLS] and with pooled words of each sentence; attention "
          "gives the mass flowing to and from [SEP]. Decodable is not the same as used by the model.",
    "Q5": "Multi-label probes for the bag of words of sentence i, read from [CLS] of a `multi` input of k "
          "sentences, for each position i; mean pooling as the reference. Micro-F1 over the most frequent "
          "words; the baseline predicts each word's training frequency.",
    "Q6": "The same probes on the classification token placed first (`pair`), between the sentences "
          "(`cls_mid`) and last (`cls_last`). Absolute position embeddings make the three different inputs; "
          "the pre-trained model only ever saw [CLS] first.",
    "Q7": "Bag-of-words, sentence-length and word-order (two adjacent words swapped) probes on [CLS] and on "
          "mean-pooled words, per layer, for the trained and a randomly initialised model of the same "
          "architecture. A random model's high bag-of-words score shows how much comes from the embeddings "
          "alone.",
    "Q8": "Frozen probes score each pooling choice per layer without training the encoder; the fine-tuning "
          "experiment trains the encoder with a linear head on each pooling over several seeds, on one fixed "
          "train/test split. Small CPU settings: differences within a standard deviation are not evidence.",
}


def _drift_sentence(d: pd.DataFrame, a: str, b: str) -> str:
    dd = pick(d, format=a, format_b=b)
    if dd.empty:
        return f"(no drift measured for {a} → {b})"
    L = last_layer(dd)
    parts = []
    for role, label in (("cls", "[CLS]"), ("s1 words", "words of sentence 1"), ("s2 words", "words of sentence 2")):
        v = one(dd, layer=L, role=role, metric="drift_mean")
        if v is not None:
            parts.append(f"{label} by 1 − cos = {fmt(v)}")
    base = one(dd, layer=L, role="all", metric="anisotropy_baseline")
    nd = one(dd, layer=L, role="cls", metric="normalised_drift")
    s = f"at layer {L} ({a} → {b}) " + "; ".join(parts)
    if base is not None:
        s += f"; the random-pair baseline at that layer is 1 − cos = {1 - base[0]:.3f}"
    if nd is not None:
        s += f", so [CLS]'s normalised drift is {fmt(nd[0])}"
    return s


def answer_q1(T: dict) -> str:
    d = T.get("drift_q1")
    if d is None:
        return "not measured"
    s = "Removing the middle [SEP] changes, " + _drift_sentence(d, "pair", "concat") + ". "
    cls = pick(d, format="pair", format_b="concat", role="cls", metric="drift_mean")
    if not cls.empty:
        worst = cls.loc[cls["value"].idxmax()]
        s += f"[CLS] moves most at layer {int(worst['layer'])} (1 − cos = {worst['value']:.3f}). "
    sep_only = one(d, format="pair", format_b="concat_segments", role="cls", metric="drift_mean",
                   layer=last_layer(d))
    seg_only = one(d, format="concat_segments", format_b="concat", role="cls", metric="drift_mean",
                   layer=last_layer(d))
    if sep_only is not None and seg_only is not None:
        s += (f"Split into its parts at the last layer: removing only the [SEP] token moves [CLS] by {fmt(sep_only)}, "
              f"removing only the segment ids by {fmt(seg_only)}.")
    c = T.get("cka_q1")
    v = one(c, layer=last_layer(c), role="cls", metric="linear_cka") if c is not None else None
    if v is not None:
        s += f" Linear CKA of [CLS] between the two formats at the last layer: {fmt(v[0])}."
    return s


def answer_q2(T: dict) -> str:
    d = T.get("drift_q2")
    if d is None:
        return "not measured"
    L = last_layer(d)
    out = []
    for single, sent in (("single", "s1 words"), ("single2", "s2 words")):
        for fmt_b in ("pair", "concat"):
            v = one(d, format=single, format_b=fmt_b, role=sent, metric="drift_mean", layer=L)
            if v is not None:
                out.append(f"{sent.split()[0]} alone → in `{fmt_b}`: 1 − cos = {fmt(v)}")
    s = f"At layer {L}, " + "; ".join(out) + "."
    a = T.get("attention")
    if a is not None:
        m = pick(a, role="s1 words", target="s2 words words" if False else "s2 words", head="mean")
        vals = []
        for f in ("pair", "concat"):
            r = pick(m, format=f)
            if not r.empty:
                vals.append(f"{r['value'].mean():.3f} in `{f}`")
        if vals:
            s += " Attention mass from sentence 1's words to sentence 2's words, averaged over layers and heads: " \
                 + ", ".join(vals) + "."
    return s


def answer_q3(T: dict) -> str:
    d = T.get("drift_q3")
    if d is None:
        return "not measured"
    L = last_layer(d)
    parts = []
    for k in sorted(d["k"].unique()):
        v = one(d, k=k, layer=L, role="cls", metric="drift_mean")
        w = one(d, k=k, layer=L, role="all", metric="drift_mean")
        parts.append(f"k={k}: [CLS] {fmt(v)}, all tokens {fmt(w[0] if w else None)}")
    return (f"`multi` ([SEP] after each of k sentences) against `concat` at layer {L}, 1 − cos: "
            + "; ".join(parts) + ".")


def _probe(T, key, **where):
    return one(T.get(key), **where)


def answer_q4(T: dict) -> str:
    p = T.get("probes_pair")
    if p is None:
        return "not measured"
    tr = pick(p, model_kind="trained")
    L = last_layer(tr)
    parts = []
    for target, metric in (("topic", "accuracy"), ("is_next", "accuracy"), ("bow_s1", "micro_f1"),
                           ("bow_s2", "micro_f1")):
        row = []
        for choice in ("sep1", "cls", "mean_s1"):
            v = one(tr, role=choice, target=target, metric=metric, layer=L)
            row.append(f"{choice} {fmt(v[0] if v else None)}")
        base = one(tr, role="sep1", target=target, metric="majority_baseline", layer=L)
        parts.append(f"{target} ({metric}): " + ", ".join(row) + f" (majority baseline {fmt(base[0] if base else None)})")
    s = f"Probes at layer {L} on the middle [SEP] (sep1) vs [CLS] vs mean of sentence 1's words — " + "; ".join(parts) + "."
    c = T.get("cka_q4")
    if c is not None:
        Lc = last_layer(c)
        vals = [f"{t} {fmt(one(c, role='sep1', target=t, metric='linear_cka', layer=Lc)[0] if one(c, role='sep1', target=t, metric='linear_cka', layer=Lc) else None)}"
                for t in ("cls", "mean_s1", "mean_s2")]
        s += f" Linear CKA of sep1 at layer {Lc} with: " + ", ".join(vals) + "."
    a = T.get("attention")
    if a is not None:
        m = pick(a, format="pair", role="s1 words", target="all [SEP]", head="mean")
        if not m.empty:
            s += f" Words of sentence 1 send {m['value'].mean():.3f} of their attention to the [SEP]s (mean over layers)."
    return s


def answer_q5(T: dict) -> str:
    p = T.get("probes_q5")
    if p is None:
        return "not measured"
    L = last_layer(p)
    targets = sorted({t for t in p["target"].unique() if str(t).startswith("bow_s")}, key=lambda t: int(t[5:]))
    parts = []
    for t in targets:
        v = one(p, role="cls", target=t, metric="micro_f1", layer=L)
        m = one(p, role="mean", target=t, metric="micro_f1", layer=L)
        parts.append(f"sentence {t[5:]}: [CLS] {fmt(v)}, mean {fmt(m[0] if m else None)}")
    base = one(p, role="cls", target=targets[0], metric="majority_baseline", layer=L) if targets else None
    return (f"Bag-of-words micro-F1 of sentence i read from [CLS] at layer {L} of a {len(targets)}-sentence input: "
            + "; ".join(parts) + f" (baseline {fmt(base[0] if base else None)}).")


def answer_q6(T: dict) -> str:
    p = T.get("probes_q6")
    if p is None:
        return "not measured"
    L = last_layer(p)
    parts = []
    for target in ("topic", "is_next"):
        vals = [f"{f} {fmt(one(p, format=f, role='cls', target=target, metric='accuracy', layer=L))}"
                for f in ("pair", "cls_mid", "cls_last")]
        parts.append(f"{target}: " + ", ".join(vals))
    return f"Probe accuracy of the classification token at layer {L}, by where it sits — " + "; ".join(parts) + "."


def answer_q7(T: dict) -> str:
    p = T.get("probes_pair")
    parts = []
    if p is not None:
        L = last_layer(p)
        for target, metric in (("bow_s1", "micro_f1"), ("length", "accuracy")):
            vals = []
            for kind in ("trained", "random_init"):
                for choice in ("cls", "mean"):
                    v = one(p, model_kind=kind, role=choice, target=target, metric=metric, layer=L)
                    if v is not None:
                        vals.append(f"{choice} ({kind.replace('_', ' ')}) {fmt(v[0])}")
            parts.append(f"{target} {metric}: " + ", ".join(vals))
    q = T.get("probes_q7")
    if q is not None:
        L = last_layer(q)
        vals = [f"{c} ({k.replace('_', ' ')}) {fmt(one(q, model_kind=k, role=c, target='swapped', metric='accuracy', layer=L))}"
                for k in ("trained", "random_init") for c in ("cls", "mean")]
        b = one(q, role="cls", target="swapped", metric="majority_baseline", layer=L)
        parts.append("word order (swapped) accuracy: " + ", ".join(vals) + f", majority {fmt(b[0] if b else None)}")
    return "At the last layer — " + "; ".join(parts) + "." if parts else "not measured"


def answer_q8(T: dict) -> str:
    p = T.get("probes_pair")
    s = ""
    if p is not None:
        tr = pick(p, model_kind="trained", target="topic", metric="accuracy")
        L = last_layer(tr)
        vals = [f"{c} {fmt(one(tr, role=c, layer=L)[0] if one(tr, role=c, layer=L) else None)}"
                for c in ("cls", "mean", "max", "sep1", "first_word", "pos3")]
        s += f"Frozen probes for topic at layer {L}: " + ", ".join(vals) + ". "
    f = T.get("finetune")
    if f is not None:
        m = pick(f, metric="test_accuracy_mean")
        if not m.empty:
            vals = [f"{r.role} {r.value:.3f} ± {getattr(r, 'sd', float('nan')):.3f}" for r in m.itertuples()]
            s += f"Fine-tuned (mean ± sd over {pick(f, metric='test_accuracy')['seed'].nunique()} seeds): " + ", ".join(vals) + "."
            base, best = one(f, metric="majority_baseline"), one(f, metric="best_constant")
            if base is not None:
                s += f" Majority baseline {fmt(base[0])}" + (f", best constant {fmt(best[0])}" if best else "") + "."
    return s or "not measured"


ANSWERS: dict[str, Callable[[dict], str]] = {
    "Q1": answer_q1, "Q2": answer_q2, "Q3": answer_q3, "Q4": answer_q4,
    "Q5": answer_q5, "Q6": answer_q6, "Q7": answer_q7, "Q8": answer_q8,
}

TITLES = {
    "Q1": "Q1. Drop the middle [SEP]: how much do the embeddings change?",
    "Q2": "Q2. Does sentence 1 take in more of sentence 2 in one format than the other?",
    "Q3": "Q3. Three or more segments: [CLS] s1 [SEP] s2 [SEP] s3 [SEP] …",
    "Q4": "Q4. What does the output at [SEP] hold?",
    "Q5": "Q5. With several sentences, does [CLS] hold information about all of them?",
    "Q6": "Q6. Why is [CLS] first? Would another position do?",
    "Q7": "Q7. Can the input be recovered from [CLS]?",
    "Q8": "Q8. Is [CLS] better than mean pooling? After fine-tuning, would any token do?",
}


def machine() -> str:
    import os

    import torch

    s = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores"
    if torch.cuda.is_available():
        s += f", {torch.cuda.get_device_name(0)}"
    return s
