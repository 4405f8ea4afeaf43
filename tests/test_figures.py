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
            rows.append(dict(base, format=fa, format_b=fb, layer=layer, choice=role, choice_b=target, value=v,
                             ci_low=v - 0.03, ci_high=min(v + 0.03, 1.0)))
    if matrix:
        for layer in layers:
            for lb in layers:
                v = np.nan if 0 in (layer, lb) else float(np.exp(-abs(layer - lb) / 3) * (1 - 0.02 * (layer + lb)))
                rows.append(dict(base, format="pair", format_b="nosep", layer=layer, layer_b=lb, choice="cls",
                                 choice_b="cls", value=v))
    assert n_layers > 0
    return make_table(rows)


def probe_table(seed: int = 0, formats=("pair",), roles=("cls", "mean", "max", "sep1", "first_word", "pos3"),
                targets=("topic",), control: bool = True, random_init: bool = True, k: int = 5) -> pd.DataFrame:
    """Probe rows as analyses.probes writes them, trained and random-init, with majority baseline,
    control task and selectivity; ``bow_s<i>`` targets (multi-label) score micro_f1."""
    rng = np.random.default_rng(seed)
    rows = []
    kinds = ["trained"] + (["random_init"] if random_init else [])
    for fmt in formats:
        for target in targets:
            multi = target.startswith("bow_s")
            metric = "micro_f1" if multi else "accuracy"
            pos = int(target[5:]) if multi else 0
            for kind in kinds:
                model = MODEL if kind == "trained" else f"{MODEL} (random init, seed 0)"
                for ri, role in enumerate(roles):
                    for layer in LAYERS:
                        peak = 0.85 - 0.05 * ri - (0.08 * (pos - 1) if multi and role == "cls" else 0.0)
                        v = 0.35 + (peak - 0.35) * np.sin(np.pi * layer / 8) if kind == "trained" else 0.4 + 0.02 * ri
                        v = float(np.clip(v + 0.02 * rng.standard_normal(), 0, 1))
                        ctrl = 0.3 + 0.03 * layer
                        base = dict(analysis="probe", model=model, corpus=CORPUS, format=fmt, format_b="",
                                    layer=layer, choice=role, target=target, n=400, seed=0, model_kind=kind)
                        vals = [(metric, v, 0.04), ("majority_baseline", 0.34 if not multi else 0.1, 0.01)]
                        if control:
                            vals += [(f"control_{metric}", ctrl, 0.03), ("selectivity", v - ctrl, 0.05)]
                        if multi:
                            vals += [("chance_micro_f1", 0.2, 0.01), ("macro_auc", 0.5 + v / 2, 0.02)]
                        for m, val, w in vals:
                            lo, hi = _ci(rng, val, w)
                            rows.append(dict(base, metric=m, value=val, ci_low=lo, ci_high=hi))
    return make_table(rows)


def attention_table(seed: int = 0, formats=("pair",), k: int = 2, heads: int = 12, layers=range(1, 7)) -> pd.DataFrame:
    """Attention rows as analyses.attention writes them: head means with CIs and per-head values."""
    rng = np.random.default_rng(seed)
    sources = ["cls"] + [f"sep{i}" for i in range(1, k + 1)] + [f"s{i} words" for i in range(1, k + 1)]
    rows = []
    for fmt in formats:
        for layer in layers:
            for src in sources:
                sep = 0.1 + 0.7 * np.exp(-((layer - 4.5) ** 2) / 3)
                cls = 0.05 + 0.03 * layer
                own = (1 - sep - cls) * 0.7
                other = 1 - sep - cls - own
                targets = {"cls": cls, "all [SEP]": sep}
                targets.update({f"sep{i}": sep / k for i in range(1, k + 1)})
                if src.endswith("words"):
                    targets.update({"own sentence": own, "other sentences": other})
                for tgt, v in targets.items():
                    base = dict(analysis="attention", model=MODEL, corpus=CORPUS, format=fmt, format_b="", layer=layer,
                                role=src, target=tgt, metric="attention_mass", n=200, seed=0)
                    lo, hi = _ci(rng, v, 0.02)
                    rows.append(dict(base, value=v, ci_low=lo, ci_high=hi, head="mean"))
                    for h in range(heads):
                        vh = float(np.clip(v * (0.4 + 1.2 * rng.random()), 0, 1))
                        rows.append(dict(base, value=vh, ci_low=np.nan, ci_high=np.nan, head=str(h)))
    return make_table(rows)


def pooling_table(seed: int = 0, poolings=("cls", "mean", "max", "sep1", "first_word", "pos3"), seeds=(0, 1, 2),
                  label: str = "topic", summary: bool = True) -> pd.DataFrame:
    """Fine-tuning rows as analyses.finetune._experiment writes them: per-seed accuracy, per-pooling summary
    with ``sd``, one majority-baseline row."""
    rng = np.random.default_rng(seed)
    base = dict(analysis="finetune_pooling", model=MODEL, corpus=CORPUS, format="pair", format_b="", layer=6,
                target=label)
    rows = []
    for pi, p in enumerate(poolings):
        accs = [float(np.clip(0.88 - 0.01 * pi + 0.02 * rng.standard_normal(), 0, 1)) for _ in seeds]
        for s, a in zip(seeds, accs):
            rows.append(dict(base, pooling=p, condition="fine_tuned", metric="test_accuracy", value=a, n=300, seed=s,
                             n_train=1200))
        if summary:
            m, sd = float(np.mean(accs)), float(np.std(accs, ddof=1)) if len(accs) > 1 else np.nan
            rows.append(dict(base, pooling=p, condition="fine_tuned", metric="test_accuracy_mean", value=m,
                             ci_low=m - 2.5 * sd, ci_high=m + 2.5 * sd, n=len(seeds), sd=sd))
    rows.append(dict(base, condition="baseline", metric="majority_baseline", value=0.34, n=300))
    return make_table(rows)


# --------------------------------------------------------------------------------------------------
# Helpers


