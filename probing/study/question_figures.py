"""How the seed questions are shown: each question's figures (drawn from its tables by :mod:`figures`)
and the table its report section prints."""

from __future__ import annotations

import pandas as pd

from .report import last_layer, pick
from .sections import safe_plot


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
    if T.get("q1_cls_patching") is not None and not T["q1_cls_patching"].empty:
        from figures.interventions import plot_patching

        out += safe_plot(plot_patching, T["q1_cls_patching"], fig / "q1_cls_patching", log=log)
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
        out += safe_plot(plot_probes, p, fig / "q4_probes_is_next", target="is_next", choices=_Q4_ROLES, log=log)
        for target in ("bow_s1", "bow_s2"):  # the macro AUC: what the verdict's content-word parts compare
            out += safe_plot(plot_probes, p, fig / f"q4_probes_{target}", target=target, metric="macro_auc",
                             choices=_Q4_ROLES, log=log)
    if "cka_q4" in T:
        out += safe_plot(plot_cka_layers, T["cka_q4"], fig / "q4_cka_sep", log=log)
    if "q4_knockout_drift" in T:
        from figures.interventions import plot_knockout_drift, plot_knockout_probes

        out += safe_plot(plot_knockout_drift, T["q4_knockout_drift"], fig / "q4_sep_knockout_drift", log=log)
        out += safe_plot(plot_knockout_probes, T["q4_knockout_probes"], fig / "q4_sep_knockout_probes", log=log)
    return out


def _fig_q5(T, fig, log):
    from figures.probes import plot_probe_position

    if "probes_q5" not in T:
        return []
    return safe_plot(plot_probe_position, T["probes_q5"], fig / "q5_cls_content_by_position", metric="macro_auc",
                     choice=["cls", "mean", "length_only"], layer="last", log=log)


def _fig_q6(T, fig, log):
    from figures.probes import plot_probes

    if "probes_q6" not in T:
        return []
    p = T["probes_q6"].copy()
    p["choice"] = p["format"].map({"pair": "cls first", "cls_mid": "cls middle", "cls_last": "cls last"})
    p["format"] = "pair / cls_mid / cls_last"
    return (safe_plot(plot_probes, p, fig / "q6_cls_position_topic", target="topic", log=log)
            + safe_plot(plot_probes, p, fig / "q6_cls_position_is_next", target="is_next", log=log))


def _fig_q7(T, fig, log):
    from figures.probes import plot_probes

    out = []
    if "probes_pair" in T:
        p = T["probes_pair"]
        # the macro AUC, beside the length-only probe's level: what the verdict's content-word part compares
        out += safe_plot(plot_probes, p, fig / "q7_probes_bow_s1", target="bow_s1", metric="macro_auc",
                         choices=["cls", "mean"], log=log)
        out += safe_plot(plot_probes, p, fig / "q7_probes_length", target="length", choices=["cls", "mean"], log=log)
    if "probes_q7" in T:
        out += safe_plot(plot_probes, T["probes_q7"], fig / "q7_probes_word_order", target="swapped", log=log)
    return out


def _fig_q8(T, fig, log):
    from figures.pooling import plot_pooling
    from figures.probes import plot_probes

    out = []
    if "probes_pair" in T:
        out += safe_plot(plot_probes, T["probes_pair"], fig / "q8_probes_topic", target="topic",
                         choices=["cls", "mean", "max", "sep1", "first_word", "pos3"], log=log)
    if "finetune" in T:
        # the fine-tuning table holds its own frozen probes on the same splits and test items: those bars
        out += safe_plot(plot_pooling, T["finetune"], fig / "q8_pooling", log=log)
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
    t.columns = [sep.join(map(str, c)) if isinstance(c, tuple) else str(c) for c in t.columns]
    return t.reset_index(), caption


def _report_table(source: str, where: dict, layout, *args, **kwargs):
    """A question's report table: the rows of table ``source`` matching ``where`` (a tuple value matches
    any of its items), laid out by ``layout`` (:func:`_at_last_layer` or :func:`_by_layer`)."""
    def table(T):
        if source not in T:
            return None
        d = T[source]
        for column, value in where.items():
            d = d[d[column].isin(value)] if isinstance(value, tuple) else pick(d, **{column: value})
        return layout(d, *args, **kwargs)

    return table


