"""The study report: one section per question, each opening with a sentence generated from the
numbers of that run's tables, then its figures and a table, then what the measurement does and does
not show; provenance at the end. Written as Markdown and as HTML with the figures inline."""

from __future__ import annotations

import base64
import html
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .stages import StageSummary
from .verdicts import format_interval


# ---------------------------------------------------------------------------------------------------
# Reading numbers out of tidy tables


def pick(df: pd.DataFrame | None, **where: Any) -> pd.DataFrame:
    if df is None or df.empty:
        return pd.DataFrame()
    m = np.ones(len(df), dtype=bool)
    for k, v in where.items():
        if k not in df.columns:
            return df.iloc[0:0]
        m &= (df[k] == v).fillna(False).to_numpy(dtype=bool)  # a missing value (nullable Int64) matches nothing
    return df[m]


def one(df: pd.DataFrame | None, **where: Any) -> tuple[float, float, float] | None:
    """``(value, ci_low, ci_high)`` of the single row matching ``where`` (None if there is none)."""
    r = pick(df, **where)
    if r.empty:
        return None
    r = r.iloc[0]
    num = lambda v: float("nan") if v is None or pd.isna(v) else float(v)  # noqa: E731
    return num(r["value"]), num(r["ci_low"]), num(r["ci_high"])


def fmt(v: tuple[float, float, float] | float | None, digits: int = 3) -> str:
    """``0.123 (95% CI 0.110 to 0.131)``, with more decimals where fewer would print equal bounds
    (:func:`probing.study.verdicts.format_interval`); ``n/a`` for missing values; NaN says undefined."""
    if v is None:
        return "n/a"
    if isinstance(v, tuple):
        return format_interval(*v)
    return "undefined" if math.isnan(v) else f"{v:.{digits}f}"


def last_layer(df: pd.DataFrame) -> int:
    return int(pd.to_numeric(df["layer"]).max())


# ---------------------------------------------------------------------------------------------------
# Document model, rendered to Markdown and HTML


@dataclass
class Section:
    """One rendered section: the verdict sentence, the evidence, figures, a table, notes, and the
    generated account of this run's limits (corpus, sizes, model, quick mode)."""

    title: str
    answer: str = ""
    figures: list[Path] = field(default_factory=list)
    table: pd.DataFrame | None = None
    table_caption: str = ""
    notes: str = ""
    verdict: str = ""
    limits: str = ""
    comparison: pd.DataFrame | None = None
    comparison_caption: str = ""
    glance: str = ""  # the verdict without its numbers, for the answers at a glance


@dataclass
class QuestionSection:
    """One question of the report: the asker's words, the plain answer, then (collapsible in HTML) the evidence
    (markdown), figures, the decided comparison rows, background and notes, and this run's limits."""

    key: str
    asked: str
    title: str
    anchor: str
    answer: Any  # probing.study.answers.Answer
    evidence: str = ""
    figures: list[Path] = field(default_factory=list)
    rows: pd.DataFrame | None = None
    notes: str = ""
    limits: str = ""
    background: str = ""


@dataclass
class ReportDocument:
    """A report before it is written: the title, the model in a line, the quick-mode notice, the questions
    (answered first, on one page), the other sections (paper reproductions, and questions not yet answered by
    a question module), how to read the report, and the provenance."""

    title: str
    model_line: str
    notice: str = ""
    questions: list[QuestionSection] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    intro: str = ""  # the other sections' introduction (their interval and rule paragraphs)
    how_to_read: str = ""
    provenance: dict = field(default_factory=dict)


#: The heading of the list of every section's verdict without its numbers, after the introduction.
GLANCE = "Answers at a glance"
GLANCE_NOTE = "Each section below gives the numbers, the evidence and what the answer does not show."


