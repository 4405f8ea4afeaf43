"""The evidence sentence of each seed question, its numbers read from that run's tables, and the text
helpers the sentences share (paired rows, power, knockouts, fine-tuning warnings)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .question_figures import q8_same_items
from .question_rows import _contextual, _q7_rows, q4_versus_cls
from .question_tables import LENGTH_BASELINE
from .report import fmt, last_layer, one, pick
from .verdicts import PRACTICAL_THRESHOLD, Claim

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


# ---------------------------------------------------------------------------------------------------
# Evidence: the numbers behind each verdict, read from the tables


#: The questions' titles and claims (and Q4's knockout claims): plain data in questions.toml beside this file.
QUESTION_TEXT: dict[str, dict] = tomllib.loads(Path(__file__).with_name("questions.toml").read_text("utf-8"))


def claim(key: str) -> Claim:
    """The :class:`probing.study.verdicts.Claim` of ``questions.toml``'s table ``key``."""
    return Claim(**{f: tuple(v) if f == "facet" else v for f, v in QUESTION_TEXT[key].items() if f != "title"})


def _reads(name: str):
    """Evidence read mainly from table ``name``: the function gets that table and all of them, and the
    evidence is "not measured" where the run has no such table."""
    def wrap(fn):
        @functools.wraps(fn)
        def evidence(T: dict) -> str:
            return "not measured" if T.get(name) is None else fn(T[name], T)

        return evidence

    return wrap


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
    own = one(dd, layer=L, role="cls", metric="anisotropy_baseline")
    nd = one(dd, layer=L, role="cls", metric="normalised_drift")
    s = f"at layer {L} ({a} → {b}) " + "; ".join(parts)
    if base is not None:
        s += f"; two random tokens of different inputs lie 1 − cos = {1 - base[0]:.3f} apart at that layer"
    if own is not None and nd is not None:
        s += (f", two [CLS] of different inputs {1 - own[0]:.3g}, so [CLS]'s drift is {fmt(nd[0])} of its own "
              "spread (its normalised drift)")
    return s


def _cls_spread_sentence(d: pd.DataFrame) -> str:
    """Where [CLS] barely varies between inputs (1 − cos of two [CLS] of different inputs per layer), and
    its normalised drift pair → concat at each layer: why Q1's verdict normalises each role by its own
    spread ("" when the table has no per-role baselines)."""
    base = pick(d, format="pair", format_b="concat", role="cls", metric="anisotropy_baseline")
    nd = pick(d, format="pair", format_b="concat", role="cls", metric="normalised_drift")
    base = base[pd.to_numeric(base["layer"]) >= 1].sort_values("layer")
    if base.empty or nd.empty:
        return ""
    spread = ", ".join(f"{int(r['layer'])}: {1 - float(r['value']):.2g}" for _, r in base.iterrows())
    by_layer = nd.set_index(pd.to_numeric(nd["layer"]))["value"]
    norm = ", ".join(f"{int(l)}: {float(by_layer[l]):.3g}" for l in base["layer"] if l in by_layer.index
                     and pd.notna(by_layer[l]))
    return (f"How far apart two [CLS] of different inputs lie (1 − cos), per layer — {spread}; all tokens lie "
            f"far further apart. So [CLS]'s raw drift is small wherever [CLS] hardly depends on the input, and "
            f"the verdict weighs each role's drift against its own spread: [CLS]'s normalised drift per layer — "
            f"{norm}. ")


@_reads("drift_q1")
def _marginal_q1(d: pd.DataFrame, T: dict) -> str:
    s = "Removing the middle [SEP] changes, " + _drift_sentence(d, "pair", "concat") + ". "
    s += _cls_spread_sentence(d)
    sep_only = one(d, format="pair", format_b="concat_segments", role="cls", metric="drift_mean",
                   layer=last_layer(d))
    seg_only = one(d, format="concat_segments", format_b="concat", role="cls", metric="drift_mean",
                   layer=last_layer(d))
    if sep_only is not None and seg_only is not None:
        s += (f"Split into its parts at the last layer: removing only the [SEP] token moves [CLS] by {fmt(sep_only)}, "
              f"removing only the segment ids by {fmt(seg_only)}.")
    c = T.get("cka_q1")
    v = one(c, layer=last_layer(c), choice="cls", metric="linear_cka") if c is not None else None
    if v is not None:
        s += f" Linear CKA of [CLS] between the two formats at the last layer: {fmt(v[0])}."
    return s


@_reads("drift_q2")
def _marginal_q2(d: pd.DataFrame, T: dict) -> str:
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