def check_outputs(paths, out):
    """Both files exist where asked; the PNG is a real, non-blank image; the PDF is a PDF."""
    import matplotlib.image as mpimg

    assert [p.suffix for p in paths] == [".png", ".pdf"]
    assert all(p.with_suffix("") == out for p in paths)
    png, pdf = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(png)
    assert img.ndim == 3 and img.shape[2] in (3, 4) and img.shape[0] > 200 and img.shape[1] > 200
    assert len(np.unique(img.reshape(-1, img.shape[2])[::7], axis=0)) > 10
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert pdf.stat().st_size > 1000


class Recorder(list):
    """The figures handed to ``style.save``, in order. Rendering is slow on small machines, so a
    figure is only written for real when ``render`` is set (once per kind, checked with
    :func:`check_outputs`); otherwise the figure is kept for inspection and closed."""

    render = False


@pytest.fixture()
def figs(monkeypatch):
    from pathlib import Path

    import matplotlib.pyplot as plt

    from figures import style

    kept = Recorder()
    original = style.save

    def save(fig, out):
        kept.append(fig)
        if kept.render:
            return original(fig, out)
        plt.close(fig)
        base = Path(out).with_suffix("")
        return [base.with_suffix(".png"), base.with_suffix(".pdf")]

    monkeypatch.setattr(style, "save", save)
    return kept


def render_once(figs, plot, out, *args, **kwargs):
    """``plot(*args, out, **kwargs)`` written for real; checks the files (:func:`check_outputs`)."""
    figs.render = True
    try:
        paths = plot(*args, out, **kwargs)
    finally:
        figs.render = False
    check_outputs(paths, out)
    return paths


def visible_axes(fig):
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def line_by_label(ax, label):
    found = [ln for ln in ax.get_lines() if ln.get_label() == label]
    assert found, f"no line {label!r} in {[ln.get_label() for ln in ax.get_lines()]}"
    return found[0]


def all_text(fig) -> str:
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return "\n".join(t for t in texts if t)


# --------------------------------------------------------------------------------------------------
# Drift


def test_drift_lines_and_baseline(tmp_path, figs):
    from figures.drift import plot_drift

    df = drift_table()
    # each role group's own baseline rows (what its normalised drift is divided by) do not move the dashed
    # line, which is the baseline of all tokens
    own = df[df.metric == "anisotropy_baseline"].assign(role="cls", value=0.999)
    render_once(figs, plot_drift, tmp_path / "drift", pd.concat([df, own], ignore_index=True))
    fig = figs[0]
    main_ax, norm_ax = visible_axes(fig)[:2]
    cls = df[(df.metric == "drift_mean") & (df.role == "cls")].sort_values("layer")
    np.testing.assert_allclose(line_by_label(main_ax, "cls").get_ydata(), cls["value"])
    base = df[df.metric == "anisotropy_baseline"].sort_values("layer")
    baseline = line_by_label(main_ax, "random-pair baseline, all tokens (1 − mean cos)")
    np.testing.assert_allclose(baseline.get_ydata(), 1 - base["value"].to_numpy())
    assert baseline.get_linestyle() == "--" and baseline.get_color() in ("black", "#000000", "k")
    assert line_by_label(norm_ax, "random-pair level (= 1)").get_ydata()[0] == 1.0
    norm = df[(df.metric == "normalised_drift") & (df.role == "s2 words")].sort_values("layer")
    np.testing.assert_allclose(line_by_label(norm_ax, "s2 words").get_ydata(), norm["value"])
    assert "1 − cos" in main_ax.get_ylabel() and main_ax.get_xlabel().startswith("layer")
    assert main_ax.get_legend() is not None
    assert MODEL in fig._suptitle.get_text() and CORPUS in fig._suptitle.get_text()
    # CI bands: one filled region per role group and one for the baseline, per panel
    assert len(main_ax.collections) == 6 + 1


def test_drift_cosine_metric_keeps_baseline_on_cosine_scale(tmp_path, figs):
    from figures.drift import plot_drift

    df = drift_table()
    plot_drift(df, tmp_path / "cos", metric="cosine_mean", normalised=False)
    (ax,) = visible_axes(figs[0])
    base = df[df.metric == "anisotropy_baseline"].sort_values("layer")["value"].to_numpy()
    np.testing.assert_allclose(line_by_label(ax, "random-pair baseline, all tokens (mean cos)").get_ydata(), base)
    assert ax.get_ylabel().startswith("cosine")


def test_drift_facets_format_pairs_and_splits_many_roles(tmp_path, figs):
    from figures.drift import plot_drift

    pairs = (("pair", "nosep"), ("pair", "nosep_seg"), ("single", "pair"))
    plot_drift(drift_table(pairs=pairs), tmp_path / "three")
    axes = visible_axes(figs[0])
    assert len(axes) == 6
    assert {ax.get_title() for ax in axes} == {"pair → nosep", "pair → nosep_seg", "single → pair"}
    lims = {ax.get_ylim() for ax in axes[:3]}
    assert len(lims) == 1, "panels of one metric share the y range"

    plot_drift(drift_table(k=5), tmp_path / "k5", normalised=False)
    special, words = visible_axes(figs[1])
    assert special.get_title().endswith("special tokens") and words.get_title().endswith("words")

    def data(ax):
        return [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("random")]

    assert data(special) == ["cls", "sep1", "sep2", "sep3", "sep4", "sep5"]
    assert data(words) == ["s1 words", "s2 words", "s3 words", "s4 words", "s5 words", "all"]


def test_drift_overlay_puts_every_format_pair_in_one_panel(tmp_path, figs):
    from figures.drift import plot_drift

    pairs = (("single", "pair"), ("single", "concat"), ("single2", "pair"))
    df = drift_table(pairs=pairs)
    render_once(figs, plot_drift, tmp_path / "overlay", df, roles=["s1 words", "s2 words"], overlay=True)
    main_ax, norm_ax = visible_axes(figs[0])
    labels = [ln.get_label() for ln in main_ax.get_lines() if not ln.get_label().startswith("random")]
    assert labels == [f"{r}: {a} → {b}" for r in ("s1 words", "s2 words") for a, b in pairs]
    want = df[(df.metric == "drift_mean") & (df.role == "s2 words") & (df.format == "single")
              & (df.format_b == "concat")].sort_values("layer")["value"]
    np.testing.assert_allclose(line_by_label(main_ax, "s2 words: single → concat").get_ydata(), want)
    # the baseline drawn is the mean of the pairs' baselines
    base = df[df.metric == "anisotropy_baseline"].groupby("layer")["value"].mean()
    baseline = line_by_label(main_ax, "random-pair baseline, all tokens (1 − mean cos)")
    np.testing.assert_allclose(baseline.get_ydata(), 1 - base)