def _md_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("–" if math.isnan(v) else f"{v:.3f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def glance_sections(sections: list[Section]) -> list[Section]:
    """The sections the answers at a glance list: those with a short verdict, where there are at least two
    (a report of one section would repeat its answer)."""
    glance = [s for s in sections if s.glance]
    return glance if len(glance) > 1 else []


def _sections_markdown(intro: str, sections: list[Section], out: Path) -> list[str]:
    parts = [intro, ""] if intro else []
    glance = glance_sections(sections)
    if glance:
        parts += [f"## {GLANCE}", "", f"*{GLANCE_NOTE}*", ""]
        parts += [f"- **{s.title}** {s.glance}." for s in glance] + [""]
    for s in sections:
        parts += [f"## {s.title}", ""]
        if s.verdict:
            parts += [f"**Answer.** {s.verdict}", "", f"**Evidence.** {s.answer}", ""]
        else:
            parts += [f"**Answer.** {s.answer}", ""]
        for f in s.figures:
            parts += [f"![{f.stem}]({f.relative_to(out).as_posix()})", ""]
        if s.table is not None and not s.table.empty:
            if s.table_caption:
                parts += [f"*{s.table_caption}*", ""]
            parts += [_md_table(s.table), ""]
        if s.comparison is not None and not s.comparison.empty:
            parts += [f"*{s.comparison_caption}*", "", _md_table(s.comparison), ""]
        if s.notes or s.limits:
            parts += [f"**What this shows and does not show.** {' '.join(t for t in (s.notes, s.limits) if t)}", ""]
    return parts


def _provenance_markdown(provenance: dict) -> list[str]:
    parts = ["## Provenance", ""]
    for k, v in provenance.items():
        if isinstance(v, StageSummary):
            parts += ["", f"**{k}** (peak RSS: {v.methods}; also in tables/stages.csv):", "",
                      _md_table(v.display()), ""]
        else:
            parts.append(f"- **{k}**: {v}")
    return parts


def _question_markdown(q: QuestionSection, out: Path) -> list[str]:
    parts = [f'<a id="{q.anchor}"></a>', "", f"## {q.key}. {q.asked}", "", f"**Answer.** {q.answer.line()}", ""]
    if q.background:
        parts += [f"*Background.* {q.background}", ""]
    if q.evidence:
        parts += ["### Evidence", "", q.evidence, ""]
    for f in q.figures:
        parts += [f"![{f.stem}]({f.relative_to(out).as_posix()})", ""]
    if q.rows is not None and not q.rows.empty:
        parts += ["*The comparisons behind the answer, each decided by the rules of "
                  "[How to read this report](#how-to-read):*", "", _md_table(q.rows), ""]
    if q.notes or q.limits:
        parts += ["### What this shows and does not show", "", " ".join(t for t in (q.notes, q.limits) if t), ""]
    return parts


def render_markdown(doc: ReportDocument, out: Path) -> str:
    """The report as Markdown: the answers first (one page), then each question's evidence, the other sections,
    how to read the report, and the provenance."""
    from .answers import PageItem, answer_page

    parts = [f"# {doc.title}", ""]
    if doc.notice:
        parts += [f"**{doc.notice}**", ""]
    if doc.questions:
        items = [PageItem(q.key, q.asked, q.answer, q.anchor) for q in doc.questions]
        parts += [answer_page(doc.model_line, items), ""]
    else:
        parts += [doc.model_line, ""]
    for q in doc.questions:
        parts += _question_markdown(q, out)
    if doc.sections:
        parts += _sections_markdown(doc.intro, doc.sections, out)
    if doc.how_to_read:
        parts += ['<a id="how-to-read"></a>', "", "## How to read this report", "", doc.how_to_read, ""]
    parts += _provenance_markdown(doc.provenance)
    return "\n".join(parts) + "\n"


#: CSS pixels per inch: a figure's natural display width is its width in inches times this.
CSS_PX_PER_INCH = 96


def _inline(text: str) -> str:
    """Plain report text -> HTML: escaped, with Markdown code spans (`` `concat` ``) as ``<code>``.

    >>> _inline("format `concat` < `pair`")
    'format <code>concat</code> &lt; <code>pair</code>'
    """
    parts = html.escape(text, quote=False).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick is text, not a code span
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _html_table(df: pd.DataFrame, float_format=None) -> str:
    """A table as HTML with one header row of column names: an index that carries information becomes
    ordinary columns first, and the index itself is never written (no empty corner cell)."""
    if not isinstance(df.index, pd.RangeIndex) or any(n is not None for n in df.index.names):
        df = df.reset_index()
    if isinstance(df.columns, pd.MultiIndex):
        df = df.set_axis([" ".join(str(x) for x in c if str(x)) for c in df.columns], axis=1)
    df = df.rename_axis(columns=None)
    kw = {"float_format": float_format} if float_format is not None else {}
    return df.to_html(index=False, na_rep="–", border=0, escape=True, **kw)


def figure_info(path: Path) -> tuple[str, int | None]:
    """``(title, natural width in CSS pixels)`` of a PNG figure: the title the figure stored in its PNG
    metadata (:func:`figures.style.save`; ``""`` if none) and its pixel width scaled from the PNG's
    dots per inch to :data:`CSS_PX_PER_INCH` (None if the PNG gives no resolution)."""
    from PIL import Image

    with Image.open(path) as im:
        title = str(im.info.get("Title", "")).strip()
        dpi = im.info.get("dpi")
        width = round(im.width * CSS_PX_PER_INCH / float(dpi[0])) if dpi and float(dpi[0]) > 0 else None
    return title, width


def _figure_html(path: Path, fallback: str) -> str:
    """One inline figure at its natural width (never wider than the page: ``max-width:100%``),
    captioned by its own title, else by ``fallback``."""
    title, width = figure_info(path)
    caption = " ".join(title.split()) or fallback
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    size = f' width="{width}"' if width else ""
    return (f'<figure><img alt="{html.escape(caption)}"{size} src="data:image/png;base64,{data}">'
            f"<figcaption>{_inline(caption)}</figcaption></figure>")


def _md_html(text: str) -> str:
    """Report markdown (paragraphs, lists, tables, code spans, links) as HTML (python-markdown)."""
    import markdown

    return markdown.markdown(text, extensions=["tables"], output_format="html")


def _sections_html(intro: str, sections: list[Section]) -> list[str]:
    e = _inline
    body = [f"<p>{e(p)}</p>" for p in intro.split("\n\n")] if intro else []
    glance = glance_sections(sections)
    if glance:
        body += [f"<h2>{e(GLANCE)}</h2>", f"<p><i>{e(GLANCE_NOTE)}</i></p>", "<ul>"]
        body += [f"<li><b>{e(s.title)}</b> {e(s.glance)}.</li>" for s in glance] + ["</ul>"]
    for s in sections:
        body.append(f'<h2 id="{_slug(s.title)}">{e(s.title)}</h2>')
        if s.verdict:
            body += [f"<p><b>Answer.</b> {e(s.verdict)}</p>", f"<p><b>Evidence.</b> {e(s.answer)}</p>"]
        else:
            body.append(f"<p><b>Answer.</b> {e(s.answer)}</p>")
        n = len(s.figures)
        for i, f in enumerate(s.figures, 1):
            body.append(_figure_html(f, f"{s.title}: figure {i} of {n}" if n > 1 else s.title))
        if s.table is not None and not s.table.empty:
            if s.table_caption:
                body.append(f"<p><i>{e(s.table_caption)}</i></p>")
            body.append(_html_table(s.table, float_format=lambda v: f"{v:.3f}"))
        if s.comparison is not None and not s.comparison.empty:
            body += [f"<p><i>{e(s.comparison_caption)}</i></p>", _html_table(s.comparison)]
        if s.notes or s.limits:
            text = " ".join(t for t in (s.notes, s.limits) if t)
            body.append(f"<p><b>What this shows and does not show.</b> {e(text)}</p>")
    return body


def _slug(title: str) -> str:
    """An HTML anchor for a section title: lower-case words joined by hyphens.

    >>> _slug("Jawahar et al. 2019: what BERT's layers hold")
    'jawahar-et-al-2019-what-bert-s-layers-hold'
    """
    import re

    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))


