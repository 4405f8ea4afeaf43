"""How contextual are the word representations, per layer (Ethayarajh 2019, Figs. 1-4 in one figure).

Rows of :mod:`analyses.contextuality` (``analysis="contextuality"``). Left panel: the raw measures,
anisotropy baseline (dashed black), self-similarity, intra-sentence similarity and maximum explainable
variance (MEV, uncentred as in the paper and centred as in the authors' code), each with its 95% CI
band. Right panel: the anisotropy-adjusted ones (raw − baseline;
MEV − the MEV of as many random words), with a line at 0.

CLI: ``python -m figures.contextuality TABLE.csv --out figs/contextuality [--format single]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from figures import style
from figures.common import (add_note, base_parser, ci_band, data_color, layer_ticks, nan_cells,
                            numeric, one_source, run_cli, select, suptitle, title_for, unique_or_error)

BASELINE = "anisotropy_baseline"
#: Metric -> (its legend label in the raw panel, that of ``<metric>_adjusted`` in the adjusted panel);
#: colours match between the panels.
LABELS: dict[str, tuple[str, str]] = {
    "self_similarity": ("self-similarity (same word, different contexts)",
                        "self-similarity − baseline"),
    "intra_similarity": ("intra-sentence similarity (word vs sentence mean)",
                         "intra-sentence similarity − baseline"),
    "mev": ("max. explainable variance (σ₁² share, uncentred: the paper)",
            "MEV − MEV of random words"),
    "mev_centred": ("MEV, centred (PCA ratio: the authors' code)",
                    "centred MEV − centred MEV of random words"),
}
#: Metric -> legend label, raw panel then adjusted panel.
RAW: dict[str, str] = {m: raw for m, (raw, _) in LABELS.items()}
ADJUSTED: dict[str, str] = {f"{m}_adjusted": adjusted for m, (_, adjusted) in LABELS.items()}


def _line(ax, g: pd.DataFrame, color: str, label: str, **kw) -> None:
    g = g.sort_values("layer")
    x = g["layer"].to_numpy()
    ax.plot(x, g["value"].to_numpy(), color=color, marker="o", markersize=3, linewidth=1.5, label=label, **kw)
    ci_band(ax, x, g["ci_low"], g["ci_high"], color)


def plot_contextuality(df: pd.DataFrame, out_stem: str | Path, format: str | None = None,
                       model: str | None = None, corpus: str | None = None) -> list[Path]:
    """Raw and anisotropy-adjusted contextuality measures per layer, with 95% CI bands; writes
    ``out_stem``.png (150 dpi) and ``out_stem``.pdf and returns both paths. ``format`` / ``model`` /
    ``corpus`` pick one when the table holds several (otherwise a ``ValueError`` lists them)."""
    what = "contextuality figure"
    d = numeric(one_source(select(df, what, analysis="contextuality"), what, model, corpus))
    d = select(d, what, format=format)
    fmt = unique_or_error(d, "format", what, option="format")
    for col in ("subword", "min_contexts", "max_contexts", "lowercase"):
        if col in d.columns and d[col].dropna().astype(str).nunique() > 1:
            raise ValueError(f"{what}: the table mixes several {col} settings {sorted(set(d[col].astype(str)))}; "
                             f"draw one at a time")
    present = set(d["metric"].astype(str))
    raw = [m for m in RAW if m in present]
    adj = [m for m in ADJUSTED if m in present]
    if not raw and not adj:
        raise ValueError(f"{what}: none of the metrics {list(RAW) + list(ADJUSTED)} in the table; "
                         f"metrics present: {sorted(present)}")
    fig, axes = style.new_figure(ncols=2, width=11.0, height=5.6)
    ax_raw, ax_adj = axes[0, 0], axes[0, 1]
    notes = []
    base = d[d["metric"] == BASELINE]
    if not base.empty:
        _line(ax_raw, base, "#000000", "anisotropy baseline (random word pairs)", linestyle="--")
    for i, m in enumerate(RAW):
        if m in raw:
            _line(ax_raw, d[d["metric"] == m], data_color(i), RAW[m])
    for i, m in enumerate(ADJUSTED):
        if m in adj:
            _line(ax_adj, d[d["metric"] == m], data_color(i), ADJUSTED[m])
    ax_adj.axhline(0.0, color="#000000", linewidth=0.8, linestyle=":", label="0 = no more than random words")
    lowest = float(np.nanmin(d.loc[d["metric"].isin([BASELINE] + raw), "ci_low"].fillna(0)))
    ax_raw.set_ylim(min(0.0, lowest) - 0.03, 1.03)
    for ax in (ax_raw, ax_adj):
        layer_ticks(ax, d["layer"].dropna())
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, fontsize=8, frameon=False)
    ax_raw.set_ylabel("mean cosine similarity, or variance share (0–1)")
    ax_adj.set_ylabel("measure − its random-word baseline")
    ax_raw.set_title("raw measures", fontsize=9)
    ax_adj.set_title("adjusted for anisotropy", fontsize=9)
    bad = nan_cells(d, ["metric"])
    if bad:
        notes.append(f"NaN (left as gaps): {bad}.")
    n = d.drop_duplicates("metric").set_index("metric")["n"] if "n" in d.columns else pd.Series(dtype=float)
    counts = []
    if "self_similarity" in n.index:
        mc = f" in ≥ {int(d['min_contexts'].iloc[0])} examples" if "min_contexts" in d.columns else ""
        counts.append(f"{int(n['self_similarity'])} word types{mc}")
    if "intra_similarity" in n.index:
        counts.append(f"{int(n['intra_similarity'])} sentences")
    if BASELINE in n.index:
        counts.append(f"{int(n[BASELINE])} random pairs")
    sub = f"{d['subword'].iloc[0]} subword" if "subword" in d.columns else ""
    notes.append("Bands: 95% bootstrap CIs (over word types for self-similarity and MEV, over examples for "
                 "intra-similarity and the baseline)." + (f" {', '.join(counts)}." if counts else "")
                 + (f" Word vector: {sub}." if sub else ""))
    suptitle(fig, title_for(d, f"How contextual are the word representations? (Ethayarajh 2019) — format {fmt}"))
    add_note(fig, notes)
    return style.save(fig, out_stem)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures.contextuality",
                    "Plot self-similarity, intra-sentence similarity and maximum explainable variance per "
                    "layer beside the anisotropy baseline, raw and adjusted (table of analyses.contextuality).")
    p.add_argument("--format", default=None, help="the format to draw, when the table holds several")
    return run_cli(p, plot_contextuality, lambda a: {"format": a.format, "model": a.model, "corpus": a.corpus}, argv)


if __name__ == "__main__":
    sys.exit(main())
