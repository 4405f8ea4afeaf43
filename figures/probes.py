"""Linear-probe accuracy per layer and token choice (Q4, Q6, Q7, Q8), and probe scores per sentence
position (Q5: does [CLS] hold the content of sentence i?).

Rows of :mod:`analyses.probes` (``analysis="probe"``): ``choice`` = token choice (``cls``, ``mean``,
``sep1``, ``pos3``, ...), ``target`` = what is predicted (``topic``, ``is_next``, ``bow_s1``, ...),
``metric`` (``accuracy`` / ``micro_f1`` primary; ``majority_baseline``, ``control_<metric>``,
``selectivity`` = task − control (Hewitt & Liang 2019), ``macro_auc``, ``chance_micro_f1``),
``value`` with its 95% interval in ``ci_low`` / ``ci_high`` (how it was computed: ``ci_method``, and
``grouping``, which the figures' notes read), and an optional ``model_kind``
column (``"trained"`` / ``"random_init"``: the same probe on a randomly initialised model).

CLI: ``python -m figures.probes TABLE.csv --out figs/probe_topic [--targets topic --metrics accuracy]``
or ``--position [--choices cls --targets bow_s1,bow_s2,... --layers best|last|<int>]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from figures import style
from figures.common import (MARKERS, add_note, interval_note, base_parser, ci_band, data_color, layer_ticks,
                            legend_right, nan_cells, numeric, one_source, order_roles, panel_grid, run_cli, select,
                            share_ylim, suptitle, table_layers, title_for, comma_list, one_value)

#: Metric -> axis label.
PROBE_LABELS: dict[str, str] = {
    "accuracy": "accuracy",
    "micro_f1": "micro-F1",
    "macro_auc": "macro ROC AUC",
    "selectivity": "selectivity (task − control)",
    "control_accuracy": "control-task accuracy",
    "control_micro_f1": "control-task micro-F1",
    "knn_accuracy": "nearest-neighbour label agreement",
}
BASELINE_COLOR = "#777777"
TRAINED, RANDOM = "trained", "random_init"


def _label(metric: str) -> str:
    return PROBE_LABELS.get(metric, metric.replace("_", " "))


#: The legend label of the length-only probe's level.
LENGTH_ONLY_LABEL = "length only (word counts, no layer)"


def _baseline_label(metric: str) -> str:
    """The legend label of the majority baseline: for the macro AUC it scores each word by its training
    frequency (one constant score per word: exactly 0.5)."""
    return "frequency baseline (0.5)" if metric == "macro_auc" else "majority baseline"


def _baseline_metric(d: pd.DataFrame, metric: str) -> str | None:
    """The majority-baseline metric on ``metric``'s scale present in ``d`` (None if none)."""
    names = [f"majority_baseline_{metric}", f"majority_{metric}"]
    if metric in ("accuracy", "micro_f1"):
        names.append("majority_baseline")
    present = set(d["metric"].astype(str))
    return next((m for m in names if m in present), None)


def _kinds(d: pd.DataFrame) -> pd.Series:
    if "model_kind" not in d.columns:
        return pd.Series(TRAINED, index=d.index)
    return d["model_kind"].astype(str).where(d["model_kind"].notna(), TRAINED)


def _probe_rows(df: pd.DataFrame, what: str, model: str | None, corpus: str | None) -> pd.DataFrame:
    """Probe rows with a ``kind`` column; one corpus and one trained model (``corpus`` / ``model``
    pick them); random-init rows are kept when their model name starts with the trained one's."""
    # nearest-neighbour tables (analyses.neighbours) share the layout and are drawn the same way
    d = numeric(one_source(select(df, what, analysis=["probe", "knn"]), what, corpus=corpus, check=("corpus",)))
    d = d.assign(kind=_kinds(d).to_numpy(), choice=d["choice"].astype(str),
                 format=d["format"].astype(str).where(d["format"].notna(), ""))
    trained = d[d["kind"] != RANDOM]
    if model is not None:
        select(trained, what, model=model)
        name = d["model"].astype(str)
        d = d[((d["kind"] != RANDOM) & (name == model)) | ((d["kind"] == RANDOM) & name.str.startswith(model))]
    else:
        models = trained["model"].dropna().astype(str).unique()
        if len(models) > 1:
            raise ValueError(f"{what}: the table holds several trained models {sorted(models)}; pick one with model=")
    return d