def _question_html(q: QuestionSection) -> list[str]:
    from .answers import CONFIDENCE_WORDS

    e = _inline
    body = [f'<section id="{q.anchor}"><h2>{e(q.key)}. {e(q.asked)}</h2>',
            f'<p class="answer"><b>Answer.</b> {_md_html(q.answer.text).removeprefix("<p>").removesuffix("</p>")} '
            f"<i>({e(CONFIDENCE_WORDS[q.answer.confidence])})</i></p>"]
    if q.background:
        body.append(f"<p><i>Background.</i> {e(q.background)}</p>")
    inner = []
    if q.evidence:
        inner.append(_md_html(q.evidence))
    n = len(q.figures)
    for i, f in enumerate(q.figures, 1):
        inner.append(_figure_html(f, f"{q.key}: figure {i} of {n}" if n > 1 else q.key))
    if q.rows is not None and not q.rows.empty:
        inner += ['<p><i>The comparisons behind the answer, each decided by the rules of '
                  '<a href="#how-to-read">How to read this report</a>:</i></p>', _html_table(q.rows)]
    if q.notes or q.limits:
        inner += ["<h3>What this shows and does not show</h3>", _md_html(" ".join(t for t in (q.notes, q.limits) if t))]
    body += [f"<details><summary>Evidence, figures and notes for {e(q.key)}</summary>", *inner, "</details>",
             "</section>"]
    return body


