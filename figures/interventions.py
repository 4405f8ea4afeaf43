"""Effects of interventions (tables of :mod:`analyses.interventions`); reads tables only.

- :func:`plot_knockout_drift` (``analysis="intervention_drift"``): drift from the clean run per layer,
  one panel per role group, the knockout against its control with 95% CI bands; below, knockout − control
  over each group's spread between inputs (the quantity Q4's verdicts read), where the table has it.
- :func:`plot_knockout_probes` (``analysis="intervention_probes"``): change in probe accuracy per
  probed layer, knockout and control side by side with 95% CIs, one panel per target and mode.
- :func:`plot_patching` (``analysis="intervention_patching"``): the share of the drift a patch
  reproduces, per patch layer, and that of other interventions as bands, with 95% CIs.

CLI: ``python -m figures.interventions TABLE.csv --out PATH`` (the kind is read from the table's
``analysis`` column); also ``python -m figures interventions ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from figures import style
from probing.cli import ArgumentParser

_LABELS = {"treated": "knockout", "control": "control (random words, same size)"}


def _only(df: pd.DataFrame, analysis: str) -> pd.DataFrame:
    d = df[df["analysis"] == analysis]
    if d.empty:
        raise ValueError(f"the table holds no {analysis!r} rows; analyses present: {sorted(set(df['analysis']))}")
    return d


def _title(d: pd.DataFrame, what: str) -> str:
    return style.title(str(d["model"].iloc[0]), str(d["corpus"].iloc[0]), what)


def _err(d: pd.DataFrame) -> np.ndarray:
    v, lo, hi = (d[c].astype(float).to_numpy() for c in ("value", "ci_low", "ci_high"))
    return np.nan_to_num(np.vstack([v - lo, hi - v]))


def plot_knockout_drift(df: pd.DataFrame, out: str | Path, roles: Sequence[str] | None = None) -> list[Path]:
    """1 − cos between the clean and the intervened run per layer: ``drift_treated`` and
    ``drift_control`` per role group (default: every group in the table), 95% CI bands. Where the table has
    ``normalised_drift_difference`` rows, a second row of panels shows them: knockout − control over the
    group's spread between inputs, the quantity Q4's verdicts read. [CLS] hardly varies between inputs in a
    sentence encoder's middle layers, so its raw drift looks flat there whatever the knockout does."""
    d = _only(df, "intervention_drift")
    roles = list(roles) if roles is not None else list(dict.fromkeys(d["role"].astype(str)))
    norm = d[d["metric"] == "normalised_drift_difference"]
    fig, axes = style.new_figure(ncols=len(roles), nrows=2 if not norm.empty else 1)
    for ax, role in zip(axes[0], roles):
        r = d[d["role"].astype(str) == role]
        for i, name in enumerate(("treated", "control")):
            m = r[r["metric"] == f"drift_{name}"].sort_values("layer")
            if m.empty:
                continue
            x = m["layer"].astype(int).to_numpy()
            ax.plot(x, m["value"].astype(float), marker="o", color=style.color(i), label=_LABELS[name])
            ax.fill_between(x, m["ci_low"].astype(float), m["ci_high"].astype(float), color=style.color(i), alpha=0.2)
        style.layer_axis(ax, r["layer"].astype(int))
        ax.set_title(role)
        ax.set_ylabel("1 − cos (clean vs intervened)")
    axes[0][0].legend()
    if not norm.empty:
        for ax, role in zip(axes[1], roles):
            m = norm[norm["role"].astype(str) == role].sort_values("layer")
            m = m[pd.to_numeric(m["value"], errors="coerce").notna()]  # NaN: a group with no spread there
            if not m.empty:
                ax.errorbar(m["layer"].astype(int), m["value"].astype(float), yerr=_err(m), marker="o", ms=4,
                            capsize=3, color=style.color(2), label="knockout − control, over the spread")
                style.layer_axis(ax, m["layer"].astype(int))
            ax.axhline(0, color="black", lw=0.8)
            ax.set_title(f"{role}: over its spread between inputs")
            ax.set_ylabel("(knockout − control) / (1 − cos\nof two inputs)")
            ax.set_xlabel("layer (0 = embeddings)")
        axes[1][0].legend()
    fig.suptitle(_title(d, f"Drift under {d['intervention'].iloc[0]}"), fontsize=10)
    return style.save(fig, out)