def _title_rows(d: pd.DataFrame) -> pd.DataFrame:
    t = d[d["kind"] != RANDOM]
    return t if not t.empty else d


def _style_handles(has_random: bool, baselines: list[tuple[str, dict]]) -> tuple[list, list]:
    handles = [Line2D([], [], color="black", linewidth=1.5), ]
    labels = ["trained model (band: 95% CI)"]
    if has_random:
        handles.append(Line2D([], [], color="black", linewidth=1.5, linestyle=":"))
        labels.append("random-init model")
    for label, kw in baselines:
        handles.append(Line2D([], [], **kw))
        labels.append(label)
    return handles, labels


_POOLED = re.compile(r"cls|mean|max|first_word|mean_s\d+")


def _role_groups(roles: list[str], max_lines: int) -> list[tuple[str, list[str]]]:
    """All roles in one group, or (more than ``max_lines``) pooled choices and single tokens apart,
    each cut into chunks of at most ``max_lines``."""
    if len(roles) <= max_lines:
        return [("", roles)]
    out = []
    for name, rs in (("pooled / [CLS]", [r for r in roles if _POOLED.fullmatch(r)]),
                     ("[SEP] / positions", [r for r in roles if not _POOLED.fullmatch(r)])):
        chunks = [rs[i:i + max_lines] for i in range(0, len(rs), max_lines)]
        out += [(name + (f" ({k + 1})" if len(chunks) > 1 else ""), c) for k, c in enumerate(chunks)]
    return out


CHANCE_LABEL = "chance (guess at training prevalence)"


def _draw_baselines(ax, d: pd.DataFrame, m: str, metric: str, base_metric: str | None, fmt: str,
                    chance_label: str = CHANCE_LABEL) -> list:
    """Majority (and chance) baseline on the metric panel, the zero line on the selectivity panel;
    returns ``[(label, line kwargs)]`` for the legend."""
    out = []
    if m == "selectivity":
        kw = dict(color=BASELINE_COLOR, linestyle="--", linewidth=1.0)
        ax.axhline(0.0, **kw)
        return [("no selectivity (= 0)", kw)]
    for name, label, ls in ((base_metric, _baseline_label(metric), "--"),
                            (f"chance_{metric}", chance_label, "-.")):
        if name is None:
            continue
        b = d[(d["metric"].astype(str) == name) & (d["format"] == fmt) & (d["kind"] != RANDOM)]
        b = b.groupby("layer")["value"].mean()
        if not b.empty:
            kw = dict(color=BASELINE_COLOR, linestyle=ls, linewidth=1.2)
            ax.plot(b.index.to_numpy(), b.to_numpy(), **kw)
            out.append((label, kw))
    # the length-only probe (the word counts of the input's sentences; no layer): one level for every layer
    lo = d[(d["choice"].astype(str) == "length_only") & (d["metric"].astype(str) == metric) & (d["format"] == fmt)
           & (d["kind"] != RANDOM)]
    if not lo.empty:
        kw = dict(color=BASELINE_COLOR, linestyle=(0, (6, 2, 1, 2)), linewidth=1.4)
        ax.axhline(float(lo["value"].iloc[0]), **kw)
        out.append((LENGTH_ONLY_LABEL, kw))
    return out


