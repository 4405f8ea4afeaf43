"""Q7: can the original sequence be recovered from [CLS]?

The asker expects not. A probe that fails cannot show that (it is a lower bound), so this module asks how much
of a sentence *at least* comes back from its vector, with decoders trained on some documents and scored on
sentences of other documents (:mod:`analyses.recovery`):

* **content words**: the sentence's in-vocabulary content words rebuilt from the vector (R-precision: the
  decoder's top ``c`` words against the ``c`` present), against a decoder that knows only word frequencies;
* **word order**: which of two adjacent words comes first, given the vector and the two words, against the same
  decoder given no vector (word-pair priors);
* **minimal pairs**: the vectors of a sentence and of the same sentence with two adjacent words swapped, shown in
  either order: which is the original (chance 50%); BShift on the same vectors beside it, the task of the
  project's Jawahar et al. (2019) reproduction, to reconcile the two.

Inputs: single sentences (the ``sentences`` corpus, ``[CLS] s [SEP]``), the swapped copy of each (derived here),
the trained model and the same architecture with random weights. [CLS] and mean pooling of the last layer are
decided; every layer is evidence. The old Q7 read bag-of-words and a BShift probe from pairs and answered "No" from a
probe near chance; neither is kept.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pandas as pd

from ..answers import Answer
from ..rules import Rule, weakest
from ..sections import Context, Job, corpus_text, safe_plot
from ._base import Question

KEY = "Q7"
ASKED = "Can the original sequence be recovered from [CLS]? I think not."
CORPUS, SWAPPED, FORMAT = "sentences", "sentences_swapped", "single"
TABLE = "q7_recovery"
CHOICES = ("cls", "mean")
NAMES = {"cls": "[CLS]", "mean": "mean pooling"}

POINTS = "points"
RULES = {
    "content": Rule("content words recovered (R-precision), decoder − word frequency alone", "points of R-precision",
                    0.02, direction=1,
                    why="2 points of a sentence's content words: the probe-accuracy threshold, on the same 0-1 scale"),
    "order": Rule("adjacent word order, decoder given the vector − given the words alone", "accuracy points", 0.02,
                  direction=1, why="2 points: the probe-accuracy threshold"),
    "minimal": Rule("minimal pairs: original told from its two-words-swapped copy, accuracy − chance (50%)",
                    "accuracy points", 0.02, direction=1, why="2 points: the probe-accuracy threshold"),
    "training": Rule("content words recovered, trained − random weights", "points of R-precision", 0.02,
                     why="the same threshold as the content words"),
}
FAMILIES = {"content": "Q7: content words, decoder − frequency (last layer)",
            "order": "Q7: word order, vector − words alone (last layer)",
            "minimal": "Q7: minimal pairs − chance (last layer)",
            "training": "Q7: content words, trained − random weights (last layer)"}


# ---------------------------------------------------------------------------------------------------
# Corpora, caches, analyses


def swapped_copy(examples: list, seed: int = 0) -> list:
    """Each example whose sentence has two adjacent different words, with one such pair swapped
    (:func:`probing.corpus_pairs.swap_adjacent_words`, every eligible example); the same ids, so each is paired
    with its original. Examples with no such pair (one word) are left out."""
    from probing.corpus_pairs import swap_adjacent_words

    def eligible(text: str) -> bool:
        words = text.split()  # the whitespace words swap_adjacent_words swaps
        return any(a != b for a, b in pairwise(words))

    keep = [e for e in examples if eligible(e.sentences[0])]
    return swap_adjacent_words(keep, sentence=1, fraction=1.0, seed=seed) if keep else []


def derive(cfg, corpora: dict) -> dict:
    return {SWAPPED: swapped_copy(corpora[CORPUS], cfg.study.seed)}


def jobs(cfg, corpora: dict) -> list[Job]:
    out = [Job(CORPUS, FORMAT), Job(SWAPPED, FORMAT)]
    if cfg.model.random_init_baseline:
        out += [Job(CORPUS, FORMAT, random=True), Job(SWAPPED, FORMAT, random=True)]
    return out


def recovery_table(ctx: Context) -> pd.DataFrame:
    """:func:`analyses.recovery.run_recovery` of the sentences, their swapped copies and the random-init model."""
    from analyses.recovery import run_recovery

    ctx.log("analyses: Q7 recovery decoders")
    caches = ctx.caches
    rnd = caches.has(CORPUS, FORMAT, True) and caches.has(SWAPPED, FORMAT, True)
    embeddings = ctx.lm.model.get_input_embeddings().weight.detach().float().cpu().numpy()
    rc = ctx.cfg.recovery
    return run_recovery(caches.get(CORPUS, FORMAT), embeddings=embeddings, swapped=caches.get(SWAPPED, FORMAT),
                        random_cache=caches.get(CORPUS, FORMAT, True) if rnd else None,
                        random_swapped=caches.get(SWAPPED, FORMAT, True) if rnd else None, choices=CHOICES,
                        vocab=rc.vocab, pairs_per_sentence=rc.pairs_per_sentence, folds=ctx.cfg.probes.folds,
                        inner_splits=ctx.cfg.probes.inner_splits, n_resamples=ctx.cfg.study.bootstrap_resamples,
                        seed=ctx.cfg.study.seed, out=ctx.out, progress=ctx.progress)


def analyse(ctx: Context) -> dict[str, pd.DataFrame]:
    return {TABLE: ctx.table(TABLE, recovery_table)}


# ---------------------------------------------------------------------------------------------------
# Rows, answer, evidence


def _num(s) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def last_layer(df: pd.DataFrame) -> int:
    return int(_num(df["layer"]).max())


def _sel(df: pd.DataFrame, **where) -> pd.DataFrame:
    m = pd.Series(True, index=df.index)
    for col, val in where.items():
        m &= _num(df[col]).eq(val) if col == "layer" else df[col].fillna("").astype(str).eq(val)
    return df[m]


def _one(df: pd.DataFrame, **where):
    d = _sel(df, **where)
    return d.iloc[0] if len(d) else None


#: measure -> (target, model_kind, versus, label template) of the table's difference rows decided at the last layer.
_ROWS = {"content": ("content_words", "trained", "frequency", "{name}: content words, decoder − word frequency"),
         "order": ("word_order", "trained", "words_only", "{name}: word order, with the vector − words alone"),
         "minimal": ("minimal_pairs", "trained", "chance", "{name}: minimal pairs, accuracy − chance"),
         "training": ("content_words", "trained", "random_init", "{name}: content words, trained − random weights")}


def rows(T: dict) -> pd.DataFrame:
    """The decided comparisons at the last layer, per pooling ([CLS], mean): content words against frequency, word
    order against the words alone, minimal pairs against chance, content words trained against random weights."""
    df = T[TABLE]
    layer = last_layer(df)
    diff = df[df["metric"] == "difference"]
    out = []
    for measure, (target, kind, versus, label) in _ROWS.items():
        for ch in CHOICES:
            r = _one(diff, target=target, model_kind=kind, versus=versus, choice=ch, layer=layer)
            if r is None:
                continue
            out.append({"measure": measure, "family": FAMILIES[measure], "layer": layer, "pooling": ch,
                        "label": label.format(name=NAMES[ch]), "value": r["value"], "se": r["se"],
                        "value_a": r["value_a"], "value_b": r["value_b"], "n": r["n"], "n_groups": r["n_groups"],
                        "grouping": r["grouping"], "n_resamples": r["n_resamples"]})
    out = pd.DataFrame(out)
    if len(out):
        out["layer"] = pd.array(out["layer"], dtype="Int64")
    return out


def _pct(x) -> str:
    return f"{100 * float(x):.0f}%"


def _row(decided: pd.DataFrame, measure: str, pooling: str):
    if decided is None or not len(decided) or "measure" not in decided:
        return None
    d = decided[(decided["measure"] == measure) & (decided["pooling"] == pooling)]
    return d.iloc[0] if len(d) else None




def _found(r) -> bool:
    return r is not None and r["decision"] in ("yes", "yes_small") and float(r["value"]) > 0


def answer(T: dict, decided: pd.DataFrame, cfg) -> Answer:
    content, mean = _row(decided, "content", "cls"), _row(decided, "content", "mean")
    if content is None:
        from ..answers import not_measured

        return not_measured("the recovery decoders of Q7")
    lead = "Partly, at least" if _found(content) else "This decoder could not show it, which does not mean no"
    text = (f"{lead}: a decoder reads back at least {_pct(content['value_a'])} of a sentence's content words from "
            f"the last-layer [CLS] (word frequency alone: {_pct(content['value_b'])}")
    text += f"; mean pooling: {_pct(mean['value_a'])})" if mean is not None else ")"
    conf = [content["confidence"]]
    minimal = _row(decided, "minimal", "cls")
    if minimal is not None:
        acc = _pct(minimal["value_a"])
        if _found(minimal):
            text += f", and tells a sentence from its two-words-swapped copy {acc} of the time (chance 50%)."
        else:
            text += (f"; telling a sentence from its two-words-swapped copy it scores {acc} (chance 50%), "
                     f"so word order was not shown.")
        conf.append(minimal["confidence"])
    else:
        text += "."
    return Answer(text, weakest(conf))


def _ci(r) -> str:
    if r is None or not np.isfinite(r["value"]):
        return "–"
    return f"{r['value']:.3f} ({r['ci_low']:.3f} to {r['ci_high']:.3f})"


def _by_layer(df: pd.DataFrame, target: str, metric: str, kind: str, versus: str = "") -> pd.DataFrame:
    d = _sel(df, target=target, metric=metric, model_kind=kind, versus=versus)
    d = d.assign(layer=_num(d["layer"])).dropna(subset=["layer"])
    return d.pivot_table(index="layer", columns="choice", values="value", aggfunc="first")


def evidence(T: dict, decided: pd.DataFrame, cfg) -> str:
    df = T[TABLE]
    layer = last_layer(df)
    meta = {m: _one(df, target="content_words", metric=m) for m in
            ("vocabulary_size", "sentences_with_vocabulary", "vocabulary_words_per_sentence")}
    freq = _one(df, target="content_words", metric="r_precision", decoder="frequency")
    words_only = _one(df, target="word_order", metric="pair_order_accuracy", decoder="words_only")
    intro = (f"**What comes back at the last layer (layer {layer})**, cross-fitted over documents (mean, 95% CI over "
             f"documents). Content words: R-precision over the {int(meta['vocabulary_size']['value'])} most frequent "
             f"content words ({_pct(meta['sentences_with_vocabulary']['value'])} of the sentences hold at least one, "
             f"{meta['vocabulary_words_per_sentence']['value']:.1f} on average); word order: accuracy over adjacent "
             f"word pairs; minimal pairs and BShift: accuracy (chance 0.5).")
    head = "| measure | baseline | [CLS] trained | mean trained | [CLS] random weights | mean random weights |"
    lines = [intro, "", head, "|---|---|---|---|---|---|"]
    spec = [("content words (R-precision)", "content_words", "r_precision", f"frequency {_ci(freq)}"),
            ("word order (pair accuracy)", "word_order", "pair_order_accuracy", f"words alone {_ci(words_only)}"),
            ("minimal pairs (accuracy)", "minimal_pairs", "accuracy", "chance 0.500"),
            ("BShift (accuracy)", "bshift", "accuracy", "chance 0.500")]
    for name, target, metric, base in spec:
        cells = [_ci(_one(df, target=target, metric=metric, model_kind=kind, choice=ch, layer=layer))
                 for kind in ("trained", "random_init") for ch in CHOICES]
        lines.append(f"| {name} | {base} | " + " | ".join(cells) + " |")
    lines += ["", _readings(decided)]
    header = ("| layer | content [CLS] | content mean | minimal pairs [CLS] | minimal pairs mean | BShift [CLS] |")
    lines += ["", ("**Every layer** (trained model; layer 0 is the input embeddings, where [CLS] is the same "
                   "vector for every sentence):"), "", header, "|---|---|---|---|---|---|"]
    tabs = [_by_layer(df, t, m, "trained") for t, m in (("content_words", "r_precision"),
                                                          ("minimal_pairs", "accuracy"), ("bshift", "accuracy"))]
    cols = [(0, "cls"), (0, "mean"), (1, "cls"), (1, "mean"), (2, "cls")]
    for lay in sorted(tabs[0].index):
        cells = [f"{tabs[i].loc[lay, ch]:.3f}" if lay in tabs[i].index and ch in tabs[i].columns else "–"
                 for i, ch in cols]
        lines.append(f"| {int(lay)} | " + " | ".join(cells) + " |")
    best = tabs[0]["cls"].idxmax() if "cls" in tabs[0] and len(tabs[0]) else None
    if best is not None:
        lines += ["", (f"The best layer for content words from [CLS] is {int(best)} ({tabs[0].loc[best, 'cls']:.3f}; "
                       f"last layer {tabs[0].loc[layer, 'cls']:.3f}).")]
    lines += ["", _reconcile(df, layer, tabs[1], tabs[2])]
    return "\n".join(lines)


def _readings(decided: pd.DataFrame) -> str:
    """The decided rows besides the answer's, in words: word order beyond the words, and what training adds."""
    out = []
    order = _row(decided, "order", "cls")
    if order is not None:
        shown = _found(order)
        out.append(f"Word order of adjacent pairs from [CLS]: {order['value_a']:.3f} with the vector against "
                   f"{order['value_b']:.3f} from the two words alone (word-pair priors), "
                   + ("so the vector adds to what the words tell." if shown else
                      "so this decoder found nothing beyond the words; a pair decoder is weaker than the minimal "
                      "pairs, which compare two whole vectors of the same sentence."))
    training = _row(decided, "training", "cls")
    if training is not None:
        more = "more" if float(training["value"]) > 0 else "fewer"
        out.append(f"The trained [CLS] gives back {more} content words than the same architecture with random "
                   f"weights ({training['value_a']:.3f} against {training['value_b']:.3f}; difference "
                   f"{training['value']:+.3f}, simultaneous CI {training['ci_low']:+.3f} to "
                   f"{training['ci_high']:+.3f}): "
                   f"random encoders keep much of their input (Wieting & Kiela 2019), and "
                   f"training to compare sentences need not keep every word.")
    return " ".join(out)


