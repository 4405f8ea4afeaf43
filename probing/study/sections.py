"""A study section declared as data: the seed questions Q1-Q8 (:mod:`probing.study.questions`) and the
paper reproductions (:mod:`probing.study.reproductions`) are all :class:`StudySection` objects, run by the
one runner of :mod:`probing.study`.

A section names the corpora it reads (keys of the config's ``[corpus]`` table), the caches it needs
(:class:`Job`), its analyses (tidy tables, computed once per study through :meth:`Context.table` and
shared between sections), its figures, its report table, its evidence sentence, its comparison rows
and the :class:`probing.study.verdicts.Claim` they test (the verdict is a function of those rows), and its
notes. Nothing else is needed to add a section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from ..examples import Example
from .verdicts import Claim, Verdict, summarise

Tables = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Job:
    """One cache a section needs: ``format`` is a built-in name or ``name=TEMPLATE``; ``intervention``
    names an intervention of :data:`probing.study.shared.INTERVENTIONS` applied at extraction (the cache
    is then known as ``<format>@<intervention>``); ``attention_norm``: also the norm-based attention summary
    (``extract(..., attention_norm=True)``, which implies ``attention``)."""

    corpus: str
    format: str
    random: bool = False
    attention: bool = False
    intervention: str = ""
    attention_norm: bool = False

    @property
    def format_name(self) -> str:
        return self.format.split("=", 1)[0].strip()

    @property
    def name(self) -> str:
        return f"{self.format_name}@{self.intervention}" if self.intervention else self.format_name


@dataclass
class Context:
    """What a section's analyses read: the config, caches, corpora, trained model, the tables
    directory, a log, and the tables computed so far (shared between sections)."""

    cfg: Any  # the typed study config, probing.study.config.StudyConfig
    caches: Any
    corpora: dict[str, list[Example]]
    lm: Any
    out: Path
    log: Callable[[str], None] = print
    tables: Tables = field(default_factory=dict)
    progress: bool = True  # progress bars of the analyses (the study's --no-progress turns them off)
    later: tuple[str, ...] = ()  # the tables the sections after the running one ask for (the study runner sets it)

    @property
    def questions(self) -> list[str]:
        return list(self.cfg.study.questions)

    def table(self, name: str, produce: Callable[["Context"], pd.DataFrame]) -> pd.DataFrame:
        """The study's table ``name``, computed by ``produce(self)`` the first time a section asks."""
        if name not in self.tables:
            self.tables[name] = produce(self)
        return self.tables[name]


def _no_table(T: Tables) -> None:
    return None


