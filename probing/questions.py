"""The seed questions Q1-Q8 declared as data: one :class:`probing.sections.StudySection` each, in
:data:`QUESTION_SECTIONS`.

Each question names the corpora and caches it needs, its analyses (tables shared between questions
are computed once, through :meth:`probing.sections.Context.table`), its figures, its report table, its
evidence sentence, the comparison rows its verdict is computed from and the claim they test.

PROVISIONAL comparison rows: until the analyses write paired comparison rows (paired drift
differences, probe differences on the same out-of-fold predictions, with Holm-adjusted p-values and
the minimum detectable effect), each ``_qN_rows`` derives its rows from two marginal intervals of the
existing tables with :func:`probing.verdicts.difference_rows` (independent-estimates SE: a
conservative test for positively correlated paired items). Replacing a ``_qN_rows`` body with a
selection of the paired rows is the whole change; the verdict machinery reads the same columns.
Comparisons involving [CLS] leave out layer 0 (the embedding layer: [CLS] is one vector for every
input there).

Wiring a paired table in, e.g. Q2 once the drift analysis writes ``drift_diff`` rows (value, ci_low,
ci_high, p_value, p_holm, n, n_groups, grouping, layer): add its producer to :data:`PRODUCERS`, name
it in Q2's tables, and let ``_q2_rows`` return ``pick(T.get("drift_diff"), ...)`` with one row per
layer. The rows' own ``p_holm`` and ``mde`` are then used as they are; the report's introduction reads
the ``grouping`` column to say how the CIs were computed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .report import fmt, last_layer, one, pick
from .sections import Context, Job, StudySection, Tables, corpus_text, group_prefixes, safe_plot
from .verdicts import Claim, difference_rows

#: Pair formats extracted with attention summaries (whichever section asks, so caches are shared).
ATTENTION_FORMATS = ("pair", "concat")
PAIR_FORMATS = ("pair", "concat", "concat_segments", "single", "single2", "cls_last", "cls_mid")
#: The probes of the pair format, per question: (token choices, targets).
PAIR_PROBES = {
    "Q8": (("cls", "mean", "max", "sep1", "first_word", "pos3"), ("topic",)),
    "Q4": (("sep1", "sep2", "cls", "mean_s1", "mean_s2"), ("is_next", "bow_s1", "bow_s2")),
    "Q7": (("cls", "mean"), ("bow_s1", "length")),
}
#: Formats of the pairs corpus each question reads.
PAIR_NEEDS = {"Q1": ("pair", "concat", "concat_segments"), "Q2": ("pair", "concat", "single", "single2"),
              "Q4": ("pair", "concat"), "Q6": ("pair", "cls_mid", "cls_last"), "Q7": ("pair",), "Q8": ("pair",)}


# ---------------------------------------------------------------------------------------------------
# Caches


def _pair_jobs(q: str):
    def jobs(cfg: dict, corpora: dict) -> list[Job]:
        out = [Job("pairs", f, attention=f in ATTENTION_FORMATS) for f in PAIR_FORMATS if f in PAIR_NEEDS.get(q, ())]
        if q in PAIR_PROBES and cfg["model"]["random_init_baseline"]:
            out.append(Job("pairs", "pair", random=True))
        if q == "Q7":
            out.append(Job("swap", "pair"))
            if cfg["model"]["random_init_baseline"]:
                out.append(Job("swap", "pair", random=True))
        return out

    return jobs


def _q3_jobs(cfg: dict, corpora: dict) -> list[Job]:
    return [Job(c, f) for c in group_prefixes(corpora).values() for f in ("multi", "concat")]


def _q5_jobs(cfg: dict, corpora: dict) -> list[Job]:
    return [Job(group_prefixes(corpora)[max(group_prefixes(corpora))], "multi")]


# ---------------------------------------------------------------------------------------------------
# Tables (each computed once per study, whichever question asks first)


def _rs(ctx: Context) -> dict:
    return dict(n_resamples=ctx.cfg["study"]["bootstrap_resamples"], seed=ctx.cfg["study"]["seed"], out=ctx.out)


def probe_kw(cfg: dict, out: Path) -> dict:
    """The probe runner's options from the config's ``[probes]`` table."""
    pr = cfg["probes"]
    return dict(n_splits=pr["folds"], seed=cfg["study"]["seed"], vocab=pr["vocab"], device=pr["device"], Cs=pr["Cs"],
                inner_splits=pr["inner_splits"], max_iter=pr["max_iter"], bow_Cs=pr["bow_Cs"], out=out)


def _pairs(ctx: Context, fmt_: str, random: bool = False):
    return ctx.caches.get("pairs", fmt_, random) if ctx.caches.has("pairs", fmt_, random) else None


def _drift_q1(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    ctx.log("analyses: drift and CKA across formats")
    pair, concat, seg = _pairs(ctx, "pair"), _pairs(ctx, "concat"), _pairs(ctx, "concat_segments")
    return pd.concat([run_drift(pair, concat, **_rs(ctx)), run_drift(pair, seg, **_rs(ctx)),
                      run_drift(seg, concat, **_rs(ctx))], ignore_index=True)


def _cka_q1(ctx: Context) -> pd.DataFrame:
    from analyses.similarity import run_cka_formats

    return run_cka_formats(_pairs(ctx, "pair"), _pairs(ctx, "concat"), ["cls", "mean_s1", "mean_s2", "sep_last"],
                           out=ctx.out)


def _drift_q2(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    pair, concat = _pairs(ctx, "pair"), _pairs(ctx, "concat")
    return pd.concat([run_drift(_pairs(ctx, s), b, words_only=True, **_rs(ctx))
                      for s in ("single", "single2") for b in (pair, concat)], ignore_index=True)


def _attention(ctx: Context) -> pd.DataFrame:
    from analyses.attention import run_attention

    ctx.log("analyses: attention")
    return pd.concat([run_attention(_pairs(ctx, f), **_rs(ctx)) for f in ATTENTION_FORMATS], ignore_index=True)


def _drift_q3(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    ctx.log("analyses: k segments")
    frames = []
    for k, c in group_prefixes(ctx.corpora).items():
        d = run_drift(ctx.caches.get(c, "multi"), ctx.caches.get(c, "concat"), **_rs(ctx))
        d["k"] = k
        frames.append(d)
    return pd.concat(frames, ignore_index=True)


def _probes_pair(ctx: Context) -> pd.DataFrame:
    """The pair-format probes of every selected question among Q4, Q7, Q8 (one table: Q4's table and
    Q7's evidence read each other's rows)."""
    from analyses.probe_runner import run_probes

    ctx.log("analyses: probes on the pair format (trained and random-init)")
    wanted = [q for q in PAIR_PROBES if q in ctx.questions]
    frames = [run_probes(_pairs(ctx, "pair"), *PAIR_PROBES[q], random_cache=_pairs(ctx, "pair", True),
                         **probe_kw(ctx.cfg, ctx.out)) for q in wanted]
    keys = ["model_kind", "layer", "role", "target", "metric"]
    return pd.concat(frames, ignore_index=True).drop_duplicates(keys)


def _cka_q4(ctx: Context) -> pd.DataFrame:
    from analyses.similarity import run_cka_roles

    return run_cka_roles(_pairs(ctx, "pair"), [("sep1", "cls"), ("sep1", "mean_s1"), ("sep1", "mean_s2"),
                                               ("sep2", "cls")], out=ctx.out)


def _probes_q5(ctx: Context) -> pd.DataFrame:
    from analyses.probe_runner import run_probes

    ctx.log("analyses: [CLS] content of sentence i")
    K = max(group_prefixes(ctx.corpora))
    multi = ctx.caches.get(f"groups_k{K}", "multi")
    return run_probes(multi, ("cls", "mean"), [f"bow_s{i}" for i in range(1, K + 1)], **probe_kw(ctx.cfg, ctx.out))


def _probes_q6(ctx: Context) -> pd.DataFrame:
    from analyses.probe_runner import run_probes

    ctx.log("analyses: classification token position")
    return pd.concat([run_probes(_pairs(ctx, f), ("cls",), ("topic", "is_next"), **probe_kw(ctx.cfg, ctx.out))
                      for f in ("pair", "cls_mid", "cls_last")], ignore_index=True)


def _probes_q7(ctx: Context) -> pd.DataFrame:
    from analyses.probe_runner import run_probes

    ctx.log("analyses: word order")
    sw = ctx.caches.get("swap", "pair")
    swr = ctx.caches.get("swap", "pair", True) if ctx.caches.has("swap", "pair", True) else None
    return run_probes(sw, ("cls", "mean"), ("swapped",), random_cache=swr, **probe_kw(ctx.cfg, ctx.out))


def _finetune(ctx: Context) -> pd.DataFrame:
    from analyses.pooling import run_pooling_experiment

    ctx.log("analyses: fine-tuning with each pooling")
    ft = ctx.cfg["finetune"]
    return run_pooling_experiment(ctx.corpora["pairs"], ft["label"], ft["poolings"], ft["seeds"], model=ctx.lm,
                                  preset=ft["preset"], out=str(ctx.out), corpus_name=ctx.cfg["corpus"]["pairs"])


#: Every table a question can ask for, and the function that computes it.
PRODUCERS = {"drift_q1": _drift_q1, "cka_q1": _cka_q1, "drift_q2": _drift_q2, "attention": _attention,
             "drift_q3": _drift_q3, "probes_pair": _probes_pair, "cka_q4": _cka_q4, "probes_q5": _probes_q5,
             "probes_q6": _probes_q6, "probes_q7": _probes_q7, "finetune": _finetune}


def _tables(*names: str):
    """``analyse`` of a question that needs the shared tables ``names``."""
    def analyse(ctx: Context) -> Tables:
        return {n: ctx.table(n, PRODUCERS[n]) for n in names}

    return analyse


# ---------------------------------------------------------------------------------------------------
# Figures


def _fig_q1(T, fig, log):
    from figures.cka import plot_cka_layers
    from figures.drift import plot_drift

    out = []
    if "drift_q1" in T:
        d = T["drift_q1"]
        out += safe_plot(plot_drift, d[(d["format"] == "pair") & (d["format_b"] == "concat")],
                         fig / "q1_drift_pair_concat", log=log)
        out += safe_plot(plot_drift, d[(d["format"] != "pair") | (d["format_b"] != "concat")],
                         fig / "q1_drift_sep_vs_segments", roles=["cls", "s1 words", "s2 words"], log=log)
    if "cka_q1" in T:
        out += safe_plot(plot_cka_layers, T["cka_q1"], fig / "q1_cka_pair_concat", log=log)
    return out


def _fig_q2(T, fig, log):
    from figures.attention import plot_attention
    from figures.drift import plot_drift

    out = []
    if "drift_q2" in T:
        out += safe_plot(plot_drift, T["drift_q2"], fig / "q2_context_drift", roles=["s1 words", "s2 words"],
                         overlay=True, log=log)
    if "attention" in T:
        out += safe_plot(plot_attention, T["attention"], fig / "q2_attention_pair", format="pair", log=log)
    return out


def _fig_q3(T, fig, log):
    from figures.drift import plot_drift_by_k

    return safe_plot(plot_drift_by_k, T["drift_q3"], fig / "q3_drift_by_k", log=log) if "drift_q3" in T else []


_Q4_ROLES = ["sep1", "sep2", "cls", "mean_s1", "mean_s2"]


def _fig_q4(T, fig, log):
    from figures.attention import plot_attention
    from figures.cka import plot_cka_layers
    from figures.probes import plot_probes

    out = []
    if "attention" in T:
        out += safe_plot(plot_attention, T["attention"], fig / "q4_attention_concat", format="concat", log=log)
    if "probes_pair" in T:
        p = T["probes_pair"]
        out += safe_plot(plot_probes, p, fig / "q4_probes_is_next", target="is_next", roles=_Q4_ROLES, log=log)
        out += safe_plot(plot_probes, p, fig / "q4_probes_bow_s2", target="bow_s2", metric="micro_f1",
                         roles=_Q4_ROLES, log=log)
    if "cka_q4" in T:
        out += safe_plot(plot_cka_layers, T["cka_q4"], fig / "q4_cka_sep", log=log)
    return out


def _fig_q5(T, fig, log):
    from figures.probes import plot_probe_position

    if "probes_q5" not in T:
        return []
    return safe_plot(plot_probe_position, T["probes_q5"], fig / "q5_cls_content_by_position", metric="micro_f1",
                     choice=["cls", "mean"], layer="last", log=log)


def _fig_q6(T, fig, log):
    from figures.probes import plot_probes

    if "probes_q6" not in T:
        return []
    p = T["probes_q6"].copy()
    p["role"] = p["format"].map({"pair": "cls first", "cls_mid": "cls middle", "cls_last": "cls last"})
    p["format"] = "pair / cls_mid / cls_last"
    return (safe_plot(plot_probes, p, fig / "q6_cls_position_topic", target="topic", log=log)
            + safe_plot(plot_probes, p, fig / "q6_cls_position_is_next", target="is_next", log=log))


def _fig_q7(T, fig, log):
    from figures.probes import plot_probes

    out = []
    if "probes_pair" in T:
        p = T["probes_pair"]
        out += safe_plot(plot_probes, p, fig / "q7_probes_bow_s1", target="bow_s1", metric="micro_f1",
                         roles=["cls", "mean"], log=log)
        out += safe_plot(plot_probes, p, fig / "q7_probes_length", target="length", roles=["cls", "mean"], log=log)
    if "probes_q7" in T:
        out += safe_plot(plot_probes, T["probes_q7"], fig / "q7_probes_word_order", target="swapped", log=log)
    return out


def _fig_q8(T, fig, log):
    from figures.pooling import plot_pooling
    from figures.probes import plot_probes

    out = []
    if "probes_pair" in T:
        out += safe_plot(plot_probes, T["probes_pair"], fig / "q8_probes_topic", target="topic",
                         roles=["cls", "mean", "max", "sep1", "first_word", "pos3"], log=log)
    if "finetune" in T:
        frozen = T.get("probes_pair")
        frozen = frozen[frozen["model_kind"] == "trained"] if frozen is not None else None
        out += safe_plot(plot_pooling, T["finetune"], fig / "q8_pooling", frozen_df=frozen, log=log)
    return out


# ---------------------------------------------------------------------------------------------------
# Report tables


def _at_last_layer(d: pd.DataFrame, index, columns: str, caption: str):
    """``d``'s values at its last layer, ``index`` × ``columns``; ``{L}`` in the caption is the layer."""
    L = last_layer(d)
    t = d[d["layer"] == L].pivot_table(index=index, columns=columns, values="value", sort=False)
    return t.reset_index(), caption.format(L=L)