#: The Jawahar et al. (2019) reproduction's BShift from [CLS] on all-MiniLM-L6-v2
#: (docs/reproductions/jawahar2019_probing, its table of [CLS] probe scores per layer): the best layer and its accuracy.
JAWAHAR_BSHIFT = (3, 0.568)


def _reconcile(df: pd.DataFrame, layer: int, minimal: pd.DataFrame, bshift: pd.DataFrame) -> str:
    """How the minimal pairs relate to the Jawahar et al. (2019) reproduction's BShift, from the numbers."""
    if "cls" not in minimal or "cls" not in bshift or not len(minimal) or not len(bshift):
        return ""
    bl, ml = int(bshift["cls"].idxmax()), int(minimal["cls"].idxmax())
    b_best = _one(df, target="bshift", metric="accuracy", model_kind="trained", choice="cls", layer=bl)
    m_best = _one(df, target="minimal_pairs", metric="accuracy", model_kind="trained", choice="cls", layer=ml)
    b_above, m_above = b_best["ci_low"] > 0.5, m_best["ci_low"] > 0.5
    if b_above and m_above:
        verdict = "Both find word order in [CLS], as the reproduction did: they agree."
    elif m_above:
        verdict = ("Here BShift's interval reaches chance while the minimal pairs' does not: the two tasks differ, not "
                   "the vectors.")
    else:
        verdict = "Neither shows word order clearly on these sentences; both are lower bounds."
    jl, jv = JAWAHAR_BSHIFT
    return (f"**Against the Jawahar et al. (2019) reproduction** (docs/reproductions/jawahar2019_probing: on "
            f"all-MiniLM-L6-v2, BShift from [CLS] peaks at {jv:.3f}, layer {jl}, on 2000 BBC sentences). Asked its "
            f"way here (one vector, swapped for half of the sentences or not), [CLS] scores {_ci(b_best)} at its best "
            f"layer "
            f"({bl}) and {bshift.loc[layer, 'cls']:.3f} at the last; the minimal pairs {_ci(m_best)} at layer {ml} "
            f"and {minimal.loc[layer, 'cls']:.3f} at the last. {verdict} Minimal pairs score higher because they "
            f"show both orders of the same sentence: the decoder needs only the direction in which a swap moves the "
            f"vector, while BShift must tell from one vector, among sentences of every content, whether it reads "
            f"well. The old Q7 answered from a BShift probe at the last layer, where BShift is weakest.")


