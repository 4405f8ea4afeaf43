"""One shared style for every figure: a colour-blind-safe palette, labelled axes, titles that say
model and corpus, and PNG (150 dpi) + PDF output.

Importing it changes no global state: no backend is chosen here. Without a display (no ``DISPLAY`` or
``WAYLAND_DISPLAY``), matplotlib falls back to the non-interactive Agg backend by itself, and every
figure is written to files with ``savefig`` and closed, never shown."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import matplotlib
import matplotlib.pyplot as plt

from probing.cache_writer import atomic_write

#: Okabe & Ito (2008) colour-blind-safe palette.
PALETTE: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
LINESTYLES: tuple[str, ...] = ("-", "--", "-.", ":")
DPI = 150

RC = {
    "figure.figsize": (6.4, 4.0),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.prop_cycle": matplotlib.cycler(color=list(PALETTE)),
}


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def new_figure(ncols: int = 1, nrows: int = 1, width: float | None = None, height: float | None = None,
               **kw):
    """A figure in the shared style; returns ``(fig, axes)``."""
    with plt.rc_context(RC):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width or 6.4 * ncols ** 0.8, height or 4.0 * nrows ** 0.9),
                                 squeeze=False, **kw)
    for ax in axes.flat:
        for k, v in RC.items():
            if k.startswith("axes.spines."):
                ax.spines[k.split(".")[-1]].set_visible(v)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    return fig, axes


def title(model: str | None, corpus: str | None, what: str) -> str:
    """``"what — model, corpus"``, the form every figure title takes."""
    parts = [p for p in (model, corpus) if p]
    if not parts:
        return what
    joined = ", ".join(parts)
    # a long corpus spec goes on its own line, so the title fits a single-panel figure
    return what + "\n" + (joined if len(joined) <= 70 else "\n".join(parts))


def layer_axis(ax, layers: Iterable[int]) -> None:
    layers = sorted(set(int(l) for l in layers))
    ax.set_xticks(layers)
    ax.set_xlabel("layer (0 = embeddings)")


def save(fig, out: str | os.PathLike) -> list[Path]:
    """Write ``out`` as PNG (150 dpi) and PDF (``out`` with or without a suffix), each atomically
    (:func:`probing.cache_writer.atomic_write`); returns both paths.
    Both files carry the figure's title (its suptitle, else its first panel's title) as metadata
    ``Title``, which the HTML report uses as the caption."""
    out = Path(out)
    base = out.with_suffix("") if out.suffix in (".png", ".pdf") else out
    base.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = [base.with_suffix(".png"), base.with_suffix(".pdf")]
    sup = getattr(fig, "_suptitle", None)  # Figure.get_suptitle() exists only from matplotlib 3.8
    texts = [sup.get_text() if sup is not None else ""] + [ax.get_title() for ax in fig.axes]
    # one line: the title's lines ("what" / "model, corpus") joined by a dash
    title = next((" — ".join(" ".join(l.split()) for l in t.splitlines() if l.strip()) for t in texts if t.strip()), "")
    meta = {"Title": title} if title else {}
    try:  # each file whole or not at all, with the umask's mode; a full disk is an error naming the file
        atomic_write(paths[0], lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, metadata=meta))
        atomic_write(paths[1], lambda tmp: fig.savefig(tmp, format="pdf", metadata=meta))
    finally:
        plt.close(fig)
    return paths