def plot_probes(df: pd.DataFrame, out: str | Path, target: str = "topic", metric: str = "accuracy",
                choices: Sequence[str] | None = None, model: str | None = None, selectivity: bool | None = None,
                max_lines: int = 6, corpus: str | None = None, heading: str | None = None,
                band_note: str | None = None, chance_label: str = CHANCE_LABEL) -> list[Path]:
    """Probe ``metric`` for ``target`` per layer: one colour per token choice (trained model solid
    with its CI band, random-init model the same colour dotted), the majority baseline grey dashed,
    one column per format, and a second row with selectivity (task − control) when the table has
    control rows. Writes ``out``.png / ``out``.pdf and returns both paths.

    ``choices`` keeps only those token choices; more than ``max_lines`` are split into rows of pooled
    choices (cls, mean, max, first_word, mean_s<i>) and single tokens ([SEP]s, positions), so no
    panel holds more than ``max_lines`` colours. ``selectivity``: add the selectivity row (None:
    when the table has it). ``model`` picks the trained model when the table holds
    several (random-init rows whose model name starts with it are kept). ``heading`` replaces the
    default title's first part ("Linear probes for ..."), ``band_note`` the note on what the bands
    are, ``chance_label`` the legend label of the ``chance_<metric>`` line (tables of other
    per-layer scores drawn in the same style, e.g. :mod:`analyses.neighbours`).
    """
    what = f"probe figure (target={target!r})"
    d = _probe_rows(df, what, model, corpus)
    d = select(d, what, target=target)
    rows = select(d, what, metric=metric)
    if choices is not None:
        rows = select(rows, what, choice=list(choices))
    role_list = order_roles(rows["choice"]) if choices is None else [str(r) for r in choices]
    formats = list(dict.fromkeys(rows["format"]))
    sel = d[(d["metric"].astype(str) == "selectivity") & d["choice"].isin(role_list)]
    show_sel = (not sel.empty and metric != "selectivity") if selectivity is None else bool(selectivity)
    if show_sel and sel.empty:
        select(d, what, metric="selectivity")  # raises, naming the metrics there
    base_metric = _baseline_metric(d, metric)
    has_random = (rows["kind"] == RANDOM).any()
    groups = _role_groups(role_list, max_lines)
    colors = {r: data_color(i) for _, rs in groups for i, r in enumerate(rs)}
    panels = [(metric, rows)] + ([("selectivity", sel)] if show_sel else [])
    per_panel = len(panels) * len(groups)
    fig, axes, where = panel_grid(len(formats), rows_per_panel=per_panel, max_cols=3, extra_w=2.2,
                                  panel_h=2.8 if per_panel > 2 else 3.0)
    notes: list[str] = []
    by_metric: dict[str, list] = {}
    for fi, fmt in enumerate(formats):
        for pi, (m, prow) in enumerate(panels):
            prow = prow[prow["format"] == fmt]
            for gi, (group_name, rs) in enumerate(groups):
                ax = where(fi, pi * len(groups) + gi)
                by_metric.setdefault(m, []).append(ax)
                for r in rs:
                    for kind, ls in ((TRAINED, "-"), (RANDOM, ":")):
                        g = prow[(prow["choice"] == r) & ((prow["kind"] == RANDOM) == (kind == RANDOM))]
                        g = g.sort_values("layer")
                        if g.empty:
                            continue
                        x = g["layer"].to_numpy()
                        ax.plot(x, g["value"].to_numpy(), color=colors[r], linestyle=ls, marker="o",
                                markersize=3 if kind == TRAINED else 0, linewidth=1.5 if kind == TRAINED else 1.1,
                                label=r if kind == TRAINED else None)
                        if kind == TRAINED:
                            ci_band(ax, x, g["ci_low"], g["ci_high"], colors[r])
                baselines = _draw_baselines(ax, d, m, metric, base_metric, fmt, chance_label)
                layer_ticks(ax, d["layer"].dropna())
                ax.set_ylabel(_label(m) if m != "selectivity" else f"selectivity ({_label(metric)} − control)")
                parts = [f"format {fmt}", group_name, "selectivity" if m != metric else ""]
                ax.set_title(" · ".join(p for p in parts if p), fontsize=9)
                if fi % 3 == 2 or fi == len(formats) - 1:
                    h, lab = ax.get_legend_handles_labels()
                    h2, lab2 = _style_handles(has_random, baselines)
                    legend_right(ax, h + h2, lab + lab2, title="token choice")
            bad = nan_cells(prow[prow["kind"] != RANDOM], ["choice"])
            if bad:
                notes.append(f"{fmt}, {m}: NaN (left as gaps) for {bad}.")
    for axs in by_metric.values():
        share_ylim(axs)
    if base_metric is None and metric != "selectivity" and band_note is None:
        notes.append(f"No majority-baseline rows for {metric}.")
    notes.append((band_note or interval_note(rows[rows["kind"] != RANDOM], default_method="t_folds"))
                 + (" Selectivity: task minus control-task score (Hewitt & Liang 2019)." if show_sel else ""))
    head = heading or f"Linear probes for {target!r}"
    suptitle(fig, title_for(_title_rows(rows), f"{head}: {_label(metric)} per layer"))
    add_note(fig, notes)
    return style.save(fig, out)


