"""Paper reproductions as sections of a study: each re-runs a published analysis's protocol on any
model and corpus, and its report section sets the measured numbers beside what the paper reports
for BERT-base (cited; the configs in ``probing/study/configs/`` list the paper's numbers in their comments).

A reproduction is a :class:`probing.study.sections.StudySection`, declared like the questions Q1-Q8: the
corpus it reads (a key of the config's ``[corpus]`` table), the caches it extracts, its analyses (tidy
tables), figures, report table, evidence sentence, verdict and notes (generated from the config). The
one runner of :mod:`probing.study` runs the keys of :data:`PAPERS` like the questions:
``questions = ["clark2019"]`` in a config, or ``--questions clark2019,Q1``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .model_facts import model_facts
from .shared import probe_kw
from .report import fmt, last_layer, one, pick
from .sections import Context, Job, StudySection, Tables, corpus_text, safe_plot
from .verdicts import Claim, difference_rows, ranges, summarise

#: A paper reproduction is a study section like the questions (the name predates the generalisation).
Reproduction = StudySection

__all__ = ["PAPERS", "Job", "Reproduction", "safe_plot", "ANISOTROPY_THRESHOLD"]


def _rs(cfg) -> tuple[int, int]:
    return cfg.study.bootstrap_resamples, cfg.study.seed


# ---------------------------------------------------------------------------------------------------
# Clark et al. 2019: attention to [CLS] and [SEP] by layer

CLARK = ("Clark, Khandelwal, Levy & Manning (2019), What Does BERT Look At? An Analysis of BERT's Attention, "
         "BlackboxNLP")


def _clark_jobs(cfg, corpora=None):
    return [Job("paragraphs", f"clark={cfg.papers.clark_format}", attention=True)]


def _clark_analyse(ctx: Context) -> Tables:
    from analyses.attention import run_attention

    R, seed = _rs(ctx.cfg)
    ctx.log("clark2019: attention to [CLS] and [SEP]")
    return {"clark2019_attention": run_attention(ctx.caches.get("paragraphs", "clark"), n_resamples=R, seed=seed,
                                                 out=ctx.out)}


def _clark_figures(T, fig, log):
    from figures.attention import plot_attention

    a = T.get("clark2019_attention")
    if a is None:
        return []
    return safe_plot(plot_attention, a, fig / "clark2019_attention", format="clark",
                      targets=("cls", "all [SEP]"), sources=("all tokens", "cls", _first_sep(a)), log=log)


def _first_sep(a: pd.DataFrame) -> str:
    """The first [SEP]'s group in the attention table (``sep<i>``: the [SEP] after sentence i)."""
    roles = a["role"].astype(str) if a is not None and not a.empty else []
    seps = sorted({r for r in roles if re.fullmatch(r"sep\d+", r)}, key=lambda r: int(r[3:]))
    return seps[0] if seps else "sep1"


def _clark_mass(T) -> pd.DataFrame:
    a = pick(T.get("clark2019_attention"), head="mean", role="all tokens")
    return a[a["target"].isin(["cls", "all [SEP]"])]


def _first_sep_mass(T) -> tuple[str, pd.DataFrame]:
    """The first [SEP]'s group and its head-mean attention mass to all [SEP]s, per layer (the table and the
    answer both report it)."""
    a = T.get("clark2019_attention")
    first = _first_sep(a)
    return first, pick(a, head="mean", role=first, target="all [SEP]")


def _clark_table(T):
    a = _clark_mass(T)
    if a.empty:
        return None
    t = a.pivot_table(index="layer", columns="target", values="value", sort=True)
    first, sep = _first_sep_mass(T)
    if not sep.empty:
        t[f"{first} → all [SEP]"] = sep.set_index("layer")["value"]
    return t.reset_index(), ("attention mass from all tokens (mean over query tokens and heads), "
                             "and from the first [SEP] to the [SEP]s")


#: Clark et al.'s headline: "over half of the attention in layers 6-10 goes to [SEP]".
CLARK_SHARE = 0.5
CLARK_CLAIM = Claim(more=f"more than {CLARK_SHARE:g} of the attention goes to the [SEP] tokens",
                    less=f"less than {CLARK_SHARE:g} of the attention goes to the [SEP] tokens",
                    none=f"the attention to the [SEP] tokens is not distinguishable from {CLARK_SHARE:g}",
                    quantity=f"attention mass to [SEP] − {CLARK_SHARE:g}", direction=1)


