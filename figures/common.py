"""What every figure module shares: colours and markers for data, reading and checking a result table
(:func:`select`, :func:`numeric`, :func:`one_source`, :func:`title_for`, :func:`nan_cells`), layout
(:func:`panel_grid`, :func:`ci_band`, :func:`add_note`, :func:`legend_right`, :func:`layer_ticks`) and the
command line (:func:`base_parser`, :func:`run_cli`). ``figures.style`` is the shared look and is not
edited here.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from figures import style

from probing.cli import ArgumentParser

#: Data colours: the Okabe-Ito palette without black, which is kept for baselines. Yellow comes last
#: because it is faint on white.
DATA_COLORS: tuple[str, ...] = tuple(c for c in style.PALETTE if c != "#000000")
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X")
BAND_ALPHA = 0.18
LEGEND_FONTSIZE = 8
NOTE_FONTSIZE = 7


def data_color(i: int) -> str:
    """The i-th data colour (cycles through :data:`DATA_COLORS`)."""
    return DATA_COLORS[i % len(DATA_COLORS)]


def numeric(df: pd.DataFrame, columns: Iterable[str] = ("layer", "value", "ci_low", "ci_high")) -> pd.DataFrame:
    """A copy with ``columns`` (those present) as float64; NA and unparsable values become NaN."""
    out = df.copy()
    for c in columns:
        if c in out.columns:
            out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


def _present(df: pd.DataFrame, col: str, limit: int = 25) -> str:
    vals = sorted({str(v) for v in df[col].dropna().unique()}) if col in df.columns else []
    more = f" (+{len(vals) - limit} more)" if len(vals) > limit else ""
    return "[" + ", ".join(repr(v) for v in vals[:limit]) + "]" + more


def select(df: pd.DataFrame, what: str, **where: Any) -> pd.DataFrame:
    """Rows of ``df`` where every ``column == value`` (or ``value`` in a list/tuple/set), applied in order.

    ``None`` values are skipped. Raises ``ValueError`` naming the first condition no row meets,
    the conditions already applied, and the values the column does hold, e.g. ``drift figure: no rows
    with metric='drift_mean' (after analysis='drift'); metric values present: ['cosine_mean']``.
    """
    out = df
    applied: list[str] = []
    for col, val in where.items():
        if val is None:
            continue
        if col not in out.columns:
            raise ValueError(f"{what}: the table has no column {col!r}; columns: {list(df.columns)}")
        many = isinstance(val, (list, tuple, set, frozenset))
        keep = out[col].astype(str).isin([str(v) for v in val]) if many else out[col].astype(str) == str(val)
        keep = keep.fillna(False).astype(bool)
        if not keep.any():
            after = f" (after {', '.join(applied)})" if applied else ""
            raise ValueError(f"{what}: no rows with {col}={list(val) if many else val!r}{after}; "
                             f"{col} values present: {_present(out, col)}")
        out = out[keep]
        applied.append(f"{col}={list(val) if many else val!r}")
    return out


def unique_or_error(df: pd.DataFrame, col: str, what: str, option: str | None = None) -> Any:
    """The single non-null value of ``col``; ``ValueError`` listing them when there are several."""
    vals = [v for v in df[col].dropna().unique()] if col in df.columns else []
    if len(vals) != 1:
        hint = f"; pick one with {option or col}=" if len(vals) > 1 else ""
        raise ValueError(f"{what}: expected one {col}, found {len(vals)}: {_present(df, col)}{hint}")
    return vals[0]


def one_source(df: pd.DataFrame, what: str, model: str | None = None, corpus: str | None = None,
               check: Sequence[str] = ("model", "corpus")) -> pd.DataFrame:
    """Rows of one model and one corpus: those named, else the only ones. A table mixing several
    (columns in ``check``) without a choice is a ``ValueError`` listing them, since lines of
    different models or corpora must not be joined into one."""
    df = select(df, what, model=model, corpus=corpus)
    for col in check:
        if col in df.columns and df[col].dropna().astype(str).nunique() > 1:
            raise ValueError(f"{what}: the table holds several {col} values {_present(df, col)}; pick one with {col}=")
    return df


def _labels(df: pd.DataFrame, col: str) -> str | None:
    if col not in df.columns:
        return None
    vals = [str(v) for v in pd.unique(df[col].dropna()) if str(v).strip()]
    if not vals:
        return None
    return " / ".join(vals) if len(vals) <= 2 else f"{len(vals)} {col}s"


def title_for(df: pd.DataFrame, what: str) -> str:
    """:func:`figures.style.title` with the table's model(s) and corpus (corpora)."""
    return style.title(_labels(df, "model"), _labels(df, "corpus"), what)