def render_html(doc: ReportDocument) -> str:
    """The report as one HTML page: a table of contents, the answers first, each question with an anchor and its
    evidence collapsible, the other sections, how to read the report, the provenance; figures inline."""
    from .answers import CONFIDENCE_WORDS

    e = _inline
    body = [f"<h1>{e(doc.title)}</h1>"]
    if doc.notice:
        body.append(f'<p class="notice"><b>{e(doc.notice)}</b></p>')
    toc = [f'<li><a href="#{q.anchor}">{e(q.key)}. {e(q.title)}</a></li>' for q in doc.questions]
    toc += [f'<li><a href="#{_slug(s.title)}">{e(s.title)}</a></li>' for s in doc.sections]
    toc += ['<li><a href="#how-to-read">How to read this report</a></li>' if doc.how_to_read else "",
            '<li><a href="#provenance">Provenance</a></li>']
    body += ['<nav><h2>Contents</h2><ol>', *[t for t in toc if t], "</ol></nav>"]
    if doc.questions:
        body += ['<section id="answers"><h2>Answers</h2>', f"<p>{_md_html(doc.model_line)}</p>", "<dl>"]
        for q in doc.questions:
            body += [f'<dt><a href="#{q.anchor}">{e(q.key)}. {e(q.asked)}</a></dt>',
                     f"<dd>{_md_html(q.answer.text).removeprefix('<p>').removesuffix('</p>')} "
                     f"<i>({e(CONFIDENCE_WORDS[q.answer.confidence])})</i></dd>"]
        body += ["</dl></section>"]
    else:
        body.append(f"<p>{e(doc.model_line)}</p>")
    for q in doc.questions:
        body += _question_html(q)
    body += _sections_html(doc.intro, doc.sections)
    if doc.how_to_read:
        body += ['<section id="how-to-read"><h2>How to read this report</h2>', _md_html(doc.how_to_read), "</section>"]
    body += ['<section id="provenance"><h2>Provenance</h2><ul>']
    for k, v in doc.provenance.items():
        if isinstance(v, StageSummary):
            body += [f"</ul><p><b>{e(k)}</b> (peak RSS: {e(v.methods)}; also in tables/stages.csv):</p>",
                     _html_table(v.display()), "<ul>"]
        else:
            body.append(f"<li><b>{e(k)}</b>: {e(str(v))}</li>")
    body.append("</ul></section>")
    # text at a readable measure, figures up to the wider page (each at its natural width, never shrunk below it
    # except to fit the window)
    style = ("body{font-family:sans-serif;max-width:75em;margin:2em auto;padding:0 1em;line-height:1.45}"
             "p,ul,ol,dl,h1,h2,h3{max-width:60em}figure{margin:1em 0}img{max-width:100%;height:auto}"
             "figcaption{font-size:90%;color:#444}code{font-size:95%;background:#f3f3f3;padding:0 2px}"
             "table{border-collapse:collapse;font-size:90%}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
             "text-align:left}dt{font-weight:bold;margin-top:.8em}dd{margin-left:1.5em}"
             "details{margin:.5em 0 1.5em}summary{cursor:pointer;color:#245}nav ol{columns:2}"
             ".notice{background:#fff4d6;padding:.5em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(doc.title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


# ---------------------------------------------------------------------------------------------------
# The introduction, generated from the run's tables and config

#: How each analysis computes its CIs when its table has no ``grouping`` column (the analyses' own
#: docstrings are the source); ``{unit}`` is filled from the ``grouping`` column where there is one.
CI_METHODS = {
    "drift": "cluster bootstrap over {unit}",
    "attention": "cluster bootstrap over {unit}",
    "cka": "bootstrap over {unit}",
    "contextuality": "bootstrap over word types (self-similarity, MEV) or {unit} (intra-sentence similarity)",
    "knn": "bootstrap over {unit}",
    "knn_comparison": "cluster bootstrap of paired per-example differences over {unit}, sign-flip p-values",
    "probe": "cluster bootstrap of the out-of-fold predictions over {unit} (macro AUC: of the out-of-fold scores)",
    "probe_comparison": "cluster bootstrap of paired out-of-fold differences over {unit}, sign-flip p-values",
    "paired_drift": "cluster bootstrap of paired per-item differences over {unit}, sign-flip p-values",
    "role_contrast": "cluster bootstrap of paired per-example differences over {unit}, sign-flip p-values",
    "prefix_drift": "cluster bootstrap of paired per-token differences over {unit}, sign-flip p-values",
    "finetune_pooling": "cluster bootstrap of the out-of-fold test predictions over {unit}",
    "intervention_drift": "cluster bootstrap over documents (examples when the corpus has none)",
    "intervention_probes": "cluster bootstrap over documents (examples when the corpus has none)",
    "intervention_patching": "cluster bootstrap over documents (examples when the corpus has none)",
}
#: The unit an analysis groups by when its table does not say.
DEFAULT_UNIT = "example"


def describe_intervals(tables: dict[str, pd.DataFrame]) -> str:
    """One sentence on how this run's CIs were computed, per analysis present in ``tables``: the unit
    comes from each table's ``grouping`` column where it has one (e.g. ``document``), else
    :data:`DEFAULT_UNIT`; the bootstrap's resamples from the tables' ``n_resamples`` column.

    >>> t = pd.DataFrame({"analysis": ["probe"], "grouping": ["document"], "ci_low": [0.4], "ci_high": [0.6],
    ...                   "n_resamples": [200]})
    >>> describe_intervals({"p": t})[:68]
    'CIs are 95% (200 bootstrap resamples): probe: cluster bootstrap of t'
    """
    methods: dict[str, set[str]] = {}
    with_ci: set[str] = set()
    over_seeds: set[str] = set()  # analyses whose CIs also resample training seeds (``ci_seeds``)
    resamples: set[int] = set()
    for df in tables.values():
        if df is None or df.empty or "analysis" not in df.columns:
            continue
        if "n_resamples" in df.columns:
            resamples.update(int(n) for n in df["n_resamples"].dropna())
        units = (sorted(set(df["grouping"].dropna().astype(str))) if "grouping" in df.columns else []) or [DEFAULT_UNIT]
        for analysis in df["analysis"].dropna().unique():
            methods.setdefault(str(analysis), set()).update(units)
            rows = df[df["analysis"] == analysis]
            if {"ci_low", "ci_high"} <= set(df.columns) and (rows["ci_low"].notna() & rows["ci_high"].notna()).any():
                with_ci.add(str(analysis))
            if "ci_seeds" in df.columns and rows["ci_seeds"].notna().any():
                over_seeds.add(str(analysis))
    parts = []
    for analysis, units in methods.items():
        how = CI_METHODS.get(analysis, "bootstrap over {unit}")
        if analysis not in with_ci and analysis in CI_METHODS and "no CI" not in how:
            how = "point values (no CI)"
        elif analysis in over_seeds:
            how += " and, for the fine-tuned rows, over the training seeds first (a two-stage bootstrap)"
        parts.append(f"{analysis}: " + how.format(unit=" or ".join(f"{u}s" for u in sorted(units))))
    counts = f" ({' or '.join(f'{n:,}' for n in sorted(resamples))} bootstrap resamples)" if resamples else ""
    return f"CIs are 95%{counts}: " + "; ".join(parts) + "." if parts else ""


def quick_notice(cfg, corpora: dict, tables: dict[str, pd.DataFrame]) -> str:
    """The quick-mode announcement: what was made smaller, from the config (probe folds and fine-tuning
    seeds only where this run's ``tables`` hold probes or fine-tuning)."""
    analyses = {a for df in tables.values() if df is not None and "analysis" in df.columns
                for a in df["analysis"].dropna().unique()}
    sizes = ", ".join(f"{k} {len(corpora[k])}" for k in cfg.corpus.specs() if k in corpora)
    parts = [f"small corpora (examples: {sizes})", f"{cfg.study.bootstrap_resamples} bootstrap resamples"]
    if "probe" in analyses:
        parts.append(f"{cfg.probes.folds} probe folds")
    if "finetune_pooling" in analyses:
        parts.append(f"fine-tuning seeds {list(cfg.finetune.seeds)} with the `{cfg.finetune.preset}` preset")
    return ("QUICK MODE: a smoke test of the pipeline, not evidence: " + ", ".join(parts)
            + ". Most verdicts below are expected to be inconclusive or to differ from a full run.")


def machine() -> str:
    import os

    import torch

    s = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores"
    if torch.cuda.is_available():
        s += f", {torch.cuda.get_device_name(0)}"
    return s
