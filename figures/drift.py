"""Cosine drift between two formats per layer and role group (Q1, Q2, Q3), against the anisotropy
baseline.

``plot_drift`` reads the tidy table of :mod:`analyses.drift` (``analysis="drift"``) and draws, per
format pair, x = layer and y = the chosen drift metric (default ``drift_mean`` = mean of 1 − cos)
with one line per role group and its bootstrap CI band. The random-pair (anisotropy) baseline is
drawn on the same scale as a dashed black line: ``1 − anisotropy_baseline`` for drift metrics,
``anisotropy_baseline`` itself for cosine metrics (the baseline of all tokens, role ``all``), and the
level 1 for normalised drift (``(1 − cos) / (1 − baseline)``, each role group against the random-pair
baseline of its own tokens, where 1 means "as far apart as that group's tokens in two random inputs").
A second row of panels shows ``normalised_drift`` when the table has it.

CLI: ``python -m figures.drift TABLE.csv --out figs/drift [--metrics drift_mean] [--choices cls,sep1]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from figures import style
from figures.common import (add_note, interval_note, base_parser, ci_band, comma_list, data_color, layer_ticks,
                            legend_right, nan_cells, numeric, one_source, order_roles, panel_grid, run_cli, select,
                            share_ylim, suptitle, table_layers, title_for)

# --------------------------------------------------------------------------------------------------
# Drift

#: Metric -> y-axis label. Declared once: used for validation, the CLI choices and the labels.
DRIFT_LABELS: dict[str, str] = {
    "drift_mean": "drift, mean of 1 − cos",
    "drift_median": "drift, median of 1 − cos",
    "cosine_mean": "cosine, mean",
    "cosine_median": "cosine, median",
    "relative_l2_mean": "relative L2, mean ‖a − b‖ / ‖a‖",
    "relative_l2_median": "relative L2, median ‖a − b‖ / ‖a‖",
    "normalised_drift": "normalised drift, (1 − cos) / (1 − own baseline)",
    "normalised_drift_median": "normalised drift (median), (1 − cos) / (1 − own baseline)",
}
BASELINE = "anisotropy_baseline"


def _baseline_curve(metric: str, base: pd.DataFrame) -> tuple[str, Any] | None:
    """(label, (x, y, lo, hi)) of the random-pair baseline on ``metric``'s scale, or None."""
    if metric.startswith("normalised"):
        return "random-pair level (= 1)", None
    if base.empty:
        return None
    b = base.groupby("layer", sort=True)[["value", "ci_low", "ci_high"]].mean()
    x = b.index.to_numpy(dtype=float)
    if metric.startswith("drift"):
        return "random-pair baseline, all tokens (1 − mean cos)", (x, 1 - b["value"].to_numpy(),
                                                                   1 - b["ci_high"].to_numpy(),
                                                                   1 - b["ci_low"].to_numpy())
    if metric.startswith("cosine"):
        return "random-pair baseline, all tokens (mean cos)", (x, b["value"].to_numpy(), b["ci_low"].to_numpy(),
                                                   b["ci_high"].to_numpy())
    return None


def _role_sets(roles: list[str], max_lines: int) -> list[tuple[str, list[str]]]:
    """One panel row of all roles, or (many roles) special tokens and words in separate rows."""
    if len(roles) <= max_lines:
        return [("", roles)]
    special = [r for r in roles if not re.fullmatch(r"s\d+ words|all", r)]
    words = [r for r in roles if r not in special]
    return [(name, rs) for name, rs in (("special tokens", special), ("words", words)) if rs]


