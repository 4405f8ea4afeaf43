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

import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from ..examples import Example, corpus_fingerprint
from .config import (CONFIG_DIR, DEFAULT_CONFIG, QUESTIONS, RESOLVED, StudyConfig, StudyError,  # noqa: F401
                     config_path, load_config, packaged_configs, resolved_lines, section_specs, sections,
                     write_resolved)
from .shared import make_intervention
from .questions import Question
from .sections import Context, Job, StudySection, prefix
from .rules import decide
from .stages import Stages

if TYPE_CHECKING:
    from analyses.results import StoreUse

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


def _selected(cfg: StudyConfig) -> list[StudySection]:
    specs = section_specs()
    return [specs[q] for q in cfg.study.questions]


def study_jobs(cfg: StudyConfig, corpora: dict[str, list[Example]]) -> list[Job]:
    """The caches the config's sections need (:class:`probing.study.sections.Job`), without repeats;
    ``corpora`` as :func:`load_corpora` returns them (Q3/Q5 read its ``groups_k<k>`` prefixes)."""
    return merge_jobs(j for s in _selected(cfg) for j in s.jobs(cfg, corpora))


def merge_jobs(jobs) -> list[Job]:
    """``jobs`` with those of one cache merged: the same corpus, format, weights and intervention are one
    extraction, keeping attention (and the norm-based attention) if any of them asks for it. A cache with
    attention holds everything one without it does, and the analyses find a cache by its corpus and format
    name, so one extraction serves both (two would cost a second pass over the corpus, ~30 s for the default
    study's pairs, for a cache nothing reads). Order: where each cache was first asked for.

    >>> [(j.format, j.attention) for j in merge_jobs([Job("c", "pair"), Job("c", "pair", attention=True)])]
    [('pair', True)]
    """
    merged: dict[tuple, Job] = {}
    for j in jobs:
        key = (j.corpus, j.format, j.random, j.intervention)
        have = merged.get(key)
        merged[key] = j if have is None else replace(
            have, attention=have.attention or j.attention, attention_norm=have.attention_norm or j.attention_norm)
    return list(merged.values())


def load_corpora(cfg: StudyConfig) -> tuple[dict[str, list[Example]], dict[str, str]]:
    """The corpora the sections read, and a display name for each (the spec)."""
    from ..corpora import load_corpus

    wanted = {c for s in _selected(cfg) for c in s.corpora}
    specs = cfg.corpus.specs()
    corpora = {c: load_corpus(specs[c]) for c in specs if c in wanted}
    names = {c: specs[c] for c in corpora}
    if "groups" in corpora:
        K = min(e.n_sentences for e in corpora["groups"])
        if K < 2:
            raise StudyError("corpus.groups needs examples of at least 2 sentences")
        for k in range(2, K + 1):
            corpora[f"groups_k{k}"] = prefix(corpora["groups"], k)
            names[f"groups_k{k}"] = f"{specs['groups']} (first {k} sentences)"
    for q in _questions(cfg):  # corpora a question derives from these (two words swapped, sentence 2 replaced, ...)
        for name, examples in q.derive(cfg, corpora).items():
            if name in corpora and corpus_fingerprint(corpora[name]) != corpus_fingerprint(examples):
                raise StudyError(f"{q.key} derives corpus {name!r}, which another question derives differently")
            corpora[name] = list(examples)
            names.setdefault(name, f"{name} (derived by {q.key})")
    return corpora, names


def _questions(cfg: StudyConfig) -> list[Question]:
    """The selected sections that are question modules (:class:`probing.study.questions.Question`)."""
    return [s for s in _selected(cfg) if isinstance(s, Question)]


