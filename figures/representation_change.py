"""How far representations move under a change of input, per layer, as a percentage of the way to another input
(the ``representation_change`` table of :mod:`analyses.representation_change`; Q1's format change beside its
yardsticks, Q2's interchange in two formats).

``plot_change`` draws one panel per representation (a token group or a token choice), x = layer, y = the mean
share in percent (0 = unchanged, 100 = as far as another input), one line per change with its bootstrap band.

CLI: ``python -m figures change TABLE.csv --out figs/change [--representations words,cls]
[--changes concat,swap_words]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from figures import style
from figures.common import (base_parser, ci_band, comma_list, data_color, interval_note, layer_ticks, legend_right,
                            numeric, one_source, panel_grid, run_cli, select, add_note, suptitle, title_for)


def _representation(df: pd.DataFrame) -> pd.Series:
    role = df["role"].fillna("").astype(str) if "role" in df.columns else pd.Series("", index=df.index)
    choice = df["choice"].fillna("").astype(str) if "choice" in df.columns else pd.Series("", index=df.index)
    return role.where(role != "", choice)


def plot_change(df: pd.DataFrame, out, *, representations: Sequence[str] | None = None,
                changes: Sequence[str] | None = None, labels: Mapping[str, str] | None = None,
                names: Mapping[str, str] | None = None, what: str = "How far each representation moves",
                model: str | None = None, corpus: str | None = None) -> list[Path]:
    """One panel per representation (in ``representations`` order; default: every one in the table), one line
    per change (``changes``; default: all), y = share × 100. ``labels``: change -> legend text; ``names``:
    representation -> panel title. Returns the PNG and PDF paths."""
    d = select(df, "representation change figure", analysis="representation_change", metric="share")
    d = one_source(d, "representation change figure", model=model, corpus=corpus)
    d = numeric(d).assign(representation=_representation(d))
    reps = list(representations) if representations is not None else list(dict.fromkeys(d["representation"]))
    d = select(d, "representation change figure", representation=reps)
    chg = list(changes) if changes is not None else list(dict.fromkeys(d["change"].astype(str)))
    d = select(d, "representation change figure", change=chg)
    reps = [r for r in reps if (d["representation"] == r).any()]
    fig, _, where = panel_grid(len(reps), max_cols=min(3, len(reps)), panel_w=3.6, panel_h=2.8, extra_w=2.2)
    handles: dict[str, object] = {}  # legend entry per change, from whichever panel draws it
    for i, rep in enumerate(reps):
        ax = where(i)
        for j, c in enumerate(chg):
            rows = d[(d["representation"] == rep) & (d["change"].astype(str) == c)].sort_values("layer")
            if rows.empty:
                continue
            x = rows["layer"].to_numpy()
            color = data_color(j)
            (line,) = ax.plot(x, 100 * rows["value"].to_numpy(), marker="o", ms=3, color=color,
                              label=(labels or {}).get(c, c))
            handles.setdefault(c, line)
            ci_band(ax, x, 100 * rows["ci_low"].to_numpy(), 100 * rows["ci_high"].to_numpy(), color)
        ax.set_title((names or {}).get(rep, rep))
        layer_ticks(ax, d["layer"])
        ax.set_ylim(bottom=0)
        if i % 3 == 0:
            ax.set_ylabel("% of the way to another input")
    order = [c for c in chg if c in handles]
    legend_right(where(min(len(reps), 3) - 1), [handles[c] for c in order], [(labels or {}).get(c, c) for c in order])
    suptitle(fig, title_for(d, what))
    add_note(fig, [interval_note(d) + " 100% = as far as the same representation of another input (the spread)."])
    return style.save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser("python -m figures change", "How far representations move under a change of input, per layer, "
                                                "as a percentage of the way to another input")
    p.add_argument("--representations", default=None, help="comma list of token groups or choices (default: all)")
    p.add_argument("--changes", default=None, help="comma list of changes (default: all)")
    return run_cli(p, plot_change, lambda a: dict(representations=comma_list(a.representations),
                                                   changes=comma_list(a.changes), model=a.model, corpus=a.corpus),
                   argv)


if __name__ == "__main__":
    sys.exit(main())