@_reads("drift_q3")
def answer_q3(d: pd.DataFrame, T: dict) -> str:
    L = last_layer(d)
    parts = []
    for k in sorted(d["k"].unique()):
        v = one(d, k=k, layer=L, role="cls", metric="drift_mean")
        w = one(d, k=k, layer=L, role="all", metric="drift_mean")
        parts.append(f"k={k}: [CLS] {fmt(v)}, all tokens {fmt(w)}")
    s = (f"`multi` ([SEP] after each of k sentences) against `concat` at layer {L}, 1 − cos: "
         + "; ".join(parts) + ".")
    p = pick(T.get("paired_q3"), metric="drift_growth")
    if not p.empty:
        last = _at_last(p)
        r0 = last.iloc[0]
        shown = ("cls", "s1 words", "s2 words", "inner words", "s1 inner words", "s2 inner words", "s2 edge words")
        parts = [f"{r['role'] if r['role'] != 'cls' else '[CLS]'} {fmt(float(r['value_a']))} → {fmt(float(r['value_b']))}, "
                 f"difference {paired_text(r)}" for _, r in last.iterrows() if r["role"] in shown]
        s += (f" Paired on the same tokens, multi → concat drift with k = {int(r0['k'])} → with k = {int(r0['k_b'])} "
              f"sentences at layer {int(r0['layer'])}: " + "; ".join(parts)
              + f" ({int(r0['n_groups'])} {r0['grouping']}s; Holm over layers).")
        if (last["role"] == "s2 edge words").any():
            s += (" Sentence 2's edge words include its last, next to the closing [SEP] in both formats at k = "
                  f"{int(r0['k'])} but next to sentence 3 in the longer `concat`: the verdict leaves the edge words out.")
    return s + _spreads_q3(T.get("paired_q3")) + _cls_spread_at_largest_k(T.get("paired_q3"))


def _cls_spread_at_largest_k(p: pd.DataFrame | None) -> str:
    """How the [CLS] part depends on its spread: the verdict divides the drift at both k by the spread at the
    smaller k (``spread_a``), so its growth is raw drift growth in one unit. The ``own_spread_drift_growth``
    rows of ``paired_q3`` divide each k's drift by that k's own spread (``spread_b`` at the largest k), paired
    per token with a CI and Holm over layers (:func:`analyses.paired.run_prefix_drift`); said with the ratio of
    the two spreads and whether each layer keeps the verdict row's sign and excludes 0."""
    own, verdict = (pick(p, metric=m, role="cls") for m in ("own_spread_drift_growth", "normalised_drift_growth"))
    if own.empty or verdict.empty:
        return ""
    own, verdict = _contextual(own), _contextual(verdict)
    sign = {int(r["layer"]): np.sign(float(r["value"])) for _, r in verdict.iterrows()}
    own = own[own["layer"].astype(int).isin(sign)]
    if own.empty:
        return ""
    layer_of = own["layer"].astype(int)
    ratios = (own["spread_b"] / own["spread_a"]).astype(float)
    flipped = [L for L, v in zip(layer_of, own["value"]) if np.sign(float(v)) != sign[L]]
    excl = [L for L, lo, hi in zip(layer_of, own["ci_low"], own["ci_high"]) if lo > 0 or hi < 0]
    layers = f"{layer_of.iloc[0]}–{layer_of.iloc[-1]}" if len(own) > 1 else f"{layer_of.iloc[0]}"
    same = ("the same sign as the verdict's row in every layer" if not flipped else
            f"the opposite sign to the verdict's row at layer{'s' if len(flipped) > 1 else ''} "
            + ", ".join(map(str, flipped)))
    ci = ("its CI excludes 0 in every layer" if len(excl) == len(own) else
          "its CI includes 0 in every layer" if not excl else
          f"its CI excludes 0 at layer{'s' if len(excl) > 1 else ''} " + ", ".join(map(str, excl)) + " only")
    return (f" [CLS]'s spread at k = {int(own['k_b'].iloc[0])} is {ratios.min():.2f}–{ratios.max():.2f} times its "
            f"spread at k = {int(own['k'].iloc[0])} (layers {layers}). With each k's drift divided by that k's own "
            f"spread instead (paired per token; Holm over layers), [CLS]'s growth per layer is "
            + "; ".join(f"{L}: {paired_text(r)}" for L, (_, r) in zip(layer_of, own.iterrows()))
            + f": {same}, and {ci}; its size depends on which spread is the unit.")


def _spreads_q3(p: pd.DataFrame | None) -> str:
    """The spreads the verdict's two parts are normalised by (``spread_a`` of the ``normalised_drift_growth``
    rows of [CLS] and of the inner words), per layer 1–L, and the growth of each at the last layer: two [CLS]
    of different inputs lie far closer than two words in a sentence encoder's middle layers."""
    n = pick(p, metric="normalised_drift_growth")
    if n.empty or "spread_a" not in n.columns:
        return ""
    n = _contextual(n)
    out = []
    for role, what in (("cls", "two [CLS]"), ("inner words", "two inner words")):
        r = pick(n, role=role)
        if not r.empty:
            out.append(f"{what} — " + ", ".join(f"{int(x['layer'])}: {float(x['spread_a']):.2g}" for _, x in r.iterrows()))
    if not out:
        return ""
    k = int(n["k"].iloc[0]) if "k" in n.columns else 2
    s = (f" How far apart tokens of different inputs lie at k = {k} (1 − cos), per layer: " + "; ".join(out)
         + ". Each part of the verdict divides its drifts by its own spread, so 1 = as far as another input")
    last = _at_last(n)
    grow = [f"{'[CLS]' if r['role'] == 'cls' else r['role']} {fmt(float(r['value_a']))} → {fmt(float(r['value_b']))}"
            for _, r in last.iterrows() if r["role"] in ("cls", "inner words")]
    if grow:
        s += f"; at layer {int(last['layer'].iloc[0])}: " + ", ".join(grow)
    return s + "."