def ci_band(ax, x: np.ndarray, lo: Any, hi: Any, color: str, alpha: float = BAND_ALPHA) -> bool:
    """Shade ``lo..hi`` over ``x`` where both are finite (NaN leaves a gap). Returns whether drawn."""
    lo = np.asarray(lo, dtype=float)
    hi = np.asarray(hi, dtype=float)
    ok = np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return False
    ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan), color=color, alpha=alpha,
                    linewidth=0, where=ok, interpolate=False)
    return True


def resampled_units(rows: pd.DataFrame) -> str:
    """The unit the bootstrap of ``rows`` resampled, in words, from their ``grouping`` column
    (:mod:`analyses.stats`): ``documents``, ``examples``, or both joined by ``or``; ``examples`` where
    the table does not say.

    >>> resampled_units(pd.DataFrame({"grouping": ["document", "document"]}))
    'documents'
    """
    units = list(dict.fromkeys(rows["grouping"].dropna().astype(str))) if "grouping" in rows.columns else []
    return " or ".join(f"{u}s" for u in units) or "examples"


def interval_note(rows: pd.DataFrame, lead: str = "Bands", default_method: str = "cluster_bootstrap") -> str:
    """What the intervals drawn from ``rows`` are, read from the rows themselves: their ``ci_method``
    (``cluster_bootstrap`` or ``t_folds``; ``default_method`` where the table has no such column) and,
    for a bootstrap, the unit it resampled (``grouping``: documents or examples; examples where the
    table does not say).

    >>> interval_note(pd.DataFrame({"ci_method": ["cluster_bootstrap"], "grouping": ["document"]}))
    'Bands: 95% cluster-bootstrap CIs over documents.'
    """
    methods = (set(rows["ci_method"].dropna().astype(str)) if "ci_method" in rows.columns else set()) \
        or {default_method}
    parts = []
    if methods - {"t_folds"}:
        parts.append(f"cluster-bootstrap CIs over {resampled_units(rows)}")
    if "t_folds" in methods:
        parts.append("t-intervals over cross-validation folds")
    return f"{lead}: 95% " + "; ".join(parts) + "."


def add_note(fig, lines: Sequence[str], width_chars: int | None = None) -> None:
    """Small italic note at the bottom left of the figure, e.g. which values are NaN.

    Drawn as the figure's ``supxlabel``: ``tight_layout`` (called by :func:`figures.style.save`)
    reserves its height, while an annotation under one axes would widen that axes' column.
    One note per figure (a second call replaces the first)."""
    lines = [ln for ln in lines if ln]
    if not lines:
        return
    width = width_chars or max(40, int(fig.get_figwidth() * 16))
    text = "\n".join(textwrap.fill(ln, width) for ln in lines)
    fig.supxlabel(text, x=0.01, ha="left", va="bottom", fontsize=NOTE_FONTSIZE, style="italic", color="#444444")