def _clark_rows(T):
    sep = _clark_mass(T)
    sep = sep[sep["target"] == "all [SEP]"].sort_values("layer")
    if sep.empty:
        return None
    shifted = sep.assign(value=sep["value"] - CLARK_SHARE, ci_low=sep["ci_low"] - CLARK_SHARE,
                         ci_high=sep["ci_high"] - CLARK_SHARE)
    return difference_rows(shifted)  # against 0: the bootstrap CI of the mass, shifted by the share


def _clark_answer(T):
    a = _clark_mass(T)
    if a.empty:
        return "not measured"
    sep = a[a["target"] == "all [SEP]"].sort_values("layer")
    cls = a[a["target"] == "cls"].sort_values("layer")
    top = sep.loc[sep["value"].idxmax()]
    over = sep.loc[sep["value"] > 0.5, "layer"].astype(int).tolist()
    s = (f"Averaged over all query tokens and heads, attention to the [SEP] tokens peaks at layer {int(top['layer'])} "
         f"with {fmt((top['value'], top['ci_low'], top['ci_high']))}; it is above one half in "
         + (f"layers {', '.join(map(str, over))}" if over else "no layer") + ". ")
    ctop = cls.loc[cls["value"].idxmax()]
    s += f"Attention to [CLS] is highest at layer {int(ctop['layer'])} ({ctop['value']:.3f}). "
    _, own = _first_sep_mass(T)
    if not own.empty:
        s += (f"From the first [SEP], {own['value'].min():.3f}–{own['value'].max():.3f} of the attention goes to the "
              f"[SEP]s (range over layers). ")
    s += ("Clark et al. (2019) report for BERT-base (12 layers) that over half of the attention in layers 6–10 goes "
          "to [SEP], that early heads attend to [CLS], and that heads attending from [SEP] put more than 90% on the "
          "[SEP]s.")
    return s


# ---------------------------------------------------------------------------------------------------
# Ethayarajh 2019: anisotropy and self-similarity

ETHAYARAJH = ("Ethayarajh (2019), How Contextual are Contextualized Word Representations? Comparing the Geometry "
              "of BERT, ELMo, and GPT-2 Embeddings, EMNLP")


def _eth_jobs(cfg, corpora=None):
    return [Job("sentences", "single")]


def _eth_analyse(ctx: Context) -> Tables:
    from analyses.contextuality import run_contextuality

    R, seed = _rs(ctx.cfg)
    p = ctx.cfg.papers
    ctx.log("ethayarajh2019: anisotropy, self-similarity, intra-sentence similarity, MEV")
    return {"ethayarajh2019": run_contextuality(ctx.caches.get("sentences", "single"), min_contexts=p.min_contexts,
                                                max_contexts=p.max_contexts, n_resamples=R, seed=seed,
                                                out=ctx.out)}


def _eth_figures(T, fig, log):
    from figures.contextuality import plot_contextuality

    d = T.get("ethayarajh2019")
    return [] if d is None else safe_plot(plot_contextuality, d, fig / "ethayarajh2019_contextuality", log=log)


_ETH_METRICS = ("anisotropy_baseline", "self_similarity", "self_similarity_adjusted", "intra_similarity",
                "intra_similarity_adjusted", "mev", "mev_adjusted", "mev_centred", "mev_centred_adjusted")
#: A layer is called anisotropic when the lower 95% bound of its mean cosine between random words is at
#: least this. 0.1: the paper's smallest per-layer value for bert-base-cased is 0.105 (the authors'
#: released statistics, layer 0), and two random directions in 384 dimensions have cosine 0 ± 0.05.
ANISOTROPY_THRESHOLD = 0.1