@_reads("probes_pair")
def _marginal_q4(p: pd.DataFrame, T: dict) -> str:
    tr = pick(p, model_kind="trained")
    L = last_layer(tr)
    parts = []
    for target, metric in (("topic", "accuracy"), ("is_next", "accuracy"), ("bow_s1", "macro_auc"),
                           ("bow_s2", "macro_auc")):
        row = []
        for choice in ("sep1", "cls", "mean_s1", "mean_s2"):
            v = one(tr, choice=choice, target=target, metric=metric, layer=L)
            if v or choice in ("sep1", "cls"):
                row.append(f"{choice} {fmt(v[0] if v else None)}")
        length = one(tr, choice="length_only", target=target, metric=metric)  # no layer: word counts only
        if length:
            row.append(f"length only {fmt(length[0])}")
        base_metric, base_name = (("majority_baseline_macro_auc", "frequency baseline") if metric == "macro_auc"
                                  else ("majority_baseline", "majority baseline"))
        base = one(tr, choice="sep1", target=target, metric=base_metric, layer=L)
        parts.append(f"{target} ({metric.replace('_', ' ')}): " + ", ".join(row)
                     + f" ({base_name} {fmt(base[0] if base else None)})")
    s = (f"Probes at layer {L} on the middle [SEP] (sep1) vs [CLS] vs the mean of sentence 1's (mean_s1) and "
         f"sentence 2's words (mean_s2) — " + "; ".join(parts) + ".")
    c = T.get("cka_q4")
    if c is not None:
        Lc = last_layer(c)
        vals = []
        for t in ("cls", "mean_s1", "mean_s2"):
            v = one(c, choice="sep1", choice_b=t, metric="linear_cka", layer=Lc)
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


@_reads("probes_q5")
def _marginal_q5(p: pd.DataFrame, T: dict) -> str:
    L = last_layer(p)
    targets = _bow_targets(p)
    parts, f1 = [], []
    for t in targets:
        v = one(p, choice="cls", target=t, metric="macro_auc", layer=L)
        m = one(p, choice="mean", target=t, metric="macro_auc", layer=L)
        lo = pick(p, choice="length_only", target=t, metric="macro_auc")
        parts.append(f"sentence {t[5:]}: [CLS] {fmt(v)}, mean {fmt(m[0] if m else None)}"
                     + (f", length only {fmt(float(lo['value'].iloc[0]))}" if not lo.empty else ""))
        fv = one(p, choice="cls", target=t, metric="micro_f1", layer=L)
        f1.append(f"sentence {t[5:]} {fmt(fv[0] if fv else None)}")
    base = one(p, choice="cls", target=targets[0], metric="majority_baseline", layer=L) if targets else None
    return (f"Bag-of-words macro AUC of sentence i read from [CLS] at layer {L} of a {len(targets)}-sentence input "
            f"(0.5: the frequency baseline; length only: a probe on the sentences' word counts alone, which "
            f"ranks above 0.5 because a longer sentence holds more of any word): " + "; ".join(parts) + ". Micro-F1 at a 0.5 threshold, from [CLS]: "
            + ", ".join(f1) + f" (baseline {fmt(base[0] if base else None)}): low wherever the probe is rarely "
            "sure a word is there, however well it ranks the examples.")


@_reads("probes_q6")
def _marginal_q6(p: pd.DataFrame, T: dict) -> str:
    L = last_layer(p)
    parts = []
    for target in ("topic", "is_next"):
        vals = [f"{f} {fmt(one(p, format=f, choice='cls', target=target, metric='accuracy', layer=L))}"
                for f in ("pair", "cls_mid", "cls_last")]
        parts.append(f"{target}: " + ", ".join(vals))
    return f"Probe accuracy of the classification token at layer {L}, by where it sits — " + "; ".join(parts) + "."


def _marginal_q7(T: dict) -> str:
    p = T.get("probes_pair")
    parts = []
    if p is not None:
        L = last_layer(p)
        for target, metric in (("bow_s1", "macro_auc"), ("fw_s1", "macro_auc"), ("length", "accuracy")):
            vals = []
            for kind in ("trained", "random_init"):
                for choice in ("cls", "mean"):
                    v = one(p, model_kind=kind, choice=choice, target=target, metric=metric, layer=L)
                    if v is not None:
                        vals.append(f"{choice} ({kind.replace('_', ' ')}) {fmt(v[0])}")
            lo = pick(p, choice="length_only", target=target, metric=metric)
            if not lo.empty:
                vals.append(f"length only {fmt(float(lo['value'].iloc[0]))}"
                            + (" (it reads the word counts this target is made of: a ceiling, not a baseline)"
                               if target == "length" else ""))
            parts.append(f"{target} {metric.replace('_', ' ')}: " + ", ".join(vals))
    q = T.get("probes_q7")
    if q is not None:
        L = last_layer(q)
        vals = [f"{c} ({k.replace('_', ' ')}) {fmt(one(q, model_kind=k, choice=c, target='swapped', metric='accuracy', layer=L))}"
                for k in ("trained", "random_init") for c in ("cls", "mean")]
        b = one(q, choice="cls", target="swapped", metric="majority_baseline", layer=L)
        parts.append("word order (swapped) accuracy: " + ", ".join(vals) + f", majority {fmt(b[0] if b else None)}")
    return "At the last layer — " + "; ".join(parts) + "." if parts else "not measured"


