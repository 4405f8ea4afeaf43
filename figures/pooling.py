"""Q8: is [CLS] better than mean pooling, and after fine-tuning would any token do?

``plot_pooling`` draws, per pooling choice, the fine-tuned test accuracy (every run a dot) from
:mod:`analyses.finetune._experiment` (``analysis="finetune_pooling"``: ``pooling`` names the pooling,
``metric="test_accuracy"`` per run, ``"test_accuracy_mean"`` per pooling; tables written before that
column existed named it ``role`` and are read too) beside the frozen accuracy of the same token choice.
Tables of the current protocol carry their own frozen probe on the same splits
(``"frozen_test_accuracy_mean"``): both bars are then out-of-fold accuracies on identical test items
with 95% cluster-bootstrap CIs over the table's ``grouping`` (``n_runs`` runs each), and a ``frozen_df``
is not drawn. Older tables (one split, mean ± sd over seeds) are drawn as before, and ``frozen_df`` (rows
of :mod:`analyses.probes`, same target and format) adds the probe accuracy at the best or the last
layer, as the figure says.

CLI: ``python -m figures.pooling FINETUNE.csv --out figs/pooling [--frozen PROBES.csv
--frozen-layer best|last|<int>]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from figures import style
from figures.common import (add_note, base_parser, comma_list, data_color, legend_right, numeric, one_source,
                            order_roles, resampled_units, run_cli, select, title_for, unique_or_error)

ANALYSIS = "finetune_pooling"
BASELINE_COLOR = "#777777"


def _finetune_summary(ft: pd.DataFrame, what: str) -> pd.DataFrame:
    """pooling -> mean, sd, n from the summary rows, or computed from the per-seed rows."""
    seeds = ft[ft["metric"].astype(str) == "test_accuracy"]
    summ = ft[ft["metric"].astype(str) == "test_accuracy_mean"]
    if seeds.empty and summ.empty:
        select(ft, what, metric=["test_accuracy_mean", "test_accuracy"])  # raises, naming what is there
    if not summ.empty:
        sd = pd.to_numeric(summ["sd"], errors="coerce") if "sd" in summ.columns else pd.Series(np.nan, index=summ.index)
        runs = summ["n_runs"] if "n_runs" in summ.columns else summ["n"]
        out = pd.DataFrame({"mean": summ["value"].to_numpy(dtype=float), "sd": sd.to_numpy(dtype=float),
                            "n": pd.to_numeric(runs, errors="coerce").to_numpy(dtype=float),
                            "ci_low": pd.to_numeric(summ["ci_low"], errors="coerce").to_numpy(dtype=float),
                            "ci_high": pd.to_numeric(summ["ci_high"], errors="coerce").to_numpy(dtype=float)},
                           index=summ["pooling"].astype(str).to_numpy())
        missing_sd = ~np.isfinite(out["sd"].to_numpy())
        if missing_sd.any() and not seeds.empty:  # fill sd from the seeds where the summary lacks it
            by = seeds.groupby(seeds["pooling"].astype(str))["value"].std(ddof=1)
            out.loc[missing_sd, "sd"] = by.reindex(out.index[missing_sd]).to_numpy()
        return out
    g = seeds.groupby(seeds["pooling"].astype(str))["value"]
    return pd.DataFrame({"mean": g.mean(), "sd": g.std(ddof=1), "n": g.count().astype(float)})


def _frozen_points(frozen_df: pd.DataFrame, poolings: list[str], target: str, fmt: str | None, model: str | None,
                   layer: str | int, what: str) -> tuple[dict[str, pd.Series], list[str]]:
    """pooling -> the probe row picked (value, ci_low, ci_high, layer); notes on what was matched.
    Frozen rows: trained model only, the fine-tuned ``model`` if the table has it (else its only one)."""
    fz = numeric(select(frozen_df, what + " (frozen table)", analysis="probe", target=target, metric="accuracy"))
    notes = []
    if "model_kind" in fz.columns:
        fz = fz[fz["model_kind"].astype(str) != "random_init"]
    models = sorted(set(fz["model"].dropna().astype(str)))
    if model is not None and str(model) in models:
        fz = fz[fz["model"].astype(str) == str(model)]
    elif len(models) > 1:
        raise ValueError(f"{what}: the frozen table holds models {models} and none is the fine-tuned {model!r}")
    elif models and model is not None:
        notes.append(f"Frozen probes are from model {models[0]!r}, fine-tuning from {model!r}.")
    formats = sorted(set(fz["format"].dropna().astype(str)))
    if fmt is not None and fmt in formats:
        fz = fz[fz["format"].astype(str) == fmt]
    elif len(formats) == 1:
        if fmt is not None:
            notes.append(f"Frozen probes are from format {formats[0]!r}, fine-tuning from {fmt!r}.")
    elif formats:
        raise ValueError(f"{what}: the frozen table has formats {formats} and none is the fine-tuning format "
                         f"{fmt!r}; pass frozen rows of one format")
    out: dict[str, pd.Series] = {}
    for p in poolings:  # pooling names are the probes' token choices (analyses.selection)
        g = fz[fz["choice"].astype(str) == p]
        if isinstance(layer, (int, np.integer)):
            g = g[g["layer"] == float(layer)]
        if g.empty:
            continue
        if isinstance(layer, (int, np.integer)):
            row = g.iloc[0]
        elif layer == "last":
            row = g.loc[g["layer"].idxmax()]
        else:
            finite = g[np.isfinite(g["value"])]
            row = finite.loc[finite["value"].idxmax()] if not finite.empty else g.iloc[-1]
        out[p] = row
    if not out:
        raise ValueError(f"{what}: no frozen probe rows for the poolings {poolings} (target={target!r}); "
                         f"token choices present: {sorted(set(fz['choice'].dropna().astype(str)))}")
    return out, notes


def plot_pooling(finetune_df: pd.DataFrame, out: str | Path, frozen_df: pd.DataFrame | None = None,
                 frozen_layer: str | int = "best", target: str | None = None, format: str | None = None,
                 model: str | None = None, corpus: str | None = None) -> list[Path]:
    """Bar chart per pooling: fine-tuned test accuracy (mean, error bar ± 1 sd over seeds, seeds as
    dots) and, with ``frozen_df``, the frozen linear-probe accuracy of the same token choice (error
    bar: 95% CI over folds) at ``frozen_layer`` ("best": the best layer per choice, written above
    the bar; "last"; or a layer number); the majority baseline as a grey dashed line. A table with
    its own frozen rows (``frozen_test_accuracy_mean``) and no ``frozen_df`` draws those instead: both
    bars from the same splits and test items, error bars 95% CIs over ``grouping``, the pooled best
    constant as a dotted line and every recorded warning in the note (``frozen_df`` is then not drawn,
    as the note says: the same-split probe is the like-for-like comparison). ``target`` /
    ``format`` / ``model`` / ``corpus`` pick one when the fine-tuning table holds several. Writes
    ``out``.png / ``out``.pdf and returns both paths."""
    what = "pooling figure"
    if not (frozen_layer in ("best", "last") or isinstance(frozen_layer, (int, np.integer))):
        raise ValueError(f"frozen_layer must be 'best', 'last' or an int, got {frozen_layer!r}")
    if "pooling" not in finetune_df.columns and "role" in finetune_df.columns:  # a table of the old layout
        finetune_df = finetune_df.rename(columns={"role": "pooling"})
    ft = select(finetune_df, what, analysis=ANALYSIS, target=target, format=format)
    ft = numeric(one_source(ft, what, model, corpus))
    target = str(unique_or_error(ft, "target", what, option="target"))
    fmt = unique_or_error(ft, "format", what, option="format") if ft["format"].notna().any() else None
    summ = _finetune_summary(ft, what)
    summ = summ[summ.index != "majority"]
    poolings = order_roles(summ.index)
    seeds = ft[ft["metric"].astype(str) == "test_accuracy"]
    frozen, notes = ({}, [])
    same = ft[ft["metric"].astype(str) == "frozen_test_accuracy_mean"]  # frozen probe on the same splits
    paired = not same.empty
    if paired:
        frozen = {str(r["pooling"]): r for _, r in same.iterrows() if str(r["pooling"]) in poolings}
        frozen_layer = "same"
        if frozen_df is not None:
            notes.append("Frozen bars: the probe fitted on the fine-tuning splits (same test items); "
                         "the separate probe table is not drawn.")
    elif frozen_df is not None:
        ft_model = ft["model"].dropna().astype(str).iloc[0] if ft["model"].notna().any() else None
        frozen, notes = _frozen_points(frozen_df, poolings, target, fmt, ft_model, frozen_layer, what)
    fig, axes = style.new_figure(width=max(5.5, 1.0 * len(poolings) + 3.8) + (3.0 if paired else 0.0), height=4.2)
    ax = axes[0, 0]
    x = np.arange(len(poolings), dtype=float)
    w = 0.38 if frozen else 0.6
    xf = x - w / 2 if frozen else x
    means = summ.loc[poolings, "mean"].to_numpy(dtype=float)
    sds = summ.loc[poolings, "sd"].to_numpy(dtype=float)
    n_seeds = summ.loc[poolings, "n"]
    n_runs = int(np.nanmax(n_seeds)) if n_seeds.notna().any() else "?"
    if paired:  # out-of-fold accuracy with its CI over documents (examples without them)
        lo_ft = summ.loc[poolings, "ci_low"].to_numpy(dtype=float)
        hi_ft = summ.loc[poolings, "ci_high"].to_numpy(dtype=float)
        yerr = np.nan_to_num(np.vstack([np.clip(means - lo_ft, 0, None), np.clip(hi_ft - means, 0, None)]))
        label = f"fine-tuned ({n_runs} runs; 95% CI over {resampled_units(ft)})"
    else:
        yerr = np.where(np.isfinite(sds), sds, 0.0)
        label = f"fine-tuned (mean ± sd over {n_runs} seeds)"
    ax.bar(xf, means, width=w, color=data_color(0), alpha=0.85, label=label)
    ax.errorbar(xf, means, yerr=yerr, fmt="none", ecolor="black", capsize=4, linewidth=1.2)
    rng = np.random.default_rng(0)  # fixed jitter: the same table gives the same picture
    for i, p in enumerate(poolings):
        v = seeds.loc[seeds["pooling"].astype(str) == p, "value"].to_numpy(dtype=float)
        if len(v):
            ax.scatter(xf[i] + rng.uniform(-w / 4, w / 4, len(v)), v, s=12, color="black", zorder=3,
                       label=("one run (fold × seed)" if paired else "one seed") if i == 0 else None)
    if frozen:
        fv = np.array([float(frozen[p]["value"]) if p in frozen else np.nan for p in poolings])
        lo = np.array([float(frozen[p]["ci_low"]) if p in frozen else np.nan for p in poolings])
        hi = np.array([float(frozen[p]["ci_high"]) if p in frozen else np.nan for p in poolings])
        where_layer = {"best": "best layer", "last": "last layer"}.get(str(frozen_layer), f"layer {frozen_layer}")
        label = (f"frozen probe (same test items; 95% CI over {resampled_units(ft)})" if paired
                 else f"frozen linear probe ({where_layer}; 95% CI over folds)")
        ax.bar(x + w / 2, np.nan_to_num(fv), width=w, color=data_color(1), alpha=0.85, label=label)
        err = np.vstack([np.clip(fv - lo, 0, None), np.clip(hi - fv, 0, None)])
        ax.errorbar(x + w / 2, fv, yerr=np.nan_to_num(err), fmt="none", ecolor="black", capsize=4, linewidth=1.2)
        for i, p in enumerate(poolings):
            if not paired and p in frozen and np.isfinite(frozen[p]["layer"]):
                top = hi[i] if np.isfinite(hi[i]) else fv[i]
                ax.annotate(f"L{int(frozen[p]['layer'])}", (x[i] + w / 2, top), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=7)
        absent = [p for p in poolings if p not in frozen]
        if absent:
            notes.append("No frozen probe for " + ", ".join(absent) + ".")
    pooled_rows = ft["fold"].isna() if "fold" in ft.columns else pd.Series(True, index=ft.index)
    base = ft[(ft["metric"].astype(str) == "majority_baseline")]
    if not base.empty:
        ax.axhline(float(base["value"].mean()), color=BASELINE_COLOR, linestyle="--", linewidth=1.2,
                   label="majority baseline (training majority class)")
    best = ft[(ft["metric"].astype(str) == "best_constant") & pooled_rows]
    if not best.empty:
        ax.axhline(float(best["value"].mean()), color=BASELINE_COLOR, linestyle=":", linewidth=1.2,
                   label="best constant (largest test class)")
    warned = summ.index[summ.index.isin(poolings)]
    flagged = ft[ft["metric"].astype(str).isin(["test_accuracy_mean", "frozen_test_accuracy_mean"])]
    if "warning" in flagged.columns:
        for _, r in flagged[flagged["warning"].fillna("").astype(str) != ""].iterrows():
            if str(r["pooling"]) in warned:
                notes.append(f"Warning, {r['pooling']} ({r.get('condition', '')}): {r['warning']}.")
    ax.set_xticks(x, poolings)
    ax.set_xlabel("pooling / token choice (last layer for fine-tuning)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.05)
    ax.grid(True, axis="y", alpha=0.3)
    ax.grid(False, axis="x")
    h, lab = ax.get_legend_handles_labels()
    rank = {"fine": 0, "one ": 1, "froz": 2, "majo": 3, "best": 4}
    order = sorted(range(len(lab)), key=lambda i: rank.get(lab[i][:4], 4))
    legend_right(ax, [h[i] for i in order], [lab[i] for i in order])
    ax.set_title(title_for(ft, f"Pooling choices for {target!r}: fine-tuned vs frozen" if frozen
                           else f"Pooling choices for {target!r}: fine-tuned"), fontsize=10)
    if not np.isfinite(means).all():
        notes.append("NaN mean accuracy (no bar) for " + ", ".join(p for p, m in zip(poolings, means)
                                                                   if not np.isfinite(m)) + ".")
    if frozen and frozen_layer == "best" and not paired:
        notes.append("Frozen: best layer per choice (picked on the same scores, so optimistic).")
    add_note(fig, notes)
    return style.save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures.pooling",
                    "Plot fine-tuned accuracy per pooling choice (mean ± sd over seeds, seeds as dots), "
                    "optionally beside frozen linear-probe accuracy of the same token choice.")
    p.add_argument("--frozen", default=None, help="probe result table (same target) for the frozen bars")
    p.add_argument("--frozen-layer", default="best", help="best, last or a layer number (default best)")
    p.add_argument("--targets", default=None, help="the one task label to draw, when the table holds several")
    p.add_argument("--format", default=None, help="format, when the table holds several")

    def options(a):
        from analyses.results import read_table

        layer = int(a.frozen_layer) if a.frozen_layer.lstrip("-").isdigit() else a.frozen_layer
        targets = comma_list(a.targets)
        if targets is not None and len(targets) != 1:
            raise ValueError(f"--targets takes exactly one label here (one figure per target), got {a.targets!r}")
        return {"frozen_df": read_table(a.frozen) if a.frozen else None, "frozen_layer": layer,
                "target": targets[0] if targets else None, "format": a.format, "model": a.model, "corpus": a.corpus}

    return run_cli(p, plot_pooling, options, argv)


if __name__ == "__main__":
    sys.exit(main())