def test_drift_by_k(tmp_path, figs):
    from figures.drift import plot_drift_by_k

    frames = []
    for k in (2, 3, 4):
        d = drift_table(pairs=(("multi", "concat"),), k=k, seed=k)
        d["k"] = k
        d["corpus"] = f"{CORPUS} (first {k} sentences)"
        frames.append(d)
    df = pd.concat(frames, ignore_index=True)
    own = df[df.metric == "anisotropy_baseline"].assign(role="cls", value=0.999)  # a group's own: not drawn
    render_once(figs, plot_drift_by_k, tmp_path / "byk", pd.concat([df, own], ignore_index=True), layers=[3])
    raw, norm = visible_axes(figs[0])
    base = df[(df.metric == "anisotropy_baseline") & (df.layer == 3)].sort_values("k")["value"]
    np.testing.assert_allclose(line_by_label(raw, "random-pair baseline, all tokens (1 − mean cos)").get_ydata(),
                               1 - base.to_numpy())
    want = df[(df.metric == "drift_mean") & (df.role == "cls") & (df.layer == 3)].sort_values("k")
    line = line_by_label(raw, "cls")
    np.testing.assert_allclose(line.get_xdata(), [2, 3, 4])
    np.testing.assert_allclose(line.get_ydata(), want["value"])
    assert raw.get_xlabel().startswith("k") and CORPUS in figs[0]._suptitle.get_text()
    assert line_by_label(norm, "random-pair level (= 1)").get_ydata()[0] == 1.0
    with pytest.raises(ValueError, match="no 'k' column"):
        plot_drift_by_k(drift_table(), tmp_path / "nok")


def test_drift_roles_option_and_nan_gaps(tmp_path, figs):
    from figures.drift import plot_drift

    df = drift_table()
    nan = (df.role == "cls") & df.layer.isin([0, 1]) & (df.metric == "drift_mean")
    df.loc[nan, ["value", "ci_low", "ci_high"]] = np.nan
    df.loc[df.role == "sep1", ["ci_low", "ci_high"]] = np.nan
    plot_drift(df, tmp_path / "nan", roles=["cls", "sep1"])
    ax = visible_axes(figs[0])[0]
    y = line_by_label(ax, "cls").get_ydata()
    assert np.isnan(y[:2]).all() and np.isfinite(y[2:]).all()
    assert [ln.get_label() for ln in ax.get_lines()][:2] == ["cls", "sep1"]
    assert "cls at layers 0, 1" in figs[0]._supxlabel.get_text()


def test_drift_missing_metric_or_analysis_is_a_clear_error(tmp_path):
    from figures.drift import plot_drift

    df = drift_table()
    with pytest.raises(ValueError, match=r"metric='drift_mean'.*values present: \[.*'cosine_mean'"):
        plot_drift(df[df.metric != "drift_mean"], tmp_path / "x")
    with pytest.raises(ValueError, match=r"analysis='drift'.*'cka'"):
        plot_drift(cka_table(), tmp_path / "x")
    with pytest.raises(ValueError, match="metric must be one of"):
        plot_drift(df, tmp_path / "x", metric="drift")
    with pytest.raises(ValueError, match=r"role=\['nope'\].*'s1 words'"):
        plot_drift(df, tmp_path / "x", roles=["nope"])
    with pytest.raises(ValueError, match="normalised_drift"):
        plot_drift(df[df.metric != "normalised_drift"], tmp_path / "x", normalised=True)
    assert not (tmp_path / "x.png").exists()


# --------------------------------------------------------------------------------------------------
# CKA


def test_cka_layers_lines_and_nan_note(tmp_path, figs):
    from figures.cka import plot_cka_layers

    df = cka_table()
    render_once(figs, plot_cka_layers, tmp_path / "cka", df)
    cross, within = visible_axes(figs[0])
    assert cross.get_title().startswith("pair vs nosep") and within.get_title().startswith("within pair")
    y = line_by_label(cross, "cls").get_ydata()
    assert len(y) == 7 and np.isnan(y[0]) and np.isfinite(y[1:]).all()
    flat = df[df.layer_b.isna() & (df.choice == "sep1") & (df.choice_b == "mean_s1")].sort_values("layer")
    np.testing.assert_allclose(line_by_label(within, "sep1 vs mean_s1").get_ydata(), flat["value"])
    assert "CKA" in cross.get_ylabel()
    note = figs[0]._supxlabel.get_text()
    assert "undefined" in note and "cls at layer 0" in note


def test_cka_layers_from_matrix_diagonal(tmp_path, figs):
    from figures.cka import plot_cka_layers

    df = cka_table()
    plot_cka_layers(df[df.layer_b.notna()], tmp_path / "diag")
    (ax,) = visible_axes(figs[0])
    diag = df[df.layer_b.notna() & (df.layer == df.layer_b)].sort_values("layer")["value"].to_numpy()
    np.testing.assert_allclose(line_by_label(ax, "cls").get_ydata(), diag)
    assert "diagonal" in figs[0]._supxlabel.get_text()


def test_cka_heatmap_values_annotation_and_nan(tmp_path, figs):
    from figures.cka import plot_cka_heatmap

    df = cka_table()
    render_once(figs, plot_cka_heatmap, tmp_path / "heat", df)
    ax = figs[0].axes[0]
    arr = ax.images[0].get_array()
    m = df[df.layer_b.notna()].pivot_table(index="layer", columns="layer_b", values="value", dropna=False)
    np.testing.assert_allclose(arr.filled(np.nan), m.to_numpy(), equal_nan=True)
    assert arr.mask[0].all() and arr.mask[:, 0].all() and not arr.mask[1:, 1:].any()
    assert ax.images[0].get_clim() == (0.0, 1.0)
    cells = [t.get_text() for t in ax.texts]
    assert len(cells) == 49 and cells.count("NaN") == 13 and f"{m.loc[3, 3]:.2f}" in cells
    assert "layer in pair" in ax.get_ylabel() and "layer in nosep" in ax.get_xlabel()
    assert "13 grey cells" in figs[0]._supxlabel.get_text()

    plot_cka_heatmap(cka_table(layers=range(14), matrix=True), tmp_path / "big")
    assert len(figs[1].axes[0].texts) == 0  # 14 x 14: too many cells to write values in