# ---------------------------------------------------------------------------------------------------
# Evidence from the paired rows: each difference with its CI, Holm p and power


def paired_text(row) -> str:
    """``+0.012 (95% CI +0.004 to +0.020; Holm p = 0.01)`` of one paired comparison row."""
    from .verdicts import format_interval, format_p

    s = format_interval(float(row["value"]), float(row["ci_low"]), float(row["ci_high"]), signed=True)
    p = row.get("p_holm") if hasattr(row, "get") else None
    if p is not None and pd.notna(p):
        s = s[:-1] + f"; Holm {format_p(float(p))})" if s.endswith(")") else s + f" (Holm {format_p(float(p))})"
    return s


def power_text(rows: pd.DataFrame, what: str) -> str:
    """Whether the default sizes can detect :data:`analyses.stats.DETECTABLE_EFFECT` in ``rows`` (from
    their ``groups_needed`` and ``n_groups``), generated from the numbers."""
    from analyses.stats import DETECTABLE_EFFECT

    if rows is None or rows.empty or "groups_needed" not in rows.columns:
        return ""
    need = pd.to_numeric(rows["groups_needed"], errors="coerce")
    have = pd.to_numeric(rows["n_groups"], errors="coerce")
    if need.isna().all() or have.isna().all():
        return ""
    worst = int(need.max())
    unit = f"{rows['grouping'].iloc[0]}s" if "grouping" in rows.columns else "groups"
    n = int(have.min())
    # several layers: the sentence is about the least powerful one, and must say so (the layer quoted just
    # before it may well have the power)
    layers = pd.to_numeric(rows["layer"], errors="coerce") if "layer" in rows.columns else pd.Series(dtype=float)
    several = layers.notna().sum() > 1
    if worst <= n:
        every = " at every layer" if several else ""
        return (f" Power: with {n} {unit}, {what} can detect a difference of {DETECTABLE_EFFECT:g}{every} "
                f"(needs at most {worst}).")
    at = f" at every layer: at layer {int(layers[need.idxmax()])} that" if several else ": that"
    return (f" Power: with {n} {unit}, {what} cannot reliably detect a difference of {DETECTABLE_EFFECT:g}{at} "
            f"would take about {worst} {unit} (a larger corpus).")


def _at_last(rows: pd.DataFrame) -> pd.DataFrame:
    layer = pd.to_numeric(rows["layer"], errors="coerce")
    return rows[layer == layer.max()] if layer.notna().any() else rows


def _paired_at_last(d: pd.DataFrame | None, intro: str, column: str = "target", tail: str = ".") -> str:
    """`` {intro} at layer L: <row's column> <difference and CI>; ...{tail}`` for the paired rows of the
    last layer in ``d`` ("" when there are none)."""
    if d is None or d.empty:
        return ""
    last = _at_last(d)
    parts = [f"{r[column]} {paired_text(r)}" for _, r in last.iterrows()]
    return f" {intro} at layer {int(last['layer'].iloc[0])}: " + "; ".join(parts) + tail


def answer_q1(T: dict) -> str:
    s = _marginal_q1(T)
    for metric, what in (("normalised_drift_diff_roles", "normalised drift (each against its own spread)"),
                         ("drift_diff_roles", "raw drift (1 − cos)")):
        d = pick(T.get("paired_q1"), metric=metric)
        if not d.empty:
            r = _at_last(d).iloc[0]
            s += (f" Paired per example, [CLS]'s {what} minus the words' at layer {int(r['layer'])}: "
                  f"{paired_text(r)} ({int(r['n_groups'])} {r['grouping']}s; Holm over layers).")
    return s + patching_text(T)


def patching_text(T: dict) -> str:
    """Q1's "how much of [CLS]'s change comes through [SEP]": the share of [CLS]'s pair → concat drift at
    the last layer each intervention on `pair` reproduces (patching [CLS] from concat at layer l; no
    attention to the middle [SEP])."""
    from .verdicts import format_interval

    d = pick(T.get("q1_cls_patching"), metric="fraction_reproduced")
    if d.empty:
        return ""
    parts = []
    for _, r in d.iterrows():
        iv = str(r.get("intervention", ""))
        what = (f"[CLS] patched from concat at layer {int(r['patch_layer'])}" if pd.notna(r.get("patch_layer"))
                else "[CLS] not attending to the middle [SEP] (every layer)" if "cls->sep1" in iv
                else "no token attending to the middle [SEP] (every layer)" if "all->sep1" in iv else iv)
        parts.append(f"{what}: {format_interval(float(r['value']), float(r['ci_low']), float(r['ci_high']))}")
    return (f" How much of [CLS]'s change comes through [SEP]: the share of [CLS]'s pair → concat drift at layer "
            f"{int(d['layer'].iloc[0])} that an intervention on `pair` reproduces (1 = all of it, 0 = none) — "
            + "; ".join(parts) + ".")


def answer_q2(T: dict) -> str:
    s = _marginal_q2(T)
    d = pick(T.get("paired_q2"), metric="drift_diff")
    parts = []
    for ref, role in (("single", "s1 words"), ("single2", "s2 words")):
        r = pick(d, reference=ref, role=role)
        if not r.empty:
            r = _at_last(r).iloc[0]
            caveat = (" (not a context effect alone: sentence 2 sits one position earlier in `concat`, without the "
                      "middle [SEP], and takes segment A there, B in `pair`)") if ref == "single2" else ""
            parts.append(f"{role.split()[0]}'s words {paired_text(r)}{caveat}")
    if parts:
        s += (" Paired on the same words, drift into `concat` − into `pair` at the last layer: " + "; ".join(parts)
              + ".")
    return s + _edges_q2(d) + _attention_q2(pick(T.get("paired_q2"), metric="attention_diff"))


