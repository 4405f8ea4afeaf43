"""One command answers the seed questions Q1-Q8: extract, analyse, draw, report.

    python -m probing.study seed_questions [--quick] [--force] [--model NAME]

A study is a TOML config: a name of one packaged with the toolkit (``probing/study/configs/*.toml``, see
:func:`packaged_configs`) or a path to your own file; it names model, corpora, options. The runner
extracts every cache it needs (existing caches are reused), runs the analyses (existing result
tables are reused), draws the figures from the tables and writes ``<out>/report.md`` and
``<out>/report.html`` (figures inline). Every number in the report is read from that run's tables.

Every section, question or paper reproduction, is one declared :class:`probing.study.sections.StudySection`
(:data:`probing.study.questions.QUESTION_SECTIONS`, :data:`probing.study.reproductions.PAPERS`); this module is
the one runner for all of them: it loads the corpora the sections name, extracts the union of their
caches, runs their analyses (shared tables computed once), draws their figures and writes the report,
each section opening with its verdict (:mod:`probing.study.verdicts`).
"""

from __future__ import annotations

import copy
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..examples import Example
from .question_tables import make_intervention
from .questions import QUESTION_SECTIONS
from .sections import Context, Job, StudySection, prefix
from .stages import Stages

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

QUESTIONS = tuple(QUESTION_SECTIONS)

DEFAULTS: dict[str, dict[str, Any]] = {
    "study": {"name": "study", "out": "runs/study", "caches": "caches", "seed": 0, "bootstrap_resamples": 1000,
              "questions": list(QUESTIONS), "title": None},
    "model": {"name": None, "random_init_baseline": True, "random_init_seed": 0, "trust_remote_code": False},
    "corpus": {"pairs": "generated:n=200,k=2", "groups": "generated:n=100,k=4,pairing=consecutive",
               "swap": "generated:n=200,k=2,seed=1,swap=1",
               # paper reproductions (probing.study.reproductions)
               "sentences": "generated:n=300,k=1", "paragraphs": "generated:n=100,k=4,pairing=consecutive",
               "swap_sentences": "generated:n=300,k=1,seed=1,swap=1"},
    "extract": {"dtype": "float32", "batch_tokens": None, "device": "auto"},
    "probes": {"folds": 5, "vocab": 50, "max_tokens": 6000, "device": None, "Cs": [1e-3, 1e-2, 1e-1, 1.0, 10.0],
               "inner_splits": 3, "max_iter": 1000, "bow_Cs": None},
    "finetune": {"preset": "default", "label": "topic", "poolings": ["cls", "mean", "max", "sep1", "first_word"],
                 "seeds": [0, 1, 2]},
    "papers": {"clark_format": "[CLS] {1} {2} [SEP] <1> {3} {4} [SEP]", "min_contexts": 5, "max_contexts": 50,
               "label": "topic", "knn_k": 1},
}


def section_specs() -> dict[str, StudySection]:
    """Every declared section by key: the questions Q1-Q8, then the paper reproductions."""
    from .reproductions import PAPERS

    return {**QUESTION_SECTIONS, **PAPERS}


def sections() -> tuple[str, ...]:
    """Every section a study can hold: the questions Q1-Q8, then the paper reproductions."""
    return tuple(section_specs())


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
    from analyses.intervals import too_few_resamples

    resamples = cfg["study"]["bootstrap_resamples"]
    if isinstance(resamples, bool) or not isinstance(resamples, int):
        raise StudyError(f"config: study.bootstrap_resamples = {resamples!r}: give a whole number")
    problem = too_few_resamples(resamples)
    if problem is not None:
        raise StudyError(f"config: study.bootstrap_resamples = {resamples}: {problem}")
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
        from ..cache import Cache

        return Cache.open(self.paths[(corpus, fmt, random)])

    def has(self, corpus: str, fmt: str, random: bool = False) -> bool:
        return (corpus, fmt, random) in self.paths


def _selected(cfg: dict) -> list[StudySection]:
    specs = section_specs()
    return [specs[q] for q in cfg["study"]["questions"]]


def study_jobs(cfg: dict, corpora: dict[str, list[Example]]) -> list[Job]:
    """The caches the config's sections need (:class:`probing.study.sections.Job`), without repeats;
    ``corpora`` as :func:`load_corpora` returns them (Q3/Q5 read its ``groups_k<k>`` prefixes)."""
    return list(dict.fromkeys(j for s in _selected(cfg) for j in s.jobs(cfg, corpora)))