def figures(T: dict, fig_dir, log) -> list:
    return safe_plot(plot_recovery, T[TABLE], fig_dir, log=log)


def plot_recovery(df: pd.DataFrame, fig_dir) -> list:
    """Per layer: content words (R-precision) and minimal pairs (accuracy) for [CLS] and mean pooling, trained
    (lines with 95% bands) and random weights (markers: the last layer for content words, every layer for minimal
    pairs), with their baselines (word frequency alone, chance)."""
    import matplotlib.pyplot as plt

    from figures.common import ci_band, data_color, legend_right
    from figures.style import layer_axis, new_figure, save

    fig, axes = new_figure(ncols=2, width=10.5, height=3.8)
    axes = axes[0]
    for ax, (target, metric, title) in zip(axes, (("content_words", "r_precision", "content words (R-precision)"),
                                                  ("minimal_pairs", "accuracy", "minimal pairs (accuracy)"))):
        for i, ch in enumerate(CHOICES):
            d = _sel(df, target=target, metric=metric, model_kind="trained", choice=ch)
            d = d.assign(layer=_num(d["layer"])).sort_values("layer")
            ax.plot(d["layer"], d["value"], marker="o", color=data_color(i), label=f"{NAMES[ch]}, trained")
            ci_band(ax, d["layer"].to_numpy(), d["ci_low"], d["ci_high"], data_color(i))
            r = _sel(df, target=target, metric=metric, model_kind="random_init", choice=ch)
            if len(r):
                ax.plot(_num(r["layer"]), r["value"], marker="x", linestyle="none", markersize=9, color=data_color(i),
                        label=f"{NAMES[ch]}, random weights")
        base = _one(df, target="content_words", metric="r_precision", decoder="frequency")
        if target == "content_words" and base is not None:
            ax.axhline(base["value"], color="0.4", linestyle="--", label="word frequency alone")
        if target == "minimal_pairs":
            ax.axhline(0.5, color="0.4", linestyle=":", label="chance")
        ax.set_title(title, fontsize=10)
        layer_axis(ax, _num(df["layer"]).dropna())
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_right(axes[-1], list(handles.values()), list(handles))
    try:
        return save(fig, fig_dir / "q7_recovery")
    finally:
        plt.close(fig)


