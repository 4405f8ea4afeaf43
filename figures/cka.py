"""CKA (Kornblith et al. 2019) between formats per layer, and layer × layer CKA matrices (Q1, Q4).

Two table shapes (``analysis="cka"``, ``metric`` in :data:`CKA_LABELS`):

* per layer: ``format`` / ``format_b`` the two formats, ``choice`` the token choice in A, ``choice_b`` the
  token choice in B, ``layer``; :func:`plot_cka_layers` draws x = layer, y = CKA, one line per
  choice → choice_b, one panel per format pair. Choice-vs-choice rows within one format (``format ==
  format_b``, e.g. ``sep1`` vs ``cls``) get their own panel, "within <format>".
* layer × layer: an extra integer column ``layer_b`` (the layer in B); :func:`plot_cka_heatmap`
  draws layer (A) on y, layer_b (B) on x, colour bar 0..1, values written in the cells up to 13 × 13.

CKA is undefined (NaN) where a representation has no variance, e.g. ``[CLS]`` at layer 0, identical
for every example: such points are left as gaps (grey cells) and listed in a note.

CLI: ``python -m figures.cka TABLE.csv --out figs/cka [--metrics linear_cka]`` (per layer) or
``python -m figures.cka TABLE.csv --out figs/cka_matrix --heatmap [--format pair --format-b nosep
--choices cls]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np
import pandas as pd

from figures import style
from figures.common import (add_note, base_parser, ci_band, data_color, layer_ticks, legend_right, nan_cells,
                            numeric, one_source, order_roles, panel_grid, run_cli, select, share_ylim, suptitle,
                            title_for, unique_or_error, comma_list)

#: Metric -> axis / colour-bar label; declared once for validation, CLI choices and labels.
CKA_LABELS: dict[str, str] = {
    "linear_cka": "linear CKA",
    "linear_cka_debiased": "linear CKA (debiased)",
    "rbf_cka": "RBF CKA",
}
MAX_ANNOTATED = 13
NAN_NOTE = "CKA undefined (a representation without variance, e.g. [CLS] at layer 0), left as gaps"


def _check_metric(metric: str) -> None:
    if metric not in CKA_LABELS:
        raise ValueError(f"metric must be one of {list(CKA_LABELS)}, got {metric!r}")


def _has_layer_b(df: pd.DataFrame) -> pd.Series:
    if "layer_b" not in df.columns:
        return pd.Series(False, index=df.index)
    return pd.to_numeric(df["layer_b"], errors="coerce").notna()


def _series_label(choice: str, choice_b: str) -> str:
    return choice if choice_b in ("", "nan", "<NA>", choice) else f"{choice} vs {choice_b}"


def plot_cka_layers(df: pd.DataFrame, out: str | Path, metric: str = "linear_cka",
                    choices: Sequence[str] | None = None, model: str | None = None,
                    corpus: str | None = None) -> list[Path]:
    """Per-layer CKA: x = layer, y = CKA, one line per choice (A) vs choice_b (B), one panel per format
    pair (``format == format_b``: choice vs choice within one format); CI bands where ``ci_low`` /
    ``ci_high`` exist; writes ``out``.png / ``out``.pdf and returns both paths.

    Uses the rows without ``layer_b``; a table holding only layer × layer rows is drawn from their
    diagonal (``layer == layer_b``), as the note says. ``choices`` keeps only those token choices (A).
    ``model`` / ``corpus`` pick one when the table holds several.
    """
    _check_metric(metric)
    what = "CKA per-layer figure"
    d = numeric(one_source(select(df, what, analysis="cka", metric=metric), what, model, corpus))
    notes = []
    flat = d[~_has_layer_b(d)]
    if flat.empty:
        lb = pd.to_numeric(d["layer_b"], errors="coerce")
        flat = d[lb == d["layer"]]
        notes.append("Drawn from the diagonal (layer = layer_b) of layer × layer rows.")
    if choices is not None:
        flat = select(flat, what, choice=list(choices))
    flat = flat.assign(format_b=flat["format_b"].fillna(flat["format"]).astype(str), format=flat["format"].astype(str),
                       choice_b=flat["choice_b"].astype(str).where(flat["choice_b"].notna(), ""),
                       choice=flat["choice"].astype(str))
    flat["series"] = [_series_label(r, t) for r, t in zip(flat["choice"], flat["choice_b"])]
    pairs = list(dict.fromkeys(zip(flat["format"], flat["format_b"])))
    # Cross-format panels first, then within-format comparisons.
    pairs.sort(key=lambda p: p[0] == p[1])
    series = order_roles(flat["series"])
    colors = {s: data_color(i) for i, s in enumerate(series)}
    fig, axes, where = panel_grid(len(pairs), max_cols=3)
    gaps: list[str] = []
    for pi, (fa, fb) in enumerate(pairs):
        ax = where(pi)
        g_pair = flat[(flat["format"] == fa) & (flat["format_b"] == fb)]
        for s in order_roles(g_pair["series"]):
            g = g_pair[g_pair["series"] == s].sort_values("layer")
            x = g["layer"].to_numpy()
            ax.plot(x, g["value"].to_numpy(), color=colors[s], marker="o", markersize=3, linewidth=1.5, label=s)
            ci_band(ax, x, g["ci_low"], g["ci_high"], colors[s])
        layer_ticks(ax, g_pair["layer"].dropna())
        ax.set_ylabel(f"{CKA_LABELS[metric]} (0–1)")
        ax.set_title(f"within {fa}: token vs token" if fa == fb else f"{fa} vs {fb}: same token choice", fontsize=9)
        lo = np.nanmin(g_pair["value"].to_numpy(dtype=float)) if g_pair["value"].notna().any() else 0.0
        ax.set_ylim(min(0.0, lo) - 0.03, 1.03)
        legend_right(ax, title="token choice (A vs B)")
        bad = nan_cells(g_pair, ["series"])
        if bad:
            gaps.append(f"{'within ' + fa if fa == fb else fa + ' vs ' + fb}: {bad}")
    share_ylim([where(i) for i in range(len(pairs))])
    if gaps:
        notes.append(f"{NAN_NOTE}: {'; '.join(gaps)}.")
    if flat[["ci_low", "ci_high"]].notna().any().any():
        notes.append("Bands: bootstrap CIs over examples.")
    suptitle(fig, title_for(flat, f"{CKA_LABELS[metric]} between representations, per layer"))
    add_note(fig, notes)
    return style.save(fig, out)


def plot_cka_heatmap(df: pd.DataFrame, out: str | Path, metric: str = "linear_cka", format: str | None = None,
                     format_b: str | None = None, choice: str | None = None, choice_b: str | None = None,
                     model: str | None = None, corpus: str | None = None) -> list[Path]:
    """Layer × layer CKA matrix: layer in A (``format``, ``choice``) on y, ``layer_b`` in B (``format_b``,
    ``choice_b``) on x, colour bar 0..1 (colour-blind-safe viridis), values in the cells when the matrix
    is at most 13 × 13, NaN cells grey. Options left ``None`` must be unique in the table (else a
    ``ValueError`` lists the choices). Writes ``out``.png / ``out``.pdf and returns both paths."""
    _check_metric(metric)
    what = "CKA heatmap"
    d = numeric(one_source(select(df, what, analysis="cka", metric=metric), what, model, corpus),
                ("layer", "layer_b", "value"))
    if "layer_b" not in d.columns or d["layer_b"].isna().all():
        raise ValueError(f"{what}: needs layer × layer rows (a non-null 'layer_b' column); the {metric} rows "
                         f"have none (columns: {list(df.columns)}); use plot_cka_layers for per-layer rows")
    d = d[d["layer_b"].notna()]
    d = select(d, what, format=format, format_b=format_b, choice=choice, choice_b=choice_b)
    fa = unique_or_error(d, "format", what)
    fb = unique_or_error(d, "format_b", what)
    ra = unique_or_error(d, "choice", what)
    tb = unique_or_error(d, "choice_b", what) if d["choice_b"].notna().any() else ra
    mat = d.pivot_table(index="layer", columns="layer_b", values="value", aggfunc="mean", dropna=False)
    mat = mat.sort_index().sort_index(axis=1)
    ys, xs, vals = mat.index.to_numpy(), mat.columns.to_numpy(), mat.to_numpy(dtype=float)
    n = max(len(ys), len(xs))
    side = min(9.0, max(4.2, 0.42 * n + 2.0))
    fig, axes = style.new_figure(width=side + 1.2, height=side + 0.3)
    ax = axes[0, 0]
    ax.grid(False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    im = ax.imshow(np.ma.masked_invalid(vals), origin="lower", cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    step = 1 if n <= 13 else (2 if n <= 26 else 4)
    ax.set_xticks(range(0, len(xs), step), [str(int(v)) for v in xs[::step]])
    ax.set_yticks(range(0, len(ys), step), [str(int(v)) for v in ys[::step]])
    ax.set_xlabel(f"layer in {fb} ({tb})  (0 = embeddings)")
    ax.set_ylabel(f"layer in {fa} ({ra})  (0 = embeddings)")
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.03)
    cb.set_label(f"{CKA_LABELS[metric]} (0–1)", fontsize=9)
    cb.ax.tick_params(labelsize=8)
    if len(ys) <= MAX_ANNOTATED and len(xs) <= MAX_ANNOTATED:
        size = 7 if n <= 9 else 6
        for i in range(len(ys)):
            for j in range(len(xs)):
                v = vals[i, j]
                txt = "NaN" if not np.isfinite(v) else f"{v:.2f}"
                ax.text(j, i, txt, ha="center", va="center", fontsize=size,
                        color="black" if not np.isfinite(v) or v > 0.55 else "white")
    ax.set_title(title_for(d, f"{CKA_LABELS[metric]}, layer × layer: {ra} in {fa} vs {tb} in {fb}"), fontsize=10)
    n_nan = int((~np.isfinite(vals)).sum())
    if n_nan:
        add_note(fig, [f"{n_nan} grey cell{'s' if n_nan != 1 else ''}: {NAN_NOTE}."])
    return style.save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures.cka",
                    "Plot CKA between formats / token choices per layer (default), or a layer × layer "
                    "CKA matrix (--heatmap; rows with a layer_b column).")
    p.add_argument("--metrics", default="linear_cka", choices=list(CKA_LABELS), metavar="METRIC",
                   help="the one CKA variant: " + ", ".join(CKA_LABELS) + " (default linear_cka)")
    p.add_argument("--heatmap", action="store_true", help="layer × layer matrix instead of per-layer lines")
    p.add_argument("--choices", default=None,
                   help="per-layer: comma list of token choices in A (default all); heatmap: the choice to draw, "
                        "or A,B for the choice in A and in B (needed when the table holds several)")
    for opt in ("format", "format-b"):
        p.add_argument(f"--{opt}", default=None, help=f"heatmap: the {opt.replace('-', '_')} to draw "
                                                      "(needed when the table holds several)")

    def plot(df, out, heatmap, **kw):
        return plot_cka_heatmap(df, out, **kw) if heatmap else plot_cka_layers(df, out, **kw)

    def options(a):
        if a.heatmap:
            choices = comma_list(a.choices) or [None]
            if len(choices) > 2:
                raise ValueError(f"--choices {a.choices!r}: a heatmap takes one choice, or two (A,B)")
            return {"heatmap": True, "metric": a.metrics, "format": a.format, "format_b": a.format_b,
                    "choice": choices[0], "choice_b": choices[-1], "model": a.model, "corpus": a.corpus}
        return {"heatmap": False, "metric": a.metrics, "choices": comma_list(a.choices),
                "model": a.model, "corpus": a.corpus}

    return run_cli(p, plot, options, argv)


if __name__ == "__main__":
    sys.exit(main())