def load_corpora(cfg: dict) -> tuple[dict[str, list[Example]], dict[str, str]]:
    """The corpora the sections read, and a display name for each (the spec)."""
    from ..corpora import load_corpus

    wanted = {c for s in _selected(cfg) for c in s.corpora}
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


def extract_all(cfg: dict, log, progress: bool = True) -> tuple[Caches, dict[str, list[Example]], Any]:
    """Every cache the selected sections need (existing ones reused); ``progress``: extraction's bars."""
    from ..extract import extract
    from ..models import load_model

    ex_cfg, m_cfg, st = cfg["extract"], cfg["model"], cfg["study"]
    corpora, names = load_corpora(cfg)
    jobs = study_jobs(cfg, corpora)
    caches = Caches()
    common = dict(out=st["caches"], dtype=ex_cfg["dtype"], batch_tokens=ex_cfg["batch_tokens"],
                  device=ex_cfg["device"], on_overflow="skip", log=log, progress=progress)
    models = {}
    for random in (False, True):
        wanted = [j for j in jobs if j.random == random]
        if not wanted and random:
            continue
        lm = load_model(m_cfg["name"], random_init=random, seed=m_cfg["random_init_seed"],
                        trust_remote_code=m_cfg["trust_remote_code"])
        models[random] = lm
        # clean caches first: an intervention may read one (a patch's source)
        for intervention in dict.fromkeys(sorted((j.intervention for j in wanted), key=bool)):
            for corpus in dict.fromkeys(j.corpus for j in wanted):
                for attention in (False, True):
                    fmts = [j for j in wanted if j.corpus == corpus and j.attention == attention
                            and j.intervention == intervention]
                    if not fmts:
                        continue
                    extra = {}
                    if intervention:
                        extra["intervention"] = make_intervention(intervention, lm.n_layers, caches, corpus, random)
                    paths = extract(corpora[corpus], [j.format for j in fmts], model=lm, corpus_name=names[corpus],
                                    attention=attention, **extra, **common)
                    for j, p in zip(fmts, paths):
                        caches.paths[(corpus, j.name, random)] = p
    return caches, corpora, models[False]


# ---------------------------------------------------------------------------------------------------
# The one runner: analyses, figures and report for every selected section


def _tables_dir(cfg) -> Path:
    """Where the study's named tables go (``<out>/tables/<name>.csv`` and ``.parquet``), one copy each."""
    return Path(cfg["study"]["out"]) / "tables"


def results_dir(cfg) -> Path:
    """The result store: each runner's table under the hash of its inputs and options
    (:func:`analyses.results.result_path`), reused by the next run. It lives apart from ``tables/``
    so that ``tables/`` holds each table once, under its name."""
    return Path(cfg["study"]["out"]) / RESULTS_DIR


#: The result store's directory name inside the study's output directory.
RESULTS_DIR = ".results"


#: A result-store file (``<analysis>-<16 hex>[.predictions].csv|parquet``); earlier versions kept them in tables/.
_STORED = re.compile(r"[a-z0-9_]+-[0-9a-f]{16}(\.predictions)?\.(csv|parquet)")


def analyse(cfg: dict, caches: Caches, corpora: dict, lm, log, stages: Stages | None = None,
            progress: bool = True) -> dict[str, pd.DataFrame]:
    """Every selected section's tables (a table two sections share is computed once, in the stage of the
    first section that asks for it), each written once to ``<out>/tables/<name>.csv`` (and ``.parquet``);
    the runners' own stores go to :func:`results_dir`. Each section's analyses are one stage of ``stages``."""
    from analyses.results import write_table

    stages = stages if stages is not None else Stages()
    ctx = Context(cfg=cfg, caches=caches, corpora=corpora, lm=lm, out=results_dir(cfg), log=log, progress=progress)
    T: dict[str, pd.DataFrame] = {}
    sections = _selected(cfg)
    for i, s in enumerate(sections):
        ctx.later = tuple(t for later in sections[i + 1:] for t in later.tables)
        with stages.stage(f"analyses {s.key}"):
            T.update(s.analyse(ctx))
    tables = _tables_dir(cfg)
    stale = [p for p in tables.glob("*") if _STORED.fullmatch(p.name)] if tables.is_dir() else []
    for p in stale:  # hash-named copies an older version stored beside the named tables
        p.unlink()
    if stale:
        log(f"removed {len(stale)} hash-named files from {tables} (the result store is now {ctx.out})")
    for name, df in T.items():
        write_table(df, tables / f"{name}.csv")
    return T


def draw_figures(cfg: dict, T: dict[str, pd.DataFrame], log) -> dict[str, list[Path]]:
    """Each selected section's figures (PNG paths), by section key."""
    fig = Path(cfg["study"]["out"]) / "figures"
    return {s.key: s.figures(T, fig, log) for s in _selected(cfg)}


