"""Figures of the fine-tuning protocol's tables (``finetune_protocol``, :func:`analyses.finetune.protocol_table`):
test accuracy per setting, fine-tuned beside the frozen probe, and a learning curve over training sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from figures import common, style

#: How each condition of the table is drawn: label, colour index, marker.
CONDITIONS = {"fine_tuned": ("fine-tuned (every weight)", 0, "o"), "frozen": ("frozen encoder + linear probe", 1, "s")}


def _accuracy(table: pd.DataFrame) -> pd.DataFrame:
    rows = table[table["metric"] == "accuracy"]
    if rows.empty:
        raise ValueError("the table has no accuracy rows")
    return common.numeric(rows, ("value", "ci_low", "ci_high", "n_train"))


def plot_settings(table: pd.DataFrame, out: str | Path, by: str, names: Mapping[str, str] | None = None,
                  what: str = "test accuracy") -> list[Path]:
    """Test accuracy of each setting along ``by`` (``format`` or ``pooling``), one panel per task, on each task's
    whole training split: fine-tuned and frozen side by side, with their 95% intervals (seeds and documents).
    ``names`` relabels the settings (``{"cls_last": "last"}``)."""
    acc = _accuracy(table)
    acc = acc[acc["n_train"] == acc.groupby("target")["n_train"].transform("max")]
    tasks = list(dict.fromkeys(acc["target"]))
    fig, axes = style.new_figure(ncols=len(tasks), width=3.6 * len(tasks) + 1.8, height=3.4)
    for ax, task in zip(axes.flat, tasks):
        part = acc[acc["target"] == task]
        order = list(dict.fromkeys(part[by]))
        x = np.arange(len(order))
        for cond, (label, ci, marker) in CONDITIONS.items():
            rows = part[part["condition"] == cond].set_index(by).reindex(order)
            if rows["value"].isna().all():
                continue
            shift = -0.1 if cond == "fine_tuned" else 0.1
            err = np.vstack([rows["value"] - rows["ci_low"], rows["ci_high"] - rows["value"]])
            ax.errorbar(x + shift, rows["value"], yerr=err, fmt=marker, color=style.color(ci), capsize=3, label=label)
        ax.set_xticks(x)
        ax.set_xticklabels([(names or {}).get(o, o) for o in order])
        ax.set_title(f"{task} (n_train {int(part['n_train'].max())})")
        ax.set_ylabel(what)
    common.legend_right(axes.flat[-1])
    model = table["model"].dropna().iloc[0] if table["model"].notna().any() else None
    corpus = table["corpus"].dropna().iloc[0] if table["corpus"].notna().any() else None
    common.suptitle(fig, style.title(model, corpus, f"{what} by {by}"))
    common.add_note(fig, ["Bars: 95% intervals over training seeds and test documents (two-stage bootstrap)."])
    return style.save(fig, out)


def plot_learning_curve(table: pd.DataFrame, out: str | Path, poolings: Sequence[str] = ("cls", "mean"),
                        what: str = "test accuracy") -> list[Path]:
    """Fine-tuned test accuracy against the number of training items for ``poolings``, one panel per task,
    with 95% bands (seeds and documents); the frozen probes as dashed lines."""
    acc = _accuracy(table)
    acc = acc[acc["pooling"].isin(poolings)]
    tasks = [t for t in dict.fromkeys(acc["target"]) if acc.loc[acc["target"] == t, "n_train"].nunique() > 1]
    if not tasks:
        raise ValueError("no task has more than one training size")
    fig, axes = style.new_figure(ncols=len(tasks), width=3.6 * len(tasks) + 1.8, height=3.4)
    for ax, task in zip(axes.flat, tasks):
        for i, p in enumerate(poolings):
            for cond, ls in (("fine_tuned", "-"), ("frozen", "--")):
                rows = acc[(acc["target"] == task) & (acc["pooling"] == p) & (acc["condition"] == cond)]
                rows = rows.sort_values("n_train")
                if rows.empty:
                    continue
                ax.plot(rows["n_train"], rows["value"], ls, marker="o", color=style.color(i),
                        label=f"{p} ({'fine-tuned' if cond == 'fine_tuned' else 'frozen'})")
                if cond == "fine_tuned":
                    common.ci_band(ax, rows["n_train"].to_numpy(float), rows["ci_low"], rows["ci_high"],
                                   style.color(i))
        ax.set_xscale("log")
        ax.set_xlabel("training items")
        ax.set_ylabel(what)
        ax.set_title(task)
    common.legend_right(axes.flat[-1])
    model = table["model"].dropna().iloc[0] if table["model"].notna().any() else None
    common.suptitle(fig, style.title(model, None, f"{what} by training size"))
    return style.save(fig, out)
