"""What the seed questions compute: the caches each needs (:class:`probing.study.sections.Job`), the
analyses that make its tables (:data:`PRODUCERS`, each computed once per study through
:meth:`probing.study.sections.Context.table`), and the multiple-comparison family of each question's
paired rows (:data:`FAMILIES`). The questions themselves are declared in :mod:`probing.study.questions`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from ..heap import hand_back_freed
from .sections import Context, Job, Tables, group_prefixes


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
#: Questions whose pair-format probes also fit the length-only probe (the sentences' word counts alone), and
#: the token choices each compares with it: Q7 [CLS] and mean pooling (can the input be recovered from
#: [CLS]?), Q4 the two [SEP]s (what does [SEP] hold, beyond what the lengths tell?). Each run compares only
#: its own choices (``run_probes(length_versus=...)``): its Holm family covers its own targets, so the same
#: row from two runs would carry two adjusted p-values.
LENGTH_BASELINE = {"Q4": ("sep1", "sep2"), "Q7": ("cls", "mean")}
#: Questions whose pair-format probes of some choices are compared with the same choices on the random-init
#: model, by macro AUC on the same resamples (``run_probes(random_versus=...)``), as (choices, targets): is
#: what a token holds of the content words learned, or what any encoder of this architecture would put there?
#: Q4 asks it of the middle [SEP], Q7 of [CLS]. A question of :data:`RANDOM_INIT_PROBES` fits every probe on the
#: random-init model anyway, so its own run makes the comparison; for another, only these choices and targets
#: are fitted there, in a run of their own (a few seconds; Q4's whole probe set would double its probe time).
RANDOM_VERSUS = {"Q4": (("sep1",), ("bow_s1", "bow_s2", "is_next")), "Q7": (("cls",), ("bow_s1",))}
#: The token choice each question's pair-format bag-of-words probes are compared with, by macro AUC on
#: the same resamples (``run_probes(versus=...)``): Q4 asks whether [SEP] holds a sentence's words better
#: than [CLS].
PAIR_VERSUS = {"Q4": "cls"}
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


def make_intervention(name: str, n_layers: int, caches=None, corpus: str = "", random: bool = False,
                      seed: int = 0):
    """The :class:`probing.interventions.Intervention` of :data:`INTERVENTIONS` ``name`` for a model of
    ``n_layers`` layers (``caches``, ``corpus`` and ``random`` locate a patch's source cache; ``seed``: the
    knockout control's draw of word keys)."""
    from analyses.interventions import cls_patches, middle_sep_knockouts, sep_knockouts

    if name in patch_layers(n_layers):
        source = caches.paths[(corpus, "concat", random)]  # extracted first: clean caches come first
        return cls_patches(source, n_layers)[patch_layers(n_layers)[name]]
    if name in ("sep1_cls_ko", "sep1_all_ko"):
        return dict(zip(("sep1_cls_ko", "sep1_all_ko"), middle_sep_knockouts(n_layers)))[name]
    if name not in ("sep_ko", "sep_ko_control"):
        raise ValueError(f"unknown intervention {name!r}; known: {', '.join(INTERVENTIONS)}")
    ko, control = sep_knockouts(n_layers, seed=seed)
    return {"sep_ko": ko, "sep_ko_control": control}[name]


def _pair_jobs(q: str):
    def jobs(cfg, corpora: dict) -> list[Job]:
        out = [Job("pairs", f, attention=f in ATTENTION_FORMATS) for f in PAIR_FORMATS if f in PAIR_NEEDS.get(q, ())]
        if q == "Q4":
            out += [Job("pairs", "pair", intervention=i) for i in ("sep_ko", "sep_ko_control")]
        if q == "Q1":
            out += [Job("pairs", "pair", intervention=i) for i in (*patch_layers(2), "sep1_cls_ko", "sep1_all_ko")]
        if (q in RANDOM_INIT_PROBES or q in RANDOM_VERSUS) and cfg.model.random_init_baseline:
            out.append(Job("pairs", "pair", random=True))
        if q == "Q7":
            out.append(Job("swap", "pair"))
            if cfg.model.random_init_baseline:
                out.append(Job("swap", "pair", random=True))
        return out

    return jobs


def _q3_jobs(cfg, corpora: dict) -> list[Job]:
    return [Job(c, f) for c in group_prefixes(corpora).values() for f in ("multi", "concat")]


def _q5_jobs(cfg, corpora: dict) -> list[Job]:
    return [Job(group_prefixes(corpora)[max(group_prefixes(corpora))], "multi")]


# ---------------------------------------------------------------------------------------------------
# Tables (each computed once per study, whichever question asks first)


def _rs(ctx: Context) -> dict:
    return dict(n_resamples=ctx.cfg.study.bootstrap_resamples, seed=ctx.cfg.study.seed, out=ctx.out)


def probe_kw(cfg, out: Path, progress: bool = True) -> dict:
    """The probe runner's options from the config's ``[probes]`` table, with the study's seed, device and
    bootstrap resamples (``progress``: its bars)."""
    pr = cfg.probes
    return dict(n_splits=pr.folds, seed=cfg.study.seed, vocab=pr.vocab, device=cfg.study.device, Cs=pr.Cs,
                inner_splits=pr.inner_splits, max_iter=pr.max_iter, bow_Cs=pr.bow_Cs, out=out, progress=progress,
                n_resamples=cfg.study.bootstrap_resamples)


def _pairs(ctx: Context, fmt_: str, random: bool = False):
    return ctx.caches.get("pairs", fmt_, random) if ctx.caches.has("pairs", fmt_, random) else None


def _drift_q1(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    ctx.log("analyses: drift and CKA across formats")
    pair, concat, seg = _pairs(ctx, "pair"), _pairs(ctx, "concat"), _pairs(ctx, "concat_segments")
    kw = dict(_rs(ctx), progress=ctx.progress)
    return pd.concat([run_drift(pair, concat, **kw), run_drift(pair, seg, **kw), run_drift(seg, concat, **kw)],
                     ignore_index=True)


def _cka_q1(ctx: Context) -> pd.DataFrame:
    from analyses.cka import run_cka_formats

    return run_cka_formats(_pairs(ctx, "pair"), _pairs(ctx, "concat"), ["cls", "mean_s1", "mean_s2", "sep_last"],
                           out=ctx.out)


def _drift_q2(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    pair, concat = _pairs(ctx, "pair"), _pairs(ctx, "concat")
    return pd.concat([run_drift(_pairs(ctx, s), b, words_only=True, **_rs(ctx), progress=ctx.progress)
                      for s in ("single", "single2") for b in (pair, concat)], ignore_index=True)


def _attention(ctx: Context) -> pd.DataFrame:
    from analyses.attention import run_attention

    ctx.log("analyses: attention")
    return pd.concat([run_attention(_pairs(ctx, f), **_rs(ctx), progress=ctx.progress) for f in ATTENTION_FORMATS],
                     ignore_index=True)


def _drift_q3(ctx: Context) -> pd.DataFrame:
    from analyses.drift import run_drift

    ctx.log("analyses: k segments")
    frames = []
    for k, c in group_prefixes(ctx.corpora).items():
        d = run_drift(ctx.caches.get(c, "multi"), ctx.caches.get(c, "concat"), **_rs(ctx), progress=ctx.progress)
        d["k"] = k
        frames.append(d)
    return pd.concat(frames, ignore_index=True)


def _paired_q3(ctx: Context) -> pd.DataFrame:
    """Q3's comparison: the multi → concat drift of the same tokens ([CLS] and the words of sentences 1–2)
    in the inputs of the largest k minus in those of k = 2, paired per token (the prefixes are the first
    k sentences of the same documents)."""
    from analyses.paired import run_prefix_drift

    ks = group_prefixes(ctx.corpora)
    short, long = ks[min(ks)], ks[max(ks)]
    if short == long:
        return pd.DataFrame()
    get = ctx.caches.get
    # edges: sentence 2's last word is next to a [SEP] in `multi` but to sentence 3 in the long `concat`
    # (its own neighbour changes only in the long input); the verdict reads [CLS] and the inner words
    return run_prefix_drift(get(short, "multi"), get(short, "concat"), get(long, "multi"), get(long, "concat"),
                            edges=True, **_rs(ctx), progress=ctx.progress).assign(family=FAMILIES["Q3"])


def _probes_pair(ctx: Context) -> pd.DataFrame:
    """The pair-format probes of every selected question among Q4, Q7, Q8 (one table: Q4's table and
    Q7's evidence read each other's rows)."""
    from analyses.probes import run_probes

    ctx.log("analyses: probes on the pair format (trained; random-init for Q7, and Q4's middle [SEP])")
    wanted = [q for q in PAIR_PROBES if q in ctx.questions]
    random = _pairs(ctx, "pair", True)

    def own_random(q: str) -> bool:  # the question's own run fits every probe on the random-init model
        return q in RANDOM_INIT_PROBES and q in RANDOM_VERSUS and random is not None

    runs = [run_probes(_pairs(ctx, "pair"), *PAIR_PROBES[q],
                       random_cache=random if q in RANDOM_INIT_PROBES else None,
                       length_baseline=q in LENGTH_BASELINE, length_versus=LENGTH_BASELINE.get(q),
                       versus=PAIR_VERSUS.get(q), items=True, **probe_kw(ctx.cfg, ctx.out, ctx.progress),
                       random_versus=RANDOM_VERSUS[q][0] if own_random(q) else None)
            for q in wanted]
    runs += [run_probes(_pairs(ctx, "pair"), *PAIR_CONTROLS[q], length_baseline=True, items=True,
                        **probe_kw(ctx.cfg, ctx.out, ctx.progress)) for q in wanted if q in PAIR_CONTROLS]
    # the others: their random-init probes and trained − random-init rows in a run of their own (the trained
    # probes it fits again are rows of the run above)
    # (their items too: a single-label target, such as Q4's is_next, is compared per item in paired_q4)
    versus = [run_probes(_pairs(ctx, "pair"), *RANDOM_VERSUS[q], random_cache=random, random_versus=RANDOM_VERSUS[q][0],
                         items=True, **probe_kw(ctx.cfg, ctx.out, ctx.progress))
              for q in wanted if q in RANDOM_VERSUS and not own_random(q) and random is not None]
    keys = ["model_kind", "model_kind_b", "layer", "choice", "choice_b", "target", "metric"]
    _keep_items(ctx, "probes_pair", [it for _, it in runs + versus])
    versus = [t for t, _ in versus]
    versus = [t.assign(model_kind_b=t["model_kind_b"] if "model_kind_b" in t.columns else pd.NA) for t in versus]
    table = pd.concat([t for t, _ in runs] + [t[t["model_kind_b"].notna() | (t["model_kind"] == "random_init")]
                                              for t in versus], ignore_index=True)
    return table.drop_duplicates([k for k in keys if k in table.columns])


def _keep_items(ctx: Context, name: str, frames: list) -> None:
    """The per-item out-of-fold predictions behind table ``name`` (``ctx.tables[name + ":items"]``; not
    a report table: the probe runner stores them beside its results)."""
    from analyses.probes import ITEM_KEYS

    items = pd.concat(frames, ignore_index=True)
    ctx.tables[f"{name}:items"] = items.drop_duplicates(list(ITEM_KEYS) + ["example", "token"])


def _items(ctx: Context, name: str) -> pd.DataFrame:
    ctx.table(name, PRODUCERS[name])
    if f"{name}:items" not in ctx.tables:  # released (release_items): computed again, from the result store
        del ctx.tables[name]
        ctx.table(name, PRODUCERS[name])
    return ctx.tables[f"{name}:items"]


#: The tables that read each probe table's per-item predictions (``<name>:items``, :func:`_items`).
ITEM_READERS: dict[str, tuple[str, ...]] = {"probes_pair": ("paired_q4", "paired_q8"),
                                            "probes_q6": ("paired_q6",),
                                            "probes_q7": ("paired_q7",)}


def release_items(ctx: Context, pending: Iterable[str]) -> list[str]:
    """Drop the per-item predictions that no table in ``pending`` (the tables the sections still to run
    ask for) reads, unless that table is already computed; returns the probe tables whose items went.
    The study's five item tables hold 85 MiB as pandas frames on the default config, and the last
    readers run before Q8's fine-tuning, the study's memory peak. Dropping is safe whatever comes
    later: :func:`_items` computes a released table again (from the result store)."""
    pending = set(pending)
    dropped = []
    for name, readers in ITEM_READERS.items():
        key = f"{name}:items"
        if key in ctx.tables and not any(r in pending and r not in ctx.tables for r in readers):
            del ctx.tables[key]
            dropped.append(name)
    if dropped:
        hand_back_freed()
    return dropped


def _cka_q4(ctx: Context) -> pd.DataFrame:
    from analyses.cka import run_cka_roles

    return run_cka_roles(_pairs(ctx, "pair"), [("sep1", "cls"), ("sep1", "mean_s1"), ("sep1", "mean_s2"),
                                               ("sep2", "cls")], out=ctx.out)


def _probes_q5(ctx: Context) -> pd.DataFrame:
    from analyses.probes import run_probes

    ctx.log("analyses: [CLS] content of sentence i")
    K = max(group_prefixes(ctx.corpora))
    multi = ctx.caches.get(f"groups_k{K}", "multi")
    # the length-only probe (every sentence's word count) is the verdict's reference; versus="mean" gives
    # [CLS] − mean on the same resamples (the macro AUC, so no per-item predictions are kept)
    return run_probes(multi, ("cls", "mean"), [f"bow_s{i}" for i in range(1, K + 1)] + ["fw_s1"],
                      length_baseline=True, versus="mean", **probe_kw(ctx.cfg, ctx.out, ctx.progress))


def _probes_q6(ctx: Context) -> pd.DataFrame:
    from analyses.probes import run_probes

    ctx.log("analyses: classification token position")
    runs = [run_probes(_pairs(ctx, f), ("cls",), ("topic", "is_next"), items=True,
                       **probe_kw(ctx.cfg, ctx.out, ctx.progress))
            for f in ("pair", "cls_mid", "cls_last")]
    _keep_items(ctx, "probes_q6", [it for _, it in runs])
    return pd.concat([t for t, _ in runs], ignore_index=True)


def _probes_q7(ctx: Context) -> pd.DataFrame:
    from analyses.probes import run_probes

    ctx.log("analyses: word order")
    sw = ctx.caches.get("swap", "pair")
    swr = ctx.caches.get("swap", "pair", True) if ctx.caches.has("swap", "pair", True) else None
    table, items = run_probes(sw, ("cls", "mean"), ("swapped",), random_cache=swr, items=True,
                              **probe_kw(ctx.cfg, ctx.out, ctx.progress))
    _keep_items(ctx, "probes_q7", [items])
    return table


def _finetune(ctx: Context) -> pd.DataFrame:
    from analyses.finetune import run_pooling_experiment

    ctx.log("analyses: fine-tuning with each pooling")
    ft = ctx.cfg.finetune
    return run_pooling_experiment(ctx.corpora["pairs"], ft.label, ft.poolings, ft.seeds, model=ctx.lm,
                                  preset=ft.preset, out=str(ctx.out), corpus_name=ctx.cfg.corpus.pairs,
                                  device=ctx.cfg.study.device, seed=ctx.cfg.study.seed, progress=ctx.progress,
                                  n_resamples=ctx.cfg.study.bootstrap_resamples, bootstrap_seed=ctx.cfg.study.seed)


# ---------------------------------------------------------------------------------------------------
# Paired comparison tables: the rows the verdicts are computed from. Probe comparisons are paired on the
# same out-of-fold items (analyses.probes.compare_probes), drift comparisons on the same token keys
# (analyses.paired); CIs resample documents where the corpus has them. Holm's correction runs over one
# declared family per question (the ``family`` column; :data:`FAMILIES`).

#: The multiple-comparison family of each question's paired rows, as the report states it.
FAMILIES = {
    "Q1": "all layers of [CLS] − words (Holm over layers)",
    "Q2": "all layers, per sentence and word group (all, inner, edge words) (Holm over layers)",
    "Q3": "all layers 1–L, per role group (Holm over layers)",
    "Q4": ("sep1 − cls over every layer 1–L × target (is_next: accuracy; bow_s1, bow_s2: macro AUC) "
           "(Holm over all of them)"),
    "Q4_next_length": "sep1 − length-only is_next accuracy over layers 1–L (Holm over layers)",
    "Q4_next_random": ("sep1 of the trained model − sep1 of the random-init model, is_next accuracy over layers 1–L "
                       "(Holm over layers)"),
    "Q5": "[CLS] − mean macro AUC over every layer 1–L × sentence position (Holm over all of them)",
    "Q6": ("first − last and first − middle over every layer 1–L × target (topic, is_next) "
           "(Holm over all of them)"),
    "Q7": "per comparison over layers 1–L (Holm over layers)",
    "Q8": ("frozen cls − mean over layers 1–L (Holm over layers); fine-tuning rows: Holm over every "
           "accuracy_diff row"),
}


def _compare(items: pd.DataFrame, a: dict, b: dict, family: str, ctx: Context, **where) -> pd.DataFrame:
    from analyses.probes import compare_probes

    for k, v in where.items():
        items = items[items[k].isin(v if isinstance(v, (list, tuple)) else [v])]
    return compare_probes(items, a, b, family=family, n_resamples=ctx.cfg.study.bootstrap_resamples,
                          seed=ctx.cfg.study.seed)


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

    d = run_role_contrast(_pairs(ctx, "pair"), _pairs(ctx, "concat"), "cls", **_rs(ctx), progress=ctx.progress)
    return d.assign(family=FAMILIES["Q1"])


def _paired_q2(ctx: Context) -> pd.DataFrame:
    from analyses.paired import run_paired_drift

    pair, concat = _pairs(ctx, "pair"), _pairs(ctx, "concat")
    # edges: a sentence's first and last words apart from its inner words (dropping the middle [SEP]
    # changes the last word's own right neighbour; the verdict reads the inner words)
    frames = [run_paired_drift(_pairs(ctx, "single"), pair, concat, edges=True, **_rs(ctx), progress=ctx.progress)]
    if _pairs(ctx, "single2") is not None:
        frames.append(run_paired_drift(_pairs(ctx, "single2"), pair, concat, edges=True, **_rs(ctx),
                                       progress=ctx.progress))
    if pair.manifest.get("attention") and concat.manifest.get("attention"):
        # the mechanistic view, paired per example: attention mass from sentence 1's words to sentence
        # 2's words in `concat` − in `pair` (evidence, not the verdict)
        from analyses.paired import run_paired_attention

        frames.append(run_paired_attention(pair, concat, **_rs(ctx)))
    return pd.concat(frames, ignore_index=True).assign(family=FAMILIES["Q2"])


#: The columns of a comparison row taken from a probe table (docs/TABLES.md, ``probe_comparison``).
_COMPARISON_COLUMNS = ("analysis", "model", "corpus", "format", "model_kind", "layer", "target", "metric",
                       "condition_a", "condition_b", "value", "ci_low", "ci_high", "p_value", "p_holm", "se", "mde",
                       "value_a", "value_b", "n", "n_groups", "grouping", "seed", "n_resamples", "family")


def _auc_comparisons(probes: pd.DataFrame, a: str, b: str, targets: Sequence[str] | None = None) -> pd.DataFrame:
    """The probe table's ``macro_auc_diff`` rows of token choice ``a`` − ``b`` (trained model, layers 1–L)
    as comparison rows (``condition_a = "choice=a"``, ``metric = "macro_auc_diff"``): the multi-label
    targets' paired comparison, on the same document resamples of the same out-of-fold items (micro-F1
    per item, thresholded at 0.5, reads 0 for a probe that ranks rare words well)."""
    d = probes[(probes["metric"] == "macro_auc_diff") & (probes["choice"] == a) & (probes["choice_b"] == b)
               & (probes["model_kind"] == "trained")]
    if targets is not None:
        d = d[d["target"].isin(list(targets))]
    d = d[pd.to_numeric(d["layer"], errors="coerce") >= 1]
    d = d.assign(analysis="probe_comparison", condition_a=f"choice={a}", condition_b=f"choice={b}")
    return d[[c for c in _COMPARISON_COLUMNS if c in d.columns]]


def _paired_q4(ctx: Context) -> pd.DataFrame:
    """sep1 − cls: is_next by per-item accuracy on the same items, the bags of words by macro AUC on the same
    resamples; one Holm family. Then, a family of its own (``condition_b = "choice=length_only"``), sep1 − the
    length-only probe on is_next, per item: the bar for [SEP]'s coherence where the sentences' lengths alone
    read is_next above the majority baseline (:func:`probing.study.question_rows._q4_sep_next_rows`). Then,
    with the random-init run, trained sep1 − random-init sep1 on is_next, per item (a family of its own): is the
    coherence that [SEP] holds learned?"""
    items = _from_layer1(_items(ctx, "probes_pair"))
    from analyses.probes import is_multilabel

    single = [t for t in PAIR_PROBES["Q4"][1] if not is_multilabel(t)]
    frames = [_compare(items, {"choice": "sep1"}, {"choice": "cls"}, FAMILIES["Q4"], ctx, model_kind="trained",
                       target=single)] if single else []
    frames.append(_auc_comparisons(ctx.table("probes_pair", _probes_pair), "sep1", "cls",
                                   [t for t in PAIR_PROBES["Q4"][1] if is_multilabel(t)]))
    out = [_rejoin_holm(frames, FAMILIES["Q4"])]
    if "is_next" in single and (items["choice"] == "length_only").any():
        out.append(_compare(items, {"choice": "sep1"}, {"choice": "length_only"}, FAMILIES["Q4_next_length"], ctx,
                            model_kind="trained", target="is_next"))
    random = items[(items["model_kind"] == "random_init") & (items["choice"] == "sep1") & (items["target"] == "is_next")]
    if not random.empty:  # is [SEP]'s coherence learned? the same probe on the random-init model, per item
        out.append(_compare(items, {"model_kind": "trained", "choice": "sep1"},
                            {"model_kind": "random_init", "choice": "sep1"}, FAMILIES["Q4_next_random"], ctx,
                            target="is_next"))
    return pd.concat(out, ignore_index=True)


def _paired_q5(ctx: Context) -> pd.DataFrame:
    return _rejoin_holm([_auc_comparisons(ctx.table("probes_q5", _probes_q5), "cls", "mean")], FAMILIES["Q5"])


def _paired_q6(ctx: Context) -> pd.DataFrame:
    items = _from_layer1(_items(ctx, "probes_q6"))
    return _rejoin_holm([_compare(items, {"format": "pair"}, {"format": other}, FAMILIES["Q6"], ctx,
                                  format=["pair", other]) for other in ("cls_last", "cls_mid")], FAMILIES["Q6"])


def _paired_q7(ctx: Context) -> pd.DataFrame:
    """Trained − random-init on the same word-order items. [CLS] against the length-only probe is in
    probes_pair's macro_auc_diff rows for the bags of words. It is not compared on the length target:
    that target is made of the word counts the length-only probe reads, so the probe is its ceiling
    (0.97 here), not a baseline."""
    q7 = _from_layer1(_items(ctx, "probes_q7"))
    if not (q7["model_kind"] == "random_init").any():
        return pd.DataFrame()
    return _compare(q7, {"model_kind": "trained"}, {"model_kind": "random_init"}, FAMILIES["Q7"], ctx)


def _paired_q8(ctx: Context) -> pd.DataFrame:
    items = _from_layer1(_items(ctx, "probes_pair"))
    return _compare(items, {"choice": "cls"}, {"choice": "mean"}, FAMILIES["Q8"], ctx, model_kind="trained",
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
                                          choice="cls", Cs=ctx.cfg.probes.Cs,
                                          inner_splits=ctx.cfg.probes.inner_splits, **_rs(ctx)))


def _q4_knockout_drift(ctx: Context) -> pd.DataFrame:
    _knockout(ctx)
    return ctx.tables["q4_knockout_drift"]


def _q4_knockout_probes(ctx: Context) -> pd.DataFrame:
    _knockout(ctx)
    return ctx.tables["q4_knockout_probes"]


#: Every table a question can ask for, and the function that computes it.
PRODUCERS = {"drift_q1": _drift_q1, "cka_q1": _cka_q1, "drift_q2": _drift_q2, "attention": _attention,
             "drift_q3": _drift_q3, "paired_q3": _paired_q3, "probes_pair": _probes_pair, "cka_q4": _cka_q4, "probes_q5": _probes_q5,
             "probes_q6": _probes_q6, "probes_q7": _probes_q7, "finetune": _finetune,
             "paired_q1": _paired_q1, "paired_q2": _paired_q2, "paired_q4": _paired_q4, "paired_q5": _paired_q5,
             "paired_q6": _paired_q6, "paired_q7": _paired_q7, "paired_q8": _paired_q8,
             "q4_knockout_drift": _q4_knockout_drift, "q4_knockout_probes": _q4_knockout_probes,
             "q1_cls_patching": _q1_patching}


def _tables(*names: str):
    """``analyse`` of a question that needs the shared tables ``names``, computed in that order; after each,
    the per-item predictions that neither the rest of them nor a later section (``ctx.later``) reads
    are released (:func:`release_items`)."""
    def analyse(ctx: Context) -> Tables:
        out = {}
        for j, n in enumerate(names):
            out[n] = ctx.table(n, PRODUCERS[n])
            release_items(ctx, names[j + 1:] + tuple(ctx.later))
        return out

    return analyse