def run_limits(cfg: dict, corpora: dict, spec: StudySection, model_name: str) -> str:
    """What this run's numbers do not show, generated from the config: the corpora the section read
    and their sizes, quick mode, and for [CLS]/[SEP] claims what the model is."""
    from .model_facts import cls_caveat
    from .sections import corpus_sizes

    parts = []
    sizes = corpus_sizes(cfg, corpora, spec.corpora)
    if sizes:
        parts.append(f"Measured on {model_name} with {sizes}; another corpus or model may differ.")
    if cfg["study"].get("quick"):
        parts.append("Quick mode: small samples and few folds, so nulls here are expected and not evidence.")
    if spec.about_cls:
        caveat = cls_caveat(model_name)
        if caveat:
            parts.append(caveat)
    return " ".join(parts)


@dataclass
class ReportDocument:
    """A report before it is written: title, introduction, sections and provenance (key -> value)."""

    title: str
    intro: str
    sections: list
    provenance: dict


def build_report(cfg: dict, T: dict, F: dict, caches: Caches, corpora: dict, lm) -> ReportDocument:
    """Every section's verdict, evidence, figures and tables, the introduction and the provenance (all
    but the run's total time and its stage table, which :func:`run_study` adds once this is done)."""
    from .. import __version__
    from .model_facts import model_sentence
    from .report import Section, describe_intervals, machine, quick_notice
    from .verdicts import describe_rules

    out = Path(cfg["study"]["out"])
    sections_ = []
    for spec in _selected(cfg):
        t = spec.table(T)
        verdict = spec.verdict(T, cfg)
        comparison = spec.comparison_table(T)
        sections_.append(Section(spec.title, spec.answer(T), F.get(spec.key, []), *(t or (None, "")),
                                 spec.note_text(cfg), verdict=verdict.sentence if verdict is not None else "",
                                 limits=run_limits(cfg, corpora, spec, lm.name),
                                 comparison=comparison[0] if comparison else None,
                                 comparison_caption=comparison[1] if comparison else "",
                                 glance=verdict.short if verdict is not None else ""))
    import torch
    import transformers

    first = next(iter(caches.paths.values()))
    from ..cache import Cache

    manifest = Cache.open(first).manifest
    skipped: dict[str, int] = {}
    for (c, _, _), p in caches.paths.items():
        skipped[c] = max(skipped.get(c, 0), len(Cache.open(p).manifest["skipped"]))
    provenance = {
        "model": f"{lm.name} (fingerprint {lm.fingerprint[:16]}…, {lm.n_layers} layers, hidden {lm.hidden_size})",
        "random-init baseline": (f"same architecture, seed {cfg['model']['random_init_seed']}"
                                 if cfg["model"]["random_init_baseline"] else "not run"),
        "corpora": "; ".join(f"{k}: {cfg['corpus'][k]} ({len(corpora[k])} examples)" for k in cfg["corpus"]
                             if k in corpora),
        "examples skipped as too long": skip_counts(skipped, T.get("finetune")),
        "caches": f"{len(caches.paths)} under {Path(cfg['study']['caches']).resolve()} "
                  f"(e.g. {Path(first).name}, corpus fingerprint {manifest['corpus']['fingerprint'][:16]}…)",
        "seed": cfg["study"]["seed"],
        "bootstrap resamples": cfg["study"]["bootstrap_resamples"],
        "versions": f"probing {__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
                    f"numpy {np.__version__}, pandas {pd.__version__}, python {platform.python_version()}",
        "machine": machine(),
        "tables": str((out / "tables").resolve()),
    }
    quick = bool(cfg["study"].get("quick"))
    title = cfg["study"]["title"] or f"probing study '{cfg['study']['name']}': what input formatting does to {lm.name}"
    if quick:
        title += " (quick mode)"
    intro = [quick_notice(cfg, corpora, T)] if quick else []
    intro += [model_sentence(lm.name),
              "Every number below was computed by this run from the result tables in tables/. "
              + describe_intervals(T),
              describe_rules()]
    return ReportDocument(title, "\n\n".join(p for p in intro if p), sections_, provenance)


def write_report(doc: ReportDocument, out: Path) -> Path:
    """Write ``<out>/report.md`` and ``<out>/report.html``; returns the Markdown path."""
    from .report import render_html, render_markdown

    md = render_markdown(doc.title, doc.intro, doc.sections, doc.provenance, out)
    (out / "report.md").write_text(md, encoding="utf-8")
    (out / "report.html").write_text(render_html(doc.title, doc.intro, doc.sections, doc.provenance),
                                     encoding="utf-8")
    return out / "report.md"