def extract_all(cfg: StudyConfig, log, progress: bool = True) -> tuple[Caches, dict[str, list[Example]], Any]:
    """Every cache the selected sections need (existing ones reused); ``progress``: extraction's bars."""
    from ..extract import extract
    from ..models import load_model

    corpora, names = load_corpora(cfg)
    jobs = study_jobs(cfg, corpora)
    caches = Caches()
    common = dict(out=cfg.study.caches, dtype=cfg.extract.dtype, batch_tokens=cfg.extract.batch_tokens,
                  device=cfg.study.device, on_overflow="skip", log=log, progress=progress)
    models = {}
    for random in (False, True):
        wanted = [j for j in jobs if j.random == random]
        if not wanted and random:
            continue
        lm = load_model(cfg.model.name, random_init=random, seed=cfg.model.random_init_seed,
                        trust_remote_code=cfg.model.trust_remote_code)
        models[random] = lm
        # clean caches first: an intervention may read one (a patch's source)
        for intervention in dict.fromkeys(sorted((j.intervention for j in wanted), key=bool)):
            for corpus in dict.fromkeys(j.corpus for j in wanted):
                for attention, norm in ((False, False), (True, False), (True, True)):
                    fmts = [j for j in wanted if j.corpus == corpus and (j.attention or j.attention_norm) == attention
                            and j.attention_norm == norm and j.intervention == intervention]
                    if not fmts:
                        continue
                    extra = {"attention_norm": True} if norm else {}
                    if intervention:
                        extra["intervention"] = make_intervention(intervention, lm.n_layers, caches, corpus, random,
                                                                   seed=cfg.study.seed)
                    paths = extract(corpora[corpus], [j.format for j in fmts], model=lm, corpus_name=names[corpus],
                                    attention=attention, **extra, **common)
                    for j, p in zip(fmts, paths):
                        caches.paths[(corpus, j.name, random)] = p
    return caches, corpora, models[False]


# ---------------------------------------------------------------------------------------------------
# The one runner: analyses, figures and report for every selected section


def _tables_dir(cfg: StudyConfig) -> Path:
    """Where the study's named tables go (``<out>/tables/<name>.csv`` and ``.parquet``), one copy each."""
    return Path(cfg.study.out) / "tables"


def results_dir(cfg: StudyConfig) -> Path:
    """The result store: each runner's table under the hash of its inputs and options
    (:func:`analyses.results.result_path`), reused by the next run. It lives apart from ``tables/``
    so that ``tables/`` holds each table once, under its name."""
    return Path(cfg.study.out) / RESULTS_DIR


#: The result store's directory name inside the study's output directory.
RESULTS_DIR = ".results"


#: A result-store file (``<analysis>-<16 hex>[.predictions].csv|parquet``); earlier versions kept them in tables/.
_STORED = re.compile(r"[a-z0-9_]+-[0-9a-f]{16}(\.predictions)?\.(csv|parquet)")


#: The study's table of fine-tuning predictions (:func:`analyses.finetune.run_protocol`): one row per run,
#: evaluation condition and test item; the questions' fine-tuned comparisons read it.
FINETUNE_TABLE = "finetune_predictions"


def decisions_table(q: Question) -> str:
    """The name of a question's decided comparison rows in the study's tables (``q1_decisions``)."""
    return f"{q.key.lower()}_decisions"


def finetune_all(cfg: StudyConfig, corpora: dict, lm, out: Path, log, progress: bool = True) -> pd.DataFrame | None:
    """Every fine-tuning run the selected questions ask for, each once (:func:`analyses.finetune.run_protocol`,
    stored runs reused): the predictions table, or None when no question fine-tunes. A task that two questions
    declare must be the same task (the same examples, label and split)."""
    from analyses.finetune import merge_conditions, run_protocol

    tasks: dict = {}
    specs = []
    for q in _questions(cfg):
        for name, task in q.tasks(cfg, corpora).items():
            if name in tasks and tasks[name] != task:
                raise StudyError(f"{q.key} declares fine-tuning task {name!r} differently from another question")
            tasks[name] = task
        specs += q.runs(cfg)
    if not specs:
        return None
    log(f"fine-tuning: {len(merge_conditions(specs))} runs ({cfg.finetune.preset} preset)")
    return run_protocol(tasks, specs, model=lm, preset=cfg.finetune.preset, device=cfg.study.device, out=out,
                        split_seed=cfg.study.seed, log=log, progress=progress)