def _by_layer(d: pd.DataFrame, columns: list[str], caption: str, sep: str = " / "):
    """``d``'s values, one row per layer, one column per combination of ``columns``."""
    t = d.pivot_table(index="layer", columns=columns, values="value", aggfunc="first", sort=False)
    t.columns = [sep.join(map(str, c)) for c in t.columns]
    return t.reset_index(), caption


def _table_q1(T):
    if "drift_q1" not in T:
        return None
    return _at_last_layer(pick(T["drift_q1"], metric="drift_mean"), ["format", "format_b"], "role",
                          "1 − cos (mean) at layer {L}, per role group")


def _table_q2(T):
    if "drift_q2" not in T:
        return None
    return _by_layer(pick(T["drift_q2"], metric="drift_mean"), ["format", "format_b"],
                     "1 − cos (mean) of the words of the single sentence (role 'all')", sep="→")


def _table_q3(T):
    if "drift_q3" not in T:
        return None
    return _at_last_layer(pick(T["drift_q3"], metric="drift_mean"), "k", "role",
                          "1 − cos (mean) between multi and concat at layer {L}, by k")


def _table_q4(T):
    if "probes_pair" not in T:
        return None
    p = pick(T["probes_pair"], model_kind="trained")
    return _at_last_layer(p[p["metric"].isin(["accuracy", "micro_f1"])], "role", "target",
                          "probe scores at layer {L} (accuracy; micro-F1 for bow_*; trained model)")


