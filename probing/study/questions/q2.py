"""Q2: without the middle [SEP], does sentence 1 integrate more information from sentence 2?

Measured as the thread asked it, by an interchange: replace sentence 2 by another sentence (same topic, another
article: the derived corpus :data:`~probing.study.questions._common.REPLACED`) and measure how far sentence 1's
tokens move, in ``pair`` and in ``concat``, paired per example. A representation that takes in more of sentence 2
moves further when sentence 2 changes. Each format's move is a share of the way to another input (1 − cos over
the spread of sentence 1's tokens between different inputs in that format: :mod:`analyses.representation_change`);
the comparison is concat − pair, and the ratio concat / pair, per example, at the last layer (every layer as
evidence).

Beside it: sentence 2's content words decoded from sentence 1's mean-pooled words in each format (a bag-of-words
probe, macro AUC, paired on the same items: :mod:`analyses.format_probes`), and the attention from sentence 1's
words to sentence 2's words in each format (the norm-based weights ||α f(x)|| of Kobayashi et al. 2020 where the
caches hold them, else the attention weights: :func:`analyses.paired.run_paired_attention`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..answers import Answer, not_measured
from ..rules import Rule
from ..sections import Context, Job, corpus_text, safe_plot
from ._base import Question
from ._common import REPLACED, derived_pairs, pairs_job

KEY = "Q2"
ASKED = "Without [SEP], will s1 integrate more information from s2?"
TABLE, DECODING, ATTENTION = "q2_interchange", "q2_decoding", "q2_attention"
#: Sentence 2 replaced, in each format: (reference (corpus, format), changed (corpus, format)).
CHANGES = {"pair": (("pairs", "pair"), (REPLACED, "pair")), "concat": (("pairs", "concat"), (REPLACED, "concat"))}
REPRESENTATIONS = {"s1 words": ("pair", "concat"), "s1 inner words": ("pair", "concat"), "mean_s1": ("pair", "concat")}
NAMES = {"s1 words": "sentence 1's words", "s1 inner words": "sentence 1's inner words (not its first or last)",
         "mean_s1": "sentence 1's mean-pooled words"}
#: The representations the decided rows read (the inner words are evidence: they leave out the last word, whose
#: right neighbour is sentence 2 itself in concat).
DECIDED = ("s1 words", "mean_s1")
N_PAIRS = 10000
DECODE_CHOICE, DECODE_TARGET = "mean_s1", "bow_s2"
#: The decoding probe's layers: the last only, the layer its row and evidence read (every layer would cost 7 times
#: the probes for numbers the report does not show).
DECODE_LAYERS = (-1,)

#: ``direction=1``: the asker asks whether sentence 1 takes in *more* of sentence 2 without [SEP], so a
#: significant difference the other way reads "No (the opposite)".
RULES = {
    "interchange": Rule("how far replacing sentence 2 moves sentence 1, concat − pair",
                        "points of the way to another input", 0.05, direction=1,
                        why="5% of the distance between two different inputs, the study's smallest representation "
                            "change that matters"),
    "decoding": Rule("macro AUC of sentence 2's content words read from sentence 1, concat − pair", "AUC points", 0.02,
                     direction=1, why="the study's threshold for a macro AUC"),
    "attention": Rule("attention share from sentence 1's words to sentence 2's words, concat − pair",
                      "points of attention share", 0.02, direction=1,
                      why="the study's threshold for an attention share"),
}
FAMILIES = {"interchange": "Q2: sentence 1's move when sentence 2 is replaced, concat − pair (last layer)",
            "decoding": "Q2: sentence 2's content words from sentence 1, concat − pair (last layer)",
            "attention": "Q2: attention sentence 1 → sentence 2, concat − pair (last layer)"}


def jobs(cfg, corpora: dict) -> list[Job]:
    return [pairs_job("pair"), pairs_job("concat"), Job(REPLACED, "pair"), Job(REPLACED, "concat")]


def interchange_table(ctx: Context) -> pd.DataFrame:
    from analyses.representation_change import run_representation_change

    ctx.log("analyses: Q2 interchange (sentence 2 replaced)")
    get = ctx.caches.get
    changes = {name: (get(*ref), get(*changed)) for name, (ref, changed) in CHANGES.items()}
    return run_representation_change(changes, REPRESENTATIONS, [("concat", "pair")], n_pairs=N_PAIRS,
                                      n_resamples=ctx.cfg.study.bootstrap_resamples, seed=ctx.cfg.study.seed,
                                      out=ctx.out)


def decoding_table(ctx: Context) -> pd.DataFrame:
    from analyses.format_probes import run_format_probes

    ctx.log("analyses: Q2 sentence 2's content words from sentence 1")
    pr = ctx.cfg.probes
    caches = {f: ctx.caches.get("pairs", f) for f in ("pair", "concat")}
    return run_format_probes(caches, DECODE_CHOICE, DECODE_TARGET, layers=list(DECODE_LAYERS), n_splits=pr.folds,
                             seed=ctx.cfg.study.seed, vocab=pr.vocab, Cs=pr.Cs, bow_Cs=pr.bow_Cs,
                             inner_splits=pr.inner_splits, max_iter=pr.max_iter, device=ctx.cfg.study.device,
                             n_resamples=ctx.cfg.study.bootstrap_resamples, out=ctx.out)


def attention_table(ctx: Context) -> pd.DataFrame:
    """Norm-based attention where both caches hold it, else the attention weights (the metric says which)."""
    from analyses.paired import run_paired_attention

    pair, concat = ctx.caches.get("pairs", "pair"), ctx.caches.get("pairs", "concat")
    if not (pair.has_attention and concat.has_attention):
        return pd.DataFrame()
    norm = bool(pair.manifest.get("attention_norm")) and bool(concat.manifest.get("attention_norm"))
    return run_paired_attention(pair, concat, pairs=(("s1 words", "s2 words"),), weighting="norm" if norm else "raw",
                                n_resamples=ctx.cfg.study.bootstrap_resamples, seed=ctx.cfg.study.seed, out=ctx.out)


def analyse(ctx: Context) -> dict[str, pd.DataFrame]:
    return {TABLE: ctx.table(TABLE, interchange_table), DECODING: ctx.table(DECODING, decoding_table),
            ATTENTION: ctx.table(ATTENTION, attention_table)}


def _rep(df: pd.DataFrame) -> pd.Series:
    role = df["role"].fillna("").astype(str)
    return role.where(role != "", df["choice"].fillna("").astype(str))


def _layer(df: pd.DataFrame) -> pd.Series:
    return pd.to_numeric(df["layer"], errors="coerce")


def rows(T: dict) -> pd.DataFrame:
    """Decided rows at the last layer: the interchange (sentence 1's words and mean-pooled words), the decoding
    and the attention, each concat − pair."""
    out = []
    df = T[TABLE]
    last = int(_layer(df).max())
    d = df[(df["metric"] == "share_diff") & (_layer(df) == last)].assign(representation=_rep)
    for rep in DECIDED:
        r = d[d["representation"] == rep]
        if len(r):
            r = r.iloc[0]
            out.append({"measure": "interchange", "family": FAMILIES["interchange"], "layer": last,
                        "representation": rep,
                        "label": f"{NAMES[rep]}: move when sentence 2 is replaced, concat − pair",
                        "value": r["value"], "se": r["se"], "value_a": r["value_a"], "value_b": r["value_b"],
                        "n": r["n"], "n_groups": r["n_groups"], "grouping": r["grouping"],
                        "n_resamples": r["n_resamples"]})
    dec = T.get(DECODING)
    if dec is not None and len(dec):
        r = dec[(dec["metric"] == "macro_auc_diff") & (_layer(dec) == int(_layer(dec).max()))]
        if len(r):
            r = r.iloc[0]
            out.append({"measure": "decoding", "family": FAMILIES["decoding"], "layer": int(r["layer"]),
                        "representation": DECODE_CHOICE, "label": "sentence 2's content words from sentence 1's "
                        "mean-pooled words (macro AUC), concat − pair", "value": r["value"], "se": r["se"],
                        "value_a": r["value_a"], "value_b": r["value_b"], "n": r["n"], "n_groups": r["n_groups"],
                        "grouping": r["grouping"], "n_resamples": r["n_resamples"]})
    att = T.get(ATTENTION)
    if att is not None and len(att):
        r = att[_layer(att) == int(_layer(att).max())]
        if len(r):
            r = r.iloc[0]
            out.append({"measure": "attention", "family": FAMILIES["attention"], "layer": int(r["layer"]),
                        "representation": "s1 words → s2 words",
                        "label": f"{_attention_kind(att)} from sentence 1's words to sentence 2's words, concat − pair",
                        "value": r["value"], "se": r["se"], "value_a": r["value_b"], "value_b": r["value_a"],
                        "n": r["n"], "n_groups": r["n_groups"], "grouping": r["grouping"],
                        "n_resamples": r["n_resamples"]})
    return pd.DataFrame(out)


def _attention_kind(att: pd.DataFrame) -> str:
    return ("norm-based attention" if (att["metric"] == "attention_norm_diff").any() else "attention weight")


def _pct(x: float) -> str:
    x = 100 * float(x)
    return f"{x:.1f}%" if abs(x) >= 1 else f"{x:.2f}%"


def _ratio(T: dict, rep: str) -> pd.Series | None:
    df = T[TABLE]
    last = int(_layer(df).max())
    r = df[(df["metric"] == "share_ratio") & (_layer(df) == last)].assign(representation=_rep)
    r = r[r["representation"] == rep]
    return r.iloc[0] if len(r) else None


def answer(T: dict, decided: pd.DataFrame, cfg) -> Answer:
    d = decided[(decided["measure"] == "interchange") & (decided["representation"] == "s1 words")] \
        if decided is not None and len(decided) else []
    if not len(d):
        return not_measured("the interchange of Q2")
    row = d.iloc[0]
    concat, pair, dec, v = row["value_a"], row["value_b"], row["decision"], float(row["value"])
    ratio = _ratio(T, "s1 words")
    times = (f"{float(ratio['value']):.1f} times as much without [SEP]" if ratio is not None
             and np.isfinite(ratio["value"]) else "")
    if dec == "inconclusive":
        lead = "Cannot tell"
    elif dec == "no_difference":
        lead = "No, not by a difference that matters"
    elif v > 0:
        lead = "Yes" if dec == "yes" else "Slightly"
    else:
        lead = "No, less" if dec == "yes" else "No, slightly less"
    text = (f"{lead}: replacing sentence 2 moves sentence 1's last-layer words {_pct(pair)} (with [SEP]) vs "
            f"{_pct(concat)} (without) of the way to another input" + (f": {times}." if times else "."))
    return Answer(text, row["confidence"])


def _ci(r, digits: str = "pct") -> str:
    if not np.isfinite(r["ci_low"]):
        return _pct(r["value"]) if digits == "pct" else f"{r['value']:.3f}"
    if digits == "pct":
        return f"{_pct(r['value'])} ({_pct(r['ci_low'])} to {_pct(r['ci_high'])})"
    return f"{r['value']:+.3f} ({r['ci_low']:+.3f} to {r['ci_high']:+.3f})"


def evidence(T: dict, decided: pd.DataFrame, cfg) -> str:
    df = T[TABLE]
    last = int(_layer(df).max())
    df = df.assign(representation=_rep)
    share = df[df["metric"] == "share"]
    lines = [f"**How far sentence 1 moves when sentence 2 is replaced, at the last layer (layer {last})**, as a share "
             f"of the way to another input (1 − cos over sentence 1's spread between different inputs in that format; "
             f"95% CI over documents):", "",
             "| representation | with [SEP] (pair) | without (concat) | concat − pair | concat / pair |",
             "|---|---|---|---|---|"]
    for rep in REPRESENTATIONS:
        cell = {}
        for f in ("pair", "concat"):
            r = share[(share["representation"] == rep) & (share["change"] == f) & (_layer(share) == last)]
            cell[f] = _ci(r.iloc[0]) if len(r) else "–"
        diff = df[(df["metric"] == "share_diff") & (df["representation"] == rep) & (_layer(df) == last)]
        ratio = df[(df["metric"] == "share_ratio") & (df["representation"] == rep) & (_layer(df) == last)]
        dcell = (f"{100 * diff['value'].iloc[0]:+.2f} points ({100 * diff['ci_low'].iloc[0]:+.2f} to "
                 f"{100 * diff['ci_high'].iloc[0]:+.2f})" if len(diff) else "–")
        rcell = (f"{ratio['value'].iloc[0]:.2f} ({ratio['ci_low'].iloc[0]:.2f} to {ratio['ci_high'].iloc[0]:.2f})"
                 if len(ratio) else "–")
        lines.append(f"| {NAMES[rep]} | {cell['pair']} | {cell['concat']} | {dcell} | {rcell} |")
    per = share[share["representation"] == "s1 words"].pivot_table(index="layer", columns="change", values="value",
                                                                     sort=True)
    if {"pair", "concat"} <= set(per.columns):
        lines += ["", "**Per layer**, sentence 1's words (% of the way to another input): "
                  + "; ".join(f"layer {int(k)}: {_pct(r['pair'])} vs {_pct(r['concat'])}" for k, r in per.iterrows())
                  + " (pair vs concat)."]
    n = share[(share["change"] == "pair") & (share["representation"] == "s1 words")]
    if len(n):
        lines += ["", f"Measured on {int(n['n'].max())} pairs ({int(n['n_groups'].max())} {n['grouping'].iloc[0]}s) "
                      f"and the same pairs with sentence 2 replaced by a sentence of the same topic from another "
                      f"article; the same sentence 2 replaces it in both formats."]
    dec = T.get(DECODING)
    if dec is not None and len(dec):
        top = int(_layer(dec).max())
        auc = dec[(dec["metric"] == "macro_auc") & (_layer(dec) == top)].set_index("format")
        diff = dec[(dec["metric"] == "macro_auc_diff") & (_layer(dec) == top)]
        if {"pair", "concat"} <= set(auc.index) and len(diff):
            lines += ["", f"**Sentence 2's content words read from sentence 1** (a bag-of-words probe on sentence 1's "
                          f"mean-pooled words, layer {top}, macro AUC; 0.5 = chance): pair "
                          f"{auc.loc['pair', 'value']:.3f}, concat {auc.loc['concat', 'value']:.3f}; concat − pair "
                          f"{_ci(diff.iloc[0], 'num')}. Sentence 1 shares its article's vocabulary, so some of "
                          f"sentence 2's words are readable from it in any format; the difference is what the format "
                          f"adds."]
    att = T.get(ATTENTION)
    if att is not None and len(att):
        a = att.assign(layer=_layer(att)).sort_values("layer")
        lines += ["", f"**{_attention_kind(att).capitalize()} from sentence 1's words to sentence 2's words** (head "
                      f"mean, pair vs concat): " + "; ".join(f"layer {int(r['layer'])}: {r['value_a']:.3f} vs "
                                                             f"{r['value_b']:.3f}" for _, r in a.iterrows()) + "."]
    return "\n".join(lines)


def figures(T: dict, fig_dir, log) -> list:
    from figures.representation_change import plot_change

    return safe_plot(plot_change, T[TABLE], fig_dir / "q2_interchange", representations=list(REPRESENTATIONS),
                     changes=["pair", "concat"], labels={"pair": "with [SEP] (pair)", "concat": "without (concat)"},
                     names=NAMES, what="Q2: how far sentence 1 moves when sentence 2 is replaced", log=log)


def notes(cfg) -> str:
    c = cfg.corpus
    subset = (f"{c.derived_examples} examples (whole documents)" if c.derived_examples is not None
              else "every example")
    return (f"Interchange: {subset} of the pairs ({corpus_text(c.pairs)} sentences) with sentence 2 replaced by a "
            f"sentence of the same topic from an article the pairs do not hold ({c.replacements}); the same "
            f"replacement in both formats. For each token of sentence 1 (paired by key and token id), 1 − cos between "
            f"its state with the original and with the replaced sentence 2, over the spread of sentence 1's tokens "
            f"between different inputs in that format at that layer ({N_PAIRS:,} random pairs, held fixed in the "
            f"bootstrap), averaged per example; concat − pair and concat / pair are paired per example, intervals "
            f"over documents. In concat sentence 1's last word sits next to sentence 2's first word, so part of a "
            f"larger move there is that neighbour; the inner words leave it out. The decoding probe reads the "
            f"{cfg.probes.vocab} most frequent content words of sentence 2 from sentence 1's mean-pooled words with "
            f"{cfg.probes.folds}-fold cross-validation grouped by document, the same folds in both formats. It does "
            f"not show what a model fine-tuned in either format would do, nor which way the information is used.")


QUESTION = Question(
    key=KEY, asked=ASKED, title="Does sentence 1 take in more of sentence 2 without [SEP]?",
    corpora=("pairs", "replacements"), jobs=jobs, analyse=analyse, rules=RULES, rows=rows, answer=answer,
    evidence=evidence, figures=figures, notes=notes, derive=derived_pairs, tables=(TABLE, DECODING, ATTENTION))
