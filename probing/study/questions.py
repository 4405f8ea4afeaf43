"""The seed questions Q1-Q8 declared as data: one :class:`probing.study.sections.StudySection` each, in
:data:`QUESTION_SECTIONS`.

Each question names the corpora and caches it needs, its analyses (tables shared between questions
are computed once, through :meth:`probing.study.sections.Context.table`), its figures, its report table, its
evidence sentence, the comparison rows its verdict is computed from and the claim they test.

Comparison rows are paired: probe comparisons on the same out-of-fold items
(:func:`analyses.probe_runner.compare_probes` on the item tables the probe runs keep with
``items=True``: Q4 sep1 − cls, Q5 [CLS] − mean, Q6 first − last / first − middle across caches of the
same examples, Q7 trained − random-init and [CLS] − a length-only probe, Q8 frozen cls − mean), drift
comparisons on the same token keys (:func:`analyses.paired.run_role_contrast` for Q1,
:func:`analyses.paired.run_paired_drift` for Q2), the fine-tuning table's own ``accuracy_diff`` rows for
Q8, and a score against a constant baseline (Q5, Q7 word order) as a one-sample row. Holm's correction
runs over the family :data:`FAMILIES` declares per question (the report's captions name it). Only Q3's
rows (largest k − k = 2) are still derived from two marginal intervals with
:func:`probing.study.verdicts.difference_rows` and marked provisional: the k-sentence prefixes are separate
caches with no shared reference format. Comparisons involving [CLS] leave out layer 0 (the embedding
layer: [CLS] is one vector for every input there).

Causal sections (issue 14): Q4 extracts ``pair`` with attention to every [SEP] knocked out in the
middle layers and its same-size control (:data:`INTERVENTIONS`, ``Job.intervention``), tables
``q4_knockout_drift`` / ``q4_knockout_probes``; Q1 extracts ``pair`` with [CLS] patched from ``concat``
at three layers (:func:`patch_layers`) and with the middle-[SEP] routes cut, table ``q1_cls_patching``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .report import fmt, last_layer, one, pick
from .sections import Context, Job, StudySection, Tables, corpus_text, group_prefixes, safe_plot
from .verdicts import PRACTICAL_THRESHOLD, Claim, difference_rows

#: Pair formats extracted with attention summaries (whichever section asks, so caches are shared).
ATTENTION_FORMATS = ("pair", "concat")
PAIR_FORMATS = ("pair", "concat", "concat_segments", "single", "single2", "cls_last", "cls_mid")
#: The probes of the pair format, per question: (token choices, targets).
PAIR_PROBES = {
    "Q8": (("cls", "mean", "max", "sep1", "first_word", "pos3"), ("topic",)),
    "Q4": (("sep1", "sep2", "cls", "mean_s1", "mean_s2"), ("is_next", "bow_s1", "bow_s2")),
    "Q7": (("cls", "mean"), ("bow_s1", "length")),
}
#: Questions whose pair-format probes are also fitted on the random-init model: only Q7 reads them
#: (what a random encoder's embeddings alone give); for Q4 and Q8 they would double the probe time.
RANDOM_INIT_PROBES = ("Q7",)
#: Control targets of the pair format, trained model only (a random-init control would add cost, not
#: information): Q7's function-word presence of sentence 1, beside its content-word bag of words.
PAIR_CONTROLS = {"Q7": (("cls", "mean"), ("fw_s1",))}
#: Interventions the study extracts (``Job.intervention``), by name -> what they do. Q4: attention to
#: every [SEP] knocked out in the middle layers, and its control of the same size on random words.
INTERVENTIONS = {
    "sep_ko": "no token attends to any [SEP] in the middle layers",
    "sep_ko_control": "as many random word keys per query knocked out, same layers (control)",
    "cls_patch_first": "[CLS]'s state at layer 1 replaced by concat's (pair format; Q1)",
    "cls_patch_mid": "[CLS]'s state at layer L // 2 replaced by concat's (Q1)",
    "cls_patch_late": "[CLS]'s state at layer L - 1 replaced by concat's (Q1)",
    "sep1_cls_ko": "[CLS] may not attend to the middle [SEP], every layer (Q1)",
    "sep1_all_ko": "no token may attend to the middle [SEP], every layer (Q1)",
}


def patch_layers(n_layers: int) -> dict[str, int]:
    """The layers Q1 patches [CLS] at, by intervention name: first, middle and last but one (a few
    extractions instead of L - 1; with 2 layers all three are layer 1, one cache)."""
    return {"cls_patch_first": 1, "cls_patch_mid": max(1, n_layers // 2), "cls_patch_late": max(1, n_layers - 1)}
#: Formats of the pairs corpus each question reads.
PAIR_NEEDS = {"Q1": ("pair", "concat", "concat_segments"), "Q2": ("pair", "concat", "single", "single2"),
              "Q4": ("pair", "concat"), "Q6": ("pair", "cls_mid", "cls_last"), "Q7": ("pair",), "Q8": ("pair",)}


# ---------------------------------------------------------------------------------------------------
# Caches


def make_intervention(name: str, n_layers: int, caches=None, corpus: str = "", random: bool = False):
    """The :class:`probing.interventions.Intervention` of :data:`INTERVENTIONS` ``name`` for a model of
    ``n_layers`` layers (``caches``, ``corpus`` and ``random`` locate a patch's source cache)."""
    from analyses.interventions import cls_patches, middle_sep_knockouts, sep_knockouts

    if name in patch_layers(n_layers):
        source = caches.paths[(corpus, "concat", random)]  # extracted first: clean caches come first
        return cls_patches(source, n_layers)[patch_layers(n_layers)[name]]
    if name in ("sep1_cls_ko", "sep1_all_ko"):
        return dict(zip(("sep1_cls_ko", "sep1_all_ko"), middle_sep_knockouts(n_layers)))[name]
    if name not in ("sep_ko", "sep_ko_control"):
        raise ValueError(f"unknown intervention {name!r}; known: {', '.join(INTERVENTIONS)}")
    ko, control = sep_knockouts(n_layers)
    return {"sep_ko": ko, "sep_ko_control": control}[name]


def _pair_jobs(q: str):
    def jobs(cfg: dict, corpora: dict) -> list[Job]:
        out = [Job("pairs", f, attention=f in ATTENTION_FORMATS) for f in PAIR_FORMATS if f in PAIR_NEEDS.get(q, ())]
        if q == "Q4":
            out += [Job("pairs", "pair", intervention=i) for i in ("sep_ko", "sep_ko_control")]
        if q == "Q1":
            out += [Job("pairs", "pair", intervention=i) for i in (*patch_layers(2), "sep1_cls_ko", "sep1_all_ko")]
        if q in RANDOM_INIT_PROBES and cfg["model"]["random_init_baseline"]:
            out.append(Job("pairs", "pair", random=True))
        if q == "Q7":
            out.append(Job("swap", "pair"))
            if cfg["model"]["random_init_baseline"]:
                out.append(Job("swap", "pair", random=True))
        return out

    return jobs


def _q3_jobs(cfg: dict, corpora: dict) -> list[Job]:
    return [Job(c, f) for c in group_prefixes(corpora).values() for f in ("multi", "concat")]


def _q5_jobs(cfg: dict, corpora: dict) -> list[Job]:
    return [Job(group_prefixes(corpora)[max(group_prefixes(corpora))], "multi")]


# ---------------------------------------------------------------------------------------------------
# Tables (each computed once per study, whichever question asks first)


def _rs(ctx: Context) -> dict:
    return dict(n_resamples=ctx.cfg["study"]["bootstrap_resamples"], seed=ctx.cfg["study"]["seed"], out=ctx.out)


def probe_kw(cfg: dict, out: Path) -> dict:
    """The probe runner's options from the config's ``[probes]`` table."""
    pr = cfg["probes"]
    return dict(n_splits=pr["folds"], seed=cfg["study"]["seed"], vocab=pr["vocab"], device=pr["device"], Cs=pr["Cs"],
                inner_splits=pr["inner_splits"], max_iter=pr["max_iter"], bow_Cs=pr["bow_Cs"], out=out)


def _pairs(ctx: Context, fmt_: str, random: bool = False):
    return ctx.caches.get("pairs", fmt_, random) if ctx.caches.has("pairs", fmt_, random) else None


def _drift_q1(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    ctx.log("analyses: drift and CKA across formats")
    pair, concat, seg = _pairs(ctx, "pair"), _pairs(ctx, "concat"), _pairs(ctx, "concat_segments")
    return pd.concat([run_drift(pair, concat, **_rs(ctx)), run_drift(pair, seg, **_rs(ctx)),
                      run_drift(seg, concat, **_rs(ctx))], ignore_index=True)


def _cka_q1(ctx: Context) -> pd.DataFrame:
    from analyses.similarity import run_cka_formats

    return run_cka_formats(_pairs(ctx, "pair"), _pairs(ctx, "concat"), ["cls", "mean_s1", "mean_s2", "sep_last"],
                           out=ctx.out)


def _drift_q2(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    pair, concat = _pairs(ctx, "pair"), _pairs(ctx, "concat")
    return pd.concat([run_drift(_pairs(ctx, s), b, words_only=True, **_rs(ctx))
                      for s in ("single", "single2") for b in (pair, concat)], ignore_index=True)


def _attention(ctx: Context) -> pd.DataFrame:
    from analyses.attention import run_attention

    ctx.log("analyses: attention")
    return pd.concat([run_attention(_pairs(ctx, f), **_rs(ctx)) for f in ATTENTION_FORMATS], ignore_index=True)


def _drift_q3(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    ctx.log("analyses: k segments")
    frames = []
    for k, c in group_prefixes(ctx.corpora).items():
        d = run_drift(ctx.caches.get(c, "multi"), ctx.caches.get(c, "concat"), **_rs(ctx))
        d["k"] = k
        frames.append(d)
    return pd.concat(frames, ignore_index=True)


def _probes_pair(ctx: Context) -> pd.DataFrame:
    """The pair-format probes of every selected question among Q4, Q7, Q8 (one table: Q4's table and
    Q7's evidence read each other's rows)."""
    from analyses.probe_runner import run_probes

    ctx.log("analyses: probes on the pair format (trained; random-init for Q7)")
    wanted = [q for q in PAIR_PROBES if q in ctx.questions]
    runs = [run_probes(_pairs(ctx, "pair"), *PAIR_PROBES[q],
                       random_cache=_pairs(ctx, "pair", True) if q in RANDOM_INIT_PROBES else None,
                       length_baseline=q == "Q7", items=True, **probe_kw(ctx.cfg, ctx.out)) for q in wanted]
    runs += [run_probes(_pairs(ctx, "pair"), *PAIR_CONTROLS[q], length_baseline=True, items=True,
                        **probe_kw(ctx.cfg, ctx.out)) for q in wanted if q in PAIR_CONTROLS]
    keys = ["model_kind", "layer", "role", "target", "metric"]
    _keep_items(ctx, "probes_pair", [it for _, it in runs])
    return pd.concat([t for t, _ in runs], ignore_index=True).drop_duplicates(keys)


def _keep_items(ctx: Context, name: str, frames: list) -> None:
    """The per-item out-of-fold predictions behind table ``name`` (``ctx.tables[name + ":items"]``; not
    a report table: the probe runner stores them beside its results)."""
    from analyses.probe_runner import ITEM_KEYS

    items = pd.concat(frames, ignore_index=True)
    ctx.tables[f"{name}:items"] = items.drop_duplicates(list(ITEM_KEYS) + ["example", "token"])


def _items(ctx: Context, name: str) -> pd.DataFrame:
    ctx.table(name, PRODUCERS[name])
    return ctx.tables[f"{name}:items"]


def _cka_q4(ctx: Context) -> pd.DataFrame:
    from analyses.similarity import run_cka_roles

    return run_cka_roles(_pairs(ctx, "pair"), [("sep1", "cls"), ("sep1", "mean_s1"), ("sep1", "mean_s2"),
                                               ("sep2", "cls")], out=ctx.out)


def _probes_q5(ctx: Context) -> pd.DataFrame:
    from analyses.probe_runner import run_probes

    ctx.log("analyses: [CLS] content of sentence i")
    K = max(group_prefixes(ctx.corpora))
    multi = ctx.caches.get(f"groups_k{K}", "multi")
    table, items = run_probes(multi, ("cls", "mean"), [f"bow_s{i}" for i in range(1, K + 1)] + ["fw_s1"], items=True,
                              **probe_kw(ctx.cfg, ctx.out))
    _keep_items(ctx, "probes_q5", [items])
    return table


def _probes_q6(ctx: Context) -> pd.DataFrame:
    from analyses.probe_runner import run_probes

    ctx.log("analyses: classification token position")
    runs = [run_probes(_pairs(ctx, f), ("cls",), ("topic", "is_next"), items=True, **probe_kw(ctx.cfg, ctx.out))
            for f in ("pair", "cls_mid", "cls_last")]
    _keep_items(ctx, "probes_q6", [it for _, it in runs])
    return pd.concat([t for t, _ in runs], ignore_index=True)


def _probes_q7(ctx: Context) -> pd.DataFrame:
    from analyses.probe_runner import run_probes

    ctx.log("analyses: word order")
    sw = ctx.caches.get("swap", "pair")
    swr = ctx.caches.get("swap", "pair", True) if ctx.caches.has("swap", "pair", True) else None
    table, items = run_probes(sw, ("cls", "mean"), ("swapped",), random_cache=swr, items=True,
                              **probe_kw(ctx.cfg, ctx.out))
    _keep_items(ctx, "probes_q7", [items])
    return table


def _finetune(ctx: Context) -> pd.DataFrame:
    from analyses.pooling import run_pooling_experiment

    ctx.log("analyses: fine-tuning with each pooling")
    ft = ctx.cfg["finetune"]
    return run_pooling_experiment(ctx.corpora["pairs"], ft["label"], ft["poolings"], ft["seeds"], model=ctx.lm,
                                  preset=ft["preset"], out=str(ctx.out), corpus_name=ctx.cfg["corpus"]["pairs"])


# ---------------------------------------------------------------------------------------------------
# Paired comparison tables: the rows the verdicts are computed from. Probe comparisons are paired on the
# same out-of-fold items (analyses.probe_runner.compare_probes), drift comparisons on the same token keys
# (analyses.paired); CIs resample documents where the corpus has them. Holm's correction runs over one
# declared family per question (the ``family`` column; :data:`FAMILIES`).

#: The multiple-comparison family of each question's paired rows, as the report states it.
FAMILIES = {
    "Q1": "all layers of [CLS] − words (Holm over layers)",
    "Q2": "all layers, per sentence (Holm over layers)",
    "Q4": "sep1 − cls over every layer 1–L × target (is_next, bow_s1, bow_s2) (Holm over all of them)",
    "Q5": "[CLS] − mean over every layer × sentence position (Holm over all of them)",
    "Q6": ("first − last and first − middle over every layer 1–L × target (topic, is_next) "
           "(Holm over all of them)"),
    "Q7": "per comparison over layers 1–L (Holm over layers)",
    "Q8": ("frozen cls − mean over layers 1–L (Holm over layers); fine-tuning rows: Holm over every "
           "accuracy_diff row"),
}


def _compare(items: pd.DataFrame, a: dict, b: dict, family: str, ctx: Context, **where) -> pd.DataFrame:
    from analyses.probe_runner import compare_probes

    for k, v in where.items():
        items = items[items[k].isin(v if isinstance(v, (list, tuple)) else [v])]
    return compare_probes(items, a, b, family=family, n_resamples=ctx.cfg["study"]["bootstrap_resamples"],
                          seed=ctx.cfg["study"]["seed"])


def _from_layer1(items: pd.DataFrame) -> pd.DataFrame:
    """Items of layers >= 1 (and of layer-less probes such as the length baseline): [CLS] is one vector
    for every input at layer 0, so comparisons involving it there are trivial."""
    layer = pd.to_numeric(items["layer"], errors="coerce")
    return items[layer.isna() | (layer >= 1)]


def _rejoin_holm(frames: list[pd.DataFrame], family: str) -> pd.DataFrame:
    """Several comparisons as one family: Holm over all their rows."""
    from analyses.stats import holm

    df = pd.concat(frames, ignore_index=True)
    df["family"] = family
    df["p_holm"] = holm(df["p_value"].to_numpy(float))
    return df


def _paired_q1(ctx: Context) -> pd.DataFrame:
    from analyses.paired import run_role_contrast

    d = run_role_contrast(_pairs(ctx, "pair"), _pairs(ctx, "concat"), "cls", **_rs(ctx))
    return d.assign(family=FAMILIES["Q1"])


def _paired_q2(ctx: Context) -> pd.DataFrame:
    from analyses.paired import run_paired_drift

    pair, concat = _pairs(ctx, "pair"), _pairs(ctx, "concat")
    frames = [run_paired_drift(_pairs(ctx, "single"), pair, concat, **_rs(ctx))]
    if _pairs(ctx, "single2") is not None:
        frames.append(run_paired_drift(_pairs(ctx, "single2"), pair, concat, **_rs(ctx)))
    return pd.concat(frames, ignore_index=True).assign(family=FAMILIES["Q2"])


def _paired_q4(ctx: Context) -> pd.DataFrame:
    items = _from_layer1(_items(ctx, "probes_pair"))
    return _compare(items, {"role": "sep1"}, {"role": "cls"}, FAMILIES["Q4"], ctx, model_kind="trained",
                    target=list(PAIR_PROBES["Q4"][1]))


def _paired_q5(ctx: Context) -> pd.DataFrame:
    return _compare(_items(ctx, "probes_q5"), {"role": "cls"}, {"role": "mean"}, FAMILIES["Q5"], ctx)


def _paired_q6(ctx: Context) -> pd.DataFrame:
    items = _from_layer1(_items(ctx, "probes_q6"))
    return _rejoin_holm([_compare(items, {"format": "pair"}, {"format": other}, FAMILIES["Q6"], ctx,
                                  format=["pair", other]) for other in ("cls_last", "cls_mid")], FAMILIES["Q6"])


def _paired_q7(ctx: Context) -> pd.DataFrame:
    frames = []
    q7 = _from_layer1(_items(ctx, "probes_q7"))
    if (q7["model_kind"] == "random_init").any():
        frames.append(_compare(q7, {"model_kind": "trained"}, {"model_kind": "random_init"}, FAMILIES["Q7"], ctx))
    pair = _items(ctx, "probes_pair") if "Q7" in ctx.questions else None
    if pair is not None and (pair["role"] == "length_only").any():
        frames.append(_compare(_from_layer1(pair), {"role": "cls"}, {"role": "length_only"}, FAMILIES["Q7"], ctx,
                               model_kind="trained", target=list(PAIR_PROBES["Q7"][1]) + list(PAIR_CONTROLS["Q7"][1]),
                               role=["cls", "length_only"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _paired_q8(ctx: Context) -> pd.DataFrame:
    items = _from_layer1(_items(ctx, "probes_pair"))
    return _compare(items, {"role": "cls"}, {"role": "mean"}, FAMILIES["Q8"], ctx, model_kind="trained",
                    target="topic")


def _q1_patching(ctx: Context) -> pd.DataFrame:
    from analyses.interventions import q1_patching

    names = [f"pair@{i}" for i in patch_layers(2) if ctx.caches.has("pairs", f"pair@{i}")]
    # one cache per patch layer (a 2-layer model patches layer 1 for all three names: the same cache)
    paths = {ctx.caches.paths[("pairs", n, False)]: n for n in names}
    patched = {}
    for path, n in paths.items():
        cache = ctx.caches.get("pairs", n)
        patched[int(cache.manifest["intervention"]["patch"][0]["layer"])] = cache
    routes = [ctx.caches.get("pairs", f"pair@{i}") for i in ("sep1_cls_ko", "sep1_all_ko")
              if ctx.caches.has("pairs", f"pair@{i}")]
    if not patched and not routes:
        return pd.DataFrame()
    ctx.log("analyses: [CLS] patching and middle-[SEP] routes (Q1)")
    return q1_patching(_pairs(ctx, "pair"), _pairs(ctx, "concat"), patched, routes, **_rs(ctx))["q1_cls_patching"]


def _knockout(ctx: Context) -> None:
    from analyses.interventions import q4_sep_knockout

    if "q4_knockout_drift" not in ctx.tables:
        ctx.log("analyses: knockout of attention to [SEP] (and its control)")
        ctx.tables.update(q4_sep_knockout(_pairs(ctx, "pair"), ctx.caches.get("pairs", "pair@sep_ko"),
                                          ctx.caches.get("pairs", "pair@sep_ko_control"), targets=("topic", "is_next"),
                                          choice="cls", probe_layer=-1, **_rs(ctx)))


def _q4_knockout_drift(ctx: Context) -> pd.DataFrame:
    _knockout(ctx)
    return ctx.tables["q4_knockout_drift"]


def _q4_knockout_probes(ctx: Context) -> pd.DataFrame:
    _knockout(ctx)
    return ctx.tables["q4_knockout_probes"]


#: Every table a question can ask for, and the function that computes it.
PRODUCERS = {"drift_q1": _drift_q1, "cka_q1": _cka_q1, "drift_q2": _drift_q2, "attention": _attention,
             "drift_q3": _drift_q3, "probes_pair": _probes_pair, "cka_q4": _cka_q4, "probes_q5": _probes_q5,
             "probes_q6": _probes_q6, "probes_q7": _probes_q7, "finetune": _finetune,
             "paired_q1": _paired_q1, "paired_q2": _paired_q2, "paired_q4": _paired_q4, "paired_q5": _paired_q5,
             "paired_q6": _paired_q6, "paired_q7": _paired_q7, "paired_q8": _paired_q8,
             "q4_knockout_drift": _q4_knockout_drift, "q4_knockout_probes": _q4_knockout_probes,
             "q1_cls_patching": _q1_patching}


def _tables(*names: str):
    """``analyse`` of a question that needs the shared tables ``names``."""
    def analyse(ctx: Context) -> Tables:
        return {n: ctx.table(n, PRODUCERS[n]) for n in names}

    return analyse


# ---------------------------------------------------------------------------------------------------
# Figures


def _fig_q1(T, fig, log):
    from figures.cka import plot_cka_layers
    from figures.drift import plot_drift

    out = []
    if "drift_q1" in T:
        d = T["drift_q1"]
        out += safe_plot(plot_drift, d[(d["format"] == "pair") & (d["format_b"] == "concat")],
                         fig / "q1_drift_pair_concat", log=log)
        out += safe_plot(plot_drift, d[(d["format"] != "pair") | (d["format_b"] != "concat")],
                         fig / "q1_drift_sep_vs_segments", roles=["cls", "s1 words", "s2 words"], log=log)
    if "cka_q1" in T:
        out += safe_plot(plot_cka_layers, T["cka_q1"], fig / "q1_cka_pair_concat", log=log)
    if T.get("q1_cls_patching") is not None and not T["q1_cls_patching"].empty:
        from figures.interventions import plot_patching

        out += safe_plot(plot_patching, T["q1_cls_patching"], fig / "q1_cls_patching", log=log)
    return out


def _fig_q2(T, fig, log):
    from figures.attention import plot_attention
    from figures.drift import plot_drift

    out = []
    if "drift_q2" in T:
        out += safe_plot(plot_drift, T["drift_q2"], fig / "q2_context_drift", roles=["s1 words", "s2 words"],
                         overlay=True, log=log)
    if "attention" in T:
        out += safe_plot(plot_attention, T["attention"], fig / "q2_attention_pair", format="pair", log=log)
    return out


def _fig_q3(T, fig, log):
    from figures.drift import plot_drift_by_k

    return safe_plot(plot_drift_by_k, T["drift_q3"], fig / "q3_drift_by_k", log=log) if "drift_q3" in T else []


_Q4_ROLES = ["sep1", "sep2", "cls", "mean_s1", "mean_s2"]


def _fig_q4(T, fig, log):
    from figures.attention import plot_attention
    from figures.cka import plot_cka_layers
    from figures.probes import plot_probes

    out = []
    if "attention" in T:
        out += safe_plot(plot_attention, T["attention"], fig / "q4_attention_concat", format="concat", log=log)
    if "probes_pair" in T:
        p = T["probes_pair"]
        out += safe_plot(plot_probes, p, fig / "q4_probes_is_next", target="is_next", roles=_Q4_ROLES, log=log)
        out += safe_plot(plot_probes, p, fig / "q4_probes_bow_s2", target="bow_s2", metric="micro_f1",
                         roles=_Q4_ROLES, log=log)
    if "cka_q4" in T:
        out += safe_plot(plot_cka_layers, T["cka_q4"], fig / "q4_cka_sep", log=log)
    if "q4_knockout_drift" in T:
        from figures.interventions import plot_knockout_drift, plot_knockout_probes

        out += safe_plot(plot_knockout_drift, T["q4_knockout_drift"], fig / "q4_sep_knockout_drift", log=log)
        out += safe_plot(plot_knockout_probes, T["q4_knockout_probes"], fig / "q4_sep_knockout_probes", log=log)
    return out


def _fig_q5(T, fig, log):
    from figures.probes import plot_probe_position

    if "probes_q5" not in T:
        return []
    return safe_plot(plot_probe_position, T["probes_q5"], fig / "q5_cls_content_by_position", metric="micro_f1",
                     choice=["cls", "mean"], layer="last", log=log)


def _fig_q6(T, fig, log):
    from figures.probes import plot_probes

    if "probes_q6" not in T:
        return []
    p = T["probes_q6"].copy()
    p["role"] = p["format"].map({"pair": "cls first", "cls_mid": "cls middle", "cls_last": "cls last"})
    p["format"] = "pair / cls_mid / cls_last"
    return (safe_plot(plot_probes, p, fig / "q6_cls_position_topic", target="topic", log=log)
            + safe_plot(plot_probes, p, fig / "q6_cls_position_is_next", target="is_next", log=log))


def _fig_q7(T, fig, log):
    from figures.probes import plot_probes

    out = []
    if "probes_pair" in T:
        p = T["probes_pair"]
        out += safe_plot(plot_probes, p, fig / "q7_probes_bow_s1", target="bow_s1", metric="micro_f1",
                         roles=["cls", "mean"], log=log)
        out += safe_plot(plot_probes, p, fig / "q7_probes_length", target="length", roles=["cls", "mean"], log=log)
    if "probes_q7" in T:
        out += safe_plot(plot_probes, T["probes_q7"], fig / "q7_probes_word_order", target="swapped", log=log)
    return out


def _fig_q8(T, fig, log):
    from figures.pooling import plot_pooling
    from figures.probes import plot_probes

    out = []
    if "probes_pair" in T:
        out += safe_plot(plot_probes, T["probes_pair"], fig / "q8_probes_topic", target="topic",
                         roles=["cls", "mean", "max", "sep1", "first_word", "pos3"], log=log)
    if "finetune" in T:
        # the fine-tuning table holds its own frozen probes on the same splits and test items: those bars
        out += safe_plot(plot_pooling, T["finetune"], fig / "q8_pooling", log=log)
    return out


# ---------------------------------------------------------------------------------------------------
# Report tables


def _at_last_layer(d: pd.DataFrame, index, columns: str, caption: str):
    """``d``'s values at its last layer, ``index`` × ``columns``; ``{L}`` in the caption is the layer."""
    L = last_layer(d)
    t = d[d["layer"] == L].pivot_table(index=index, columns=columns, values="value", sort=False)
    return t.reset_index(), caption.format(L=L)


def _by_layer(d: pd.DataFrame, columns: list[str], caption: str, sep: str = " / "):
    """``d``'s values, one row per layer, one column per combination of ``columns``."""
    t = d.pivot_table(index="layer", columns=columns, values="value", aggfunc="first", sort=False)
    t.columns = [sep.join(map(str, c)) for c in t.columns]
    return t.reset_index(), caption


def _table_q1(T):
    if "drift_q1" not in T:
        return None
    return _at_last_layer(pick(T["drift_q1"], metric="drift_mean"), ["format", "format_b"], "role",
                          "1 − cos (mean) at layer {L}, per role group")


def _table_q2(T):
    if "drift_q2" not in T:
        return None
    return _by_layer(pick(T["drift_q2"], metric="drift_mean"), ["format", "format_b"],
                     "1 − cos (mean) of the words of the single sentence (role 'all')", sep="→")


def _table_q3(T):
    if "drift_q3" not in T:
        return None
    return _at_last_layer(pick(T["drift_q3"], metric="drift_mean"), "k", "role",
                          "1 − cos (mean) between multi and concat at layer {L}, by k")


def _table_q4(T):
    if "probes_pair" not in T:
        return None
    p = pick(T["probes_pair"], model_kind="trained")
    return _at_last_layer(p[p["metric"].isin(["accuracy", "micro_f1"])], "role", "target",
                          "probe scores at layer {L} (accuracy; micro-F1 for bow_*; trained model)")


def _table_q5(T):
    if "probes_q5" not in T:
        return None
    return _at_last_layer(pick(T["probes_q5"], metric="micro_f1"), "role", "target",
                          "bag-of-words micro-F1 per sentence position at layer {L}")


def _table_q6(T):
    if "probes_q6" not in T:
        return None
    return _by_layer(pick(T["probes_q6"], metric="accuracy"), ["target", "format"],
                     "probe accuracy of the classification token by layer and position")


def _table_q7(T):
    if "probes_q7" not in T:
        return None
    return _by_layer(pick(T["probes_q7"], metric="accuracy"), ["model_kind", "role"],
                     "word-order (swapped) probe accuracy by layer")


def q8_same_items(f: pd.DataFrame) -> pd.DataFrame:
    """Per pooling of the fine-tuning table: fine-tuned and frozen accuracy over the out-of-fold test
    items (CIs over documents), the items each is scored on, whether they are the same items (equal
    counts, and the paired fine-tuned − frozen row matched that many), and the paired difference."""
    from .verdicts import format_interval

    rows = []
    for pooling in dict.fromkeys(pick(f, metric="test_accuracy_mean")["role"]):
        ft = pick(f, metric="test_accuracy_mean", role=pooling).iloc[0]
        fr = pick(f, metric="frozen_test_accuracy_mean", role=pooling)
        d = pick(f, metric="accuracy_diff", role=pooling)
        fr = fr.iloc[0] if not fr.empty else None
        d = d.iloc[0] if not d.empty else None
        n_ft, n_fr = int(ft["n"]), int(fr["n"]) if fr is not None else None
        rows.append({
            "pooling": pooling,
            "fine-tuned": format_interval(float(ft["value"]), float(ft["ci_low"]), float(ft["ci_high"])),
            "frozen (same splits)": (format_interval(float(fr["value"]), float(fr["ci_low"]), float(fr["ci_high"]))
                                     if fr is not None else "not run"),
            "fine-tuned − frozen": (format_interval(float(d["value"]), float(d["ci_low"]), float(d["ci_high"]),
                                                    signed=True) if d is not None else "not run"),
            "p (Holm)": float(d["p_holm"]) if d is not None else float("nan"),
            "test items": n_ft,
            "same test items": bool(fr is not None and d is not None and n_ft == n_fr == int(d["n"])),
            "runs": int(ft["n_runs"]) if "n_runs" in ft and pd.notna(ft["n_runs"]) else None,
            "warning": str(ft["warning"]) if "warning" in ft and pd.notna(ft["warning"]) and ft["warning"] else "",
        })
    return pd.DataFrame(rows)


def _table_q8(T):
    if "finetune" not in T:
        return None
    t = q8_same_items(T["finetune"])
    if t.empty:
        return None
    return t, ("fine-tuned and frozen (a probe on the frozen encoder's pooled last layer) test accuracy per pooling, "
               "both on the same stratified document-grouped splits and the same out-of-fold test items (95% CIs "
               "over documents); fine-tuned − frozen paired per item, Holm over every accuracy_diff row")


# ---------------------------------------------------------------------------------------------------
# Evidence: the numbers behind each verdict, read from the tables


def _drift_sentence(d: pd.DataFrame, a: str, b: str) -> str:
    dd = pick(d, format=a, format_b=b)
    if dd.empty:
        return f"(no drift measured for {a} → {b})"
    L = last_layer(dd)
    parts = []
    for role, label in (("cls", "[CLS]"), ("s1 words", "words of sentence 1"), ("s2 words", "words of sentence 2")):
        v = one(dd, layer=L, role=role, metric="drift_mean")
        if v is not None:
            parts.append(f"{label} by 1 − cos = {fmt(v)}")
    base = one(dd, layer=L, role="all", metric="anisotropy_baseline")
    nd = one(dd, layer=L, role="cls", metric="normalised_drift")
    s = f"at layer {L} ({a} → {b}) " + "; ".join(parts)
    if base is not None:
        s += f"; the random-pair baseline at that layer is 1 − cos = {1 - base[0]:.3f}"
    if nd is not None:
        s += f", so [CLS]'s normalised drift is {fmt(nd[0])}"
    return s


def _marginal_q1(T: dict) -> str:
    d = T.get("drift_q1")
    if d is None:
        return "not measured"
    s = "Removing the middle [SEP] changes, " + _drift_sentence(d, "pair", "concat") + ". "
    cls = pick(d, format="pair", format_b="concat", role="cls", metric="drift_mean")
    if not cls.empty:
        worst = cls.loc[cls["value"].idxmax()]
        s += f"[CLS] moves most at layer {int(worst['layer'])} (1 − cos = {fmt(float(worst['value']))}). "
    sep_only = one(d, format="pair", format_b="concat_segments", role="cls", metric="drift_mean",
                   layer=last_layer(d))
    seg_only = one(d, format="concat_segments", format_b="concat", role="cls", metric="drift_mean",
                   layer=last_layer(d))
    if sep_only is not None and seg_only is not None:
        s += (f"Split into its parts at the last layer: removing only the [SEP] token moves [CLS] by {fmt(sep_only)}, "
              f"removing only the segment ids by {fmt(seg_only)}.")
    c = T.get("cka_q1")
    v = one(c, layer=last_layer(c), role="cls", metric="linear_cka") if c is not None else None
    if v is not None:
        s += f" Linear CKA of [CLS] between the two formats at the last layer: {fmt(v[0])}."
    return s


def _marginal_q2(T: dict) -> str:
    d = T.get("drift_q2")
    if d is None:
        return "not measured"
    L = last_layer(d)
    out = []
    for single, sent in (("single", "s1 words"), ("single2", "s2 words")):
        for fmt_b in ("pair", "concat"):
            v = one(d, format=single, format_b=fmt_b, role=sent, metric="drift_mean", layer=L)
            if v is not None:
                out.append(f"{sent.split()[0]} alone → in `{fmt_b}`: 1 − cos = {fmt(v)}")
    s = f"At layer {L}, " + "; ".join(out) + "."
    a = T.get("attention")
    if a is not None:
        m = pick(a, role="s1 words", target="s2 words", head="mean")
        vals = []
        for f in ("pair", "concat"):
            r = pick(m, format=f)
            if not r.empty:
                vals.append(f"{r['value'].mean():.3f} in `{f}`")
        if vals:
            s += " Attention mass from sentence 1's words to sentence 2's words, averaged over layers and heads: " \
                 + ", ".join(vals) + "."
    return s


def answer_q3(T: dict) -> str:
    d = T.get("drift_q3")
    if d is None:
        return "not measured"
    L = last_layer(d)
    parts = []
    for k in sorted(d["k"].unique()):
        v = one(d, k=k, layer=L, role="cls", metric="drift_mean")
        w = one(d, k=k, layer=L, role="all", metric="drift_mean")
        parts.append(f"k={k}: [CLS] {fmt(v)}, all tokens {fmt(w)}")
    return (f"`multi` ([SEP] after each of k sentences) against `concat` at layer {L}, 1 − cos: "
            + "; ".join(parts) + ".")


def _marginal_q4(T: dict) -> str:
    p = T.get("probes_pair")
    if p is None:
        return "not measured"
    tr = pick(p, model_kind="trained")
    L = last_layer(tr)
    parts = []
    for target, metric in (("topic", "accuracy"), ("is_next", "accuracy"), ("bow_s1", "micro_f1"),
                           ("bow_s2", "micro_f1")):
        row = []
        for choice in ("sep1", "cls", "mean_s1"):
            v = one(tr, role=choice, target=target, metric=metric, layer=L)
            row.append(f"{choice} {fmt(v[0] if v else None)}")
        base = one(tr, role="sep1", target=target, metric="majority_baseline", layer=L)
        parts.append(f"{target} ({metric}): " + ", ".join(row) + f" (majority baseline {fmt(base[0] if base else None)})")
    s = f"Probes at layer {L} on the middle [SEP] (sep1) vs [CLS] vs mean of sentence 1's words — " + "; ".join(parts) + "."
    c = T.get("cka_q4")
    if c is not None:
        Lc = last_layer(c)
        vals = []
        for t in ("cls", "mean_s1", "mean_s2"):
            v = one(c, role="sep1", target=t, metric="linear_cka", layer=Lc)
            vals.append(f"{t} {fmt(v[0] if v else None)}")
        s += f" Linear CKA of sep1 at layer {Lc} with: " + ", ".join(vals) + "."
    a = T.get("attention")
    if a is not None:
        m = pick(a, format="pair", role="s1 words", target="all [SEP]", head="mean")
        if not m.empty:
            s += f" Words of sentence 1 send {m['value'].mean():.3f} of their attention to the [SEP]s (mean over layers)."
    return s


def _bow_targets(p: pd.DataFrame) -> list[str]:
    return sorted({t for t in p["target"].unique() if str(t).startswith("bow_s")}, key=lambda t: int(t[5:]))


def _marginal_q5(T: dict) -> str:
    p = T.get("probes_q5")
    if p is None:
        return "not measured"
    L = last_layer(p)
    targets = _bow_targets(p)
    parts = []
    for t in targets:
        v = one(p, role="cls", target=t, metric="micro_f1", layer=L)
        m = one(p, role="mean", target=t, metric="micro_f1", layer=L)
        parts.append(f"sentence {t[5:]}: [CLS] {fmt(v)}, mean {fmt(m[0] if m else None)}")
    base = one(p, role="cls", target=targets[0], metric="majority_baseline", layer=L) if targets else None
    return (f"Bag-of-words micro-F1 of sentence i read from [CLS] at layer {L} of a {len(targets)}-sentence input: "
            + "; ".join(parts) + f" (baseline {fmt(base[0] if base else None)}).")


def _marginal_q6(T: dict) -> str:
    p = T.get("probes_q6")
    if p is None:
        return "not measured"
    L = last_layer(p)
    parts = []
    for target in ("topic", "is_next"):
        vals = [f"{f} {fmt(one(p, format=f, role='cls', target=target, metric='accuracy', layer=L))}"
                for f in ("pair", "cls_mid", "cls_last")]
        parts.append(f"{target}: " + ", ".join(vals))
    return f"Probe accuracy of the classification token at layer {L}, by where it sits — " + "; ".join(parts) + "."


def _marginal_q7(T: dict) -> str:
    p = T.get("probes_pair")
    parts = []
    if p is not None:
        L = last_layer(p)
        for target, metric in (("bow_s1", "micro_f1"), ("fw_s1", "micro_f1"), ("length", "accuracy")):
            vals = []
            for kind in ("trained", "random_init"):
                for choice in ("cls", "mean"):
                    v = one(p, model_kind=kind, role=choice, target=target, metric=metric, layer=L)
                    if v is not None:
                        vals.append(f"{choice} ({kind.replace('_', ' ')}) {fmt(v[0])}")
            parts.append(f"{target} {metric}: " + ", ".join(vals))
    q = T.get("probes_q7")
    if q is not None:
        L = last_layer(q)
        vals = [f"{c} ({k.replace('_', ' ')}) {fmt(one(q, model_kind=k, role=c, target='swapped', metric='accuracy', layer=L))}"
                for k in ("trained", "random_init") for c in ("cls", "mean")]
        b = one(q, role="cls", target="swapped", metric="majority_baseline", layer=L)
        parts.append("word order (swapped) accuracy: " + ", ".join(vals) + f", majority {fmt(b[0] if b else None)}")
    return "At the last layer — " + "; ".join(parts) + "." if parts else "not measured"


# ---------------------------------------------------------------------------------------------------
# Evidence from the paired rows: each difference with its CI, Holm p and power


def paired_text(row) -> str:
    """``+0.012 (95% CI +0.004 to +0.020; Holm p = 0.01)`` of one paired comparison row."""
    from .verdicts import format_interval, format_p

    s = format_interval(float(row["value"]), float(row["ci_low"]), float(row["ci_high"]), signed=True)
    p = row.get("p_holm") if hasattr(row, "get") else None
    if p is not None and pd.notna(p):
        s = s[:-1] + f"; Holm {format_p(float(p))})" if s.endswith(")") else s + f" (Holm {format_p(float(p))})"
    return s


def power_text(rows: pd.DataFrame, what: str) -> str:
    """Whether the default sizes can detect :data:`analyses.stats.DETECTABLE_EFFECT` in ``rows`` (from
    their ``groups_needed`` and ``n_groups``), generated from the numbers."""
    from analyses.stats import DETECTABLE_EFFECT

    if rows is None or rows.empty or "groups_needed" not in rows.columns:
        return ""
    need = pd.to_numeric(rows["groups_needed"], errors="coerce")
    have = pd.to_numeric(rows["n_groups"], errors="coerce")
    if need.isna().all() or have.isna().all():
        return ""
    worst = int(need.max())
    unit = f"{rows['grouping'].iloc[0]}s" if "grouping" in rows.columns else "groups"
    n = int(have.min())
    if worst <= n:
        return (f" Power: with {n} {unit}, {what} can detect a difference of {DETECTABLE_EFFECT:g} "
                f"(needs at most {worst}).")
    return (f" Power: with {n} {unit}, {what} cannot reliably detect a difference of {DETECTABLE_EFFECT:g}: that "
            f"would take about {worst} {unit} (a larger corpus).")


def _at_last(rows: pd.DataFrame) -> pd.DataFrame:
    layer = pd.to_numeric(rows["layer"], errors="coerce")
    return rows[layer == layer.max()] if layer.notna().any() else rows


def answer_q1(T: dict) -> str:
    s = _marginal_q1(T)
    d = pick(T.get("paired_q1"), metric="drift_diff_roles")
    if not d.empty:
        r = _at_last(d).iloc[0]
        s += (f" Paired per example, [CLS]'s drift minus the mean drift of the words at layer {int(r['layer'])}: "
              f"{paired_text(r)} ({int(r['n_groups'])} {r['grouping']}s; Holm over layers).")
    return s + patching_text(T)


def patching_text(T: dict) -> str:
    """Q1's "how much of [CLS]'s change comes through [SEP]": the share of [CLS]'s pair → concat drift at
    the last layer each intervention on `pair` reproduces (patching [CLS] from concat at layer l; no
    attention to the middle [SEP])."""
    from .verdicts import format_interval

    d = pick(T.get("q1_cls_patching"), metric="fraction_reproduced")
    if d.empty:
        return ""
    parts = []
    for _, r in d.iterrows():
        iv = str(r.get("intervention", ""))
        what = (f"[CLS] patched from concat at layer {int(r['patch_layer'])}" if pd.notna(r.get("patch_layer"))
                else "[CLS] not attending to the middle [SEP] (every layer)" if "cls->sep1" in iv
                else "no token attending to the middle [SEP] (every layer)" if "all->sep1" in iv else iv)
        parts.append(f"{what}: {format_interval(float(r['value']), float(r['ci_low']), float(r['ci_high']))}")
    return (f" How much of [CLS]'s change comes through [SEP]: the share of [CLS]'s pair → concat drift at layer "
            f"{int(d['layer'].iloc[0])} that an intervention on `pair` reproduces (1 = all of it, 0 = none) — "
            + "; ".join(parts) + ".")


def answer_q2(T: dict) -> str:
    s = _marginal_q2(T)
    d = pick(T.get("paired_q2"), metric="drift_diff")
    parts = []
    for ref, role in (("single", "s1 words"), ("single2", "s2 words")):
        r = pick(d, reference=ref, role=role)
        if not r.empty:
            r = _at_last(r).iloc[0]
            parts.append(f"{role.split()[0]}'s words {paired_text(r)}")
    if parts:
        s += (" Paired on the same words, drift into `concat` − into `pair` at the last layer: " + "; ".join(parts)
              + ".")
    return s


def answer_q4(T: dict) -> str:
    s = _marginal_q4(T)
    d = T.get("paired_q4")
    if d is not None and not d.empty:
        last = _at_last(d)
        parts = [f"{r['target']} {paired_text(r)}" for _, r in last.iterrows()]
        s += (f" Paired on the same out-of-fold items, sep1 − cls at layer {int(last['layer'].iloc[0])}: "
              + "; ".join(parts) + "." + power_text(pick(d, target="is_next"), "the is_next comparison"))
    return s + knockout_text(T)


#: The knockout claims: the treated effect beyond the control's, on [CLS] and on the task probes.
KNOCKOUT_DRIFT_CLAIM = Claim(
    more="knocking out attention to [SEP] moves [CLS] more than the control knockout does",
    less="the control knockout moves [CLS] more than knocking out attention to [SEP] does",
    none="knocking out attention to [SEP] moves [CLS] no more than the control knockout",
    quantity="[CLS] drift from the clean run, knockout − control (1 − cos, per example)")
KNOCKOUT_PROBE_CLAIM = Claim(
    more="knocking out attention to [SEP] raises the accuracy more than the control",
    less="knocking out attention to [SEP] lowers the accuracy more than the control",
    none="knocking out attention to [SEP] changes the accuracy no more than the control",
    quantity="change in accuracy, knockout − control (probe trained on clean states)")


def knockout_text(T: dict) -> str:
    """Q4's "does the model use [SEP]?": verdicts from the knockout − control rows (drift of [CLS] per
    layer; [CLS] probe accuracy per target), by the same rules as every section's verdict."""
    from .verdicts import summarise

    drift, probes = T.get("q4_knockout_drift"), T.get("q4_knockout_probes")
    if drift is None and probes is None:
        return ""
    s = " Does the model use [SEP]? Attention to every [SEP] knocked out in the middle layers, against a control " \
        "knockout of as many random word keys:"
    d = pick(drift, role="cls", metric="drift_difference")
    if not d.empty:
        d = _contextual(d)
        d = d[pd.to_numeric(d["layer"]) >= pd.to_numeric(d["layer"]).min()]
        s += " " + summarise(d, KNOCKOUT_DRIFT_CLAIM).sentence
    p = pick(probes, metric="change_difference", mode="transfer")
    for _, r in p.iterrows():
        v = summarise(pd.DataFrame([r]), KNOCKOUT_PROBE_CLAIM)
        acc = {m: one(probes, metric=m, mode="transfer", target=r["target"])
               for m in ("accuracy_clean", "accuracy_treated", "accuracy_control")}
        accs = ", ".join(f"{m.split('_')[1]} {fmt(v_[0])}" for m, v_ in acc.items() if v_ is not None)
        s += f" {r['target']} ([CLS], last layer; {accs}): {v.sentence}"
    return s


def answer_q5(T: dict) -> str:
    s = _marginal_q5(T)
    d = T.get("paired_q5")
    if d is not None and not d.empty:
        last = _at_last(d)
        parts = [f"{r['target']} {paired_text(r)}" for _, r in last.iterrows()]
        s += (f" Paired on the same items, [CLS] − mean at layer {int(last['layer'].iloc[0])}: " + "; ".join(parts)
              + ".")
    p = T.get("probes_q5")
    fw = one(p, role="cls", target="fw_s1", metric="micro_f1", layer=last_layer(p)) if p is not None else None
    if fw is not None:
        s += (f" Control: function-word presence of sentence 1 (fw_s1, which tracks length) from [CLS], micro-F1 "
              f"{fmt(fw)}; the bow targets are content words.")
    return s


def answer_q6(T: dict) -> str:
    s = _marginal_q6(T)
    d = T.get("paired_q6")
    if d is not None and not d.empty:
        last = _at_last(d)
        parts = [f"{r['target']} {r['condition_a'].split('=')[1]} − {r['condition_b'].split('=')[1]} {paired_text(r)}"
                 for _, r in last.iterrows()]
        same = bool(d["same_folds"].all()) if "same_folds" in d.columns else False
        s += (f" Paired on the same examples {'and folds' if same else '(folds differ)'} across the three caches, at "
              f"layer {int(last['layer'].iloc[0])}: " + "; ".join(parts) + "."
              + power_text(pick(d, target="topic"), "the topic comparison"))
    return s


def answer_q7(T: dict) -> str:
    from .verdicts import row_mde

    s = _marginal_q7(T)
    q = T.get("probes_q7")
    if q is not None:
        rows = _q7_rows(T)
        if rows is not None and not rows.empty:
            worst = max(row_mde(r) for _, r in rows.iterrows())
            acc = pick(q, role="cls", target="swapped", metric="accuracy")
            n = f"n = {int(acc['n'].max())} pairs" if "n" in acc.columns and acc["n"].notna().any() else "this size"
            s += (f" Word order: at {n}, the smallest accuracy above the majority baseline this sample could detect "
                  f"is {worst:.3f}"
                  + (f" (it cannot detect {PRACTICAL_THRESHOLD:g})." if worst > PRACTICAL_THRESHOLD else "."))
    d = T.get("paired_q7")
    if d is not None and not d.empty:
        tr = pick(d, condition_a="model_kind=trained")
        if not tr.empty:
            last = _at_last(tr)
            parts = [f"{r['role']} {paired_text(r)}" for _, r in last.iterrows()]
            s += " Trained − random-init (word order, paired items, last layer): " + "; ".join(parts) + "."
        lb = pick(d, condition_b="role=length_only")
        if not lb.empty:
            last = _at_last(lb)
            parts = [f"{r['target']} {paired_text(r)}" for _, r in last.iterrows()]
            s += (" Beyond the length baseline (a probe on words per sentence), [CLS] − length-only at the last layer: "
                  + "; ".join(parts) + " (fw_s1: function words, the length-tracking control).")
    return s


def answer_q8(T: dict) -> str:
    s = ""
    d = T.get("paired_q8")
    if d is not None and not d.empty:
        r = _at_last(d).iloc[0]
        s += (f"Frozen probes for topic, cls − mean at layer {int(r['layer'])}, paired on the same out-of-fold items: "
              f"{paired_text(r)}." + power_text(d, "this comparison") + " ")
    f = T.get("finetune")
    if f is not None:
        t = q8_same_items(f)
        if not t.empty:
            s += ("Fine-tuned vs frozen on the same splits and test items: "
                  + "; ".join(f"{r['pooling']} fine-tuned {r['fine-tuned']}, frozen {r['frozen (same splits)']}, "
                              f"difference {r['fine-tuned − frozen']}" for _, r in t.iterrows()) + ".")
        for _, r in pick(f, metric="accuracy_diff").iterrows():
            if " − " in str(r["role"]):
                s += f" {r['role']} ({r['condition']}): {paired_text(r)}."
        best, chance = one(f, metric="best_constant", role="baseline"), one(f, metric="chance", role="baseline")
        if best is not None:
            s += f" Best constant {fmt(best[0])}" + (f", chance {fmt(chance[0])}" if chance else "") + "."
        s += finetune_warnings(f)
    return s.strip() or "not measured"


def finetune_warnings(f: pd.DataFrame) -> str:
    """A visible line per fine-tuning or frozen run flagged below the best constant or not converged."""
    if f is None or "warning" not in f.columns:
        return ""
    runs = f["metric"].isin(["test_accuracy", "frozen_test_accuracy"])
    flagged = runs & f["warning"].fillna("").astype(str).ne("")
    if not flagged.any():
        return ""
    means = f[f["metric"].isin(["test_accuracy_mean", "frozen_test_accuracy_mean"])
              & f["warning"].fillna("").astype(str).ne("")]
    what = "; ".join(f"{r['role']} {'frozen' if r['metric'].startswith('frozen') else 'fine-tuned'}: {r['warning']}"
                     for _, r in means.iterrows())
    return (f" **Warning:** {int(flagged.sum())} of {int(runs.sum())} runs flagged (below the best constant, or "
            f"training did not converge){': ' + what if what else ''}; see the `warning` column of "
            "tables/finetune.csv.")


# ---------------------------------------------------------------------------------------------------
# Comparison rows (PROVISIONAL: from marginal intervals; see the module docstring) and claims


def _layers(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by layer, the layer as an integer (probe comparison rows carry it as a float)."""
    df = df[pd.to_numeric(df["layer"], errors="coerce").notna()]
    return df.assign(layer=pd.to_numeric(df["layer"]).astype(int)).sort_values("layer")


def _contextual(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of layers >= 1: comparisons involving [CLS] leave out layer 0, the embedding layer, where
    [CLS] is the same vector for every input (a trivial difference, or a trivial null)."""
    return _layers(df[pd.to_numeric(df["layer"], errors="coerce") >= 1])


def _q1_rows(T):
    d = pick(T.get("paired_q1"), metric="drift_diff_roles")
    return None if d.empty else _contextual(d)


def _q2_rows(T):
    d = pick(T.get("paired_q2"), reference="single", role="s1 words", metric="drift_diff")
    return None if d.empty else _layers(d)


def _q3_rows(T):
    # PROVISIONAL: k = 2 and the largest k are prefixes of different lengths (different corpora for the
    # caches), so no shared reference pairs their token keys; two marginal intervals, marked so.
    d = pick(T.get("drift_q3"), role="all", metric="drift_mean")
    if d.empty or d["k"].nunique() < 2:
        return None
    return difference_rows(_layers(pick(d, k=d["k"].max())), _layers(pick(d, k=d["k"].min())))


def _q4_rows(T):
    d = pick(T.get("paired_q4"), target="is_next")
    return None if d.empty else _contextual(d)


def _q5_rows(T):
    p = pick(T.get("probes_q5"), role="cls")
    if p.empty:
        return None
    p = p[p["target"].astype(str).str.startswith("bow_s")]  # fw_s1 is the control, not the question
    L = last_layer(p)
    p = p[p["layer"] == L]
    score = p[p["metric"] == "micro_f1"].assign(sentence=lambda t: t["target"].str[5:].astype(int))
    base = p[p["metric"] == "majority_baseline"].assign(sentence=lambda t: t["target"].str[5:].astype(int),
                                                        ci_low=float("nan"), ci_high=float("nan"))
    return difference_rows(score.sort_values("sentence"), base, on="sentence")


def _q6_rows(T):
    d = pick(T.get("paired_q6"), target="topic", condition_b="format=cls_last")
    return None if d.empty else _contextual(d)


def _q7_rows(T):
    q = pick(T.get("probes_q7"), model_kind="trained", role="cls", target="swapped")
    if q.empty:
        return None
    base = pick(q, metric="majority_baseline").assign(ci_low=float("nan"), ci_high=float("nan"))
    return difference_rows(_contextual(pick(q, metric="accuracy")), base)


def _q8_rows(T):
    d = pick(T.get("paired_q8"), target="topic")
    return None if d.empty else _contextual(d)


CLAIMS = {
    "Q1": Claim(more="[CLS] changes more than the words of sentence 1 when the middle [SEP] is dropped",
                less="[CLS] changes less than the words of sentence 1 when the middle [SEP] is dropped",
                none="[CLS] and the words of sentence 1 change alike when the middle [SEP] is dropped",
                quantity="drift of [CLS] − mean drift of the words, paired per example (1 − cos, pair → concat)"),
    "Q2": Claim(more="sentence 1's words take in more of sentence 2 in `concat` than in `pair`",
                less="sentence 1's words take in more of sentence 2 in `pair` than in `concat`",
                none="sentence 1's words take in as much of sentence 2 in `concat` as in `pair`",
                quantity="drift from `single` into `concat` − into `pair`, paired per word (1 − cos)"),
    "Q3": Claim(more="the token states move further from `concat` with more segments",
                less="the token states move less from `concat` with more segments",
                none="more segments move the token states no further from `concat`",
                quantity="drift of all tokens (multi vs concat) at the largest k − at k = 2"),
    "Q4": Claim(more="the middle [SEP] tells coherent from shuffled pairs (is_next) better than [CLS]",
                less="[CLS] tells coherent from shuffled pairs (is_next) better than the middle [SEP]",
                none="the middle [SEP] and [CLS] tell coherent from shuffled pairs alike",
                quantity="is_next probe accuracy, sep1 − cls, paired on the same out-of-fold items"),
    "Q5": Claim(more="[CLS] holds words of these sentences beyond the frequency baseline",
                less="[CLS] predicts the words of these sentences worse than the frequency baseline",
                none="[CLS] holds no more of these sentences' words than the frequency baseline",
                quantity="bag-of-words micro-F1 of [CLS] (last layer) − baseline", facet=("sentence", "sentences"),
                direction=1),
    "Q6": Claim(more="[CLS] placed first is read better than [CLS] placed last",
                less="[CLS] placed last is read better than [CLS] placed first",
                none="[CLS] first and [CLS] last are read alike",
                quantity="topic probe accuracy, first − last, paired on the same out-of-fold items"),
    "Q7": Claim(more="word order (two adjacent words swapped) can be read from [CLS] above chance",
                less="the word-order probe on [CLS] scores below chance",
                none="word order cannot be read from [CLS] above chance",
                quantity="swapped probe accuracy of [CLS] − majority baseline", direction=1),
    "Q8": Claim(more="frozen [CLS] reads topic better than mean pooling",
                less="frozen mean pooling reads topic better than [CLS]",
                none="frozen [CLS] and mean pooling read topic alike",
                quantity="topic probe accuracy, cls − mean (frozen), paired on the same out-of-fold items"),
}


# ---------------------------------------------------------------------------------------------------
# Notes: how it was measured and what it does not show


def _q3_notes(cfg: dict) -> str:
    return (f"For k consecutive sentences of one document of the groups corpus ({corpus_text(cfg['corpus']['groups'])} "
            "sentences), `multi` ([SEP] after every sentence, alternating segments) against `concat` (one [CLS] … "
            "[SEP]); the model's pre-training format has two segments at most, so growth with k shows the format "
            "moving away from what it saw in training. It does not measure task accuracy with k segments. The "
            "largest-k − k=2 comparison is still PROVISIONAL (two marginal intervals treated as independent): the "
            "k-sentence prefixes are separate caches with no shared reference format to pair their tokens on.")


def _q8_notes(cfg: dict) -> str:
    ft = cfg["finetune"]
    return ("Frozen probes score each pooling choice per layer without training the encoder (cls − mean paired on "
            "the same out-of-fold items); the fine-tuning experiment trains the encoder with a linear head on each "
            f"pooling ({', '.join(ft['poolings'])}) over {len(ft['seeds'])} seed(s) with the `{ft['preset']}` preset "
            "of analyses.finetune_config, on stratified document-grouped cross-validation splits, and on the same splits "
            "fits a frozen probe per pooling: both predict the same test items, so fine-tuned − frozen and "
            "pooling − mean are paired per item. Multiple comparisons: " + FAMILIES["Q8"] + ".")


NOTES = {
    "Q1": "Drift is 1 − cos between the same token key (same example, sentence, word, subword) in two formats, "
          "averaged per role group, with a cluster bootstrap over documents (examples when the corpus has none). Raw cosines are high for any two "
          "tokens in these models, so each drift is shown beside the random-pair baseline of its layer and "
          "normalised by it (0 = unchanged, 1 = as far as two random tokens). `pair` → `concat_segments` "
          "removes only the [SEP] token; `concat_segments` → `concat` removes only the segment embedding. It "
          "does not say whether the change matters for a downstream task (see Q4/Q8 for probes). [CLS] − words is "
          "paired per example (analyses.paired.run_role_contrast; " + FAMILIES["Q1"] + ").",
    "Q2": "Context effect: sentence i's words alone (`single`/`single2`) against the same words inside "
          "`pair` and `concat`; a larger drift means the sentence took in more of its neighbour. concat − pair "
          "is paired on the same words (analyses.paired.run_paired_drift; " + FAMILIES["Q2"] + "). Attention "
          "mass from sentence 1's words to sentence 2's words is a second, mechanistic view (Clark et al. "
          "2019); attention weights are not explanations and mass to special tokens is often a no-op.",
    "Q3": _q3_notes,
    "Q4": "Probes read what is linearly decodable from the [SEP] state (topic, is_next, the bag of words of "
          "the sentence before/after it), against the majority baseline, a control task and a randomly "
          "initialised model; CKA compares [SEP] with [CLS] and with pooled words of each sentence; attention "
          "gives the mass flowing to and from [SEP]. is_next negatives share sentence 1's topic, so is_next is "
          "not topic mismatch; the bag-of-words targets are content words. Decodable is not the same as used by "
          "the model: the knockout (attention from every token to every [SEP] masked before the softmax in the "
          "middle layers, analyses.interventions.sep_knockouts) against a control knockout of as many random word "
          "keys per query asks whether the model uses [SEP]; its CIs are per row (no multiple-comparison "
          "correction). Paired sep1 − cls rows: " + FAMILIES["Q4"] + ".",
    "Q5": "Multi-label probes for the bag of words of sentence i, read from [CLS] of a `multi` input of k "
          "sentences, for each position i; mean pooling as the reference. Micro-F1 over the most frequent "
          "content words (stop words and the top frequency band removed); the baseline predicts each word's "
          "training frequency. fw_s1 (function words of sentence 1, which track length) is the named control. "
          "[CLS] − mean rows are paired on the same out-of-fold items: " + FAMILIES["Q5"] + ".",
    "Q6": "The same probes on the classification token placed first (`pair`), between the sentences "
          "(`cls_mid`) and last (`cls_last`). Absolute position embeddings make the three different inputs; "
          "the pre-trained model only ever saw [CLS] first. Topic is asked of pairs whose sentences share it "
          "(is_next negatives come from the same topic). Comparisons are paired on the same examples, with the "
          "same folds, across the three caches: " + FAMILIES["Q6"] + ".",
    "Q7": "Bag-of-words, sentence-length and word-order (two adjacent words swapped) probes on [CLS] and on "
          "mean-pooled words, per layer, for the trained and a randomly initialised model of the same "
          "architecture. A random model's high bag-of-words score shows how much comes from the embeddings "
          "alone. Bag-of-words targets are content words; fw_s1 (function words) is the length-tracking control, "
          "and a length-only probe (words per sentence, same splits) is the baseline the [CLS] rows are paired "
          "against. Word order is tested against the majority baseline (one-sample, with its detectable effect); "
          "trained − random-init is paired on the same items: " + FAMILIES["Q7"] + ".",
    "Q8": _q8_notes,
}

TITLES = {
    "Q1": "Q1. Drop the middle [SEP]: how much do the embeddings change?",
    "Q2": "Q2. Does sentence 1 take in more of sentence 2 in one format than the other?",
    "Q3": "Q3. Three or more segments: [CLS] s1 [SEP] s2 [SEP] s3 [SEP] …",
    "Q4": "Q4. What does the output at [SEP] hold?",
    "Q5": "Q5. With several sentences, does [CLS] hold information about all of them?",
    "Q6": "Q6. Why is [CLS] first? Would another position do?",
    "Q7": "Q7. Can the input be recovered from [CLS]?",
    "Q8": "Q8. Is [CLS] better than mean pooling? After fine-tuning, would any token do?",
}


def _question(key, corpora, jobs, tables, figures, table, answer, rows, about_cls=False) -> StudySection:
    return StudySection(key=key, title=TITLES[key], corpora=corpora, jobs=jobs, analyse=_tables(*tables),
                        figures=figures, table=table, answer=answer, notes=NOTES[key], comparisons=rows,
                        claim=CLAIMS[key], about_cls=about_cls)


#: The seed questions, in report order.
QUESTION_SECTIONS: dict[str, StudySection] = {s.key: s for s in (
    _question("Q1", ("pairs",), _pair_jobs("Q1"), ("drift_q1", "cka_q1", "paired_q1", "q1_cls_patching"), _fig_q1, _table_q1, answer_q1, _q1_rows,
              about_cls=True),
    _question("Q2", ("pairs",), _pair_jobs("Q2"), ("drift_q2", "attention", "paired_q2"), _fig_q2, _table_q2, answer_q2, _q2_rows),
    _question("Q3", ("groups",), _q3_jobs, ("drift_q3",), _fig_q3, _table_q3, answer_q3, _q3_rows),
    _question("Q4", ("pairs",), _pair_jobs("Q4"), ("attention", "probes_pair", "cka_q4", "paired_q4",
                                                      "q4_knockout_drift", "q4_knockout_probes"), _fig_q4, _table_q4,
              answer_q4, _q4_rows, about_cls=True),
    _question("Q5", ("groups",), _q5_jobs, ("probes_q5", "paired_q5"), _fig_q5, _table_q5, answer_q5, _q5_rows),
    _question("Q6", ("pairs",), _pair_jobs("Q6"), ("probes_q6", "paired_q6"), _fig_q6, _table_q6, answer_q6, _q6_rows,
              about_cls=True),
    _question("Q7", ("pairs", "swap"), _pair_jobs("Q7"), ("probes_pair", "probes_q7", "paired_q7"), _fig_q7, _table_q7, answer_q7,
              _q7_rows),
    _question("Q8", ("pairs",), _pair_jobs("Q8"), ("probes_pair", "finetune", "paired_q8"), _fig_q8, _table_q8, answer_q8,
              _q8_rows, about_cls=True),
)}
