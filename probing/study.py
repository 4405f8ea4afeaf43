"""One command answers the seed questions Q1-Q8: extract, analyse, draw, report.

    python -m probing.study seed_questions [--quick] [--force] [--model NAME]

A study is a TOML config: a name of one packaged with the toolkit (``probing/configs/*.toml``, see
:func:`packaged_configs`) or a path to your own file; it names model, corpora, options. The runner
extracts every cache it needs (existing caches are reused), runs the analyses (existing result
tables are reused), draws the figures from the tables and writes ``<out>/report.md`` and
``<out>/report.html`` (figures inline). Every number in the report is read from that run's tables.
"""

from __future__ import annotations

import copy
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .examples import Example
from .reproductions import safe_plot as _safe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

QUESTIONS = ("Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8")

DEFAULTS: dict[str, dict[str, Any]] = {
    "study": {"name": "study", "out": "runs/study", "caches": "caches", "seed": 0, "bootstrap_resamples": 1000,
              "questions": list(QUESTIONS), "title": None},
    "model": {"name": None, "random_init_baseline": True, "random_init_seed": 0, "trust_remote_code": False},
    "corpus": {"pairs": "generated:n=200,k=2", "groups": "generated:n=100,k=4,pairing=consecutive",
               "swap": "generated:n=200,k=2,seed=1,swap=1",
               # paper reproductions (probing.reproductions)
               "sentences": "generated:n=300,k=1", "paragraphs": "generated:n=100,k=4,pairing=consecutive",
               "swap_sentences": "generated:n=300,k=1,seed=1,swap=1"},
    "extract": {"dtype": "float32", "batch_tokens": 4096, "device": "auto"},
    "probes": {"folds": 5, "vocab": 50, "max_tokens": 6000, "device": None, "Cs": [1e-3, 1e-2, 1e-1, 1.0, 10.0],
               "inner_splits": 3, "max_iter": 1000, "bow_Cs": None},
    "finetune": {"preset": "default", "label": "topic", "poolings": ["cls", "mean", "max", "sep", "first_word"],
                 "seeds": [0, 1, 2]},
    "papers": {"clark_format": "[CLS] {1} {2} [SEP] <1> {3} {4} [SEP]", "min_contexts": 5, "max_contexts": 50,
               "label": "topic", "knn_k": 1},
}

PAIR_FORMATS = ("pair", "concat", "concat_segments", "single", "single2", "cls_last", "cls_mid")
#: Pair formats extracted with attention summaries (whichever section asks, so caches are shared).
ATTENTION_FORMATS = ("pair", "concat")
#: The probes of the pair format, per question: (token choices, targets).
PAIR_PROBES = {
    "Q8": (("cls", "mean", "max", "sep1", "first_word", "pos3"), ("topic",)),
    "Q4": (("sep1", "sep2", "cls", "mean_s1", "mean_s2"), ("is_next", "bow_s1", "bow_s2")),
    "Q7": (("cls", "mean"), ("bow_s1", "length")),
}
#: Formats of the pairs corpus each question reads.
PAIR_NEEDS = {"Q1": ("pair", "concat", "concat_segments"), "Q2": ("pair", "concat", "single", "single2"),
              "Q4": ("pair", "concat"), "Q6": ("pair", "cls_mid", "cls_last"), "Q7": ("pair",), "Q8": ("pair",)}


def sections() -> tuple[str, ...]:
    """Every section a study can hold: the questions Q1-Q8, then the paper reproductions."""
    from .reproductions import PAPERS

    return QUESTIONS + tuple(PAPERS)


class StudyError(ValueError):
    """A study config is malformed."""


#: The study configs shipped inside the package (package data), found by name.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "seed_questions"