def _attention_q2(a: pd.DataFrame) -> str:
    """The paired attention rows of Q2 in words: where sentence 1's words attend more or less to sentence 2
    in `concat` than in `pair`, by the same significance rule as the verdicts."""
    from .verdicts import ranges, significant

    a = pick(a, role="s1 words", target="s2 words")
    if a.empty:
        return ""
    a = a.reset_index(drop=True)
    sig = [significant(r) for _, r in a.iterrows()]
    up = a.loc[[i for i, ok in enumerate(sig) if ok and a.loc[i, "value"] > 0], "layer"]
    down = a.loc[[i for i, ok in enumerate(sig) if ok and a.loc[i, "value"] < 0], "layer"]
    big = a.loc[pd.to_numeric(a["value"]).abs().idxmax()]
    parts = ([f"more in `concat` at layer{'s' if len(up) > 1 else ''} {ranges(up)}"] if len(up) else []) + \
            ([f"less in `concat` at layer{'s' if len(down) > 1 else ''} {ranges(down)}"] if len(down) else [])
    return (" Attention mass from sentence 1's words to sentence 2's words (head mean), `concat` − `pair` paired "
            "per example: " + ("; ".join(parts) if parts else "no layer differs") +
            f" (largest at layer {int(big['layer'])}: {paired_text(big)}; Holm over layers).")


def _edges_q2(d: pd.DataFrame) -> str:
    """Sentence 1's edge words against its inner words: where the concat − pair difference sits."""
    edge, inner = pick(d, reference="single", role="s1 edge words"), pick(d, reference="single", role="s1 inner words")
    if edge.empty or inner.empty:
        return ""
    peak = edge.loc[pd.to_numeric(edge["value"]).abs().idxmax()]
    L = int(peak["layer"])
    at = pick(inner, layer=L)
    last_e, last_i = _at_last(edge).iloc[0], _at_last(inner).iloc[0]
    s = (f" Where in sentence 1: its edge words (the first and the last; the last one's right neighbour is the "
         f"middle [SEP] in `pair` and sentence 2's first word in `concat`) differ most at layer {L}, "
         f"{paired_text(peak)}")
    if not at.empty:
        s += f", against {paired_text(at.iloc[0])} for its inner words"
    s += (f"; at layer {int(last_e['layer'])}, edge words {paired_text(last_e)}, inner words "
          f"{paired_text(last_i)}. The verdict reads the inner words, whose neighbours are words of sentence 1 in "
          f"every format.")
    return s


def answer_q4(T: dict) -> str:
    s = _marginal_q4(T)
    d = q4_versus_cls(T.get("paired_q4"))
    if not d.empty:
        s += (_paired_at_last(d, "Paired on the same out-of-fold items, sep1 − cls (accuracy for is_next, macro AUC "
                             "for the bags of words)")
              + power_text(pick(d, target="is_next"), "the is_next comparison"))
    return (s + _coherence_by_layer(T.get("probes_pair")) + _coherence_from_length(T.get("probes_pair"))
            + _sep_content_untrained(T.get("probes_pair")) + _sep_next_untrained(T.get("probes_pair"))
            + knockout_text(T))


def _sep_content_untrained(p: pd.DataFrame | None) -> str:
    """The middle [SEP]'s content-word macro AUC on the trained and on the random-init model at the layer where
    the trained one is highest (layers 1–L), beside [CLS]'s on the random-init model where Q7 probed it: what an
    encoder of this architecture puts at each token without training."""
    if p is None or "model_kind_b" not in p.columns:
        return ""
    d = _contextual(pick(p, model_kind="trained", model_kind_b="random_init", choice="sep1", metric="macro_auc_diff"))
    parts = []
    for target in ("bow_s1", "bow_s2"):
        r = pick(d, target=target)
        if r.empty:
            continue
        r = r.loc[pd.to_numeric(r["value_a"]).idxmax()]
        L = int(r["layer"])
        trained = one(pick(p, model_kind="trained", target=target, metric="macro_auc"), choice="sep1", layer=L)
        random = one(pick(p, model_kind="random_init", target=target, metric="macro_auc"), choice="sep1", layer=L)
        if trained is None or random is None:
            continue
        s = (f"sentence {target[-1]}'s content words at layer {L}, {fmt(trained)} trained against {fmt(random)} "
             f"with random weights")
        cls_random = one(pick(p, model_kind="random_init", target=target, metric="macro_auc"), choice="cls", layer=L)
        if cls_random is not None:
            s += f" (the random-weight [CLS] {fmt(cls_random)})"
        parts.append(s)
    if not parts:
        return ""
    return (" The middle [SEP] with random weights (same architecture, embeddings included), macro AUC: "
            + "; ".join(parts) + ".")