def plot_knockout_probes(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """Change in out-of-fold probe accuracy (intervened − clean, per item) per probed layer: knockout and
    control with 95% CIs, one panel per target (columns) and mode (rows: transfer, retrain)."""
    d = _only(df, "intervention_probes")
    modes = list(dict.fromkeys(d["mode"].astype(str)))
    targets = list(dict.fromkeys(d["target"].astype(str)))
    fig, axes = style.new_figure(ncols=len(targets), nrows=len(modes), sharey=True)
    for row, mode in zip(axes, modes):
        for ax, target in zip(row, targets):
            m = d[(d["mode"].astype(str) == mode) & (d["target"].astype(str) == target)]
            layers = sorted(int(l) for l in m["layer"].dropna().unique())
            for i, name in enumerate(("treated", "control")):
                r = m[m["metric"] == f"change_{name}"].assign(layer=lambda t: t["layer"].astype(int))
                r = r.set_index("layer").reindex(layers).reset_index()
                if r["value"].isna().all():
                    continue
                ax.errorbar(np.array(layers) + (i - 0.5) * 0.12, r["value"].astype(float), yerr=_err(r), marker="o",
                            ms=4, capsize=3, color=style.color(i), label=_LABELS[name])
            ax.axhline(0, color="black", lw=0.8)
            style.layer_axis(ax, layers)
            ax.set_title(f"{target}: {m['choice'].iloc[0]}, probe {mode}" if not m.empty else target)
        row[0].set_ylabel("accuracy change (intervened − clean)")
    axes[0][0].legend()
    fig.suptitle(_title(d, f"Probe accuracy under {d['intervention'].iloc[0]}"), fontsize=10)
    return style.save(fig, out)


def plot_patching(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """``fraction_reproduced`` with its 95% CI: per patch layer for patched runs (a line), and as a
    horizontal band for every other intervention (e.g. a knockout of the middle [SEP])."""
    d = _only(df, "intervention_patching")
    f = d[d["metric"] == "fraction_reproduced"]
    patch = f[f["patch_layer"].notna()].sort_values("patch_layer")
    other = f[f["patch_layer"].isna()]
    fig, axes = style.new_figure()
    ax = axes[0][0]
    if not patch.empty:
        x = patch["patch_layer"].astype(int).to_numpy()
        ax.errorbar(x, patch["value"].astype(float), yerr=_err(patch), marker="o", capsize=3, color=style.color(0),
                    label=f"{d['role'].iloc[0]} patched at layer l")
        ax.set_xticks(x)
    for i, (_, r) in enumerate(other.iterrows(), start=1):
        ax.axhline(float(r["value"]), color=style.color(i), ls="--", label=str(r["intervention"]))
        ax.axhspan(float(r["ci_low"]), float(r["ci_high"]), color=style.color(i), alpha=0.15)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("patch layer l")
    ax.set_ylabel(f"share of the drift at layer {int(d['layer'].iloc[0])} reproduced")
    ax.legend()
    fig.suptitle(_title(d, f"{d['role'].iloc[0]}: {d['format'].iloc[0]} → {d['format_b'].iloc[0]}, share reproduced"),
                 fontsize=10)
    return style.save(fig, out)


KINDS = {"intervention_drift": plot_knockout_drift, "intervention_probes": plot_knockout_probes,
         "intervention_patching": plot_patching}


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m figures.interventions",
                       description="Figures of intervention effects (tables of analyses.interventions).")
    p.add_argument("table", help="CSV or Parquet table")
    p.add_argument("--out", required=True, help="output path without suffix (PNG and PDF are written)")
    args = p.parse_args(argv)
    try:
        from analyses.results import read_table

        df = read_table(args.table)
        kinds = [k for k in KINDS if k in set(df["analysis"])]
        if len(kinds) != 1:
            raise ValueError(f"{args.table}: expected rows of one of {list(KINDS)}, "
                             f"found {sorted(set(df['analysis']))}")
        paths = KINDS[kinds[0]](df, args.out)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(str(x) for x in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