def packaged_configs() -> list[str]:
    """Names of the configs shipped with the package, e.g. ``seed_questions``, ``clark2019_attention``."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def config_path(config: str | os.PathLike) -> Path:
    """A config argument -> its file: an existing path as given, else a packaged config's name
    (``seed_questions`` or ``seed_questions.toml``). Anything else is a StudyError listing the names."""
    path = Path(config)
    if path.is_file():
        return path
    name = path.name[:-len(".toml")] if path.name.endswith(".toml") else path.name
    if str(config) in (name, f"{name}.toml") and (CONFIG_DIR / f"{name}.toml").is_file():
        return CONFIG_DIR / f"{name}.toml"
    raise StudyError(f"config {str(config)!r} is neither a file nor a packaged config; "
                     f"packaged: {', '.join(packaged_configs())}")


def load_config(path: str | os.PathLike | None, quick: bool = False,
                overrides: dict[str, Any] | None = None,
                trust_remote_code: bool = False) -> dict[str, dict[str, Any]]:
    """Read a TOML study config over :data:`DEFAULTS`; ``quick`` applies its ``[quick]`` table.

    ``path`` is a file or the name of a packaged config (:func:`config_path`). A model's own code runs
    only when ``trust_remote_code`` (the command line's ``--trust-remote-code``) is given: a config or
    override that sets ``model.trust_remote_code`` without it is a StudyError."""
    cfg = copy.deepcopy(DEFAULTS)
    raw: dict[str, Any] = {}
    if path is not None:
        path = config_path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise StudyError(f"config {path}: {err}") from None
    quick_table = raw.pop("quick", {})
    for section, values in raw.items():
        if section not in cfg:
            raise StudyError(f"config: unknown section [{section}]; known: {', '.join(cfg)}, quick")
        for key, value in values.items():
            if key not in cfg[section]:
                raise StudyError(f"config: unknown key {section}.{key}; known: {', '.join(cfg[section])}")
            cfg[section][key] = value
    extra = dict(quick_table) if quick else {}
    extra.update(overrides or {})
    for dotted, value in extra.items():
        section, _, key = dotted.partition(".")
        if section not in cfg or key not in cfg[section]:
            raise StudyError(f"config: override {dotted!r} names no known key")
        cfg[section][key] = value
    bad = [q for q in cfg["study"]["questions"] if q not in sections()]
    if bad:
        raise StudyError(f"config: unknown questions {bad}; known: {', '.join(sections())}")
    if cfg["model"]["trust_remote_code"] and not trust_remote_code:
        raise StudyError(f"config {str(path)!r} sets model.trust_remote_code = true: a model's own code runs only "
                         f"when you pass --trust-remote-code on the command line")
    cfg["model"]["trust_remote_code"] = bool(trust_remote_code)
    cfg["study"]["quick"] = quick
    return cfg


# ---------------------------------------------------------------------------------------------------
# Extraction


@dataclass
class Caches:
    """The caches of one study: ``get(corpus, format, random=False)``."""

    paths: dict[tuple[str, str, bool], Path] = field(default_factory=dict)

    def get(self, corpus: str, fmt: str, random: bool = False):
        from .cache import Cache

        return Cache.open(self.paths[(corpus, fmt, random)])

    def has(self, corpus: str, fmt: str, random: bool = False) -> bool:
        return (corpus, fmt, random) in self.paths


def prefix(examples: Sequence[Example], k: int) -> list[Example]:
    """The first ``k`` sentences of each example (Q3's k-segment inputs from the same groups)."""
    return [Example(e.id, e.sentences[:k], e.labels) for e in examples]


def group_prefixes(corpora: dict) -> dict[int, str]:
    """``{k: corpus key}`` of the ``groups_k<k>`` prefixes :func:`load_corpora` made, in order of k."""
    ks = {int(c.rsplit("k", 1)[1]): c for c in corpora if c.startswith("groups_k")}
    return dict(sorted(ks.items()))


def study_jobs(cfg: dict, corpora: dict[str, list[Example]]) -> list:
    """The caches the config's sections need (:class:`probing.reproductions.Job`), without repeats;
    ``corpora`` as :func:`load_corpora` returns them (Q3/Q5 read its ``groups_k<k>`` prefixes)."""
    from .reproductions import PAPERS, Job

    qs, rnd = set(cfg["study"]["questions"]), cfg["model"]["random_init_baseline"]
    jobs: list[Job] = []
    pair_formats = {f for q in qs for f in PAIR_NEEDS.get(q, ())}
    jobs += [Job("pairs", f, attention=f in ATTENTION_FORMATS) for f in PAIR_FORMATS if f in pair_formats]
    if rnd and qs & set(PAIR_PROBES):
        jobs.append(Job("pairs", "pair", random=True))
    if qs & {"Q3", "Q5"}:
        K = max(group_prefixes(corpora))
        ks = range(2, K + 1) if "Q3" in qs else [K]
        for k in ks:
            jobs.append(Job(f"groups_k{k}", "multi"))
            if "Q3" in qs:
                jobs.append(Job(f"groups_k{k}", "concat"))
    if "Q7" in qs:
        jobs.append(Job("swap", "pair"))
        if rnd:
            jobs.append(Job("swap", "pair", random=True))
    for key in (q for q in cfg["study"]["questions"] if q in PAPERS):
        jobs += PAPERS[key].jobs(cfg)
    return list(dict.fromkeys(jobs))


def load_corpora(cfg: dict) -> tuple[dict[str, list[Example]], dict[str, str]]:
    """The corpora the sections read, and a display name for each (the spec)."""
    from .corpora import load_corpus
    from .reproductions import PAPERS

    qs = set(cfg["study"]["questions"])
    wanted = set()
    if qs & set(PAIR_NEEDS):
        wanted.add("pairs")
    if qs & {"Q3", "Q5"}:
        wanted.add("groups")
    if "Q7" in qs:
        wanted.add("swap")
    for key in qs & set(PAPERS):
        wanted |= {j.corpus for j in PAPERS[key].jobs(cfg)}
    specs = cfg["corpus"]
    corpora = {c: load_corpus(specs[c]) for c in specs if c in wanted}
    names = {c: specs[c] for c in corpora}
    if "groups" in corpora:
        K = min(e.n_sentences for e in corpora["groups"])
        if K < 2:
            raise StudyError("corpus.groups needs examples of at least 2 sentences")
        for k in range(2, K + 1):
            corpora[f"groups_k{k}"] = prefix(corpora["groups"], k)
            names[f"groups_k{k}"] = f"{specs['groups']} (first {k} sentences)"
    return corpora, names


def extract_all(cfg: dict, log) -> tuple[Caches, dict[str, list[Example]], Any]:
    from .extract import extract
    from .models import load_model

    ex_cfg, m_cfg, st = cfg["extract"], cfg["model"], cfg["study"]
    corpora, names = load_corpora(cfg)
    jobs = study_jobs(cfg, corpora)
    caches = Caches()
    common = dict(out=st["caches"], dtype=ex_cfg["dtype"], batch_tokens=ex_cfg["batch_tokens"],
                  device=ex_cfg["device"], on_overflow="skip", log=log)
    models = {}
    for random in (False, True):
        wanted = [j for j in jobs if j.random == random]
        if not wanted and random:
            continue
        lm = load_model(m_cfg["name"], random_init=random, seed=m_cfg["random_init_seed"],
                        trust_remote_code=m_cfg["trust_remote_code"])
        models[random] = lm
        for corpus in dict.fromkeys(j.corpus for j in wanted):
            for attention in (False, True):
                fmts = [j for j in wanted if j.corpus == corpus and j.attention == attention]
                if not fmts:
                    continue
                paths = extract(corpora[corpus], [j.format for j in fmts], model=lm, corpus_name=names[corpus],
                                attention=attention, **common)
                for j, p in zip(fmts, paths):
                    caches.paths[(corpus, j.name, random)] = p
    return caches, corpora, models[False]


# ---------------------------------------------------------------------------------------------------
# Analyses, one function per question; each returns its tables


def _tables_dir(cfg) -> Path:
    return Path(cfg["study"]["out"]) / "tables"


def analyse(cfg: dict, caches: Caches, corpora: dict, lm, log) -> dict[str, pd.DataFrame]:
    from analyses.attention import run_attention
    from analyses.drift import run_drift
    from analyses.probe_runner import run_probes
    from analyses.similarity import run_cka_formats, run_cka_roles

    st, pr = cfg["study"], cfg["probes"]
    out, seed, R = _tables_dir(cfg), st["seed"], st["bootstrap_resamples"]
    qs = set(st["questions"])
    T: dict[str, pd.DataFrame] = {}
    drift = lambda a, b, **kw: run_drift(a, b, n_resamples=R, seed=seed, out=out, **kw)  # noqa: E731
    pair = caches.get("pairs", "pair") if caches.has("pairs", "pair") else None
    rnd = caches.get("pairs", "pair", True) if caches.has("pairs", "pair", True) else None
    if qs & {"Q1", "Q2", "Q4"}:
        log("analyses: drift and CKA across formats")
        concat, concat_seg = caches.get("pairs", "concat"), caches.get("pairs", "concat_segments")
        T["drift_q1"] = pd.concat([drift(pair, concat), drift(pair, concat_seg), drift(concat_seg, concat)],
                                  ignore_index=True)
        T["cka_q1"] = run_cka_formats(pair, concat, ["cls", "mean_s1", "mean_s2", "sep_last"], out=out)
    if "Q2" in qs:
        single, single2 = caches.get("pairs", "single"), caches.get("pairs", "single2")
        T["drift_q2"] = pd.concat([drift(single, pair, words_only=True), drift(single, concat, words_only=True),
                                   drift(single2, pair, words_only=True), drift(single2, concat, words_only=True)],
                                  ignore_index=True)
    if qs & {"Q2", "Q4"}:
        log("analyses: attention")
        T["attention"] = pd.concat([run_attention(caches.get("pairs", f), n_resamples=R, seed=seed, out=out)
                                    for f in ATTENTION_FORMATS], ignore_index=True)
    if "Q3" in qs:
        log("analyses: k segments")
        frames = []
        for k, c in group_prefixes(corpora).items():
            d = drift(caches.get(c, "multi"), caches.get(c, "concat"))
            d["k"] = k
            frames.append(d)
        T["drift_q3"] = pd.concat(frames, ignore_index=True)
    probe_kw = dict(n_splits=pr["folds"], seed=seed, vocab=pr["vocab"], device=pr["device"], Cs=pr["Cs"],
                    inner_splits=pr["inner_splits"], max_iter=pr["max_iter"], bow_Cs=pr["bow_Cs"], out=out)
    wanted = [q for q in PAIR_PROBES if q in qs]
    if wanted:
        log("analyses: probes on the pair format (trained and random-init)")
        frames = [run_probes(pair, *PAIR_PROBES[q], random_cache=rnd, **probe_kw) for q in wanted]
        keys = ["model_kind", "layer", "role", "target", "metric"]
        T["probes_pair"] = pd.concat(frames, ignore_index=True).drop_duplicates(keys)
    if "Q4" in qs:
        T["cka_q4"] = run_cka_roles(pair, [("sep1", "cls"), ("sep1", "mean_s1"), ("sep1", "mean_s2"),
                                           ("sep2", "cls")], out=out)
    if "Q5" in qs:
        log("analyses: [CLS] content of sentence i")
        K = max(group_prefixes(corpora))
        multi = caches.get(f"groups_k{K}", "multi")
        T["probes_q5"] = run_probes(multi, ("cls", "mean"), [f"bow_s{i}" for i in range(1, K + 1)], **probe_kw)
    if "Q6" in qs:
        log("analyses: classification token position")
        T["probes_q6"] = pd.concat([run_probes(caches.get("pairs", f), ("cls",), ("topic", "is_next"), **probe_kw)
                                    for f in ("pair", "cls_mid", "cls_last")], ignore_index=True)
    if "Q7" in qs:
        log("analyses: word order")
        sw = caches.get("swap", "pair")
        swr = caches.get("swap", "pair", True) if caches.has("swap", "pair", True) else None
        T["probes_q7"] = run_probes(sw, ("cls", "mean"), ("swapped",), random_cache=swr, **probe_kw)
    if "Q8" in qs:
        log("analyses: fine-tuning with each pooling")
        from analyses.pooling import run_pooling_experiment

        ft = cfg["finetune"]
        T["finetune"] = run_pooling_experiment(corpora["pairs"], ft["label"], ft["poolings"], ft["seeds"], model=lm,
                                               preset=ft["preset"], out=str(out), corpus_name=cfg["corpus"]["pairs"])
    from .reproductions import PAPERS

    for key in (q for q in st["questions"] if q in PAPERS):
        T.update(PAPERS[key].analyse(cfg, caches, out, log))
    for name, df in T.items():
        from analyses.results import write_table

        write_table(df, out / f"{name}.csv")
    return T


# ---------------------------------------------------------------------------------------------------
# Figures and report


def draw_figures(cfg: dict, T: dict[str, pd.DataFrame], log) -> dict[str, list[Path]]:
    from figures.attention import plot_attention
    from figures.cka import plot_cka_layers
    from figures.drift import plot_drift, plot_drift_by_k
    from figures.pooling import plot_pooling
    from figures.probes import plot_probe_position, plot_probes

    fig = Path(cfg["study"]["out"]) / "figures"
    F: dict[str, list[Path]] = {q: [] for q in sections()}
    if "drift_q1" in T:
        d = T["drift_q1"]
        F["Q1"] += _safe(plot_drift, d[(d["format"] == "pair") & (d["format_b"] == "concat")], fig / "q1_drift_pair_concat", log=log)
        F["Q1"] += _safe(plot_drift, d[(d["format"] != "pair") | (d["format_b"] != "concat")], fig / "q1_drift_sep_vs_segments",
                         roles=["cls", "s1 words", "s2 words"], log=log)
    if "cka_q1" in T:
        F["Q1"] += _safe(plot_cka_layers, T["cka_q1"], fig / "q1_cka_pair_concat", log=log)
    if "drift_q2" in T:
        F["Q2"] += _safe(plot_drift, T["drift_q2"], fig / "q2_context_drift", roles=["s1 words", "s2 words"],
                         overlay=True, log=log)
    if "attention" in T:
        a = T["attention"]
        F["Q2"] += _safe(plot_attention, a, fig / "q2_attention_pair", format="pair", log=log)
        F["Q4"] += _safe(plot_attention, a, fig / "q4_attention_concat", format="concat", log=log)
    if "drift_q3" in T:
        F["Q3"] += _safe(plot_drift_by_k, T["drift_q3"], fig / "q3_drift_by_k", log=log)
    if "probes_pair" in T:
        p = T["probes_pair"]
        F["Q4"] += _safe(plot_probes, p, fig / "q4_probes_is_next", target="is_next",
                         roles=["sep1", "sep2", "cls", "mean_s1", "mean_s2"], log=log)
        F["Q4"] += _safe(plot_probes, p, fig / "q4_probes_bow_s2", target="bow_s2", metric="micro_f1",
                         roles=["sep1", "sep2", "cls", "mean_s1", "mean_s2"], log=log)
        F["Q7"] += _safe(plot_probes, p, fig / "q7_probes_bow_s1", target="bow_s1", metric="micro_f1",
                         roles=["cls", "mean"], log=log)
        F["Q7"] += _safe(plot_probes, p, fig / "q7_probes_length", target="length", roles=["cls", "mean"], log=log)
        F["Q8"] += _safe(plot_probes, p, fig / "q8_probes_topic", target="topic",
                         roles=["cls", "mean", "max", "sep1", "first_word", "pos3"], log=log)
    if "cka_q4" in T:
        F["Q4"] += _safe(plot_cka_layers, T["cka_q4"], fig / "q4_cka_sep", log=log)
    if "probes_q5" in T:
        F["Q5"] += _safe(plot_probe_position, T["probes_q5"], fig / "q5_cls_content_by_position", metric="micro_f1",
                         choice=["cls", "mean"], layer="last", log=log)
    if "probes_q6" in T:
        p = T["probes_q6"].copy()
        p["role"] = p["format"].map({"pair": "cls first", "cls_mid": "cls middle", "cls_last": "cls last"})
        p["format"] = "pair / cls_mid / cls_last"
        F["Q6"] += _safe(plot_probes, p, fig / "q6_cls_position_topic", target="topic", log=log)
        F["Q6"] += _safe(plot_probes, p, fig / "q6_cls_position_is_next", target="is_next", log=log)
    if "probes_q7" in T:
        F["Q7"] += _safe(plot_probes, T["probes_q7"], fig / "q7_probes_word_order", target="swapped", log=log)
    if "finetune" in T:
        frozen = T.get("probes_pair")
        frozen = frozen[frozen["model_kind"] == "trained"] if frozen is not None else None
        F["Q8"] += _safe(plot_pooling, T["finetune"], fig / "q8_pooling", frozen_df=frozen, log=log)
    from .reproductions import PAPERS

    for key in (q for q in cfg["study"]["questions"] if q in PAPERS):
        F[key] += PAPERS[key].figures(T, fig, log)
    return F


def _tables_for_report(T: dict) -> dict[str, tuple[pd.DataFrame, str]]:
    from .report import last_layer, pick

    out = {}
    if "drift_q1" in T:
        d = pick(T["drift_q1"], metric="drift_mean")
        L = last_layer(d)
        t = d[d["layer"] == L].pivot_table(index=["format", "format_b"], columns="role", values="value", sort=False)
        out["Q1"] = (t.reset_index(), f"1 − cos (mean) at layer {L}, per role group")
    if "drift_q2" in T:
        d = pick(T["drift_q2"], metric="drift_mean")
        t = d.pivot_table(index="layer", columns=["format", "format_b"], values="value", aggfunc="first", sort=False)
        t.columns = [f"{a}→{b}" for a, b in t.columns]
        out["Q2"] = (t.reset_index(), "1 − cos (mean) of the words of the single sentence (role 'all')")
    if "drift_q3" in T:
        d = pick(T["drift_q3"], metric="drift_mean")
        L = last_layer(d)
        t = d[d["layer"] == L].pivot_table(index="k", columns="role", values="value", sort=False)
        out["Q3"] = (t.reset_index(), f"1 − cos (mean) between multi and concat at layer {L}, by k")
    if "probes_pair" in T:
        p = pick(T["probes_pair"], model_kind="trained")
        p = p[p["metric"].isin(["accuracy", "micro_f1"])]
        L = last_layer(p)
        t = p[p["layer"] == L].pivot_table(index="role", columns="target", values="value", sort=False)
        out["Q4"] = (t.reset_index(), f"probe scores at layer {L} (accuracy; micro-F1 for bow_*; trained model)")
    if "probes_q5" in T:
        p = pick(T["probes_q5"], metric="micro_f1")
        L = last_layer(p)
        t = p[p["layer"] == L].pivot_table(index="role", columns="target", values="value", sort=False)
        out["Q5"] = (t.reset_index(), f"bag-of-words micro-F1 per sentence position at layer {L}")
    if "probes_q6" in T:
        p = pick(T["probes_q6"], metric="accuracy")
        t = p.pivot_table(index="layer", columns=["target", "format"], values="value", sort=False)
        t.columns = [f"{a} / {b}" for a, b in t.columns]
        out["Q6"] = (t.reset_index(), "probe accuracy of the classification token by layer and position")
    if "probes_q7" in T:
        p = pick(T["probes_q7"], metric="accuracy")
        t = p.pivot_table(index="layer", columns=["model_kind", "role"], values="value", sort=False)
        t.columns = [f"{a} / {b}" for a, b in t.columns]
        out["Q7"] = (t.reset_index(), "word-order (swapped) probe accuracy by layer")
    if "finetune" in T:
        f = pick(T["finetune"], metric="test_accuracy")
        t = f.pivot_table(index="role", columns="seed", values="value", sort=False)
        t.columns = [f"seed {int(c)}" for c in t.columns]
        t["mean"] = t.mean(axis=1)
        t["sd"] = t.drop(columns="mean").std(axis=1, ddof=1)
        out["Q8"] = (t.reset_index().rename(columns={"role": "pooling"}), "fine-tuned test accuracy per pooling and seed")
    return out


def write_report(cfg: dict, T: dict, F: dict, caches: Caches, corpora: dict, lm, run_time: str) -> Path:
    from . import __version__
    from .report import ANSWERS, NOTES, TITLES, Section, machine, render_html, render_markdown

    from .reproductions import PAPERS

    out = Path(cfg["study"]["out"])
    tables = _tables_for_report(T)
    sections_ = []
    for q in cfg["study"]["questions"]:
        if q in PAPERS:
            r = PAPERS[q]
            t = r.table(T)
            sections_.append(Section(r.title, r.answer(T), F.get(q, []), *(t or (None, "")),
                                     f"{r.notes} Reference: {r.citation}."))
            continue
        t, caption = tables.get(q, (None, ""))
        sections_.append(Section(TITLES[q], ANSWERS[q](T), F.get(q, []), t, caption, NOTES[q]))
    import torch
    import transformers

    first = next(iter(caches.paths.values()))
    from .cache import Cache

    manifest = Cache.open(first).manifest
    skipped = {c: len(Cache.open(p).manifest["skipped"]) for (c, _, _), p in caches.paths.items()}
    provenance = {
        "model": f"{lm.name} (fingerprint {lm.fingerprint[:16]}…, {lm.n_layers} layers, hidden {lm.hidden_size})",
        "random-init baseline": (f"same architecture, seed {cfg['model']['random_init_seed']}"
                                 if cfg["model"]["random_init_baseline"] else "not run"),
        "corpora": "; ".join(f"{k}: {cfg['corpus'][k]} ({len(corpora[k])} examples)" for k in cfg["corpus"]
                             if k in corpora),
        "examples skipped as too long": sum(skipped.values()),
        "caches": f"{len(caches.paths)} under {Path(cfg['study']['caches']).resolve()} "
                  f"(e.g. {Path(first).name}, corpus fingerprint {manifest['corpus']['fingerprint'][:16]}…)",
        "seed": cfg["study"]["seed"],
        "bootstrap resamples": cfg["study"]["bootstrap_resamples"],
        "versions": f"probing {__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
                    f"numpy {np.__version__}, pandas {pd.__version__}, python {platform.python_version()}",
        "machine": machine(),
        "run time": run_time,
        "tables": str((out / "tables").resolve()),
    }
    title = cfg["study"]["title"] or f"probing study '{cfg['study']['name']}': what input formatting does to {lm.name}"
    intro = ("Every number below was computed by this run from the result tables in tables/; CIs are 95% "
             "(cluster bootstrap over examples, or over word types for self-similarity, for drift, attention and "
             "similarity measures; t-interval over cross-validation folds for probes).")
    md = render_markdown(title, intro, sections_, provenance, out)
    (out / "report.md").write_text(md, encoding="utf-8")
    (out / "report.html").write_text(render_html(title, intro, sections_, provenance), encoding="utf-8")
    return out / "report.md"


def _run_time(seconds: float, started: float, caches: Caches, out: Path, quick: bool) -> str:
    """This run's wall time, and how much of the work earlier runs had already done (files older than
    this run's start were reused, not recomputed)."""
    manifests = [Path(p) / "manifest.json" for p in caches.paths.values()]
    old_caches = sum(m.stat().st_mtime < started for m in manifests)
    tables = [t for t in (out / "tables").glob("*.csv") if "-" in t.stem]  # result_path files: <analysis>-<hash>
    old_tables = sum(t.stat().st_mtime < started for t in tables)
    s = f"{seconds:.0f} s" + (" (quick mode)" if quick else "")
    if old_caches or old_tables:
        s += (f"; reused from earlier runs: {old_caches} of {len(manifests)} caches, {old_tables} of {len(tables)} "
              "result tables")
    return s


def run_study(config: str | os.PathLike | None, *, quick: bool = False, force_analyses: bool = False,
              overrides: dict[str, Any] | None = None, trust_remote_code: bool = False, log=print) -> Path:
    """Run a whole study; returns the path of ``report.md``. ``config`` as :func:`load_config` takes it."""
    t0, started = time.perf_counter(), time.time()
    plain_log = log
    log = lambda msg: plain_log(f"[{time.perf_counter() - t0:6.0f}s] {msg}")  # noqa: E731
    cfg = load_config(config, quick=quick, overrides=overrides, trust_remote_code=trust_remote_code)
    out = Path(cfg["study"]["out"])
    if force_analyses and (out / "tables").exists():
        import shutil

        shutil.rmtree(out / "tables")
    log(f"study {cfg['study']['name']!r}{' (quick)' if quick else ''}: extracting")
    caches, corpora, lm = extract_all(cfg, log)
    T = analyse(cfg, caches, corpora, lm, log)
    log("drawing figures")
    F = draw_figures(cfg, T, log)
    report = write_report(cfg, T, F, caches, corpora, lm, _run_time(time.perf_counter() - t0, started, caches, out,
                                                                   quick))
    log(f"report: {report} (and {report.with_suffix('.html')}), {time.perf_counter() - t0:.0f} s")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import ArgumentParser, check_output_dir

    p = ArgumentParser(
        prog="python -m probing.study",
        description="Run a study from a TOML config: extract the caches it needs (reusing existing ones), run the "
                    "analyses for Q1-Q8 (reusing existing result tables), draw the figures and write "
                    "<out>/report.md and report.html.",
    )
    p.add_argument("config", nargs="?", default=DEFAULT_CONFIG,
                   help=f"a packaged config's name ({', '.join(packaged_configs())}) or a path to a TOML file "
                        f"(default {DEFAULT_CONFIG})")
    p.add_argument("--quick", action="store_true", help="the config's [quick] settings: a small run in minutes")
    p.add_argument("--model", default=None, help="override [model] name (a Hugging Face id or local path)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model's own code to run (off by default; a config cannot switch it on)")
    p.add_argument("--out", default=None, help="override [study] out")
    p.add_argument("--caches", default=None, help="override [study] caches")
    p.add_argument("--questions", default=None, help="comma list, e.g. Q1,Q4 (default: the config's)")
    p.add_argument("--force", action="store_true", help="recompute the analyses (caches are still reused)")
    args = p.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.model:
        overrides["model.name"] = args.model
    if args.out:
        overrides["study.out"] = args.out
    if args.caches:
        overrides["study.caches"] = args.caches
    if args.questions:
        overrides["study.questions"] = [q.strip() for q in args.questions.split(",")]
    from .cache import CacheError
    from .models import ModelLoadError

    try:
        cfg = load_config(args.config, quick=args.quick, overrides=overrides, trust_remote_code=args.trust_remote_code)
        check_output_dir(cfg["study"]["out"], "--out (study.out)")
        check_output_dir(cfg["study"]["caches"], "--caches (study.caches)")
        run_study(args.config, quick=args.quick, force_analyses=args.force, overrides=overrides,
                  trust_remote_code=args.trust_remote_code)
    except (StudyError, ModelLoadError, CacheError, ValueError, ImportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
