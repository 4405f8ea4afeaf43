"""Figures of the k-sentence readouts (Q3, Q5): content words per sentence position by format and k, the
interchange test, and the fine-tuned intruder task. Each reads one result table
(:mod:`analyses.sentence_content`; the study's ``q3_intruder``) and writes PNG + PDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from figures import style
from figures.common import add_note, data_color, legend_right, numeric, panel_grid, select, share_ylim, suptitle

#: Line style per token choice: [CLS] solid, mean pooling dashed, bertsum's own [CLS] dotted.
_CHOICE_STYLE = {"cls": "-", "mean": "--", "own_cls": ":"}
_FORMAT_ORDER = ("multi", "concat", "control", "bertsum")
_LENGTH = "#000000"


def _levels(df: pd.DataFrame, what: str) -> pd.DataFrame:
    d = select(df, what, analysis="sentence_content", metric="macro_auc")
    return numeric(d, ("value", "ci_low", "ci_high", "k", "position"))


def _line(ax, g: pd.DataFrame, label: str, color: str, ls: str, offset: float = 0.0) -> None:
    g = g.sort_values("position")
    x = g["position"].to_numpy(float) + offset
    y = g["value"].to_numpy(float)
    err = np.vstack([y - g["ci_low"].to_numpy(float), g["ci_high"].to_numpy(float) - y])
    ax.errorbar(x, y, yerr=np.where(np.isfinite(err), err, 0), color=color, ls=ls, marker="o", ms=3.5, lw=1.3,
                capsize=2, label=label)


def plot_content_by_k(df: pd.DataFrame, out: str | Path, choices=("cls", "mean")) -> list[Path]:
    """Q3: macro AUC of each sentence's content words (y) by sentence position (x), one panel per k, a line per
    format and token choice, the length-only probe in black. Writes ``out``.png / .pdf."""
    what = "content-by-k figure"
    d = _levels(df, what)
    ks = sorted(int(k) for k in d["k"].dropna().unique())
    fig, axes, where = panel_grid(len(ks), max_cols=3, panel_w=3.6, panel_h=3.0, extra_w=1.9)
    used = []
    for pi, k in enumerate(ks):
        ax = where(pi)
        dk = d[d["k"] == k]
        formats = [f for f in _FORMAT_ORDER if (dk["format"] == f).any()]
        n = 0
        for ci, f in enumerate(formats):
            for ch in choices:
                g = dk[(dk["format"] == f) & (dk["choice"] == ch)]
                if g.empty:
                    continue
                _line(ax, g, f"{f} {ch}", data_color(ci), _CHOICE_STYLE.get(ch, "-"), offset=(n - 2) * 0.04)
                n += 1
        g = dk[dk["choice"] == "length_only"]
        if not g.empty:
            _line(ax, g, "sentence lengths alone", _LENGTH, ":")
        ax.axhline(0.5, color="#999999", lw=0.8)
        ax.set_xticks(range(1, k + 1))
        ax.set_xlabel("sentence position i")
        ax.set_title(f"k = {k} sentences", fontsize=9)
        if pi % 3 == 0:
            ax.set_ylabel("macro AUC, content words of sentence i")
        used.append(ax)
    share_ylim(used)
    legend_right(used[-1])
    model, corpus = d["model"].iloc[0], d["corpus"].iloc[0]
    suptitle(fig, style.title(model, None, "Each sentence's content words read from a k-sentence input"))
    add_note(fig, [f"Frozen probes at layer {int(d['layer'].dropna().iloc[0])}, items of {corpus}; bars: 95% CI over "
                   "documents; grey line: 0.5, word frequency alone."])
    return style.save(fig, out)


def plot_content_by_position(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """Q5: at the largest k, macro AUC of each sentence's content words from multi's [CLS] and mean pooling,
    bertsum's own [CLS], and the length-only probe."""
    what = "content-by-position figure"
    d = _levels(df, what)
    K = int(d["k"].max())
    d = d[d["k"] == K]
    fig, axes = style.new_figure(width=6.4 + 1.9, height=4.0)
    ax = axes[0, 0]
    lines = [("multi", "cls", "multi [CLS]"), ("multi", "mean", "multi mean pooling"),
             ("bertsum", "own_cls", "bertsum's own [CLS]")]
    for i, (f, ch, label) in enumerate(lines):
        g = d[(d["format"] == f) & (d["choice"] == ch)]
        if not g.empty:
            _line(ax, g, label, data_color(i), _CHOICE_STYLE[ch], offset=(i - 1) * 0.05)
    g = d[d["choice"] == "length_only"]
    if not g.empty:
        _line(ax, g, "sentence lengths alone", _LENGTH, ":")
    ax.axhline(0.5, color="#999999", lw=0.8)
    ax.set_xticks(range(1, K + 1))
    ax.set_xlabel("sentence position i")
    ax.set_ylabel("macro AUC, content words of sentence i")
    legend_right(ax)
    ax.set_title(style.title(d["model"].iloc[0], None, f"What a {K}-sentence input's vectors hold of each sentence"))
    add_note(fig, ["Bars: 95% CI over documents; grey line: 0.5, word frequency alone."])
    return style.save(fig, out)