def _sep_next_untrained(p: pd.DataFrame | None) -> str:
    """The middle [SEP]'s is_next accuracy on the trained and on the random-init model at the layer where the
    trained one is highest (layers 1–L), beside the majority baseline: coherence without training."""
    if p is None or p.empty:
        return ""
    acc = _contextual(pick(p, target="is_next", metric="accuracy", choice="sep1"))
    trained, random = pick(acc, model_kind="trained"), pick(acc, model_kind="random_init")
    if trained.empty or random.empty:
        return ""
    L = int(trained.loc[pd.to_numeric(trained["value"]).idxmax(), "layer"])
    t, r = one(trained, layer=L), one(random, layer=L)
    base = one(pick(p, model_kind="trained", target="is_next", metric="majority_baseline"), choice="sep1")
    if t is None or r is None:
        return ""
    lo, hi = (pd.to_numeric(random["value"]).agg(f) for f in ("min", "max"))
    return (f" On is_next, at layer {L} the middle [SEP] reads {fmt(t)} trained against {fmt(r)} with random weights"
            + (f" (majority baseline {fmt(base[0])})" if base else "")
            + f"; with random weights {lo:.3f}–{hi:.3f} over layers 1–{int(pd.to_numeric(acc['layer']).max())}.")


def _coherence_from_length(p: pd.DataFrame | None) -> str:
    """The length-only probe's is_next accuracy beside the majority baseline, and which of the two the first
    part's verdict reads (the stronger, as :func:`probing.study.question_rows._q4_sep_next_rows` decides):
    adjacent sentences' lengths could tell coherent from shuffled pairs a little by themselves."""
    length = one(pick(p, model_kind="trained"), choice="length_only", target="is_next", metric="accuracy")
    base = one(pick(p, model_kind="trained", target="is_next", metric="majority_baseline"), choice="sep1")
    if not length or not base:
        return ""
    s = (f" A probe on the two sentences' word counts alone reads is_next at {fmt(length)}, against the majority "
         f"baseline {fmt(base[0])}")
    if length[0] > base[0]:
        return s + (": lengths alone read is_next above the majority baseline, so the first part's verdict compares "
                    "the middle [SEP] with this probe, paired on the same items, not with the majority baseline.")
    return s + (": lengths alone do not tell coherent from shuffled pairs here, so the first part's verdict "
                "compares the middle [SEP] with the majority baseline.")


def _coherence_by_layer(p: pd.DataFrame | None) -> str:
    """Where each of [CLS] and the middle [SEP] reads is_next best (layers 1–L), and whether [CLS]'s last-layer
    interval reaches its majority baseline: a last-layer sep1 − cls difference can be [CLS] losing what it
    held in the middle layers rather than [SEP] holding more than [CLS] ever did."""
    tr = pick(p, model_kind="trained", target="is_next", metric="accuracy")
    if tr.empty:
        return ""
    tr = _contextual(tr)
    best = {}
    for choice in ("cls", "sep1"):
        r = pick(tr, choice=choice)
        if not r.empty:
            best[choice] = r.loc[pd.to_numeric(r["value"]).idxmax()]
    if len(best) < 2:
        return ""
    name = {"cls": "[CLS]", "sep1": "sep1"}
    s = " Coherence by layer: " + ", ".join(
        f"{name[c]} reads is_next best at layer {int(r['layer'])}, "
        f"{fmt((float(r['value']), float(r['ci_low']), float(r['ci_high'])))}" for c, r in best.items())
    L = int(tr["layer"].max())
    cls_last = one(tr, choice="cls", layer=L)
    sep_last = one(tr, choice="sep1", layer=L)
    base = one(pick(p, model_kind="trained", target="is_next", metric="majority_baseline"), choice="cls", layer=L)
    if cls_last and base and cls_last[1] <= base[0]:
        s += (f"; at layer {L} [CLS]'s interval reaches its majority baseline ({fmt(cls_last)} against "
              f"{fmt(base[0])})")
        if sep_last and sep_last[0] <= float(best["cls"]["value"]) and int(best["cls"]["layer"]) != L:
            s += (f", so the last layer's sep1 − cls difference is [CLS] losing what it held at layer "
                  f"{int(best['cls']['layer'])}, not the middle [SEP] holding more than [CLS] did there")
    return s + "."


#: The knockout claims: the treated effect beyond the control's, on [CLS] and on the task probes.
KNOCKOUT_DRIFT_CLAIM = claim("Q4_knockout_drift")
KNOCKOUT_PROBE_CLAIM = claim("Q4_knockout_probes")
KNOCKOUT_WORDS_CLAIM = claim("Q4_knockout_drift_words")


def knockout_text(T: dict) -> str:
    """Q4's "does the model use [SEP]?": verdicts from the knockout − control rows (drift of [CLS] per
    layer; [CLS] probe accuracy per target), by the same rules as every section's verdict."""
    from .verdicts import summarise

    drift, probes = T.get("q4_knockout_drift"), T.get("q4_knockout_probes")
    if drift is None and probes is None:
        return ""
    s = " Does the model use [SEP]? Attention to every [SEP] knocked out in the middle layers, against a control " \
        "knockout of as many random word keys:"
    # [CLS], then the words: is attention to [SEP] worth more to them than as many random word keys?
    # each group's drift over its own spread between inputs: [CLS] hardly varies between inputs in a sentence
    # encoder's middle layers, so a raw 1 − cos against the 0–1 threshold would call any effect on it small
    for role, claim_, lead in (("cls", KNOCKOUT_DRIFT_CLAIM, " "), ("word", KNOCKOUT_WORDS_CLAIM, " Words: ")):
        d = pick(drift, role=role, metric="normalised_drift_difference")
        if not d.empty:
            s += lead + summarise(_contextual(d), claim_).sentence
    p = pick(probes, metric="change_difference", mode="transfer")
    if p is not None and not p.empty:
        for target in dict.fromkeys(p["target"].astype(str)):
            s += " " + _knockout_probe_text(probes, p[p["target"].astype(str) == target], target)
    return s