def skip_counts(extraction: dict[str, int], finetune: pd.DataFrame | None = None) -> str:
    """Every example left out, counted: extraction skips per corpus (the most any cache of it skipped)
    and the fine-tuning experiment's ``n_skipped`` (examples over its length limit).

    >>> skip_counts({"pairs": 2, "swap": 0})
    '2 at extraction (pairs 2, swap 0)'
    """
    s = f"{sum(extraction.values())} at extraction (" + ", ".join(f"{k} {v}" for k, v in extraction.items()) + ")"
    if finetune is not None and "metric" in finetune.columns:
        n = finetune.loc[finetune["metric"] == "n_skipped", "value"]
        if len(n):
            s += f"; {int(pd.to_numeric(n).max())} in fine-tuning (Q8)"
    return s


def _run_time(seconds: float, started: float, caches: Caches, out: Path, quick: bool) -> str:
    """This run's wall time, and how much of the work earlier runs had already done (files older than
    this run's start were reused, not recomputed)."""
    manifests = [Path(p) / "manifest.json" for p in caches.paths.values()]
    old_caches = sum(m.stat().st_mtime < started for m in manifests)
    tables = [t for t in (out / RESULTS_DIR).glob("*.csv") if not t.stem.endswith(".predictions")]
    old_tables = sum(t.stat().st_mtime < started for t in tables)
    s = f"{seconds:.0f} s" + (" (quick mode)" if quick else "")
    if old_caches or old_tables:
        s += (f"; reused from earlier runs: {old_caches} of {len(manifests)} caches, {old_tables} of {len(tables)} "
              "result tables")
    return s


def run_study(config: str | os.PathLike | None, *, quick: bool = False, force_analyses: bool = False,
              overrides: dict[str, Any] | None = None, trust_remote_code: bool = False, log=print,
              progress: bool = True) -> Path:
    """Run a whole study; returns the path of ``report.md``. ``config`` as :func:`load_config` takes it."""
    t0, started = time.perf_counter(), time.time()
    plain_log = log
    log = lambda msg: plain_log(f"[{time.perf_counter() - t0:6.0f}s] {msg}")  # noqa: E731
    cfg = load_config(config, quick=quick, overrides=overrides, trust_remote_code=trust_remote_code)
    out = Path(cfg["study"]["out"])
    if force_analyses:
        import shutil

        for d in (results_dir(cfg), _tables_dir(cfg)):
            if d.exists():
                shutil.rmtree(d)
    stages = Stages()
    log(f"study {cfg['study']['name']!r}{' (quick)' if quick else ''}: extracting")
    with stages.stage("extraction"):
        caches, corpora, lm = extract_all(cfg, log, progress)
    T = analyse(cfg, caches, corpora, lm, log, stages, progress)
    log("drawing figures")
    with stages.stage("figures"):
        F = draw_figures(cfg, T, log)
    with stages.stage("report"):
        doc = build_report(cfg, T, F, caches, corpora, lm)
    total = time.perf_counter() - t0
    doc.provenance["run time"] = _run_time(total, started, caches, out, quick)
    doc.provenance["time and memory per stage"] = stages.summary()
    report = write_report(doc, out)
    write_stages(stages, out)
    for line in stages.lines(total):
        log(line)
    log(f"report: {report} (and {report.with_suffix('.html')}), {time.perf_counter() - t0:.0f} s")
    return report


def write_stages(stages: Stages, out: Path) -> Path:
    """The stage table as ``<out>/tables/stages.csv`` (and Parquet), beside the result tables."""
    from analyses.results import write_table

    return write_table(stages.table(), out / "tables" / "stages.csv")


def main(argv: Sequence[str] | None = None) -> int:
    from ..cli import ArgumentParser, check_output_dir

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
    p.add_argument("--no-progress", action="store_true", help="no progress bars (the stage log lines stay)")
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
    from ..cache import CacheError
    from ..models import ModelLoadError

    try:
        cfg = load_config(args.config, quick=args.quick, overrides=overrides, trust_remote_code=args.trust_remote_code)
        check_output_dir(cfg["study"]["out"], "--out (study.out)")
        check_output_dir(cfg["study"]["caches"], "--caches (study.caches)")
        run_study(args.config, quick=args.quick, force_analyses=args.force, overrides=overrides,
                  trust_remote_code=args.trust_remote_code, progress=not args.no_progress)
    except (StudyError, ModelLoadError, CacheError, ValueError, ImportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
