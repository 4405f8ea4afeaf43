"""What one question of a study is, as data: :class:`Question`.

A question module (``q1.py`` ... ``q8.py``) declares one :class:`Question`: the asker's words, the corpora and
caches it needs, the fine-tuning runs it asks of the shared protocol (:mod:`analyses.finetune_protocol`), its
analyses, the comparison rows its answer is decided from and the rules that decide them
(:mod:`probing.study.rules`), its plain answer (:mod:`probing.study.answers`), its evidence, figures and notes.
The runner (:mod:`probing.study.runner`) does the rest: corpora, caches and fine-tuning runs shared between
questions are made once; each question's rows are decided by its rules; the answers open the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from ..answers import Answer
from ..rules import Rule
from ..sections import Context, Job

Tables = dict[str, pd.DataFrame]
Corpora = dict[str, list]


def _none(*args: Any) -> list:
    return []


def _no_corpora(cfg: Any, corpora: Corpora) -> Corpora:
    return {}


@dataclass(frozen=True)
class Question:
    """One question (module docstring).

    - ``key`` (``"Q1"``), ``asked`` (the question as the thread put it, one line), ``title`` (for the contents).
    - ``corpora``: keys of the config's ``[corpus]`` table it reads; ``derive(cfg, corpora) -> {name: examples}``:
      corpora it makes from them (two words swapped, sentence 2 replaced, ...), available to every question.
    - ``jobs(cfg, corpora) -> [Job]``: the caches it needs.
    - ``tasks(cfg, corpora) -> {name: ProtocolTask}`` and ``runs(cfg) -> [RunSpec]``: the fine-tuning it asks of the
      shared protocol (a task of the same name must be the same task in every question that declares it).
    - ``analyse(ctx) -> {table: DataFrame}``: its tables; the protocol's predictions are
      ``ctx.tables["finetune_predictions"]``.
    - ``rows(T) -> DataFrame``: the comparison rows (``measure``, ``family``, ``value``, ``se``, ``label`` and a
      facet column where there are several), decided by ``rules`` (measure -> :class:`Rule`).
    - ``answer(T, decided, cfg) -> Answer``: the plain answer; ``evidence(T, decided, cfg) -> str``: markdown.
    - ``figures(T, fig_dir, log) -> [png]``; ``notes(cfg) -> str``: how it was measured, what it does not show.
    - ``tables``: the names of the tables ``analyse`` returns (shared tables are computed once, through
      :meth:`probing.study.sections.Context.table`).
    - ``about_cls``: its findings are about [CLS]/[SEP], so the report repeats what the model is.
    - ``background``: a sentence of context that is not measured (e.g. Q6's mechanical reason).
    """

    key: str
    asked: str
    title: str
    corpora: tuple[str, ...]
    jobs: Callable[[Any, Corpora], list[Job]]
    analyse: Callable[[Context], Tables]
    rules: Mapping[str, Rule]
    rows: Callable[[Tables], pd.DataFrame]
    answer: Callable[[Tables, pd.DataFrame, Any], Answer]
    evidence: Callable[[Tables, pd.DataFrame, Any], str]
    figures: Callable[[Tables, Path, Callable], list[Path]] = _none
    notes: Callable[[Any], str] = lambda cfg: ""
    derive: Callable[[Any, Corpora], Corpora] = _no_corpora
    tasks: Callable[[Any, Corpora], dict] = lambda cfg, corpora: {}
    runs: Callable[[Any], list] = lambda cfg: []
    tables: tuple[str, ...] = ()
    about_cls: bool = False
    background: str = ""

    @property
    def anchor(self) -> str:
        """The report anchor of the question's evidence."""
        return self.key.lower()