@dataclass(frozen=True)
class StudySection:
    """One section of a study (a question or a paper reproduction).

    - ``corpora``: config corpus keys it reads; ``jobs(cfg, corpora)``: the caches it needs.
    - ``analyse(ctx) -> {table name: table}``: its tables (through ``ctx.table`` where shared).
    - ``figures(T, fig_dir, log) -> [png paths]``; ``table(T) -> (table, caption) | None``.
    - ``answer(T) -> str``: the evidence, numbers read from the tables.
    - ``comparisons(T) -> rows | None`` and ``claim``: the verdict's input (:mod:`probing.study.verdicts`);
      ``verdict_text(T)`` overrides it for sections whose verdict is not a comparison.
    - ``parts``: a question answered in several parts, each ``(what, comparisons, claim)``: the verdict is
      one sentence per part ("what — verdict"), decided by the same rules, and the report table holds
      every part's rows; ``comparisons``/``claim`` are then not used.
    - ``notes``: how it was measured and what it does not show (text, or a function of the config).
    - ``about_cls``: the section makes claims about [CLS]/[SEP], so the model caveat is repeated there.
    """

    key: str
    title: str
    corpora: tuple[str, ...]
    jobs: Callable[[Any, dict], list[Job]]  # (the study config, the corpora)
    analyse: Callable[[Context], Tables]
    figures: Callable[[Tables, Path, Callable], list[Path]]
    answer: Callable[[Tables], str]
    notes: str | Callable[[Any], str] = ""
    table: Callable[[Tables], tuple[pd.DataFrame, str] | None] = _no_table
    comparisons: Callable[[Tables], pd.DataFrame | None] | None = None
    claim: Claim | None = None
    verdict_text: Callable[[Tables, Any], str] | None = None
    citation: str = ""
    about_cls: bool = False
    tables: tuple[str, ...] = ()  # the shared tables ``analyse`` computes, where declared (the questions)
    parts: tuple[tuple[str, Callable[[Tables], pd.DataFrame | None], Claim], ...] = ()

    def verdict(self, T: Tables, cfg: Any) -> Verdict | None:
        """The section's opening sentence: from its comparison rows and claim (or ``verdict_text``, or one
        sentence per part)."""
        if self.parts:
            verdicts = [(what, summarise(rows(T), claim)) for what, rows, claim in self.parts]
            decided = [v for _, v in verdicts if v.decision != "not_measured"]
            return Verdict(decided[0].decision if decided else "not_measured",
                           " ".join(f"{what} — {v.sentence}" for what, v in verdicts),
                           short="; ".join(f"{what} — {v.short}" for what, v in verdicts))
        if self.verdict_text is not None:
            text = self.verdict_text(T, cfg)
            return Verdict("yes", text) if text else None
        if self.comparisons is None or self.claim is None:
            return None
        return summarise(self.comparisons(T), self.claim)

    def comparison_table(self, T: Tables) -> tuple[pd.DataFrame, str] | None:
        """The comparison rows behind the verdict as the report prints them, with a caption."""
        from .verdicts import verdict_table

        if self.parts:
            tables, captions, families = [], [], []
            for what, rows_of, claim in self.parts:
                rows = rows_of(T)
                if rows is None or len(rows) == 0:
                    continue
                tables.append(verdict_table(rows, claim).astype(object).assign(part=what))  # object: ints stay ints
                captions.append(f"{what}: {claim.quantity}")
                if "family" in rows.columns and rows["family"].notna().any():
                    lead = what if what.startswith("[") else what[:1].lower() + what[1:]  # "[CLS]" stays as it is
                    families.append(f"{lead}: {rows['family'].dropna().iloc[0]}")
            if not tables:
                return None
            table = pd.concat(tables, ignore_index=True)
            facets = list(dict.fromkeys(claim.facet[0] for _, _, claim in self.parts))
            first = ["part"] + facets
            table = table[[c for c in first if c in table.columns] + [c for c in table.columns if c not in first]]
            table = table.fillna("–")
            caption = "; ".join(captions) + f"; per {' or '.join(facets)}, each row decided by the rules above"
            return table, caption + (f"; multiple comparisons: {'; '.join(families)}" if families else "")
        rows = self.comparisons(T) if self.comparisons is not None and self.claim is not None else None
        if rows is None or len(rows) == 0:
            return None
        caption = f"{self.claim.quantity}, per {self.claim.facet[0]}; each row decided by the rules above"
        if "family" in rows.columns and rows["family"].notna().any():
            caption += f"; multiple comparisons: {rows['family'].dropna().iloc[0]}"
        if "provisional" in rows.columns and rows["provisional"].fillna(False).astype(bool).any():
            caption += (" (provisional: from two marginal intervals treated as independent, not yet a paired "
                        "comparison)")
        return verdict_table(rows, self.claim), caption

    def note_text(self, cfg: Any) -> str:
        text = self.notes(cfg) if callable(self.notes) else self.notes
        return f"{text} Reference: {self.citation}." if self.citation else text


def safe_plot(fn, *args, log=print, **kwargs) -> list[Path]:
    """Draw one figure; one that cannot be drawn from the tables is logged, not fatal."""
    try:
        return [p for p in fn(*args, **kwargs) if str(p).endswith(".png")]
    except (ValueError, KeyError) as err:
        log(f"figure skipped ({getattr(fn, '__name__', fn)}): {err}")
        return []


def prefix(examples: Sequence[Example], k: int) -> list[Example]:
    """The first ``k`` sentences of each example (Q3's k-segment inputs from the same groups)."""
    return [Example(e.id, e.sentences[:k], e.labels) for e in examples]


def group_prefixes(corpora: dict) -> dict[int, str]:
    """``{k: corpus key}`` of the ``groups_k<k>`` prefixes the study made, in order of k."""
    ks = {int(c.rsplit("k", 1)[1]): c for c in corpora if c.startswith("groups_k")}
    return dict(sorted(ks.items()))


# ---------------------------------------------------------------------------------------------------
# Protocol text generated from the config

#: What each corpus kind's text is, for protocol sentences ("sentences" is appended by the caller).
CORPUS_TEXT = {"generated": "generated template", "bbc": "BBC News", "ptb": "Penn Treebank"}


def corpus_text(spec: str) -> str:
    """What a corpus spec's sentences are: ``'BBC News'``, ``'generated template'``, ``'data.csv'``.

    >>> corpus_text("generated:n=120,k=2")
    'generated template'
    """
    from ..corpora import parse_corpus_spec

    name, kwargs, _ = parse_corpus_spec(spec)
    if name == "file":
        return Path(str(kwargs.get("path", "file"))).name
    return CORPUS_TEXT.get(name, name)


def corpus_sizes(cfg, corpora: dict, keys: Sequence[str]) -> str:
    """``'pairs: 120 examples of generated template sentences (generated:n=120,k=2)'`` for each key."""
    parts = []
    for k in keys:
        spec = cfg.corpus.specs().get(k)
        if k in corpora and spec is not None:
            parts.append(f"{k}: {len(corpora[k])} examples of {corpus_text(spec)} sentences ({spec})")
    return "; ".join(parts)