def analyse(cfg: StudyConfig, caches: Caches, corpora: dict, lm, log, stages: Stages | None = None,
            progress: bool = True) -> dict[str, pd.DataFrame]:
    """Every selected section's tables (a table two sections share is computed once, in the stage of the
    first section that asks for it), each written once to ``<out>/tables/<name>.csv`` (and ``.parquet``);
    the runners' own stores go to :func:`results_dir`. Each section's analyses are one stage of ``stages``."""
    from analyses.results import write_table

    stages = stages if stages is not None else Stages()
    ctx = Context(cfg=cfg, caches=caches, corpora=corpora, lm=lm, out=results_dir(cfg), log=log, progress=progress)
    T: dict[str, pd.DataFrame] = {}
    with stages.stage("fine-tuning"):
        predictions = finetune_all(cfg, corpora, lm, ctx.out, log, progress)
    if predictions is not None:
        T[FINETUNE_TABLE] = ctx.tables[FINETUNE_TABLE] = predictions
    selected = _selected(cfg)
    _analyse_in_workers(cfg, selected, ctx, stages)
    for i, s in enumerate(selected):
        ctx.later = tuple(t for later in selected[i + 1:] for t in later.tables)
        with stages.stage(f"analyses {s.key}"):
            if predictions is not None:  # the protocol's predictions, read by the question modules by that name
                ctx.tables[FINETUNE_TABLE] = predictions
            T.update(s.analyse(ctx))
            if isinstance(s, Question):
                T[decisions_table(s)] = decide(s.rows(T), s.rules)
    tables = _tables_dir(cfg)
    stale = [p for p in tables.glob("*") if _STORED.fullmatch(p.name)] if tables.is_dir() else []
    for p in stale:  # hash-named copies an older version stored beside the named tables
        p.unlink()
    if stale:
        log(f"removed {len(stale)} hash-named files from {tables} (the result store is now {ctx.out})")
    for name, df in T.items():
        write_table(df, tables / f"{name}.csv")
    return T


def _analyse_in_workers(cfg: StudyConfig, selected: list[StudySection], ctx: Context, stages: Stages) -> None:
    """On the CPU with more than one core (``study.threads``), the sections' analyses first run side by side in
    forked single-threaded workers that fill the result store (:mod:`probing.study.parallel`); the runner's pass
    over the sections then reads their tables back. Longest first, by this output's last stage table."""
    from ..models import pick_device
    from .parallel import WORKER_RSS, analyse_in_workers, can_fork, default_workers, previous_costs

    workers = cfg.study.threads or default_workers()
    if workers < 2 or len(selected) < 2 or not can_fork(pick_device(cfg.study.device).type):
        return
    costs = previous_costs(_tables_dir(cfg) / "stages.csv")
    ctx.log(f"analyses: {len(selected)} sections in up to {workers} worker processes")
    runs, row = analyse_in_workers(selected, ctx, workers, ctx.log, costs)
    stages.add(f"analyses, {workers} workers", **row)
    for run in runs:
        stages.add(run.stage, run.seconds, run.cpu_seconds, run.peak_rss_mb, WORKER_RSS)


def draw_figures(cfg: StudyConfig, T: dict[str, pd.DataFrame], log) -> dict[str, list[Path]]:
    """Each selected section's figures (PNG paths), by section key."""
    fig = Path(cfg.study.out) / "figures"
    return {s.key: s.figures(T, fig, log) for s in _selected(cfg)}


def run_limits(cfg: StudyConfig, corpora: dict, spec: StudySection, model_name: str) -> str:
    """What this run's numbers do not show, generated from the config: the corpora the section read
    and their sizes, quick mode, and for [CLS]/[SEP] claims what the model is."""
    from .model_facts import cls_caveat
    from .sections import corpus_sizes

    parts = []
    sizes = corpus_sizes(cfg, corpora, spec.corpora)
    if sizes:
        parts.append(f"Measured on {model_name} with {sizes}; another corpus or model may differ.")
    if cfg.quick:
        parts.append("Quick mode: small samples and few folds, so nulls here are expected and not evidence.")
    if spec.about_cls:
        caveat = cls_caveat(model_name)
        if caveat:
            parts.append(caveat)
    return " ".join(parts)