def _knockout_probe_text(probes: pd.DataFrame, diff: pd.DataFrame, target: str) -> str:
    """One target's knockout − control verdict over the probed layers, leaving out the layers where the
    clean probe does not beat its majority baseline (a knockout has nothing to lower there)."""
    from .verdicts import ranges, summarise

    def at(metric: str, layer) -> pd.Series | None:
        r = pick(probes, metric=metric, mode="transfer", target=target, layer=layer)
        return None if r.empty else r.iloc[0]

    layers = sorted(int(l) for l in diff["layer"])
    clean = {l: at("accuracy_clean", l) for l in layers}
    base = {l: at("majority_baseline", l) for l in layers}
    empty = [l for l in layers if clean[l] is not None and base[l] is not None
             and float(clean[l]["ci_low"]) <= float(base[l]["value"])]
    kept = diff[~diff["layer"].astype(int).isin(empty)]
    majority = next((float(b["value"]) for b in base.values() if b is not None), None)
    if len(layers) == 1:
        accs = ", ".join(f"{m.split('_')[1]} {fmt(float(r['value']))}"
                         for m in ("accuracy_clean", "accuracy_treated", "accuracy_control")
                         if (r := at(m, layers[0])) is not None)
        head = f"{target} ([CLS], layer {layers[0]}; {accs}"
    else:
        vals = [float(clean[l]["value"]) for l in layers if clean[l] is not None]
        head = (f"{target} ([CLS], layers {ranges(layers)}; clean accuracy {fmt(min(vals))} to {fmt(max(vals))}"
                if vals else f"{target} ([CLS], layers {ranges(layers)}")
    head += (f", majority baseline {fmt(majority)})" if majority is not None else ")")
    if kept.empty:
        first = diff.sort_values("layer").iloc[0]
        return (f"{head}: no verdict: the clean probe's CI reaches its majority baseline at every probed layer, so a "
                f"knockout has nothing to lower (knockout − control at layer {int(first['layer'])}: "
                f"{paired_text(first)}).")
    s = f"{head}: {summarise(kept, KNOCKOUT_PROBE_CLAIM).sentence}"
    if empty:
        worst = ", ".join(f"{fmt(float(clean[l]['value']))} at layer {l}" for l in empty)
        s += (f" Left out of the verdict: {'layers' if len(empty) > 1 else 'layer'} {ranges(empty)}, where the clean "
              f"probe's CI reaches its majority baseline ({worst}), so there is nothing to lower.")
    return s


def answer_q5(T: dict) -> str:
    s = _marginal_q5(T)
    s += _paired_at_last(T.get("paired_q5"), "[CLS] − mean macro AUC on the same document resamples")
    p = T.get("probes_q5")
    if p is not None:
        L = last_layer(p)
        fw = one(p, choice="cls", target="fw_s1", metric="macro_auc", layer=L)
        lo = pick(p, choice="length_only", target="fw_s1", metric="macro_auc")
        d = pick(p, choice="cls", choice_b="length_only", target="fw_s1", metric="macro_auc_diff", layer=L)
        if fw is not None:
            s += (f" Control: function-word presence of sentence 1 (fw_s1, which tracks length, so the length-only "
                  f"probe is its reference) from [CLS], macro AUC "
                  f"{fmt(fw[0])}" + (f", the length-only probe {fmt(float(lo['value'].iloc[0]))}" if not lo.empty else "")
                  + (f", [CLS] − length-only {paired_text(d.iloc[0])}" if not d.empty else "")
                  + "; the bow targets are content words.")
    return s


def answer_q6(T: dict) -> str:
    s = _marginal_q6(T)
    d = T.get("paired_q6")
    if d is not None and not d.empty:
        last = _at_last(d)
        parts = [f"{r['target']} {r['condition_a'].split('=')[1]} − {r['condition_b'].split('=')[1]} {paired_text(r)}"
                 for _, r in last.iterrows()]
        same = bool(d["same_folds"].all()) if "same_folds" in d.columns else False
        s += (f" Paired on the same examples {'and folds' if same else '(folds differ)'} across the three caches, at "
              f"layer {int(last['layer'].iloc[0])}: " + "; ".join(parts) + "."
              + power_text(pick(d, target="topic"), "the topic comparison"))
    return s