def test_cka_errors(tmp_path, figs):
    from figures.cka import plot_cka_heatmap, plot_cka_layers

    df = cka_table()
    with pytest.raises(ValueError, match=r"metric='rbf_cka'.*'linear_cka'"):
        plot_cka_layers(df, tmp_path / "x", metric="rbf_cka")
    with pytest.raises(ValueError, match="layer_b"):
        plot_cka_heatmap(df[df.layer_b.isna()], tmp_path / "x")
    two = pd.concat([df, df[df.layer_b.notna()].assign(choice="mean", choice_b="mean")])
    with pytest.raises(ValueError, match=r"expected one choice, found 2: \['cls', 'mean'\]; pick one with choice="):
        plot_cka_heatmap(two, tmp_path / "x")
    with pytest.raises(ValueError, match=r"no rows with choice='max'.*\['cls', 'mean'\]"):
        plot_cka_heatmap(two, tmp_path / "x", choice="max")
    plot_cka_heatmap(two, tmp_path / "ok", choice="mean", choice_b="mean")
    assert "mean in pair vs mean in nosep" in figs[0].axes[0].get_title()


# --------------------------------------------------------------------------------------------------
# Probes


def test_probes_trained_random_baseline_and_selectivity(tmp_path, figs):
    from figures.probes import plot_probes

    df = probe_table()
    render_once(figs, plot_probes, tmp_path / "p", df)
    acc, sel = visible_axes(figs[0])
    want = df[(df.metric == "accuracy") & (df.choice == "cls") & (df.model_kind == "trained")].sort_values("layer")
    cls = line_by_label(acc, "cls")
    np.testing.assert_allclose(cls.get_ydata(), want["value"])
    assert cls.get_linestyle() == "-"
    dotted = [ln for ln in acc.get_lines() if ln.get_linestyle() == ":" and ln.get_color() == cls.get_color()]
    rnd = df[(df.metric == "accuracy") & (df.choice == "cls") & (df.model_kind == "random_init")].sort_values("layer")
    assert len(dotted) == 1 and np.allclose(dotted[0].get_ydata(), rnd["value"])
    grey = [ln for ln in acc.get_lines() if ln.get_linestyle() == "--"]
    assert len(grey) == 1 and np.allclose(grey[0].get_ydata(), 0.34)
    legend = [t.get_text() for t in acc.get_legend().get_texts()]
    assert legend[:6] == ["cls", "mean", "max", "first_word", "sep1", "pos3"]
    assert {"majority baseline", "random-init model"} <= set(legend)
    want_sel = df[(df.metric == "selectivity") & (df.choice == "mean") & (df.model_kind == "trained")]
    want_sel = want_sel.sort_values("layer")
    np.testing.assert_allclose(line_by_label(sel, "mean").get_ydata(), want_sel["value"])
    assert "selectivity" in sel.get_ylabel() and acc.get_ylabel() == "accuracy"
    assert MODEL in figs[0]._suptitle.get_text() and "random init" not in figs[0]._suptitle.get_text()