def _eth_verdict(T, cfg) -> str:
    """Which layers are anisotropic by :data:`ANISOTROPY_THRESHOLD` (CI lower bound), said against the
    paper's "anisotropic in every layer"."""
    base = pick(T.get("ethayarajh2019"), metric="anisotropy_baseline").sort_values("layer")
    if base.empty:
        return ""
    aniso = base[base["ci_low"] >= ANISOTROPY_THRESHOLD]
    layers = base["layer"].astype(int)
    lo, hi = base.loc[base["value"].idxmin()], base.loc[base["value"].idxmax()]
    rng_ = (f"mean cosine of random words {fmt(float(lo['value']))} at layer {int(lo['layer'])} to "
            f"{fmt(float(hi['value']))} at layer {int(hi['layer'])}")
    rule = f"anisotropic = the 95% CI of that cosine lies at or above {ANISOTROPY_THRESHOLD:g}"
    if len(aniso) == len(base):
        return f"Yes, anisotropic in every layer, as the paper reports for BERT-base ({rng_}; {rule})."
    if aniso.empty:
        return (f"No: no layer is anisotropic, unlike the paper's BERT-base, which is anisotropic in every layer "
                f"({rng_}; {rule}).")
    return (f"Only in layers {ranges(aniso['layer'].astype(int))} of {ranges(layers)}: the paper's \"anisotropic in "
            f"every layer\" does not hold for this model ({rng_}; {rule}).")


def _eth_table(T):
    d = T.get("ethayarajh2019")
    if d is None:
        return None
    d = d[d["metric"].isin(_ETH_METRICS)]
    t = d.pivot_table(index="layer", columns="metric", values="value", aggfunc="first", sort=True)
    return t[[m for m in _ETH_METRICS if m in t.columns]].reset_index(), "per layer (raw and anisotropy-adjusted)"


def _eth_answer(T):
    d = T.get("ethayarajh2019")
    if d is None or d.empty:
        return "not measured"
    L = last_layer(d)
    get = lambda m, layer: one(d, metric=m, layer=layer)  # noqa: E731
    s = ""
    base = pick(d, metric="anisotropy_baseline").sort_values("layer")
    if not base.empty:
        hi = base.loc[base["value"].idxmax()]
        s += (f"The mean cosine of two random words (anisotropy) runs from {base['value'].iloc[0]:.3f} at layer "
              f"{int(base['layer'].iloc[0])} to {fmt(get('anisotropy_baseline', L))} at layer {L}, highest at layer "
              f"{int(hi['layer'])} ({hi['value']:.3f}). ")
    ss = pick(d, metric="self_similarity_adjusted").sort_values("layer")
    if not ss.empty:
        first = int(ss["layer"].iloc[1] if len(ss) > 1 else ss["layer"].iloc[0])
        a, b = get("self_similarity_adjusted", first), get("self_similarity_adjusted", L)
        verb = "falls" if b[0] < a[0] else "rises"
        low = ss.loc[ss["value"].idxmin()]
        s += (f"Anisotropy-adjusted self-similarity of the same word in different sentences {verb} from {fmt(a)} at "
              f"layer {first} to {fmt(b)} at layer {L} (lowest at layer {int(low['layer'])}, {low['value']:.3f}). ")
    mev = pick(d, metric="mev_adjusted")
    if not mev.empty:
        s += (f"A static vector explains at most {mev['value'].max():.3f} of a word's variance beyond the random "
              f"baseline (adjusted MEV, uncentred as the paper defines it, max over layers)")
        cen = pick(d, metric="mev_centred_adjusted")
        s += (f"; centred on each word's mean, as the authors' code computes it, at most {cen['value'].max():.3f}. "
              if not cen.empty else ". ")
    s += ("Ethayarajh (2019) reports for BERT-base that representations are anisotropic in every layer, that "
          "self-similarity falls in the upper layers, and that on average less than 5% of a word's variance is "
          "explained by a static embedding.")
    return s


# ---------------------------------------------------------------------------------------------------
# Reimers & Gurevych 2019: [CLS] vs mean pooling

REIMERS = "Reimers & Gurevych (2019), Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks, EMNLP"
REIMERS_CHOICES = ("cls", "mean", "max")


def _rg_jobs(cfg, corpora=None):
    return [Job("sentences", "single")]


def _rg_analyse(ctx: Context) -> Tables:
    from analyses.neighbours import run_knn
    from analyses.probes import run_probes

    cfg = ctx.cfg
    R, seed = _rs(cfg)
    c = ctx.caches.get("sentences", "single")
    label = cfg.papers.label
    ctx.log("reimers2019: [CLS] vs mean vs max pooling, probes and nearest neighbours")
    return {"reimers2019_probes": run_probes(c, REIMERS_CHOICES, (label,), **probe_kw(cfg, ctx.out, ctx.progress)),
            "reimers2019_knn": run_knn(c, REIMERS_CHOICES, label, k=cfg.papers.knn_k, versus="cls",
                                       n_resamples=R, seed=seed, out=ctx.out)}


