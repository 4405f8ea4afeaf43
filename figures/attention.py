"""Attention mass to special tokens and sentences per layer (Clark et al. 2019, "What does BERT look
at?", Fig. 2 style) and per head (Q2, Q4).

Rows of :mod:`analyses.attention` (``analysis="attention"``, ``metric="attention_mass"``): ``role``
= source group, named in the token-choice grammar of :mod:`analyses.selection` (``cls``, ``sep1`` = the
[SEP] after sentence 1, ``s1 words``, ``all tokens``), ``target`` = where the mass goes (``cls``,
``sep1``, ``all [SEP]``, ``own sentence``, ``other sentences``, ``s1 words``, ...),
``layer`` 1..L, and ``head``: ``"mean"`` for the head average (bootstrap CI over ``grouping``) or
``"0"``..``"H-1"`` per head (no CI). Values are fractions of each query token's attention (0..1),
averaged over the source group's tokens.

CLI: ``python -m figures.attention TABLE.csv --out figs/attention [--format pair]`` or
``--heads [--targets "all [SEP]" --choices "s1 words"]`` for the layer × head heatmap.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np
import pandas as pd

from figures import style
from figures.common import (add_note, base_parser, ci_band, comma_list, data_color, interval_note, layer_ticks,
                            legend_right, nan_cells, numeric, one_source, order_roles, run_cli, select, suptitle,
                            title_for, unique_or_error, one_value)

METRIC = "attention_mass"
#: Targets drawn by :func:`plot_attention` by default, with fixed colours across panels.
DEFAULT_TARGETS: tuple[str, ...] = ("cls", "all [SEP]", "own sentence", "other sentences")
Y_LABEL = "attention mass (fraction)"
MAX_ANNOTATED = 13


def _rows(df: pd.DataFrame, what: str, model: str | None, corpus: str | None) -> pd.DataFrame:
    d = numeric(one_source(select(df, what, analysis="attention", metric=METRIC), what, model, corpus))
    head = d["head"].astype(str) if "head" in d.columns else pd.Series("mean", index=d.index)
    head = head.where(~head.isin(["<NA>", "nan", "None", ""]), "mean")  # no head given: the head average
    return d.assign(head=head.to_numpy(), role=d["role"].astype(str),
                    target=d["target"].astype(str), format=d["format"].astype(str))


def plot_attention(df: pd.DataFrame, out: str | Path, format: str | Sequence[str] | None = None,
                   targets: Sequence[str] = DEFAULT_TARGETS, sources: Sequence[str] | None = None,
                   max_cols: int = 3, model: str | None = None, corpus: str | None = None) -> list[Path]:
    """Head-averaged attention mass per layer: one panel per source group (row blocks per format),
    one line per target (default :data:`DEFAULT_TARGETS`, the same colour in every panel) with its
    95% CI band. ``format``: one format, a list, or None for every format in the table. Writes
    ``out``.png / ``out``.pdf and returns both paths."""
    what = "attention figure"
    rows = _rows(df, what, model, corpus)
    d = rows[rows["head"] == "mean"]
    if d.empty:
        raise ValueError(f"{what}: no head-average rows (head='mean'); heads present: {sorted(set(rows['head']))}")
    d = select(d, what, format=[format] if isinstance(format, str) else format, target=list(targets))
    if sources is not None:
        d = select(d, what, role=list(sources))
    formats = list(dict.fromkeys(d["format"]))
    src_by_fmt = {f: order_roles(d.loc[d["format"] == f, "role"]) if sources is None else list(sources)
                  for f in formats}
    # Special-token sources and word sources start their own rows, wrapped at ncols.
    kinds = {f: [[s for s in srcs if not s.endswith("words")], [s for s in srcs if s.endswith("words")]]
             for f, srcs in src_by_fmt.items()}
    ncols = min(max_cols, max(len(k) for ks in kinds.values() for k in ks))
    layout = [[(f, chunk[i:i + ncols]) for ks in [kinds[f]] for chunk in ks for i in range(0, len(chunk), ncols)]
              for f in formats]
    layout = [row for rows_f in layout for row in rows_f]
    nrows = len(layout)
    fig, axes = style.new_figure(ncols=ncols, nrows=nrows, width=3.4 * ncols + 1.9, height=2.7 * nrows + 0.9,
                                 sharey=True)
    colors = {t: data_color(i) for i, t in enumerate(targets)}
    used = set()
    notes = []
    missing = []
    for r, (f, srcs) in enumerate(layout):
        for c, src in enumerate(srcs):
            ax = axes[r, c]
            used.add((r, c))
            g_src = d[(d["format"] == f) & (d["role"] == src)]
            for t in targets:
                g = g_src[g_src["target"] == t].sort_values("layer")
                if g.empty:
                    missing.append((src, t))
                    continue
                x = g["layer"].to_numpy()
                ax.plot(x, g["value"].to_numpy(), color=colors[t], marker="o", markersize=2.5, linewidth=1.5, label=t)
                ci_band(ax, x, g["ci_low"], g["ci_high"], colors[t])
            ax.set_ylim(-0.02, 1.02)
            layer_ticks(ax, d["layer"].dropna(), label="layer")
            ax.set_title(f"from {src}" + (f" — {f}" if len(formats) > 1 else ""), fontsize=9)
            if c == 0:
                ax.set_ylabel(Y_LABEL)
            bad = nan_cells(g_src, ["target"])
            if bad:
                notes.append(f"{f}, from {src}: NaN (left as gaps) for {bad}.")
    for r in range(nrows):
        for c in range(ncols):
            if (r, c) not in used:
                axes[r, c].set_visible(False)
    # One legend for the figure, beside the top-right panel, with every target.
    handles = [matplotlib.lines.Line2D([], [], color=colors[t], marker="o", markersize=3, linewidth=1.5)
               for t in targets]
    legend_right(axes[0, ncols - 1], handles, [str(t) for t in targets], title="attention to")
    if missing:
        srcs_missing = sorted({s for s, t in missing if t in ("own sentence", "other sentences")})
        if srcs_missing:
            notes.append("'own sentence' / 'other sentences' apply to word groups only (none for "
                         + ", ".join(srcs_missing) + ").")
        other = sorted({f"{s} → {t}" for s, t in missing if t not in ("own sentence", "other sentences")})
        if other:
            notes.append("Not in the table: " + ", ".join(other[:8]) + (" ..." if len(other) > 8 else "") + ".")
    notes.append("Mean over heads; " + interval_note(d, lead="bands"))
    suptitle(fig, title_for(d, "Attention mass from each token group, per layer"))
    add_note(fig, notes)
    return style.save(fig, out)


def plot_attention_heads(df: pd.DataFrame, out: str | Path, target: str = "all [SEP]",
                         role: str | Sequence[str] | None = None, format: str | None = None,
                         max_cols: int = 3, model: str | None = None, corpus: str | None = None) -> list[Path]:
    """Per-head attention mass to ``target``: a layer × head heatmap (colour bar 0..1, values in the
    cells up to 13 × 13) for source group ``role`` — or one heatmap per source group when ``role``
    is None or a list. ``format`` must be given when the table holds several. Writes ``out``.png /
    ``out``.pdf and returns both paths."""
    what = "attention-heads figure"
    d = _rows(df, what, model, corpus)
    heads = d[d["head"] != "mean"]
    if heads.empty:
        raise ValueError(f"{what}: no per-head rows (head '0'..'H-1'); only head={sorted(set(d['head']))}; "
                         "run the attention analysis with per-head output")
    heads = select(heads, what, format=format, target=target, role=[role] if isinstance(role, str) else role)
    fmt = unique_or_error(heads, "format", what, option="format")
    srcs = order_roles(heads["role"]) if role is None or not isinstance(role, str) else [role]
    hnum = pd.to_numeric(heads["head"], errors="coerce")
    heads = heads.assign(head_num=hnum)
    ncols = min(max_cols, len(srcs))
    nrows = math.ceil(len(srcs) / ncols)
    H = int(np.nanmax(hnum)) + 1
    L = heads["layer"].nunique()
    cell = 0.32 if len(srcs) == 1 else 0.24
    # A narrow last column holds the colour bar, so tight_layout (in style.save) can place it.
    fig, grid = style.new_figure(ncols=ncols + 1, nrows=nrows, width=max(4.2, cell * H + 1.6) * ncols + 0.9,
                                 height=max(3.2, cell * L + 1.4) * nrows + 0.6,
                                 gridspec_kw={"width_ratios": [1.0] * ncols + [0.05]})
    axes, caxes = grid[:, :ncols], grid[:, ncols]
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    annotate = H <= MAX_ANNOTATED and L <= MAX_ANNOTATED and (len(srcs) == 1 or max(H, L) <= 8)
    im = None
    n_nan = 0
    for i, src in enumerate(srcs):
        ax = axes[i // ncols, i % ncols]
        ax.grid(False)
        g = heads[heads["role"] == src]
        mat = g.pivot_table(index="layer", columns="head_num", values="value", aggfunc="mean", dropna=False)
        mat = mat.reindex(columns=range(H)).sort_index()
        vals = mat.to_numpy(dtype=float)
        n_nan += int((~np.isfinite(vals)).sum())
        im = ax.imshow(np.ma.masked_invalid(vals), origin="lower", cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                       interpolation="nearest")
        layers = mat.index.to_numpy()
        step = 1 if len(layers) <= 13 else 2
        ax.set_yticks(range(0, len(layers), step), [str(int(v)) for v in layers[::step]])
        hstep = 1 if H <= 16 else 2
        ax.set_xticks(range(0, H, hstep), [str(h) for h in range(0, H, hstep)])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"from {src}", fontsize=9)
        if annotate:
            for r in range(vals.shape[0]):
                for c in range(vals.shape[1]):
                    v = vals[r, c]
                    dark = np.isfinite(v) and v <= 0.55
                    ax.text(c, r, "–" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center",
                            fontsize=6 if max(H, L) > 8 else 7, color="white" if dark else "black")
    for j in range(len(srcs), nrows * ncols):
        axes[j // ncols, j % ncols].set_visible(False)
    for cax in caxes[1:]:
        cax.set_visible(False)
    cb = fig.colorbar(im, cax=caxes[0])
    cb.ax.grid(False)
    cb.set_label(f"{Y_LABEL} to {target}", fontsize=9)
    cb.ax.tick_params(labelsize=8)
    head_title = title_for(heads, f"Attention mass to {target} per layer and head — format {fmt}")
    if len(srcs) == 1:
        axes[0, 0].set_title(head_title + f"\nfrom {srcs[0]}", fontsize=10)
    else:
        suptitle(fig, head_title)
    if n_nan:
        add_note(fig, [f"{n_nan} grey cell{'s' if n_nan != 1 else ''}: no value (NaN) in the table."])
    return style.save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures.attention",
                    "Plot attention mass from each token group to [CLS], the [SEP]s, its own sentence "
                    "and the other sentences per layer (default), or a layer × head heatmap (--heads).")
    p.add_argument("--format", default=None, help="format(s) to draw, comma list (default: all; --heads: needed "
                                                  "when the table holds several)")
    p.add_argument("--targets", default=None,
                   help="comma list of targets (default: " + ", ".join(DEFAULT_TARGETS) + "); --heads: the one "
                        "target (default 'all [SEP]')")
    p.add_argument("--choices", default=None,
                   help="comma list of source groups, e.g. cls,sep1,'s1 words' (default: every source)")
    p.add_argument("--heads", action="store_true", help="layer × head heatmap of the per-head rows")

    def plot(df, out, heads, **kw):
        return plot_attention_heads(df, out, **kw) if heads else plot_attention(df, out, **kw)

    def options(a):
        if a.heads:
            return {"heads": True, "target": one_value(a.targets, "--targets") if a.targets else "all [SEP]",
                    "role": comma_list(a.choices), "format": a.format, "model": a.model, "corpus": a.corpus}
        return {"heads": False, "format": comma_list(a.format), "targets": comma_list(a.targets) or DEFAULT_TARGETS,
                "sources": comma_list(a.choices), "model": a.model, "corpus": a.corpus}

    return run_cli(p, plot, options, argv)


if __name__ == "__main__":
    sys.exit(main())