def test_probes_without_control_or_random_and_with_many_choices(tmp_path, figs):
    from figures.probes import plot_probes

    plot_probes(probe_table(control=False, random_init=False), tmp_path / "plain")
    (ax,) = visible_axes(figs[0])
    assert not [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    roles = ("cls", "mean", "max", "sep1", "sep2", "first_word", "pos3", "pos5")
    plot_probes(probe_table(roles=roles, formats=("pair", "nosep")), tmp_path / "many", selectivity=False)
    axes = visible_axes(figs[1])
    assert len(axes) == 4  # 2 formats x (pooled choices, single tokens)
    for ax in axes:
        solid = {ln.get_label() for ln in ax.get_lines() if ln.get_linestyle() == "-"}
        assert 0 < len(solid) <= 6
    single = {ln.get_label() for ln in axes[2].get_lines() if ln.get_linestyle() == "-"}
    assert single == {"sep1", "sep2", "pos3", "pos5"}
    assert axes[2].get_title() == "format pair · [SEP] / positions"


def test_probes_draw_the_length_only_probe_as_one_level(tmp_path, figs):
    """A length-only probe (no layer) on the figure's target and metric is one horizontal level across the
    layers, named in the legend, and not drawn on the selectivity panel."""
    from figures.probes import LENGTH_ONLY_LABEL, plot_probes

    df = probe_table(roles=("cls", "mean"), random_init=False)
    row = df[(df.metric == "accuracy") & (df.choice == "cls") & (df.layer == 0)].assign(
        choice="length_only", layer=np.nan, value=0.61)
    plot_probes(pd.concat([df, row]), tmp_path / "length", choices=["cls", "mean"])
    acc, sel = visible_axes(figs[0])
    level = [ln for ln in acc.get_lines() if np.allclose(ln.get_ydata(), 0.61)]
    assert len(level) == 1 and LENGTH_ONLY_LABEL in [t.get_text() for t in acc.get_legend().get_texts()]
    assert not [ln for ln in sel.get_lines() if np.allclose(ln.get_ydata(), 0.61)]
    assert {ln.get_label() for ln in acc.get_lines() if ln.get_linestyle() == "-"} == {"cls", "mean"}


def test_probes_errors_and_nan(tmp_path, figs):
    from figures.probes import plot_probes

    df = probe_table()
    with pytest.raises(ValueError, match=r"target='is_next'.*'topic'"):
        plot_probes(df, tmp_path / "x", target="is_next")
    with pytest.raises(ValueError, match=r"metric='micro_f1'.*'accuracy'"):
        plot_probes(df, tmp_path / "x", metric="micro_f1")
    two = pd.concat([df, df.assign(model="bert-base-uncased")])
    with pytest.raises(ValueError, match="several trained models"):
        plot_probes(two, tmp_path / "x")
    plot_probes(two, tmp_path / "x", model="bert-base-uncased")
    assert "bert-base-uncased" in figs[0]._suptitle.get_text()
    nan = df.copy()
    nan.loc[(nan.choice == "mean") & (nan.layer == 0), ["value", "ci_low", "ci_high"]] = np.nan
    plot_probes(nan, tmp_path / "nan")
    assert np.isnan(line_by_label(visible_axes(figs[1])[0], "mean").get_ydata()[0])
    assert "mean at layer 0" in figs[1]._supxlabel.get_text()


def test_probe_position_best_and_last_layer(tmp_path, figs):
    from figures.probes import plot_probe_position

    df = probe_table(targets=tuple(f"bow_s{i}" for i in range(1, 6)), roles=("cls", "mean"), random_init=False)
    render_once(figs, plot_probe_position, tmp_path / "best", df, choice=["cls", "mean"])
    ax = figs[0].axes[0]
    f1 = df[(df.metric == "micro_f1") & (df.choice == "cls")]
    best = f1.groupby("target")["value"].max().loc[[f"bow_s{i}" for i in range(1, 6)]].to_numpy()
    cls = ax.containers[0]  # errorbar container of the first choice
    x, y = cls.lines[0].get_data()
    np.testing.assert_allclose(y, best)
    assert np.allclose(np.round(x), [1, 2, 3, 4, 5]) and ax.get_xlabel().startswith("sentence position")
    assert "best layer" in ax.get_ylabel() and "s1→L" in figs[0]._supxlabel.get_text()
    base = line_by_label(ax, "majority baseline")
    assert np.allclose(base.get_ydata(), 0.1)

    plot_probe_position(df, tmp_path / "last", choice="cls", layer="last")
    ax = figs[1].axes[0]
    last = f1[f1.layer == 6].set_index("target").loc[[f"bow_s{i}" for i in range(1, 6)], "value"].to_numpy()
    np.testing.assert_allclose(ax.containers[0].lines[0].get_ydata(), last)
    assert "last layer (6)" in ax.get_ylabel()
    plot_probe_position(df, tmp_path / "l2", choice="cls", layer=2)
    l2 = f1[f1.layer == 2].set_index("target").loc[[f"bow_s{i}" for i in range(1, 6)], "value"].to_numpy()
    np.testing.assert_allclose(figs[2].axes[0].containers[0].lines[0].get_ydata(), l2)
    # the length-only probe (no layer) is drawn from its one row beside the last layer's; the macro AUC's
    # baseline is the frequency baseline (0.5)
    auc = df[df.metric == "macro_auc"]
    length = auc[(auc.choice == "cls") & (auc.layer == 6)].assign(choice="length_only", layer=np.nan, value=0.55)
    base = auc[auc.choice == "cls"].assign(metric="majority_baseline_macro_auc", value=0.5)
    plot_probe_position(pd.concat([df, length, base]), tmp_path / "auc", choice=["cls", "length_only"],
                        metric="macro_auc", layer="last")
    ax = figs[3].axes[0]
    np.testing.assert_allclose(ax.containers[1].lines[0].get_ydata(), 0.55)
    assert np.allclose(line_by_label(ax, "frequency baseline (0.5)").get_ydata(), 0.5)
    assert "length_only: a probe on the word counts" in figs[3]._supxlabel.get_text()
    with pytest.raises(ValueError, match="layer must be"):
        plot_probe_position(df, tmp_path / "x", layer="first")
    with pytest.raises(ValueError, match=r"no targets named bow_s<i>.*'topic'"):
        plot_probe_position(probe_table(), tmp_path / "x")


# --------------------------------------------------------------------------------------------------
# Attention


def test_attention_panels_lines_and_notes(tmp_path, figs):
    from figures.attention import plot_attention

    df = attention_table(heads=2)
    render_once(figs, plot_attention, tmp_path / "a", df)
    axes = visible_axes(figs[0])
    assert [ax.get_title() for ax in axes] == ["from cls", "from sep1", "from sep2", "from s1 words",
                                               "from s2 words"]
    want = df[(df["head"] == "mean") & (df.role == "s1 words") & (df.target == "own sentence")].sort_values("layer")
    np.testing.assert_allclose(line_by_label(axes[3], "own sentence").get_ydata(), want["value"])
    assert {ln.get_label() for ln in axes[0].get_lines()} == {"cls", "all [SEP]"}
    colors = {ax.get_title(): line_by_label(ax, "all [SEP]").get_color() for ax in axes}
    assert len(set(colors.values())) == 1, "a target has one colour in every panel"
    assert axes[0].get_ylabel() == "attention mass (fraction)" and axes[0].get_ylim() == (-0.02, 1.02)
    assert "word groups only" in figs[0]._supxlabel.get_text()
    two = attention_table(heads=0, formats=("pair", "nosep_seg"))
    plot_attention(two, tmp_path / "two", sources=["s1 words"])
    assert [ax.get_title() for ax in visible_axes(figs[1])] == ["from s1 words — pair", "from s1 words — nosep_seg"]
    plot_attention(two, tmp_path / "one", format="nosep_seg", sources=["cls", "s2 words"])
    assert [ax.get_title() for ax in visible_axes(figs[2])] == ["from cls", "from s2 words"]


def test_attention_heads_matrix_and_errors(tmp_path, figs):
    from figures.attention import plot_attention_heads

    df = attention_table(heads=4)
    render_once(figs, plot_attention_heads, tmp_path / "h", df, role="s1 words")
    ax = figs[0].axes[0]
    sub = df[(df["head"] != "mean") & (df.role == "s1 words") & (df.target == "all [SEP]")]
    want = sub.assign(h=sub["head"].astype(int)).pivot_table(index="layer", columns="h", values="value")
    np.testing.assert_allclose(ax.images[0].get_array(), want.to_numpy())
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer" and len(ax.texts) == 6 * 4
    plot_attention_heads(df, tmp_path / "all")
    assert len([a for a in figs[1].axes if a.images]) == 5
    with pytest.raises(ValueError, match="no per-head rows"):
        plot_attention_heads(df[df["head"] == "mean"], tmp_path / "x")
    with pytest.raises(ValueError, match=r"expected one format.*\['nosep', 'pair'\].*format="):
        plot_attention_heads(attention_table(heads=2, formats=("pair", "nosep")), tmp_path / "x")
    with pytest.raises(ValueError, match=r"metric='attention_mass'"):
        plot_attention_heads(df.assign(metric="mass"), tmp_path / "x")


# --------------------------------------------------------------------------------------------------
# Pooling


def bars(ax):
    return [p for p in ax.patches if p.get_width() > 0]


def test_pooling_bars_seeds_and_frozen(tmp_path, figs):
    from figures.pooling import plot_pooling

    ft = pooling_table()
    plot_pooling(ft, tmp_path / "ft")
    ax = figs[0].axes[0]
    means = ft[ft.metric == "test_accuracy_mean"].set_index("pooling")["value"]
    order = ["cls", "mean", "max", "first_word", "sep1", "pos3"]
    assert [t.get_text() for t in ax.get_xticklabels()] == order
    np.testing.assert_allclose([b.get_height() for b in bars(ax)], means.loc[order])
    from matplotlib.collections import PathCollection

    dots = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections if isinstance(c, PathCollection)])
    assert len(dots) == 18 and np.allclose(sorted(dots), sorted(ft[ft.metric == "test_accuracy"]["value"]))
    assert np.isclose(line_by_label(ax, "majority baseline (training majority class)").get_ydata()[0], 0.34)
    assert ax.get_ylabel() == "test accuracy"

    probes = probe_table()
    render_once(figs, plot_pooling, tmp_path / "frozen", ft, frozen_df=probes)
    ax = figs[1].axes[0]
    heights = [b.get_height() for b in bars(ax)]
    acc = probes[(probes.metric == "accuracy") & (probes.model_kind == "trained")]
    best = acc.groupby("choice")["value"].max()
    np.testing.assert_allclose(heights[6:], [best[r] for r in ["cls", "mean", "max", "first_word", "sep1", "pos3"]])
    assert any(t.get_text().startswith("frozen linear probe (best layer") for t in ax.get_legend().get_texts())

    plot_pooling(ft, tmp_path / "last", frozen_df=probes, frozen_layer="last")
    last = acc[acc.layer == 6].set_index("choice")["value"]
    np.testing.assert_allclose([b.get_height() for b in bars(figs[2].axes[0])][6:],
                               [last[r] for r in ["cls", "mean", "max", "first_word", "sep1", "pos3"]])
    # a table written before the `pooling` column (the pooling in `role`) draws the same bars
    plot_pooling(ft.drop(columns="role").rename(columns={"pooling": "role"}), tmp_path / "old")
    np.testing.assert_allclose([b.get_height() for b in bars(figs[3].axes[0])], means.loc[order])