def _rg_figures(T, fig, log):
    from figures.probes import plot_probes

    out = []
    p, k = T.get("reimers2019_probes"), T.get("reimers2019_knn")
    if p is not None:
        t = p["target"].iloc[0]
        out += safe_plot(plot_probes, p, fig / "reimers2019_probes", target=t, choices=list(REIMERS_CHOICES), log=log)
    if k is not None:
        t = k["target"].iloc[0]
        out += safe_plot(plot_probes, k, fig / "reimers2019_knn", target=t,
                          metric="knn_accuracy", choices=list(REIMERS_CHOICES),
                          heading=f"Nearest neighbour (cosine) agrees on {t!r}",
                          band_note="Bands: 95% bootstrap CIs over documents (examples without them). "
                                    "Neighbours from the same document are excluded.",
                          chance_label="chance (a random neighbour)", log=log)
    return out


def _rg_table(T):
    p, k = T.get("reimers2019_probes"), T.get("reimers2019_knn")
    if p is None or k is None:
        return None
    L = last_layer(p)
    rows = []
    for c in REIMERS_CHOICES:
        rows.append({"pooling": c,
                     "probe accuracy": (one(p, choice=c, metric="accuracy", layer=L) or (np.nan,))[0],
                     "nearest-neighbour accuracy": (one(k, choice=c, metric="knn_accuracy", layer=L) or (np.nan,))[0]})
    base = one(p, choice="cls", metric="majority_baseline", layer=L)
    chance = one(k, choice="cls", metric="chance_knn_accuracy", layer=L)
    rows.append({"pooling": "baseline (majority / chance)", "probe accuracy": base[0] if base else np.nan,
                 "nearest-neighbour accuracy": chance[0] if chance else np.nan})
    return pd.DataFrame(rows), f"last layer ({L}): trained linear probe vs training-free cosine neighbours"


REIMERS_CLAIM = Claim(more="the cosine nearest neighbour of a mean-pooled vector shares the label more often than "
                           "that of [CLS]",
                      less="the cosine nearest neighbour of [CLS] shares the label more often than that of the "
                           "mean-pooled vector",
                      none="[CLS] and mean pooling give equally meaningful cosine neighbours",
                      quantity="nearest-neighbour accuracy, mean − cls, paired on the same examples")


def _rg_rows(T):
    k = T.get("reimers2019_knn")
    if k is None or k.empty:
        return None
    d = pick(k, metric="knn_accuracy_diff", choice="mean", choice_b="cls")
    return None if d.empty else pick(d, layer=last_layer(d))


def _by_construction(cfg) -> str:
    name = cfg.model.name
    facts = model_facts(name)
    if facts is not None and facts.pooling == "mean":
        return (f" On {name} a win for mean pooling holds by construction: the model was trained to produce "
                "sentence vectors by mean pooling with a cosine objective, so it is no test of the paper's claim "
                "about BERT's [CLS]; bert-base-uncased is.")
    return ""


def _rg_verdict(T, cfg) -> str:
    v = summarise(_rg_rows(T), REIMERS_CLAIM)
    return v.sentence + _by_construction(cfg) if v.decision != "not_measured" else ""


def _rg_answer(T):
    p, k = T.get("reimers2019_probes"), T.get("reimers2019_knn")
    if p is None or k is None:
        return "not measured"
    L = last_layer(p)
    t = p["target"].iloc[0]
    probe = ", ".join(f"{c} {fmt(one(p, choice=c, metric='accuracy', layer=L))}" for c in REIMERS_CHOICES)
    knn = ", ".join(f"{c} {fmt(one(k, choice=c, metric='knn_accuracy', layer=L))}" for c in REIMERS_CHOICES)
    chance = one(k, choice="cls", metric="chance_knn_accuracy", layer=L)
    return (f"At the last layer ({L}), a linear probe for {t!r} reads {probe}; without training, the nearest "
            f"neighbour by cosine has the same {t!r} for {knn} (chance {fmt(chance[0] if chance else None)}). "
            "Reimers & Gurevych (2019) report for BERT-base that cosine similarity of [CLS] vectors ranks STS "
            "pairs far worse than mean pooling (Spearman ×100 averaged over 7 STS sets: 29.19 vs 54.81), while "
            "logistic-regression probes on SentEval barely differ (84.66 vs 84.94).")


# ---------------------------------------------------------------------------------------------------
# Jawahar et al. 2019: a per-layer probing table