def _table_q5(T):
    if "probes_q5" not in T:
        return None
    return _at_last_layer(pick(T["probes_q5"], metric="micro_f1"), "role", "target",
                          "bag-of-words micro-F1 per sentence position at layer {L}")


def _table_q6(T):
    if "probes_q6" not in T:
        return None
    return _by_layer(pick(T["probes_q6"], metric="accuracy"), ["target", "format"],
                     "probe accuracy of the classification token by layer and position")


def _table_q7(T):
    if "probes_q7" not in T:
        return None
    return _by_layer(pick(T["probes_q7"], metric="accuracy"), ["model_kind", "role"],
                     "word-order (swapped) probe accuracy by layer")


def _table_q8(T):
    if "finetune" not in T:
        return None
    f = pick(T["finetune"], metric="test_accuracy")
    t = f.pivot_table(index="role", columns="seed", values="value", sort=False)
    t.columns = [f"seed {int(c)}" for c in t.columns]
    t["mean"] = t.mean(axis=1)
    t["sd"] = t.drop(columns="mean").std(axis=1, ddof=1)
    return t.reset_index().rename(columns={"role": "pooling"}), "fine-tuned test accuracy per pooling and seed"


# ---------------------------------------------------------------------------------------------------
# Evidence: the numbers behind each verdict, read from the tables


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
        s += f"[CLS] moves most at layer {int(worst['layer'])} (1 − cos = {fmt(float(worst['value']))}). "
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
        m = pick(a, role="s1 words", target="s2 words", head="mean")
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
        parts.append(f"k={k}: [CLS] {fmt(v)}, all tokens {fmt(w)}")
    return (f"`multi` ([SEP] after each of k sentences) against `concat` at layer {L}, 1 − cos: "
            + "; ".join(parts) + ".")


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
        vals = []
        for t in ("cls", "mean_s1", "mean_s2"):
            v = one(c, role="sep1", target=t, metric="linear_cka", layer=Lc)
            vals.append(f"{t} {fmt(v[0] if v else None)}")
        s += f" Linear CKA of sep1 at layer {Lc} with: " + ", ".join(vals) + "."
    a = T.get("attention")
    if a is not None:
        m = pick(a, format="pair", role="s1 words", target="all [SEP]", head="mean")
        if not m.empty:
            s += f" Words of sentence 1 send {m['value'].mean():.3f} of their attention to the [SEP]s (mean over layers)."
    return s