def _position(target: str) -> int | None:
    m = re.search(r"(\d+)$", str(target))
    return int(m.group(1)) if m else None


def plot_probe_position(df: pd.DataFrame, out: str | Path, metric: str = "micro_f1",
                        choice: str | Sequence[str] = "cls", targets: Sequence[str] | None = None,
                        layer: str | int = "best", target_prefix: str = "bow_s",
                        model: str | None = None, corpus: str | None = None) -> list[Path]:
    """Q5: probe ``metric`` for the content of sentence i (targets ``bow_s1`` ... ``bow_sk``) against
    the position i, one line per token choice and format, with CI error bars and the majority
    baseline; ``layer="best"`` takes each point at the layer where it scores best (layer written
    beside the point; an optimistic pick, said in the note), ``"last"`` the last layer, an int that
    layer. ``targets`` default: every target ``<target_prefix><i>`` in the table. Trained model
    only. Writes ``out``.png / ``out``.pdf and returns both paths.
    """
    what = "probe-position figure"
    if not (layer in ("best", "last") or isinstance(layer, (int, np.integer))):
        raise ValueError(f"layer must be 'best', 'last' or an int, got {layer!r}")
    choices = [choice] if isinstance(choice, str) else list(choice)
    d = _probe_rows(df, what, model, corpus)
    d = d[d["kind"] != RANDOM]
    if targets is None:
        pat = re.compile(re.escape(target_prefix) + r"\d+")
        targets = sorted({t for t in d["target"].dropna().astype(str) if pat.fullmatch(t)}, key=_position)
        if not targets:
            raise ValueError(f"{what}: no targets named {target_prefix}<i>; targets present: "
                             f"{sorted(set(d['target'].dropna().astype(str)))}; pass targets=")
    targets = [str(t) for t in targets]
    if any(_position(t) is None for t in targets):
        raise ValueError(f"{what}: every target must end in its sentence position, got {targets}")
    d = select(d, what, target=targets)
    rows = select(d, what, metric=metric, choice=choices)
    if isinstance(layer, (int, np.integer)):
        rows = select(rows, what, layer=float(layer))
    base_metric = _baseline_metric(d, metric)
    formats = list(dict.fromkeys(rows["format"]))
    lines = [(c, f) for c in choices for f in formats if ((rows["choice"] == c) & (rows["format"] == f)).any()]
    fig, axes = style.new_figure(width=6.4 + 1.8, height=4.2)
    ax = axes[0, 0]
    width = 0.25 / max(1, len(lines) - 1) if len(lines) > 1 else 0.0
    best_notes: list[str] = []
    base_pts: dict[str, dict[str, list[float]]] = {}
    for li, (c, f) in enumerate(lines):
        g = rows[(rows["choice"] == c) & (rows["format"] == f)]
        pts = []
        for t in targets:
            gt = g[g["target"].astype(str) == t]
            if gt.empty:
                continue
            if layer == "best":
                finite = gt[np.isfinite(gt["value"])]
                pick = finite.loc[finite["value"].idxmax()] if not finite.empty else gt.iloc[-1]
            elif gt["layer"].isna().all():  # a probe with no layer (the length-only baseline): its one row
                pick = gt.iloc[0]
            else:
                pick = gt.loc[gt["layer"].idxmax()] if layer == "last" else gt.iloc[0]
            pts.append((_position(t), pick))
            for name in (base_metric, f"chance_{metric}"):
                b = d[(d["metric"].astype(str) == str(name)) & (d["target"].astype(str) == t)
                      & (d["format"] == f) & (d["layer"] == pick["layer"])]
                if not b.empty:
                    base_pts.setdefault(str(name), {}).setdefault(t, []).append(float(b["value"].mean()))
        if not pts:
            continue
        x = np.array([p for p, _ in pts], dtype=float) + (li - (len(lines) - 1) / 2) * width
        v = np.array([float(r["value"]) for _, r in pts])
        lo = np.array([float(r["ci_low"]) for _, r in pts])
        hi = np.array([float(r["ci_high"]) for _, r in pts])
        yerr = np.vstack([np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)])
        label = c if len(formats) == 1 else f"{c} ({f})"
        ax.errorbar(x, v, yerr=yerr, color=data_color(li), marker=MARKERS[li % len(MARKERS)], markersize=4,
                    linewidth=1.5, capsize=3, label=label)
        if layer == "best":
            best_notes.append(f"{label}: " + ", ".join(f"s{p}→L{int(r['layer'])}" for p, r in pts
                                                       if np.isfinite(r["layer"])))
    for name, blabel, ls, marker in ((base_metric, _baseline_label(metric), "--", "x"),
                                     (f"chance_{metric}", CHANCE_LABEL, "-.", "+")):
        pts_b = base_pts.get(name, {})
        if pts_b:
            bx = [_position(t) for t in targets if t in pts_b]
            ax.plot(bx, [np.mean(pts_b[t]) for t in targets if t in pts_b], color=BASELINE_COLOR, linestyle=ls,
                    marker=marker, markersize=4, linewidth=1.2, label=blabel)
    positions = sorted({_position(t) for t in targets})
    ax.set_xticks(positions)
    ax.set_xlim(min(positions) - 0.5, max(positions) + 0.5)
    ax.set_xlabel("sentence position i (probe target: content of sentence i)")
    last = int(np.nanmax(rows["layer"])) if rows["layer"].notna().any() else "?"
    where_layer = {"best": "at each point's best layer", "last": f"at the last layer ({last})"}.get(
        str(layer), f"at layer {layer}")
    ax.set_ylabel(f"{_label(metric)} {where_layer if layer != 'best' else 'at best layer'}")
    h, lab = ax.get_legend_handles_labels()
    baseline_labels = (_baseline_label(metric), CHANCE_LABEL)
    order = sorted(range(len(lab)), key=lambda i: lab[i] in baseline_labels)
    legend_right(ax, [h[i] for i in order], [lab[i] for i in order],
                 title="token choice" + (" (format)" if len(formats) > 1 else ""))
    ax.set_title(title_for(rows, f"Sentence content in {', '.join(choices)} by position ({_label(metric)})"),
                 fontsize=10)
    notes = [f"Each point: {_label(metric)} {where_layer}; "
             + interval_note(rows, lead="error bars", default_method="t_folds")]
    if layer == "best":
        notes.append("Best layer per point (chosen on the same scores, so optimistic; layer='last' avoids "
                     "that), as s<i>→L<layer>: " + "; ".join(best_notes) + ".")
    if (rows["choice"] == "length_only").any():
        notes.append("length_only: a probe on the word counts of the input's sentences alone (no layer).")
    if rows["value"].isna().any():
        notes.append("NaN values are left out: " + nan_cells(rows, ["choice", "target"]) + ".")
    add_note(fig, notes)
    return style.save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures.probes",
                    "Plot probe scores per layer and token choice (default), or per sentence position "
                    "(--position, Q5: content of sentence i in [CLS]).")
    p.add_argument("--targets", default=None,
                   help="per-layer: the one probe target (default topic); --position: comma list of targets "
                        "(default the bow_s<i> present)")
    p.add_argument("--metrics", default=None, help="the one metric (default accuracy; micro_f1 with --position)")
    p.add_argument("--choices", default=None,
                   help="comma list of token choices (default: all per layer; cls with --position)")
    p.add_argument("--position", action="store_true", help="score against sentence position (Q5)")
    p.add_argument("--layers", default="best",
                   help="--position: best, last or one layer (-1 = the table's last) (default best)")

    def plot(df, out, position, **kw):
        if position:
            if kw["layer"] not in ("best", "last"):
                kw["layer"] = table_layers(df, kw["layer"])
                if len(kw["layer"]) != 1:
                    raise ValueError(f"--layers: --position takes best, last or one layer, got {kw['layer']}")
                kw["layer"] = kw["layer"][0]
            return plot_probe_position(df, out, **kw)
        return plot_probes(df, out, **kw)

    def options(a):
        metric = one_value(a.metrics, "--metrics") if a.metrics else None
        if a.position:
            return {"position": True, "metric": metric or "micro_f1", "choice": comma_list(a.choices) or ["cls"],
                    "targets": comma_list(a.targets), "layer": a.layers, "model": a.model, "corpus": a.corpus}
        target = one_value(a.targets, "--targets") if a.targets else "topic"
        return {"position": False, "target": target, "metric": metric or "accuracy",
                "choices": comma_list(a.choices), "model": a.model, "corpus": a.corpus}

    return run_cli(p, plot, options, argv)


if __name__ == "__main__":
    sys.exit(main())