def legend_right(ax, handles=None, labels=None, title: str | None = None) -> None:
    """Legend outside the axes, on its right, so it never hides data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              fontsize=LEGEND_FONTSIZE, title=title, title_fontsize=LEGEND_FONTSIZE, frameon=False)


def layer_ticks(ax, layers: Iterable[float], label: str | None = None) -> None:
    """:func:`figures.style.layer_axis`, thinned to every 2nd/4th tick for deep models."""
    layers = sorted({int(l) for l in layers if np.isfinite(l)})
    if not layers:
        return
    style.layer_axis(ax, layers)
    step = 1 if len(layers) <= 13 else (2 if len(layers) <= 26 else 4)
    if step > 1:
        ax.set_xticks(layers[::step])
    if label is not None:
        ax.set_xlabel(label)


def nan_cells(df: pd.DataFrame, keys: Sequence[str], max_items: int = 6) -> str:
    """``"cls at layer 0; sep1 at layers 0, 1"`` for the rows whose value is NaN ('' if none)."""
    bad = df[~np.isfinite(df["value"].to_numpy(dtype=float))]
    if bad.empty:
        return ""
    parts = []
    for key, g in bad.groupby(list(keys), sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        name = " ".join(str(k) for k in key)
        ls = sorted({int(l) for l in g["layer"] if np.isfinite(l)}) if "layer" in g else []
        parts.append(f"{name} at layer{'s' if len(ls) != 1 else ''} {', '.join(map(str, ls))}" if ls else name)
    more = f"; +{len(parts) - max_items} more" if len(parts) > max_items else ""
    return "; ".join(parts[:max_items]) + more


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(s))]


def order_roles(roles: Iterable[str]) -> list[str]:
    """Role groups / token choices in reading order: cls, pooled choices (mean, max, first_word,
    mean_s<i>), sep<i>, sep_last, words by sentence, own / other sentences, pos<k>, others; ``all`` last."""
    def rank(r: str) -> tuple:
        r = str(r)
        for i, pat in enumerate([r"cls", r"\[CLS\]", r"mean", r"max", r"first_word", r"mean_s\d+",
                                 r"sep(\d.*)?", r"\[SEP\].*", r"sep_last", r"all \[SEP\]", r"s\d+ words",
                                 r"own sentence", r"other sentences", r"pos\d+"]):
            if re.fullmatch(pat, r):
                return (i, _natural(r))
        return (98 if r != "all" else 99, _natural(r))
    return sorted(dict.fromkeys(str(r) for r in roles), key=rank)


def panel_grid(n_panels: int, rows_per_panel: int = 1, max_cols: int = 3, panel_w: float = 4.8,
               panel_h: float = 3.0, extra_w: float = 1.6):
    """``(fig, axes, where)`` for ``n_panels`` panels wrapped at ``max_cols`` columns, each panel a
    stack of ``rows_per_panel`` axes; ``where(i, r)`` -> the axes of panel i, row r. ``extra_w``
    inches leave room for a legend on the right."""
    ncols = max(1, min(n_panels, max_cols))
    blocks = math.ceil(n_panels / ncols)
    nrows = blocks * rows_per_panel
    fig, axes = style.new_figure(ncols=ncols, nrows=nrows, width=panel_w * ncols + extra_w,
                                 height=panel_h * nrows + 0.9)

    def where(i: int, r: int = 0):
        return axes[(i // ncols) * rows_per_panel + r, i % ncols]

    for i in range(n_panels, blocks * ncols):
        for r in range(rows_per_panel):
            where(i, r).set_visible(False)
    return fig, axes, where


def share_ylim(axes: Sequence) -> None:
    """Give ``axes`` the union of their y-limits, so panels of one metric compare at a glance."""
    lims = [ax.get_ylim() for ax in axes]
    if len(lims) > 1:
        lo, hi = min(l[0] for l in lims), max(l[1] for l in lims)
        for ax in axes:
            ax.set_ylim(lo, hi)


def suptitle(fig, text: str) -> None:
    fig.suptitle(text, fontsize=10)


def run_cli(parser: argparse.ArgumentParser, plot: Callable[..., list[Path]],
            options: Callable[[argparse.Namespace], Mapping[str, Any]], argv: Sequence[str] | None) -> int:
    """Shared CLI body: read ``args.table`` (:func:`analyses.results.read_table`), call ``plot(df,
    args.out, **options(args))``, print the written paths; a ``ValueError`` exits 2 with its message."""
    from analyses.results import read_table

    args = parser.parse_args(argv)
    try:
        df = read_table(args.table)
        paths = plot(df, args.out, **options(args))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = ArgumentParser(prog=prog, description=description)
    p.add_argument("table", help="result table (CSV; a Parquet file beside it is read instead if present)")
    p.add_argument("--out", required=True, help="output path without suffix (writes OUT.png at 150 dpi and OUT.pdf)")
    p.add_argument("--model", default=None, help="the model to draw, when the table holds several")
    p.add_argument("--corpus", default=None, help="the corpus to draw, when the table holds several")
    return p


def comma_list(s: str | None) -> list[str] | None:
    return [x.strip() for x in s.split(",") if x.strip()] if s else None


def one_value(s: str, option: str) -> str:
    """The one item of a comma-list option that takes exactly one value here."""
    items = comma_list(s) or []
    if len(items) != 1:
        raise ValueError(f"{option} {s!r}: this figure takes exactly one value, got {len(items)}")
    return items[0]


def table_layers(df: pd.DataFrame, spec: str | None, option: str = "--layers") -> list[int] | None:
    """A layer spec (:mod:`probing.layers`; -1 = last) resolved against the layers a table holds, the
    largest of them counting as the last; None stays None (the figure's default)."""
    from probing.layers import resolve_layers

    if spec is None:
        return None
    have = sorted(int(x) for x in pd.to_numeric(df["layer"], errors="coerce").dropna().unique())
    if not have:
        raise ValueError(f"{option} {spec!r}: the table has no layer values")
    return resolve_layers(spec, have[-1], stored=have, option=option)