def _bow_targets(p: pd.DataFrame) -> list[str]:
    return sorted({t for t in p["target"].unique() if str(t).startswith("bow_s")}, key=lambda t: int(t[5:]))


def answer_q5(T: dict) -> str:
    p = T.get("probes_q5")
    if p is None:
        return "not measured"
    L = last_layer(p)
    targets = _bow_targets(p)
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
        vals = [f"{c} {fmt(one(tr, role=c, layer=L))}" for c in ("cls", "mean", "max", "sep1", "first_word", "pos3")]
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


# ---------------------------------------------------------------------------------------------------
# Comparison rows (PROVISIONAL: from marginal intervals; see the module docstring) and claims


def _layers(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("layer")


def _contextual(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of layers >= 1: comparisons involving [CLS] leave out layer 0, the embedding layer, where
    [CLS] is the same vector for every input (a trivial difference, or a trivial null)."""
    return _layers(df[pd.to_numeric(df["layer"]) >= 1])


def _q1_rows(T):
    d = pick(T.get("drift_q1"), format="pair", format_b="concat", metric="drift_mean")
    if d.empty:
        return None
    return difference_rows(_contextual(pick(d, role="cls")), _contextual(pick(d, role="s1 words")))


def _q2_rows(T):
    d = pick(T.get("drift_q2"), role="s1 words", metric="drift_mean")
    if d.empty:
        return None
    return difference_rows(_layers(pick(d, format="single", format_b="concat")),
                           _layers(pick(d, format="single", format_b="pair")))


def _q3_rows(T):
    d = pick(T.get("drift_q3"), role="all", metric="drift_mean")
    if d.empty or d["k"].nunique() < 2:
        return None
    return difference_rows(_layers(pick(d, k=d["k"].max())), _layers(pick(d, k=d["k"].min())))


def _q4_rows(T):
    p = pick(T.get("probes_pair"), model_kind="trained", target="is_next", metric="accuracy")
    if p.empty:
        return None
    return difference_rows(_contextual(pick(p, role="sep1")), _contextual(pick(p, role="cls")))


def _q5_rows(T):
    p = pick(T.get("probes_q5"), role="cls")
    if p.empty:
        return None
    L = last_layer(p)
    p = p[p["layer"] == L]
    score = p[p["metric"] == "micro_f1"].assign(sentence=lambda t: t["target"].str[5:].astype(int))
    base = p[p["metric"] == "majority_baseline"].assign(sentence=lambda t: t["target"].str[5:].astype(int),
                                                        ci_low=float("nan"), ci_high=float("nan"))
    return difference_rows(score.sort_values("sentence"), base, on="sentence")


def _q6_rows(T):
    p = pick(T.get("probes_q6"), role="cls", target="topic", metric="accuracy")
    if p.empty:
        return None
    return difference_rows(_contextual(pick(p, format="pair")), _contextual(pick(p, format="cls_last")))


def _q7_rows(T):
    q = pick(T.get("probes_q7"), model_kind="trained", role="cls", target="swapped")
    if q.empty:
        return None
    base = pick(q, metric="majority_baseline").assign(ci_low=float("nan"), ci_high=float("nan"))
    return difference_rows(_contextual(pick(q, metric="accuracy")), base)


def _q8_rows(T):
    p = pick(T.get("probes_pair"), model_kind="trained", target="topic", metric="accuracy")
    if p.empty:
        return None
    return difference_rows(_contextual(pick(p, role="cls")), _contextual(pick(p, role="mean")))


CLAIMS = {
    "Q1": Claim(more="[CLS] changes more than the words of sentence 1 when the middle [SEP] is dropped",
                less="[CLS] changes less than the words of sentence 1 when the middle [SEP] is dropped",
                none="[CLS] and the words of sentence 1 change alike when the middle [SEP] is dropped",
                quantity="drift of [CLS] − drift of sentence 1's words (1 − cos, pair → concat)"),
    "Q2": Claim(more="sentence 1's words take in more of sentence 2 in `concat` than in `pair`",
                less="sentence 1's words take in more of sentence 2 in `pair` than in `concat`",
                none="sentence 1's words take in as much of sentence 2 in `concat` as in `pair`",
                quantity="drift from `single` into `concat` − into `pair` (1 − cos)"),
    "Q3": Claim(more="the token states move further from `concat` with more segments",
                less="the token states move less from `concat` with more segments",
                none="more segments move the token states no further from `concat`",
                quantity="drift of all tokens (multi vs concat) at the largest k − at k = 2"),
    "Q4": Claim(more="the middle [SEP] tells coherent from shuffled pairs (is_next) better than [CLS]",
                less="[CLS] tells coherent from shuffled pairs (is_next) better than the middle [SEP]",
                none="the middle [SEP] and [CLS] tell coherent from shuffled pairs alike",
                quantity="is_next probe accuracy, sep1 − cls"),
    "Q5": Claim(more="[CLS] holds words of these sentences beyond the frequency baseline",
                less="[CLS] predicts the words of these sentences worse than the frequency baseline",
                none="[CLS] holds no more of these sentences' words than the frequency baseline",
                quantity="bag-of-words micro-F1 of [CLS] (last layer) − baseline", facet=("sentence", "sentences"),
                direction=1),
    "Q6": Claim(more="[CLS] placed first is read better than [CLS] placed last",
                less="[CLS] placed last is read better than [CLS] placed first",
                none="[CLS] first and [CLS] last are read alike",
                quantity="topic probe accuracy, first − last"),
    "Q7": Claim(more="word order (two adjacent words swapped) can be read from [CLS] above chance",
                less="the word-order probe on [CLS] scores below chance",
                none="word order cannot be read from [CLS] above chance",
                quantity="swapped probe accuracy of [CLS] − majority baseline", direction=1),
    "Q8": Claim(more="frozen [CLS] reads topic better than mean pooling",
                less="frozen mean pooling reads topic better than [CLS]",
                none="frozen [CLS] and mean pooling read topic alike",
                quantity="topic probe accuracy, cls − mean (frozen)"),
}


# ---------------------------------------------------------------------------------------------------
# Notes: how it was measured and what it does not show


def _q3_notes(cfg: dict) -> str:
    return (f"For k consecutive sentences of one document of the groups corpus ({corpus_text(cfg['corpus']['groups'])} "
            "sentences), `multi` ([SEP] after every sentence, alternating segments) against `concat` (one [CLS] … "
            "[SEP]); the model's pre-training format has two segments at most, so growth with k shows the format "
            "moving away from what it saw in training. It does not measure task accuracy with k segments.")


def _q8_notes(cfg: dict) -> str:
    ft = cfg["finetune"]
    return ("Frozen probes score each pooling choice per layer without training the encoder; the fine-tuning "
            f"experiment trains the encoder with a linear head on each pooling ({', '.join(ft['poolings'])}) over "
            f"{len(ft['seeds'])} seeds with the `{ft['preset']}` preset of analyses.pooling, on one fixed train/test "
            "split. Differences within a standard deviation over seeds are not evidence.")


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
    "Q3": _q3_notes,
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
    "Q8": _q8_notes,
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


def _question(key, corpora, jobs, tables, figures, table, answer, rows, about_cls=False) -> StudySection:
    return StudySection(key=key, title=TITLES[key], corpora=corpora, jobs=jobs, analyse=_tables(*tables),
                        figures=figures, table=table, answer=answer, notes=NOTES[key], comparisons=rows,
                        claim=CLAIMS[key], about_cls=about_cls)


#: The seed questions, in report order.
QUESTION_SECTIONS: dict[str, StudySection] = {s.key: s for s in (
    _question("Q1", ("pairs",), _pair_jobs("Q1"), ("drift_q1", "cka_q1"), _fig_q1, _table_q1, answer_q1, _q1_rows,
              about_cls=True),
    _question("Q2", ("pairs",), _pair_jobs("Q2"), ("drift_q2", "attention"), _fig_q2, _table_q2, answer_q2, _q2_rows),
    _question("Q3", ("groups",), _q3_jobs, ("drift_q3",), _fig_q3, _table_q3, answer_q3, _q3_rows),
    _question("Q4", ("pairs",), _pair_jobs("Q4"), ("attention", "probes_pair", "cka_q4"), _fig_q4, _table_q4,
              answer_q4, _q4_rows, about_cls=True),
    _question("Q5", ("groups",), _q5_jobs, ("probes_q5",), _fig_q5, _table_q5, answer_q5, _q5_rows),
    _question("Q6", ("pairs",), _pair_jobs("Q6"), ("probes_q6",), _fig_q6, _table_q6, answer_q6, _q6_rows,
              about_cls=True),
    _question("Q7", ("pairs", "swap"), _pair_jobs("Q7"), ("probes_pair", "probes_q7"), _fig_q7, _table_q7, answer_q7,
              _q7_rows),
    _question("Q8", ("pairs",), _pair_jobs("Q8"), ("probes_pair", "finetune"), _fig_q8, _table_q8, answer_q8,
              _q8_rows, about_cls=True),
)}
