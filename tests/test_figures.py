"""Figures from synthetic tidy tables: files are written, PNGs are real multi-colour images, PDFs
are PDFs, the CLIs run, missing metrics are a ValueError naming what is there, NaN values do not
crash."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses.results import make_table, write_table

MODEL, CORPUS = "all-MiniLM-L6-v2", "toy-news"
LAYERS = range(7)  # embeddings + 6 layers


def _ci(rng, v, w):
    w = w * (0.6 + 0.8 * rng.random())
    return v - w, v + w


def drift_table(pairs=(("pair", "nosep"),), k: int = 2, seed: int = 0) -> pd.DataFrame:
    """Drift rows as analyses.drift writes them: role groups cls, sep1..k, s1..k words, all."""
    rng = np.random.default_rng(seed)
    roles = ["cls"] + [f"sep{i}" for i in range(1, k + 1)] + [f"s{i} words" for i in range(1, k + 1)] + ["all"]
    scale = {"cls": 0.25, "all": 0.08}
    rows = []
    for pi, (a, b) in enumerate(pairs):
        for layer in LAYERS:
            base = 0.2 + 0.08 * layer
            rows.append(dict(analysis="drift", model=MODEL, corpus=CORPUS, format=a, format_b=b, layer=layer,
                             role="all", target="", metric="anisotropy_baseline", value=base,
                             ci_low=base - 0.01, ci_high=base + 0.01, n=10000, seed=0, n_examples=200))
            for r in roles:
                s = scale.get(r, 0.15 if r.startswith("sep") else 0.04 * (1 + int(r[1]) if r[0] == "s" else 1))
                drift = 0.0 if layer == 0 and r.startswith("s") else s * (1 - np.exp(-layer / 3)) * (1 + 0.2 * pi)
                drift = min(drift + 0.005 * rng.random(), 0.99)
                for m, v in (("drift_mean", drift), ("cosine_mean", 1 - drift),
                             ("normalised_drift", drift / (1 - base)), ("relative_l2_mean", 1.3 * drift)):
                    lo, hi = _ci(rng, v, 0.01 + 0.05 * v)
                    rows.append(dict(analysis="drift", model=MODEL, corpus=CORPUS, format=a, format_b=b, layer=layer,
                                     role=r, target="", metric=m, value=v, ci_low=lo, ci_high=hi, n=500, seed=0,
                                     n_examples=200))
    df = make_table(rows)
    df["standardised"] = False
    df["subword"] = "first"
    return df


def cka_table(seed: int = 0, matrix: bool = True, layers=LAYERS) -> pd.DataFrame:
    """Per-layer CKA rows across formats (cls, mean) and within one format (sep1 vs cls / mean_s1),
    NaN for [CLS] at layer 0 (no variance), plus layer x layer rows with ``layer_b``."""
    rng = np.random.default_rng(seed)
    base = dict(analysis="cka", model=MODEL, corpus=CORPUS, metric="linear_cka", n=200, seed=0)
    rows = []
    n_layers = len(layers)
    for layer in layers:
        for role, target, fa, fb, v in (("cls", "cls", "pair", "nosep", 1 - 0.06 * layer),
                                        ("mean", "mean", "pair", "nosep", 1 - 0.02 * layer),
                                        ("sep1", "cls", "pair", "pair", 0.2 + 0.1 * layer),
                                        ("sep1", "mean_s1", "pair", "pair", 0.5 + 0.04 * layer)):
            v = np.nan if layer == 0 and "cls" in (role, target) else float(np.clip(v + 0.02 * rng.random(), 0, 1))
            rows.append(dict(base, format=fa, format_b=fb, layer=layer, role=role, target=target, value=v,
                             ci_low=v - 0.03, ci_high=min(v + 0.03, 1.0)))
    if matrix:
        for layer in layers:
            for lb in layers:
                v = np.nan if 0 in (layer, lb) else float(np.exp(-abs(layer - lb) / 3) * (1 - 0.02 * (layer + lb)))
                rows.append(dict(base, format="pair", format_b="nosep", layer=layer, layer_b=lb, role="cls",
                                 target="cls", value=v))
    assert n_layers > 0
    return make_table(rows)