def notes(cfg) -> str:
    rc = cfg.recovery
    rnd = "and the same architecture with random weights (seed {cfg.model.random_init_seed})" \
        if cfg.model.random_init_baseline else "(no random-weights baseline in this run)"
    return (f"Single sentences `[CLS] s [SEP]` of the `{CORPUS}` corpus ({corpus_text(cfg.corpus.sentences)}: "
            f"`{cfg.corpus.sentences}`) and a copy of each with two adjacent different words swapped, encoded by "
            f"{cfg.model.name} {rnd.format(cfg=cfg)}. Every decoder is trained on the sentences of some documents and "
            f"scored on those of others ({cfg.probes.folds} outer folds grouped by document; its L2 strength chosen by "
            f"{cfg.probes.inner_splits} grouped inner folds); intervals bootstrap documents "
            f"({cfg.study.bootstrap_resamples} resamples). Content words: a ridge decoder from the vector to the "
            f"{rc.vocab} most frequent content words, scored per sentence by R-precision. Word order: up to "
            f"{rc.pairs_per_sentence} adjacent word pairs per sentence, a bilinear antisymmetric decoder on the two "
            f"words' input embeddings with and without the vector. Minimal pairs: a linear decoder on the difference "
            f"of the two vectors. **What it does not show**: a decoder is a lower bound, so what it misses may still "
            f"be in the vector for a better decoder, and \"not shown\" is never \"no\"; recovering words and the order "
            f"of adjacent pairs is not rebuilding the whole sentence verbatim; and these are single sentences, not the "
            f"[CLS] of a pair.")


QUESTION = Question(
    key=KEY, asked=ASKED, title="Reading a sentence back from [CLS]", corpora=(CORPUS,), derive=derive, jobs=jobs,
    analyse=analyse, rules=RULES, rows=rows, answer=answer, evidence=evidence, figures=figures, notes=notes,
    tables=(TABLE,), about_cls=True)