JAWAHAR = "Jawahar, Sagot & Seddah (2019), What Does BERT Learn about the Structure of Language?, ACL"
#: SentEval-like tasks: (our target, the SentEval task it stands in for).
JAWAHAR_TASKS = (("length6", "SentLen"), ("bow_s1", "WC (bag of words)"), ("swapped", "BShift"))


def _jw_jobs(cfg, corpora=None):
    jobs = [Job("swap_sentences", "single")]
    if cfg.model.random_init_baseline:
        jobs.append(Job("swap_sentences", "single", random=True))
    return jobs


def _jw_analyse(ctx: Context) -> Tables:
    from analyses.probes import run_probes

    caches = ctx.caches
    c = caches.get("swap_sentences", "single")
    rnd = caches.get("swap_sentences", "single", True) if caches.has("swap_sentences", "single", True) else None
    ctx.log("jawahar2019: per-layer probing table")
    return {"jawahar2019_probes": run_probes(c, ("cls", "mean"), [t for t, _ in JAWAHAR_TASKS], random_cache=rnd,
                                             **probe_kw(ctx.cfg, ctx.out, ctx.progress))}


def _jw_metric(target: str) -> str:
    # the bag of words by its macro AUC (0.5: the frequency baseline), not micro-F1 at a 0.5 threshold, which
    # counts only the words a probe is sure of (see Q5)
    return "macro_auc" if target.startswith("bow_") else "accuracy"


def _jw_baseline(target: str) -> str:
    return "majority_baseline_macro_auc" if target.startswith("bow_") else "majority_baseline"


def _jw_figures(T, fig, log):
    from figures.probes import plot_probes

    p = T.get("jawahar2019_probes")
    if p is None:
        return []
    return [f for t, _ in JAWAHAR_TASKS
            for f in safe_plot(plot_probes, p, fig / f"jawahar2019_{t}", target=t, metric=_jw_metric(t), log=log)]


def _jw_table(T):
    p = T.get("jawahar2019_probes")
    if p is None:
        return None
    p = p[(p["choice"] == "cls") & (p.get("model_kind", "trained") == "trained")]
    cols = {}
    for t, name in JAWAHAR_TASKS:
        g = p[(p["target"] == t) & (p["metric"] == _jw_metric(t))]
        cols[name] = g.set_index("layer")["value"]
    t = pd.DataFrame(cols).sort_index()
    return t.reset_index(names="layer"), "[CLS] probe score per layer (accuracy; macro AUC for the bag of words)"


def _jw_answer(T):
    p = T.get("jawahar2019_probes")
    if p is None or p.empty:
        return "not measured"
    tr = pick(p, model_kind="trained", choice="cls")
    parts = []
    for t, name in JAWAHAR_TASKS:
        g = tr[(tr["target"] == t) & (tr["metric"] == _jw_metric(t))]
        if g.empty:
            continue
        best = g.loc[g["value"].idxmax()]
        base = one(tr, target=t, metric=_jw_baseline(t), layer=int(best["layer"]))
        parts.append(f"{name} is best read at layer {int(best['layer'])} "
                     f"({fmt((best['value'], best['ci_low'], best['ci_high']))}; "
                     f"majority {fmt(base[0] if base else None)})")
    s = "From [CLS]: " + "; ".join(parts) + "."
    rnd = pick(p, model_kind="random_init", choice="cls", target="length6", metric="accuracy")
    trn = tr[(tr["target"] == "length6") & (tr["metric"] == "accuracy")]
    if not rnd.empty and not trn.empty:
        L = last_layer(trn)
        s += (f" Sentence length at the last layer: trained {fmt(one(trn, layer=L))}, random-init "
              f"{fmt(one(rnd, layer=L))}.")
    s += (" Jawahar et al. (2019) find for BERT-base a hierarchy: surface features (SentLen) best in the lowest "
          "layers, syntactic ones (BShift) in the middle and semantic ones at the top.")
    return s


def _corpus_read(cfg, key: str) -> str:
    """The corpus a paper's section reads (``cfg.corpus.<key>``), as its notes name it."""
    spec = cfg.corpus.specs()[key]
    return f"{corpus_text(spec)} sentences ({spec})"