def question_section(q: Question, cfg: StudyConfig, T: dict, F: dict, corpora: dict, model_name: str):
    """A question's part of the report: its answer (from its decided rows), evidence, figures, the decided rows as
    a table, notes and this run's limits. A question whose tables this run did not produce says "not measured"."""
    from dataclasses import replace

    from .answers import not_measured
    from .report import QuestionSection
    from .rules import display

    decided = T.get(decisions_table(q))
    preset = "quick" if cfg.quick else cfg.finetune.preset
    try:
        answer = replace(q.answer(T, decided, cfg), preset=preset)
        evidence = q.evidence(T, decided, cfg)
    except KeyError as err:  # a table the question reads was not made in this run
        answer, evidence = not_measured(f"the table {err} is missing", preset), ""
    return QuestionSection(q.key, q.asked, q.title, q.anchor, answer, evidence, F.get(q.key, []),
                           display(decided, q.rules) if decided is not None else None, q.notes(cfg),
                           run_limits(cfg, corpora, q, model_name), q.background)


def build_report(cfg: StudyConfig, T: dict, F: dict, caches: Caches, corpora: dict, lm):
    """The report (:class:`probing.study.report.ReportDocument`): each question's answer (on the one page of
    answers), evidence, figures and decided rows; the other sections with their verdicts; how to read it; the
    provenance (all but the run's total time and its stage table, which :func:`run_study` adds)."""
    from .. import __version__
    from ..models import pick_device
    from .report import ReportDocument, Section, describe_intervals, machine, quick_notice
    from .rules import describe
    from .verdicts import describe_rules

    out = Path(cfg.study.out)
    questions, sections_ = [], []
    for spec in _selected(cfg):
        if isinstance(spec, Question):
            questions.append(question_section(spec, cfg, T, F, corpora, lm.name))
            continue
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

    first = next(iter(caches.paths.values()), None)  # None: the selected questions only fine-tune
    from ..cache import Cache

    manifest = Cache.open(first).manifest if first is not None else None
    skipped: dict[str, int] = {}
    for (c, _, _), p in caches.paths.items():
        skipped[c] = max(skipped.get(c, 0), len(Cache.open(p).manifest["skipped"]))
    provenance = {
        "command": " ".join(sys.argv) if sys.argv and sys.argv[0] else "run_study() from Python",
        "code": code_revision(),
        "model": f"{lm.name} (fingerprint {lm.fingerprint[:16]}…, {lm.n_layers} layers, hidden {lm.hidden_size})",
        "random-init baseline": (f"same architecture, seed {cfg.model.random_init_seed}"
                                 if cfg.model.random_init_baseline else "not run"),
        "corpora": "; ".join(f"{k}: {spec} ({len(corpora[k])} examples)" for k, spec in cfg.corpus.specs().items()
                             if k in corpora),
        "examples skipped as too long": skip_counts(skipped, T.get("finetune")),
        "caches": (f"{len(caches.paths)} under {Path(cfg.study.caches).resolve()} "
                   f"(e.g. {Path(first).name}, corpus fingerprint {manifest['corpus']['fingerprint'][:16]}…)"
                   if first is not None else "none (the selected questions read no hidden-state cache)"),
        "seed": cfg.study.seed,
        "bootstrap resamples": cfg.study.bootstrap_resamples,
        "device": f"{pick_device(cfg.study.device)} (study.device = {cfg.study.device!r})",
        "versions": f"probing {__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
                    f"numpy {np.__version__}, pandas {pd.__version__}, python {platform.python_version()}",
        "machine": machine(),
        "tables": str((out / "tables").resolve()),
    }
    title = cfg.study.title or f"What input formatting does to {lm.name}: the study '{cfg.study.name}'"
    if cfg.quick:
        title += " (quick mode)"
    rules = {f"{q.key}:{k}": r for q in _questions(cfg) for k, r in q.rules.items()}
    how = [describe(rules)] if rules else []
    how.append("Every number was computed by this run from the result tables in tables/. " + describe_intervals(T))
    legacy = [describe_rules()] if sections_ and any(not isinstance(s, Question) and s.key.startswith("Q")
                                                     for s in _selected(cfg)) else []
    return ReportDocument(title=title, model_line=model_line(lm.name),
                          notice=quick_notice(cfg, corpora, T) if cfg.quick else "", questions=questions,
                          sections=sections_, intro="\n\n".join(legacy), how_to_read="\n\n".join(how),
                          provenance=provenance)


def model_line(name: str) -> str:
    """What the model is, in one line, with how to run the study on another (a download or a local copy)."""
    from .model_facts import model_sentence

    return model_sentence(name)