def answer_q7(T: dict) -> str:
    from .verdicts import row_mde

    s = _marginal_q7(T)
    q = T.get("probes_q7")
    if q is not None:
        rows = _q7_rows(T)
        if rows is not None and not rows.empty:
            worst = max(row_mde(r) for _, r in rows.iterrows())
            acc = pick(q, choice="cls", target="swapped", metric="accuracy")
            n = f"n = {int(acc['n'].max())} pairs" if "n" in acc.columns and acc["n"].notna().any() else "this size"
            s += (f" Word order: at {n}, the smallest accuracy above the majority baseline this sample could detect "
                  f"is {worst:.3f}"
                  + (f" (it cannot detect {PRACTICAL_THRESHOLD:g})." if worst > PRACTICAL_THRESHOLD else "."))
    d = T.get("paired_q7")
    if d is not None and not d.empty:
        s += _paired_at_last(pick(d, condition_a="model_kind=trained"),
                             "Trained − random-init (word order, paired items)", column="choice")
    auc = pick(T.get("probes_pair"), model_kind="trained", choice_b="length_only", metric="macro_auc_diff")
    auc = auc[auc["choice"].isin(LENGTH_BASELINE["Q7"])] if not auc.empty else auc  # Q4 reads the [SEP] rows
    if not auc.empty:
        auc = _contextual(auc).sort_values(["target", "choice"], kind="stable")
        s += _paired_at_last(auc.assign(what=auc["target"].astype(str) + " " + auc["choice"].astype(str)),
                             "Macro AUC − the length-only probe's, on the same resamples of the same items",
                             column="what", tail=" (fw_s1: function words, the length-tracking control).")
    return s


def answer_q8(T: dict) -> str:
    from analyses.finetune import BASELINE, diff_label

    s = ""
    d = T.get("paired_q8")
    if d is not None and not d.empty:
        r = _at_last(d).iloc[0]
        s += (f"Frozen probes for topic, cls − mean at layer {int(r['layer'])}, paired on the same out-of-fold items"
              f"{_items_text(r, 'cross-validated over ', ' examples')}: {paired_text(r)}."
              + power_text(d, "this comparison") + " ")
    f = T.get("finetune")
    if f is not None:
        t = q8_same_items(f)
        if not t.empty:
            s += ("Fine-tuned vs frozen on the same splits and test items: "
                  + "; ".join(f"{r['pooling']} fine-tuned {r['fine-tuned']}, frozen {r['frozen (same splits)']}, "
                              f"difference {r['fine-tuned − frozen']}" for _, r in t.iterrows()) + ".")
        d = pick(f, metric="accuracy_diff")
        others = d[d["pooling"] != d["pooling_b"]]
        if not others.empty:
            note = "the frozen rows here are probes fitted on those splits, not the cross-validated probes above"
            s += (f" Each pooling − mean on the fine-tuning splits' test items{_items_text(others.iloc[0], '', ' items', note)}: "
                  + "; ".join(f"{diff_label(r)}: {paired_text(r)}" for _, r in others.iterrows()) + ".")
        pooled = f[f["fold"].isna()] if "fold" in f.columns else f
        best, chance = (one(pooled, metric=m, condition=BASELINE) for m in ("best_constant", "chance"))
        if best is not None:
            s += f" Best constant {fmt(best[0])}" + (f", chance {fmt(chance[0])}" if chance else "") + "."
        s += finetune_precision(f)
        s += finetune_warnings(f)
    return s.strip() or "not measured"


def _items_text(row, before: str, unit: str, note: str = "") -> str:
    """`` (cross-validated over 1000 examples, 124 documents; note)``: the items and groups a row is
    measured on, from its ``n``, ``n_groups`` and ``grouping`` where it has them, then ``note``."""
    n, g = row.get("n"), row.get("n_groups")
    parts = [f"{before}{int(n)}{unit}"] if n is not None and pd.notna(n) else []
    if g is not None and pd.notna(g):
        parts.append(f"{int(g)} {row.get('grouping') or 'group'}s")
    inside = "; ".join(x for x in (", ".join(parts), note) if x)
    return f" ({inside})" if inside else ""


def finetune_precision(f: pd.DataFrame) -> str:
    """How the fine-tuning runs computed (the table's ``autocast`` column): the "default" preset uses bfloat16
    autocast only where the machine computes bfloat16 natively, so the same study on another machine can differ
    by float rounding (on a 1,000-pair check, 99.7% of the test predictions were the same)."""
    if f is None or "autocast" not in f.columns or f["autocast"].dropna().empty:
        return ""
    on = {str(v).lower() == "true" for v in f["autocast"].dropna()}
    if on == {True}:
        return " The fine-tuning runs computed under bfloat16 autocast (float32 weights and optimiser)."
    if on == {False}:
        return " The fine-tuning runs computed in float32."
    return " Some fine-tuning runs computed in float32, others under bfloat16 autocast."


def finetune_warnings(f: pd.DataFrame) -> str:
    """A visible line per fine-tuning or frozen run flagged below the best constant or not converged."""
    if f is None or "warning" not in f.columns:
        return ""
    runs = f["metric"].isin(["test_accuracy", "frozen_test_accuracy"])
    flagged = runs & f["warning"].fillna("").astype(str).ne("")
    if not flagged.any():
        return ""
    means = f[f["metric"].isin(["test_accuracy_mean", "frozen_test_accuracy_mean"])
              & f["warning"].fillna("").astype(str).ne("")]
    what = "; ".join(f"{r['pooling']} {'frozen' if r['metric'].startswith('frozen') else 'fine-tuned'}: {r['warning']}"
                     for _, r in means.iterrows())
    return (f" **Warning:** {int(flagged.sum())} of {int(runs.sum())} runs flagged (below the best constant, or "
            f"training did not converge){': ' + what if what else ''}; see the `warning` column of "
            "tables/finetune.csv.")