_table_q1 = _report_table("drift_q1", {"format": "pair", "format_b": "concat", "metric": "normalised_drift"}, _by_layer,
                          ["role"], "normalised drift pair → concat, per layer and role group: 1 − cos over the 1 − cos "
                          "of two tokens of the same role group in different inputs (1 = as far as another input)")
_table_q2 = _report_table("drift_q2", {"metric": "drift_mean"}, _by_layer, ["format", "format_b"],
                          "1 − cos (mean) of the words of the single sentence (role 'all')", sep="→")
_table_q3 = _report_table("drift_q3", {"metric": "drift_mean"}, _at_last_layer, "k", "role",
                          "1 − cos (mean) between multi and concat at layer {L}, by k")
_table_q4 = _report_table("probes_pair", {"model_kind": "trained", "metric": ("accuracy", "macro_auc")}, _at_last_layer,
                          "choice", "target", "probe scores at layer {L} (accuracy; macro AUC for the bags of words bow_* "
                          "and fw_s1, 0.5 their frequency baseline; trained model)")
def _table_q5(T):
    """Macro AUC per sentence position: [CLS] and mean at the last layer, and the length-only probe."""
    if "probes_q5" not in T:
        return None
    d = pick(T["probes_q5"], metric="macro_auc")
    L = last_layer(d)
    d = d[(d["layer"] == L) | (d["choice"] == "length_only")]
    t = d.pivot_table(index="choice", columns="target", values="value", sort=False)
    return t.reset_index(), (f"bag-of-words macro AUC per sentence position at layer {L} (0.5: the frequency "
                             "baseline; length_only: a probe on the sentences' word counts alone, no layer)")
_table_q6 = _report_table("probes_q6", {"metric": "accuracy"}, _by_layer, ["target", "format"],
                          "probe accuracy of the classification token by layer and position")
_table_q7 = _report_table("probes_q7", {"metric": "accuracy"}, _by_layer, ["model_kind", "choice"],
                          "word-order (swapped) probe accuracy by layer")


def q8_same_items(f: pd.DataFrame) -> pd.DataFrame:
    """Per pooling of the fine-tuning table: fine-tuned and frozen accuracy over the out-of-fold test
    items (CIs over documents), the items each is scored on, whether they are the same items (equal
    counts, and the paired fine-tuned − frozen row matched that many), and the paired difference."""
    from .verdicts import format_interval, format_p_cell

    rows = []
    for pooling in dict.fromkeys(pick(f, metric="test_accuracy_mean")["pooling"]):
        ft = pick(f, metric="test_accuracy_mean", pooling=pooling).iloc[0]
        fr = pick(f, metric="frozen_test_accuracy_mean", pooling=pooling)
        d = pick(f, metric="accuracy_diff", pooling=pooling, condition="fine_tuned", pooling_b=pooling,
                 condition_b="frozen")
        fr = fr.iloc[0] if not fr.empty else None
        d = d.iloc[0] if not d.empty else None
        n_ft, n_fr = int(ft["n"]), int(fr["n"]) if fr is not None else None
        rows.append({
            "pooling": pooling,
            "fine-tuned": format_interval(float(ft["value"]), float(ft["ci_low"]), float(ft["ci_high"])),
            "frozen (same splits)": (format_interval(float(fr["value"]), float(fr["ci_low"]), float(fr["ci_high"]))
                                     if fr is not None else "not run"),
            "fine-tuned − frozen": (format_interval(float(d["value"]), float(d["ci_low"]), float(d["ci_high"]),
                                                    signed=True) if d is not None else "not run"),
            "p (Holm)": format_p_cell(float(d["p_holm"])) if d is not None else "–",
            "test items": n_ft,
            "same test items": bool(fr is not None and d is not None and n_ft == n_fr == int(d["n"])),
            "runs": int(ft["n_runs"]) if "n_runs" in ft and pd.notna(ft["n_runs"]) else None,
            "warning": str(ft["warning"]) if "warning" in ft and pd.notna(ft["warning"]) and ft["warning"] else "",
        })
    return pd.DataFrame(rows)


def _table_q8(T):
    if "finetune" not in T:
        return None
    t = q8_same_items(T["finetune"])
    if t.empty:
        return None
    return t, ("fine-tuned and frozen (a probe on the frozen encoder's pooled last layer) test accuracy per pooling, "
               "both on the same stratified document-grouped splits and the same out-of-fold test items (95% CIs "
               "over documents); fine-tuned − frozen paired per item, Holm over every accuracy_diff row")