def code_revision() -> str:
    """The toolkit's version and, in a git checkout, its commit (and whether the tree had changes)."""
    import subprocess

    from .. import __version__

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    if not commit:
        return f"probing {__version__} (not a git checkout)"
    return f"probing {__version__}, commit {commit}" + (" with uncommitted changes" if dirty else "")


def write_report(doc, out: Path) -> Path:
    """Write ``<out>/report.md`` and ``<out>/report.html``; returns the Markdown path."""
    from ..cache_writer import atomic_write
    from .report import render_html, render_markdown

    md = render_markdown(doc, out)
    html = render_html(doc)
    for name, text in (("report.md", md), ("report.html", html)):  # whole or not at all, under the umask
        atomic_write(out / name, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
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


def _run_time(seconds: float, started: float, caches: Caches, store: StoreUse, quick: bool) -> str:
    """This run's wall time, and how much of the work earlier runs had already done: caches complete before
    this run's start, and the result tables this run looked up and found stored (``store``: only tables whose
    key matched, never those an older version left under other keys)."""
    manifests = [Path(p) / "manifest.json" for p in caches.paths.values()]
    old_caches = sum(m.stat().st_mtime < started for m in manifests)
    s = f"{seconds:.0f} s" + (" (quick mode)" if quick else "")
    if manifests or store.asked:
        s += (f"; reused from earlier runs: {old_caches} of {len(manifests)} caches, {store.reused} of {store.asked} "
              "result tables")
    return s


def run_study(config: str | os.PathLike | None, *, quick: bool = False, force_analyses: bool = False,
              overrides: dict[str, Any] | None = None, trust_remote_code: bool = False, log=print,
              progress: bool = True) -> Path:
    """Run a whole study; returns the path of ``report.md``. ``config`` as :func:`load_config` takes it."""
    from analyses.results import recording_store_use

    t0, started = time.perf_counter(), time.time()
    plain_log = log
    log = lambda msg: plain_log(f"[{time.perf_counter() - t0:6.0f}s] {msg}")  # noqa: E731
    cfg = load_config(config, quick=quick, overrides=overrides, trust_remote_code=trust_remote_code)
    from ..models import pick_device

    pick_device(cfg.study.device)  # a device that is not here is refused before any work
    out = Path(cfg.study.out)
    if force_analyses:
        import shutil

        for d in (results_dir(cfg), _tables_dir(cfg)):
            if d.exists():
                shutil.rmtree(d)
    stages = Stages()
    log(f"study {cfg.study.name!r}{' (quick)' if quick else ''}: extracting")
    with stages.stage("extraction"):
        caches, corpora, lm = extract_all(cfg, log, progress)
    with recording_store_use() as store:
        T = analyse(cfg, caches, corpora, lm, log, stages, progress)
    log("drawing figures")
    with stages.stage("figures"):
        F = draw_figures(cfg, T, log)
    with stages.stage("report"):
        doc = build_report(cfg, T, F, caches, corpora, lm)
    total = time.perf_counter() - t0
    doc.provenance["run time"] = _run_time(total, started, caches, store, quick)
    doc.provenance["time and memory per stage"] = stages.summary()
    source = str(config_path(config)) if config is not None else "the defaults"
    doc.provenance.update(config_provenance(cfg, source, overrides))
    report = write_report(doc, out)
    write_resolved(cfg, out, source)
    write_stages(stages, out)
    write_answers(doc, out, lm.name)
    for line in stages.lines(total):
        log(line)
    log(f"run time {doc.provenance['run time']}")
    log(f"report: {report} (and {report.with_suffix('.html')}), {time.perf_counter() - t0:.0f} s")
    return report


def config_provenance(cfg: StudyConfig, source: str, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """The report's provenance of the config: where it came from (file, [quick], overrides) and every key's
    resolved value, as :func:`probing.study.config.write_resolved` writes them to ``config.resolved.toml``."""
    how = source + (" with its [quick] table" if cfg.quick else "")
    if overrides:
        how += "; overrides " + ", ".join(f"{k} = {v!r}" for k, v in overrides.items())
    return {"config": f"{how}; resolved in {RESOLVED}",
            "resolved config": "; ".join(resolved_lines(cfg))}


def write_stages(stages: Stages, out: Path) -> Path:
    """The stage table as ``<out>/tables/stages.csv`` (and Parquet), beside the result tables."""
    from analyses.results import write_table

    return write_table(stages.table(), out / "tables" / "stages.csv")


def write_answers(doc, out: Path, model: str) -> Path:
    """The report's answers as ``<out>/tables/answers.csv`` (one row per question), which a comparison of models
    reads (:mod:`probing.study.across`)."""
    from analyses.results import write_table

    from .across import ANSWERS, answers_table

    return write_table(answers_table(doc, model), out / "tables" / f"{ANSWERS}.csv")


def run_models(config: str | os.PathLike | None, models: Sequence[str], *, quick: bool = False,
               overrides: dict[str, Any] | None = None, log=print, **kw: Any) -> Path:
    """The study once per model, each into ``<out>/<model>/`` (:func:`probing.study.across.unique_slugs`), then
    which answers hold on every model (:func:`probing.study.across.write_comparison`); returns ``models.md``."""
    from .across import unique_slugs, write_comparison

    if len(models) < 2 or len(set(models)) != len(models):
        raise StudyError(f"--model: comparing models needs at least two different ones, got {list(models)}")
    base = dict(overrides or {})
    cfg = load_config(config, quick=quick, overrides=base, trust_remote_code=kw.get("trust_remote_code", False))
    out = Path(cfg.study.out)
    runs = {}
    for name, slug in zip(models, unique_slugs(models)):
        log(f"model {name} -> {out / slug}")
        run_study(config, quick=quick, overrides={**base, "model.name": name, "study.out": str(out / slug)}, log=log,
                  **kw)
        runs[name] = out / slug
    path = write_comparison(runs, out)
    log(f"which answers hold on every model: {path}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    from ..cli import ArgumentParser, check_output_dir, int_at_least

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
    p.add_argument("--model", action="append", default=None,
                   help="override [model] name (a Hugging Face id or local path); given several times, the study runs "
                        "once per model into <out>/<model>/ and <out>/models.md says which answers hold on every one")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model's own code to run (off by default; a config cannot switch it on)")
    p.add_argument("--out", default=None, help="override [study] out")
    p.add_argument("--caches", default=None, help="override [study] caches")
    p.add_argument("--questions", default=None, help="comma list, e.g. Q1,Q4 (default: the config's)")
    p.add_argument("--device", default=None,
                   help="override [study] device, the one device of extraction, probes and fine-tuning: 'auto' "
                        "(CUDA if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument("--threads", type=int_at_least(1), default=None,
                   help="override [study] threads: CPU: the questions' analyses run side by side in this many "
                        "single-threaded worker processes (default: one per core; 1: one after another)")
    p.add_argument("--force", action="store_true", help="recompute the analyses (caches are still reused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (the stage log lines stay)")
    args = p.parse_args(argv)
    overrides: dict[str, Any] = {}
    models = [m for m in dict.fromkeys(args.model or []) if m]  # an empty --model is no override
    if len(models) == 1:
        overrides["model.name"] = models[0]
    if args.out:
        overrides["study.out"] = args.out
    if args.caches:
        overrides["study.caches"] = args.caches
    if args.questions:
        overrides["study.questions"] = [q.strip() for q in args.questions.split(",")]
    if args.device is not None:
        overrides["study.device"] = args.device
    if args.threads is not None:
        overrides["study.threads"] = args.threads
    from ..cache import CacheError
    from ..models import ModelLoadError

    try:
        cfg = load_config(args.config, quick=args.quick, overrides=overrides, trust_remote_code=args.trust_remote_code)
        check_output_dir(cfg.study.out, "--out (study.out)")
        check_output_dir(cfg.study.caches, "--caches (study.caches)")
        if len(models) > 1:
            run_models(args.config, models, quick=args.quick, force_analyses=args.force, overrides=overrides,
                       trust_remote_code=args.trust_remote_code, progress=not args.no_progress)
        else:
            run_study(args.config, quick=args.quick, force_analyses=args.force, overrides=overrides,
                      trust_remote_code=args.trust_remote_code, progress=not args.no_progress)
    except (StudyError, ModelLoadError, CacheError, ValueError, ImportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