def plot_interchange(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """Q5: per sentence position, how far the readout follows a replaced sentence (AUC vs new words − vs old)
    and how much the other positions' readouts move (replaced input − clean), with 95% CIs."""
    what = "interchange figure"
    d = numeric(select(df, what, analysis="interchange"), ("value", "ci_low", "ci_high", "position"))
    fig, axes = style.new_figure(width=6.4 + 1.9, height=3.8)
    ax = axes[0, 0]
    for i, (metric, label) in enumerate((("interchange_follow", "sentence i replaced: follows the new words"),
                                         ("interchange_stay", "another sentence replaced: change of i's readout"))):
        g = d[d["metric"] == metric].sort_values("position")
        if g.empty:
            continue
        x = g["position"].to_numpy(float) + (i - 0.5) * 0.3
        y = g["value"].to_numpy(float)
        err = np.vstack([y - g["ci_low"].to_numpy(float), g["ci_high"].to_numpy(float) - y])
        ax.bar(x, y, width=0.3, color=data_color(i), label=label)
        ax.errorbar(x, y, yerr=np.where(np.isfinite(err), err, 0), fmt="none", color="#333333", capsize=2, lw=1)
    ax.axhline(0, color="#333333", lw=0.8)
    ax.set_xticks(sorted(int(p) for p in d["position"].dropna().unique()))
    ax.set_xlabel("sentence position i")
    ax.set_ylabel("difference of macro AUC")
    legend_right(ax)
    ax.set_title(style.title(d["model"].iloc[0], None, "Interchange: does the readout of sentence i track it?"))
    add_note(fig, ["95% CI over documents; the probes were fitted on the clean inputs' training folds."])
    return style.save(fig, out)


def plot_intruder(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """Q3: accuracy on the intruder task per format, fine-tuned and frozen, with 95% CIs and chance (50%)."""
    what = "intruder figure"
    d = numeric(select(df, what, analysis="intruder", metric="accuracy"), ("value", "ci_low", "ci_high"))
    formats = [f for f in _FORMAT_ORDER if (d["format"] == f).any()]
    fig, axes = style.new_figure(width=5.6 + 1.6, height=3.6)
    ax = axes[0, 0]
    for i, (frozen, label) in enumerate(((False, "fine-tuned"), (True, "frozen probe"))):
        g = d[d["frozen"].astype(bool) == frozen].set_index("format").reindex(formats)
        x = np.arange(len(formats)) + (i - 0.5) * 0.35
        y = g["value"].to_numpy(float)
        err = np.vstack([y - g["ci_low"].to_numpy(float), g["ci_high"].to_numpy(float) - y])
        ax.bar(x, y, width=0.35, color=data_color(i), label=label)
        ax.errorbar(x, y, yerr=np.where(np.isfinite(err), err, 0), fmt="none", color="#333333", capsize=2, lw=1)
    ax.axhline(0.5, color="#999999", lw=0.8, ls="--", label="chance")
    ax.set_xticks(range(len(formats)))
    ax.set_xticklabels(formats)
    ax.set_ylabel("accuracy (test items)")
    ax.set_ylim(0, 1)
    legend_right(ax)
    k = int(d["k"].dropna().iloc[0]) if "k" in d and d["k"].notna().any() else None
    ax.set_title(f"Is one of the {k} sentences an intruder?" if k else "Intruder task")
    add_note(fig, ["95% CI over training seeds and documents (frozen: documents)."])
    return style.save(fig, out)