def _clark_notes(cfg) -> str:
    return ("Protocol: consecutive sentences of one document laid out by the config's clark_format "
            f"(`{cfg.papers.clark_format}`), attention weights of every head summed over the target tokens, "
            "averaged over all query tokens (special tokens included, as in the authors' notebook), then over "
            "heads and examples; 95% bootstrap CIs over documents (examples without them). The passages here are "
            f"{_corpus_read(cfg, 'paragraphs')}, not the paper's Wikipedia paragraphs of about 128 tokens. "
            "The figure also shows attention from [CLS] and from the first [SEP]. Attention weights are not "
            "explanations: Clark et al. argue that attention to [SEP] is largely a no-op.")


def _eth_notes(cfg) -> str:
    return ("Protocol: each sentence encoded alone ([CLS] s [SEP]); a word's vector is its first subword; words "
            f"occurring in at least {cfg.papers.min_contexts} sentences; self-similarity = mean pairwise "
            "cosine of a word's occurrences, intra-sentence similarity = mean cosine of a sentence's words with their "
            "mean, MEV = share of variance on the first principal direction; each adjusted by its random-word "
            "baseline of the same layer. The paper used STS sentences and WordPiece tokens as words; here "
            f"{_corpus_read(cfg, 'sentences')} and whole words. MEV is given both ways: uncentred (`mev`, the "
            "paper's definition) and centred on each word's mean (`mev_centred`, what the authors' released code "
            f"computes with PCA); over at most {cfg.papers.max_contexts} occurrences per word, and a share of "
            "variance on one direction is larger for fewer occurrences, so neither is comparable with the paper's "
            "'less than 5%', which came from words with many more contexts. 'Anisotropic' follows the declared "
            f"threshold: the 95% CI of the mean random-word cosine at or above {ANISOTROPY_THRESHOLD:g}.")


def _rg_notes(cfg) -> str:
    return ("Protocol: single sentences; the last layer's [CLS] vector against the mean (and max) of the word "
            "vectors. Two readings: a logistic-regression probe with cross-validation (the SentEval protocol) and a "
            "training-free one, whether the cosine nearest neighbour from another document shares the label. No "
            "gold similarity scores (STS) are available offline, so the second stands in for the paper's Spearman "
            "correlation; it tests the same property, that cosine distances are meaningful.")


PAPERS: dict[str, StudySection] = {s.key: s for s in (
    StudySection(
        key="clark2019", title="Clark et al. 2019: attention to [CLS] and [SEP] by layer", citation=CLARK,
        corpora=("paragraphs",), jobs=_clark_jobs, analyse=_clark_analyse, figures=_clark_figures,
        table=_clark_table, answer=_clark_answer, notes=_clark_notes, comparisons=_clark_rows, claim=CLARK_CLAIM,
        about_cls=True),
    StudySection(
        key="ethayarajh2019", title="Ethayarajh 2019: anisotropy and self-similarity", citation=ETHAYARAJH,
        corpora=("sentences",), jobs=_eth_jobs, analyse=_eth_analyse, figures=_eth_figures, table=_eth_table,
        answer=_eth_answer, notes=_eth_notes, verdict_text=_eth_verdict),
    StudySection(
        key="reimers2019", title="Reimers & Gurevych 2019: [CLS] vs mean pooling", citation=REIMERS,
        corpora=("sentences",), jobs=_rg_jobs, analyse=_rg_analyse, figures=_rg_figures, table=_rg_table,
        answer=_rg_answer, notes=_rg_notes, verdict_text=_rg_verdict, about_cls=True),
    StudySection(
        key="jawahar2019", title="Jawahar et al. 2019: a per-layer probing table", citation=JAWAHAR,
        corpora=("swap_sentences",), jobs=_jw_jobs, analyse=_jw_analyse, figures=_jw_figures, table=_jw_table,
        answer=_jw_answer, about_cls=True,
        notes="Protocol: single sentences, [CLS] (and mean pooling) of every layer, for the trained and a randomly "
              "initialised model. Tasks stand in for SentEval's: SentLen = sentence length in 6 equal-count bins, WC "
              "= a multi-label bag of the most frequent words (SentEval: which one of 1000 mid-frequency words), "
              "scored by its macro AUC (0.5: the words' frequencies alone; micro-F1 at a 0.5 threshold is in the "
              "tables), BShift = two adjacent words swapped in half of the sentences. Probes are linear (the paper "
              "used SentEval's MLP), with grouped cross-validation (the report's introduction says how the CIs were "
              "computed, from the tables)."),
)}