def test_pooling_from_seeds_only_nan_and_errors(tmp_path, figs):
    from figures.pooling import plot_pooling

    ft = pooling_table(summary=False)
    plot_pooling(ft, tmp_path / "seeds")
    seeds = ft[ft.metric == "test_accuracy"]
    means = seeds.groupby("pooling")["value"].mean()
    order = ["cls", "mean", "max", "first_word", "sep1", "pos3"]
    np.testing.assert_allclose([b.get_height() for b in bars(figs[0].axes[0])], means.loc[order])
    nan = pooling_table()
    nan.loc[(nan.pooling == "max"), ["value", "sd"]] = np.nan
    plot_pooling(nan, tmp_path / "nan")
    assert "NaN mean accuracy (no bar) for max" in figs[1]._supxlabel.get_text()
    with pytest.raises(ValueError, match=r"metric=\['test_accuracy_mean', 'test_accuracy'\].*'majority_baseline'"):
        plot_pooling(ft[ft.metric == "majority_baseline"], tmp_path / "x")
    with pytest.raises(ValueError, match=r"analysis='finetune_pooling'.*'probe'"):
        plot_pooling(probe_table(), tmp_path / "x")
    with pytest.raises(ValueError, match=r"no frozen probe rows.*'cls'"):
        plot_pooling(pooling_table(poolings=("pos9",)), tmp_path / "x", frozen_df=probe_table())


# --------------------------------------------------------------------------------------------------
# Files and command lines


def test_nan_everywhere_does_not_crash(tmp_path, figs):
    """Whole series of NaN (values and CIs) in every kind of table: gaps and a note, not a crash."""
    from figures.attention import plot_attention
    from figures.cka import plot_cka_heatmap, plot_cka_layers
    from figures.drift import plot_drift
    from figures.probes import plot_probe_position

    def blank(df, mask):
        df = df.copy()
        df.loc[mask, ["value", "ci_low", "ci_high"]] = np.nan
        return df

    d = drift_table()
    plot_drift(blank(d, d.role == "cls"), tmp_path / "d", roles=["cls", "s1 words"], normalised=False)
    c = cka_table()
    plot_cka_layers(blank(c, c.choice == "mean"), tmp_path / "c", choices=["mean"])
    plot_cka_heatmap(blank(c, c.layer_b.notna()), tmp_path / "h")
    p = probe_table(targets=("bow_s1", "bow_s2"), roles=("cls",), random_init=False)
    plot_probe_position(blank(p, p.target == "bow_s2"), tmp_path / "pp")
    a = attention_table(heads=0)
    plot_attention(blank(a, a.layer == 2), tmp_path / "a", sources=["s1 words"])
    assert len(figs) == 5
    assert "cls at layers 0, 1, 2, 3, 4, 5, 6" in figs[0]._supxlabel.get_text()
    assert np.isnan(line_by_label(figs[1].axes[0], "mean").get_ydata()).all()
    assert "49 grey cells" in figs[2]._supxlabel.get_text()
    assert "NaN values are left out: cls bow_s2" in figs[3]._supxlabel.get_text()
    assert np.isnan(line_by_label(figs[4].axes[0], "cls").get_ydata()[1])