def _overlay(d: pd.DataFrame, rows: pd.DataFrame, roles: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Fold every format pair into one: role ``r`` of pair A → B becomes ``"r: A → B"``."""
    def fold(t: pd.DataFrame) -> pd.DataFrame:
        label = t["role"].astype(str) + ": " + t["format"].astype(str) + " → " + t["format_b"].astype(str)
        keep = t["metric"].astype(str) == BASELINE
        return t.assign(role=label.where(~keep, t["role"]), format="all", format_b="all")

    wanted = d["role"].astype(str).isin(roles) | (d["metric"].astype(str) == BASELINE)
    d2 = fold(d[wanted])
    rows2 = fold(rows)
    order = [f"{r}: {a} → {b}" for r in roles
             for a, b in dict.fromkeys(zip(rows["format"].astype(str), rows["format_b"].astype(str)))]
    present = set(rows2["role"])
    return d2, rows2, [r for r in order if r in present]


def plot_drift(df: pd.DataFrame, out: str | Path, metric: str = "drift_mean", roles: Sequence[str] | None = None,
               normalised: bool | None = None, max_lines: int = 7, model: str | None = None,
               corpus: str | None = None, log_scale: bool = True, overlay: bool = False) -> list[Path]:
    """Drift per layer and role group, one panel per format pair (A → B), with CI bands and the
    random-pair baseline; writes ``out``.png (150 dpi) and ``out``.pdf and returns both paths.
    ``overlay``: all format pairs in one panel, one line per (role group, pair) that has rows, with
    the baselines averaged over the pairs.

    ``df``: rows of :mod:`analyses.drift` (``analysis="drift"``; ``role`` = role group, ``format`` /
    ``format_b`` = the pair). ``metric``: a key of :data:`DRIFT_LABELS`. ``roles``: role groups to
    draw (default all, in reading order); more than ``max_lines`` are split into a special-token row
    and a word row. ``normalised``: add a row with ``normalised_drift`` (None: when the table has it).
    NaN values leave gaps and are listed in a note under the figure. ``model`` / ``corpus`` pick
    one when the table holds several. ``log_scale``: a symmetric-log y axis (linear below 1e-3), so
    drifts far below the random-pair baseline stay readable beside it.
    """
    if metric not in DRIFT_LABELS:
        raise ValueError(f"metric must be one of {list(DRIFT_LABELS)}, got {metric!r}")
    what = "drift figure"
    d = numeric(one_source(select(df, what, analysis="drift"), what, model, corpus))
    rows = select(d, what, metric=metric)
    if roles is not None:
        rows = select(rows, what, role=list(roles))
        role_list = [str(r) for r in roles]
    else:
        role_list = order_roles(rows["role"].dropna())
    if overlay:
        d, rows, role_list = _overlay(d, rows, role_list)
    # the dashed line: the baseline of all tokens (tables also hold each role group's own, which its
    # normalised drift is divided by)
    base = d[(d["metric"].astype(str) == BASELINE) & (d["role"].astype(str) == "all")]
    norm_metric = "normalised_drift"
    norm_rows = d[d["metric"].astype(str) == norm_metric]
    if normalised is True and norm_rows.empty:
        select(d, what, metric=norm_metric)  # raises, naming what is there
    show_norm = bool(normalised if normalised is not None else not norm_rows.empty) and metric != norm_metric

    pairs = list(dict.fromkeys(zip(rows["format"].astype(str), rows["format_b"].astype(str))))
    role_sets = _role_sets(role_list, max_lines)
    metrics = [metric] + ([norm_metric] if show_norm else [])
    per_panel = len(role_sets) * len(metrics)
    fig, axes, where = panel_grid(len(pairs), rows_per_panel=per_panel, max_cols=3)
    colors = {r: data_color(i) for _, rs in role_sets for i, r in enumerate(rs)}
    by_metric: dict[str, list] = {m: [] for m in metrics}
    notes: list[str] = []
    for pi, (fa, fb) in enumerate(pairs):
        pair_rows = d[(d["format"].astype(str) == fa) & (d["format_b"].astype(str) == fb)]
        pair_base = base[(base["format"].astype(str) == fa) & (base["format_b"].astype(str) == fb)]
        for mi, m in enumerate(metrics):
            mrows = pair_rows[pair_rows["metric"].astype(str) == m]
            for si, (set_name, rs) in enumerate(role_sets):
                ax = where(pi, mi * len(role_sets) + si)
                by_metric[m].append(ax)
                for r in rs:
                    g = mrows[mrows["role"].astype(str) == r].sort_values("layer")
                    if g.empty:
                        continue
                    x = g["layer"].to_numpy()
                    ax.plot(x, g["value"].to_numpy(), color=colors[r], marker="o", markersize=3, linewidth=1.5,
                            label=r)
                    ci_band(ax, x, g["ci_low"], g["ci_high"], colors[r])
                curve = _baseline_curve(m, pair_base)
                if curve is not None:
                    label, xy = curve
                    if xy is None:
                        ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2, label=label)
                    else:
                        ax.plot(xy[0], xy[1], color="black", linestyle="--", linewidth=1.2, label=label)
                        ci_band(ax, xy[0], xy[2], xy[3], "black", alpha=0.10)
                elif mi == 0 and pi == 0 and si == 0:
                    notes.append(f"No random-pair baseline drawn: {m} is not on the cosine scale"
                                 if not pair_base.empty or not m.startswith(("drift", "cosine"))
                                 else "No anisotropy_baseline rows in the table: no random-pair baseline drawn.")
                layer_ticks(ax, pair_rows["layer"].dropna())
                ax.set_ylabel(DRIFT_LABELS[m])
                head = "all format pairs (A → B)" if overlay else f"{fa} → {fb}"
                ax.set_title(head + (f" — {set_name}" if set_name else ""), fontsize=9)
                if pi % 3 == 2 or pi == len(pairs) - 1:
                    legend_right(ax, title="role group" + (": A → B" if overlay else ""))
            bad = nan_cells(mrows[mrows["role"].astype(str).isin(role_list)], ["role"])
            if bad:
                notes.append(f"{fa} → {fb}, {m}: NaN (left as gaps) for {bad}.")
    for axs in by_metric.values():
        share_ylim(axs)
        if log_scale:
            for ax in axs:
                ax.set_yscale("symlog", linthresh=1e-3)
                ax.set_ylim(bottom=0)
    suptitle(fig, title_for(rows, f"Drift of the same tokens between formats ({metric})"))
    notes.append(interval_note(rows[rows["metric"] != "anisotropy_baseline"])
                 + (" Symmetric-log y axis: linear below 0.001." if log_scale else ""))
    add_note(fig, notes)
    return style.save(fig, out)


def plot_drift_by_k(df: pd.DataFrame, out: str | Path, roles: Sequence[str] = ("cls", "all", "s1 words", "s2 words"),
                    layers: Sequence[int] | None = None, model: str | None = None,
                    corpus: str | None = None) -> list[Path]:
    """Drift against the number of segments ``k`` (a ``k`` column, as the study's Q3 table has): one
    panel per layer (default: the middle and the last), one line per role group with its CI band,
    raw drift above and normalised drift below. Writes ``out``.png / ``out``.pdf."""
    what = "drift-by-k figure"
    d = select(df, what, analysis="drift")
    # Each k is its own corpus (the first k sentences of the same groups): one source once that is cut off.
    d = d.assign(corpus=d["corpus"].astype(str).str.replace(r" \(first \d+ sentences\)$", "", regex=True))
    d = numeric(one_source(d, what, model, corpus), ("layer", "value", "ci_low", "ci_high", "k"))
    if "k" not in d.columns or d["k"].isna().all():
        raise ValueError(f"{what}: the table has no 'k' column")
    all_layers = sorted(d["layer"].dropna().astype(int).unique())
    layers = list(layers) if layers is not None else sorted({all_layers[len(all_layers) // 2], all_layers[-1]})
    metrics = [m for m in ("drift_mean", "normalised_drift") if (d["metric"].astype(str) == m).any()]
    if not metrics:
        select(d, what, metric="drift_mean")  # raises, naming what is there
    fig, axes = style.new_figure(ncols=len(layers), nrows=len(metrics), width=4.2 * len(layers) + 1.8,
                                 height=3.0 * len(metrics) + 0.9)
    colors = {r: data_color(i) for i, r in enumerate(roles)}
    for mi, m in enumerate(metrics):
        for li, layer in enumerate(layers):
            ax = axes[mi, li]
            g = d[(d["metric"].astype(str) == m) & (d["layer"] == layer)]
            for r in roles:
                gr = g[g["role"].astype(str) == r].sort_values("k")
                if gr.empty:
                    continue
                x = gr["k"].to_numpy(dtype=float)
                ax.plot(x, gr["value"].to_numpy(), color=colors[r], marker="o", markersize=3, linewidth=1.5, label=r)
                ci_band(ax, x, gr["ci_low"], gr["ci_high"], colors[r])
            base = d[(d["metric"].astype(str) == BASELINE) & (d["role"].astype(str) == "all")
                     & (d["layer"] == layer)].sort_values("k")
            if m == "normalised_drift":
                ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2, label="random-pair level (= 1)")
            elif not base.empty:
                ax.plot(base["k"].to_numpy(dtype=float), 1 - base["value"].to_numpy(), color="black", linestyle="--",
                        linewidth=1.2, label="random-pair baseline, all tokens (1 − mean cos)")
            ax.set_yscale("symlog", linthresh=1e-3)
            ax.set_ylim(bottom=0)
            ax.set_xticks(sorted(d["k"].dropna().unique()))
            ax.set_xlabel("k (sentences in the input)")
            ax.set_ylabel(DRIFT_LABELS[m])
            ax.set_title(f"layer {layer}", fontsize=9)
        legend_right(axes[mi, -1], title="role group")
    pairs = sorted({f"{a} → {b}" for a, b in zip(d["format"].astype(str), d["format_b"].astype(str))})
    suptitle(fig, title_for(d, f"Drift with k segments ({', '.join(pairs)})"))
    add_note(fig, [interval_note(d[d["metric"] != "anisotropy_baseline"])
                   + " Symmetric-log y axis: linear below 0.001."])
    return style.save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures.drift",
                    "Plot cosine drift between two formats per layer and role group (table of "
                    "analyses.drift), with 95% CI bands and the random-pair (anisotropy) baseline.")
    p.add_argument("--metrics", default="drift_mean", choices=list(DRIFT_LABELS), metavar="METRIC",
                   help="the one y metric: " + ", ".join(DRIFT_LABELS) + " (default drift_mean)")
    p.add_argument("--choices", default=None, help="comma list of role groups, e.g. cls,sep1,'s1 words' (default: all)")
    p.add_argument("--no-normalised", action="store_true", help="no second row with normalised_drift")
    p.add_argument("--linear", action="store_true", help="linear y axis (default: symmetric log)")
    p.add_argument("--overlay", action="store_true", help="every format pair in one panel (one line per role and pair)")
    p.add_argument("--by-k", action="store_true",
                   help="drift against the number of segments k (a table with a 'k' column, as the study's Q3)")
    p.add_argument("--layers", default=None,
                   help="--by-k: layers, one panel each: a comma list or a-b range, -1 = the table's last "
                        "(default middle, last)")

    def plot(df, out, by_k, **kw):
        if by_k:
            return plot_drift_by_k(df, out, roles=kw["roles"] or ("cls", "all", "s1 words", "s2 words"),
                                   layers=table_layers(df, kw["layers"]), model=kw["model"], corpus=kw["corpus"])
        kw.pop("layers")
        return plot_drift(df, out, **kw)

    return run_cli(p, plot, lambda a: {"by_k": a.by_k, "metric": a.metrics, "roles": comma_list(a.choices),
                                       "model": a.model, "corpus": a.corpus,
                                       "normalised": False if a.no_normalised else None, "log_scale": not a.linear,
                                       "overlay": a.overlay, "layers": a.layers},
                   argv)


if __name__ == "__main__":
    sys.exit(main())