def test_clis_run_on_csv(tmp_path, capsys, figs):
    from figures import attention, cka, drift, pooling, probes
    from figures.__main__ import main as figures_main

    tables = {"drift": drift_table(), "cka": cka_table(), "probe": probe_table(roles=("cls", "mean")),
              "attention": attention_table(heads=3), "pool": pooling_table()}
    csv = {k: write_table(v, tmp_path / f"{k}.csv") for k, v in tables.items()}
    for path in csv.values():
        path.with_suffix(".parquet").unlink(missing_ok=True)  # read the CSV itself
    runs = [
        (drift.main, [csv["drift"], "--metrics", "cosine_mean", "--choices", "cls,s1 words"], "drift"),
        (cka.main, [csv["cka"], "--heatmap", "--choices", "cls"], "cka"),
        (probes.main, [csv["probe"], "--targets", "topic"], "probes"),
        (attention.main, [csv["attention"], "--heads", "--choices", "s2 words"], "heads"),
        (pooling.main, [csv["pool"], "--frozen", csv["probe"], "--frozen-layer", "last"], "pool"),
    ]
    for main, args, name in runs:
        figs.render = name == "pool"  # one run writes real files; the others are checked on the figure
        assert main([str(a) for a in args] + ["--out", str(tmp_path / "figs" / name)]) == 0
    figs.render = False
    check_outputs([tmp_path / "figs" / "pool.png", tmp_path / "figs" / "pool.pdf"], tmp_path / "figs" / "pool")
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "figs" / f"{n}.{ext}") for *_, n in runs for ext in ("png", "pdf")]
    drift_ax = visible_axes(figs[0])[0]
    assert [ln.get_label() for ln in drift_ax.get_lines()] == ["cls", "s1 words",
                                                               "random-pair baseline, all tokens (mean cos)"]
    assert figs[1].axes[0].get_ylabel() == "layer in pair (cls)  (0 = embeddings)"
    assert figs[3].axes[0].get_title().endswith("from s2 words")
    legend = [t.get_text() for t in figs[4].axes[0].get_legend().get_texts()]
    assert "frozen linear probe (last layer; 95% CI over folds)" in legend

    assert figures_main(["cka", str(csv["cka"]), "--out", str(tmp_path / "figs" / "cka_layers")]) == 0
    assert len(visible_axes(figs[5])) == 2
    assert drift.main([str(csv["cka"]), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: drift figure: no rows with analysis='drift'") and "'cka'" in err
    assert not (tmp_path / "bad.png").exists()
    assert figures_main(["histogram"]) == 2
    with pytest.raises(SystemExit) as ex:
        probes.main(["--help"])
    assert ex.value.code == 0 and "--position" in capsys.readouterr().out


def test_tables_mixing_models_or_corpora_need_a_choice(tmp_path, figs):
    from figures.attention import plot_attention
    from figures.cka import plot_cka_layers
    from figures.drift import plot_drift
    from figures.pooling import plot_pooling
    from figures.probes import plot_probes

    mixed = {
        plot_drift: drift_table(), plot_cka_layers: cka_table(matrix=False),
        plot_attention: attention_table(heads=0), plot_pooling: pooling_table(),
    }
    for plot, df in mixed.items():
        two = pd.concat([df, df.assign(model="bert-base-uncased")])
        msg = r"several model values \['all-MiniLM-L6-v2', 'bert-base-uncased'\]; pick one with model="
        with pytest.raises(ValueError, match=msg):
            plot(two, tmp_path / "x")
        plot(two, tmp_path / "ok", model="bert-base-uncased")
        assert "bert-base-uncased" in all_text(figs[-1]) and MODEL not in all_text(figs[-1])
    p = probe_table()
    with pytest.raises(ValueError, match=r"several corpus values \['other', 'toy-news'\]; pick one with corpus="):
        plot_probes(pd.concat([p, p.assign(corpus="other")]), tmp_path / "x")
    plot_probes(pd.concat([p, p.assign(corpus="other")]), tmp_path / "ok", corpus="other")
    assert "other" in figs[-1]._suptitle.get_text()


def test_drift_cli_overlay_and_by_k(tmp_path, figs):
    from figures import drift

    pairs = (("single", "pair"), ("single", "concat"))
    csv = write_table(drift_table(pairs=pairs), tmp_path / "d.csv")
    assert drift.main([str(csv), "--overlay", "--choices", "s1 words", "--out", str(tmp_path / "o")]) == 0
    labels = [ln.get_label() for ln in visible_axes(figs[0])[0].get_lines()]
    assert labels[:2] == ["s1 words: single → pair", "s1 words: single → concat"]
    frames = []
    for k in (2, 3):
        d = drift_table(pairs=(("multi", "concat"),), k=k, seed=k)
        d["k"] = k
        frames.append(d)
    csv = write_table(pd.concat(frames, ignore_index=True), tmp_path / "k.csv")
    argv = [str(csv), "--by-k", "--layers", "2,4", "--choices", "cls,all", "--out", str(tmp_path / "k")]
    assert drift.main(argv) == 0
    axes = visible_axes(figs[1])
    assert [ax.get_title() for ax in axes[:2]] == ["layer 2", "layer 4"]
    assert [ln.get_label() for ln in axes[0].get_lines()][:2] == ["cls", "all"]
    # one layer spec: -1 is the table's last layer, ranges work, a layer the table lacks is an error
    assert drift.main([str(csv), "--by-k", "--layers", "3--1", "--out", str(tmp_path / "k2")]) == 0
    last = int(pd.concat(frames)["layer"].max())
    want = [f"layer {l}" for l in range(3, last + 1)]
    assert [ax.get_title() for ax in visible_axes(figs[2])][:len(want)] == want
    assert drift.main([str(csv), "--by-k", "--layers", "99", "--out", str(tmp_path / "k3")]) == 2


def test_probe_figure_draws_a_nearest_neighbour_table(tmp_path, figs):
    from figures import probes

    rows = []
    for layer in LAYERS:
        for role, v in (("cls", 0.5 + 0.05 * layer), ("mean", 0.6 + 0.04 * layer)):
            rows.append(dict(analysis="knn", model=MODEL, corpus=CORPUS, format="single", layer=layer, choice=role,
                             target="topic", metric="knn_accuracy", value=v, ci_low=v - 0.02, ci_high=v + 0.02, n=100))
            rows.append(dict(analysis="knn", model=MODEL, corpus=CORPUS, format="single", layer=layer, choice=role,
                             target="topic", metric="chance_knn_accuracy", value=0.2, n=100))
    csv = write_table(make_table(rows), tmp_path / "knn.csv")
    assert probes.main([str(csv), "--metrics", "knn_accuracy", "--out", str(tmp_path / "knn")]) == 0
    ax = visible_axes(figs[0])[0]
    np.testing.assert_allclose(line_by_label(ax, "mean").get_ydata(), [0.6 + 0.04 * l for l in LAYERS])
    assert ax.get_ylabel() == "nearest-neighbour label agreement"


def test_interval_notes_say_how_the_intervals_were_computed(tmp_path, figs):
    """The notes under the drift and probe figures read each table's ci_method and grouping columns
    (they used to say 't-intervals over folds' and 'over examples' whatever the table held)."""
    from figures.common import interval_note
    from figures.drift import plot_drift
    from figures.probes import plot_probe_position, plot_probes

    boot = dict(ci_method="cluster_bootstrap", grouping="document")
    plot_probes(probe_table().assign(**boot), tmp_path / "p")
    assert "Bands: 95% cluster-bootstrap CIs over documents." in figs[-1]._supxlabel.get_text()
    plot_probes(probe_table(), tmp_path / "legacy")  # a table from before the items' bootstrap
    assert "t-intervals over cross-validation folds" in figs[-1]._supxlabel.get_text()
    bow = probe_table(targets=tuple(f"bow_s{i}" for i in range(1, 4)), roles=("cls",), random_init=False)
    plot_probe_position(bow.assign(**boot), tmp_path / "pos", choice="cls", layer="last")
    assert "error bars: 95% cluster-bootstrap CIs over documents." in figs[-1]._supxlabel.get_text()
    plot_drift(drift_table().assign(grouping="document"), tmp_path / "d")
    assert "Bands: 95% cluster-bootstrap CIs over documents." in figs[-1]._supxlabel.get_text()
    mixed = pd.DataFrame({"ci_method": ["cluster_bootstrap", "t_folds"], "grouping": ["example", "example"]})
    assert interval_note(mixed) == ("Bands: 95% cluster-bootstrap CIs over examples; t-intervals over "
                                    "cross-validation folds.")


@pytest.mark.parametrize("grouping, unit", [("document", "documents"), ("example", "examples")])
def test_attention_and_pooling_notes_name_the_unit_resampled(tmp_path, figs, grouping, unit):
    """The attention figure said 'over examples' and Q8's 'over documents' whatever the table grouped by."""
    from figures.attention import plot_attention
    from figures.pooling import plot_pooling

    plot_attention(attention_table(heads=0).assign(grouping=grouping), tmp_path / "a")
    assert f"bands: 95% cluster-bootstrap CIs over {unit}." in figs[-1]._supxlabel.get_text()
    rows = [dict(analysis="finetune_pooling", model=MODEL, corpus=CORPUS, format="pair", layer=2, target="topic",
                 pooling=p, condition=c, metric=m, value=0.6, ci_low=0.5, ci_high=0.7, n=40, n_runs=2, sd=0.01,
                 grouping=grouping, warning="")
            for p in ("cls", "mean") for c, m in (("fine_tuned", "test_accuracy_mean"),
                                                  ("frozen", "frozen_test_accuracy_mean"))]
    plot_pooling(make_table(rows), tmp_path / "q8")
    labels = [t.get_text() for t in figs[-1].axes[0].get_legend().get_texts()]
    assert sum(f"95% CI over {unit})" in t for t in labels) == 2, labels


def _knockout_table(normalised: bool) -> "pd.DataFrame":
    """An intervention_drift table: roles cls and word, layers 0-2; [CLS]'s raw drifts tiny (1e-6), its
    knockout − control over its spread large (0.04 and 0.02), NaN at layer 0 where it has no spread."""
    import pandas as pd

    rows = []
    for role, raw, norm in (("cls", 1e-6, [float("nan"), 0.04, 0.02]), ("word", 0.01, [0.0, -0.001, -0.002])):
        for layer in range(3):
            base = {"analysis": "intervention_drift", "model": "m", "corpus": "c",
                    "intervention": "knockout all->sep@1", "role": role, "layer": layer}
            rows += [{**base, "metric": "drift_treated", "value": raw * layer, "ci_low": 0.0,
                      "ci_high": 2 * raw * layer},
                     {**base, "metric": "drift_control", "value": raw * layer / 2, "ci_low": 0.0,
                      "ci_high": raw * layer}]
            if normalised:
                v = norm[layer]
                rows.append({**base, "metric": "normalised_drift_difference", "value": v, "ci_low": v - 0.001,
                             "ci_high": v + 0.001})
    return pd.DataFrame(rows)


def test_knockout_drift_figure_shows_each_group_over_its_spread(figs, tmp_path):
    """The knockout drift figure's second row is knockout − control over each group's spread, the quantity Q4
    decides on: there [CLS]'s effect shows (0.04, 0.02) where its raw drift is a flat line near 0; NaN
    (no spread) is left out. A table without those rows draws the raw drifts alone."""
    from figures.interventions import plot_knockout_drift

    plot_knockout_drift(_knockout_table(True), tmp_path / "ko")
    axes = figs[-1].axes
    assert len(axes) == 4  # 2 roles x (raw, normalised)
    cls_norm = next(a for a in axes if a.get_title() == "cls: over its spread between inputs")
    ys = [line.get_ydata() for line in cls_norm.get_lines() if len(line.get_xdata()) == 2]
    assert any(np.allclose(y, [0.04, 0.02]) for y in ys), ys
    plot_knockout_drift(_knockout_table(False), tmp_path / "raw")
    assert len(figs[-1].axes) == 2
    render_once(figs, plot_knockout_drift, tmp_path / "rendered", _knockout_table(True))
