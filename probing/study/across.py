"""Which answers hold on several models: one study run per model, compared question by question.

``python -m probing.study seed_questions --model A --model B`` runs the whole study once per model, each into
``<out>/<model>/`` (its own report, tables and figures; the caches are shared, keyed by the model), and then writes
``<out>/models.md`` and ``<out>/tables/models.csv``: for each question, each model's answer and confidence, and
how many of the question's decided rows come out the same on every model.

A decided row (a question's ``q<k>_decisions`` table) is matched across models by what it measures: its measure,
label and facet columns (representation, pooling, task, format, ...), with a layer taken by its rank among the
layers the question reads (the middle and the last layer of a 6-layer model match those of a 2-layer one).
Its *finding* is the rule's decision with the sign of the difference where there is one (``yes +`` and ``yes −``
are different findings; ``no difference`` and ``cannot tell`` have none). A row *holds* when every model reaches
the same finding; a question's answer holds when every row found on every model holds. "Cannot tell" on one model
is no finding to hold or to break, so a row with one is counted apart (``undecided``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

#: The answers table each study writes beside its other tables (``tables/answers.csv``).
ANSWERS = "answers"
#: The comparison's tables: one row per question (``models.csv``) and one per matched decided row
#: (``models_rows.csv``).
SUMMARY, ROWS = "models", "models_rows"
#: Columns of a decisions table that are results, not what the row measures.
STAT_COLUMNS = frozenset({"family", "value", "se", "value_a", "value_b", "n_groups", "grouping", "n_resamples", "m",
                          "ci_low", "ci_high", "p_adj", "significant", "mde", "decision", "verdict", "confidence",
                          "n_items", "n_seeds", "epochs", "steps", "ci_seeds", "model", "n",
                          "n_examples"})
#: The summary's counts, written as integers (the result tables' writer knows only its own integer columns,
#: :data:`analyses.results.INTEGER_COLUMNS`).
COUNT_COLUMNS = frozenset({"n_rows", "n_hold", "n_differ", "n_undecided", "n_only_some"})
#: Decisions without a direction; ``inconclusive`` is no finding.
UNDIRECTED = {"no_difference": "no difference", "inconclusive": "cannot tell"}
_DECISIONS = re.compile(r"^(q\d+)_decisions\.csv$")


def model_slug(name: str) -> str:
    """A directory name for a model: a local path's last part, a hub id with ``/`` as ``--``.

    >>> model_slug("sentence-transformers/all-MiniLM-L6-v2"), model_slug("/runs/why/mlm+nsp.first/seed0/")
    ('sentence-transformers--all-MiniLM-L6-v2', 'mlm+nsp.first_seed0')
    """
    text = str(name).rstrip("/\\")
    p = Path(text)
    local = p.is_absolute() or text.startswith(".") or p.exists()
    base = p.name if local else text.replace("/", "--")
    if local and re.fullmatch(r"seed\d+", base) and p.parent.name:  # a pretraining run: its variant too
        base = f"{p.parent.name}_{base}"
    slug = re.sub(r"[^A-Za-z0-9._+-]+", "_", base).strip("._") or "model"
    return slug


def unique_slugs(names: Sequence[str]) -> list[str]:
    """:func:`model_slug` of each name, made distinct by the path's parent parts where two would clash
    (``why/mlm/seed0`` and ``why/nsp/seed0`` → ``mlm_seed0``, ``nsp_seed0``)."""
    slugs = [model_slug(n) for n in names]
    for depth in range(2, 6):
        clash = {s for s in slugs if slugs.count(s) > 1}
        if not clash:
            break
        slugs = [model_slug("_".join(Path(str(n).rstrip("/\\")).parts[-depth:])) if s in clash else s
                 for n, s in zip(names, slugs)]
    if len(set(slugs)) != len(slugs):
        slugs = [f"{s}_{i}" for i, s in enumerate(slugs)]
    return slugs


def answers_table(doc, model: str) -> pd.DataFrame:
    """The answers of a report (:class:`probing.study.report.ReportDocument`): one row per question."""
    return pd.DataFrame([{"question": q.key, "asked": q.asked, "answer": q.answer.text,
                          "confidence": q.answer.confidence, "preset": q.answer.preset, "model": model}
                         for q in doc.questions],
                        columns=["question", "asked", "answer", "confidence", "preset", "model"])


def finding(decision: str, value: float) -> str:
    """The finding of a decided row: the decision with the sign of the difference where it has one.

    >>> finding("yes_small", -0.2), finding("no_difference", 0.3), finding("yes", 1.0)
    ('yes_small −', 'no difference', 'yes +')
    """
    if decision in UNDIRECTED:
        return UNDIRECTED[decision]
    return f"{decision} {'+' if float(value) >= 0 else '−'}"


def _cell(v: Any) -> str:
    """A facet's value as text: empty where there is none, a whole number without its ``.0``."""
    if pd.isna(v):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _rows(tables: Path) -> pd.DataFrame:
    """Every decided row of a run's ``tables/``, keyed by what it measures (module docstring)."""
    frames = []
    for path in sorted(tables.iterdir()) if tables.is_dir() else []:
        m = _DECISIONS.match(path.name)
        if not m:
            continue
        d = pd.read_csv(path)
        if d.empty:
            continue
        keys = [c for c in d.columns if c not in STAT_COLUMNS]
        if "layer" in d.columns:
            ranks = {v: i for i, v in enumerate(sorted(d["layer"].dropna().unique()))}
            last = len(ranks) - 1
            d["layer"] = d["layer"].map(lambda v: "" if v not in ranks else "last" if ranks[v] == last
                                        else f"{ranks[v] + 1} of {last + 1}")
        cells = d[keys].apply(lambda col: col.map(_cell))
        d["key"] = cells.agg(" | ".join, axis=1)
        facets = [c for c in keys if c not in ("measure", "label")]
        d["facets"] = cells[facets].apply(lambda r: ", ".join(f"{c} {v}" for c, v in r.items() if v), axis=1) \
            if facets else ""
        d["question"] = m.group(1).upper()
        d["finding"] = [finding(a, b) for a, b in zip(d["decision"], d["value"])]
        frames.append(d[["question", "key", "label", "facets", "finding"]])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["question", "key", "label", "facets", "finding"])


def compare(runs: Mapping[str, str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(summary, rows)`` of the runs (model name -> the study's output directory, each with ``tables/``).

    ``rows``: one row per decided row found on every model: ``question``, ``label``, ``finding_<i>`` per model (in
    the order given), ``holds`` (True / False; NA where a model cannot tell). ``summary``: one row per question:
    ``answer_<i>`` and ``confidence_<i>`` per model, ``n_rows`` (matched), ``n_hold``, ``n_differ``,
    ``n_undecided``, ``n_only_some`` (rows not found on every model) and ``holds`` (every matched row decided and
    alike)."""
    if len(runs) < 2:
        raise ValueError(f"comparing models needs at least two runs, got {len(runs)}")
    names = list(runs)
    answers, rows = [], []
    for i, name in enumerate(names):
        tables = Path(runs[name]) / "tables"
        a_path = tables / f"{ANSWERS}.csv"
        if not a_path.is_file():
            raise ValueError(f"{runs[name]}: no {ANSWERS}.csv under tables/ (not a finished study of this version)")
        a = pd.read_csv(a_path)[["question", "asked", "answer", "confidence"]]
        answers.append(a.rename(columns={"answer": f"answer_{i}", "confidence": f"confidence_{i}"}))
        r = _rows(tables).rename(columns={"finding": f"finding_{i}"})
        rows.append(r.drop_duplicates(["question", "key"]))
    merged = rows[0]
    for i, r in enumerate(rows[1:], start=1):
        merged = merged.merge(r.drop(columns=["label", "facets"]), on=["question", "key"], how="outer")
    findings = [f"finding_{i}" for i in range(len(names))]
    everywhere = merged[findings].notna().all(axis=1)
    matched = merged[everywhere].copy()
    undecided = (matched[findings] == "cannot tell").any(axis=1)
    alike = matched[findings].nunique(axis=1) == 1
    matched["holds"] = pd.array([pd.NA if u else bool(s) for u, s in zip(undecided, alike)], dtype="boolean")
    summary = answers[0]
    for a in answers[1:]:
        summary = summary.merge(a.drop(columns="asked"), on="question", how="outer")
    counts = []
    for q in summary["question"]:
        m = matched[matched["question"] == q]
        only = int((merged["question"] == q).sum() - len(m))
        hold = int((m["holds"] == True).sum())  # noqa: E712 (a nullable boolean)
        differ = int((m["holds"] == False).sum())  # noqa: E712
        counts.append({"question": q, "n_rows": len(m), "n_hold": hold, "n_differ": differ,
                       "n_undecided": len(m) - hold - differ, "n_only_some": only,
                       "holds": bool(len(m)) and hold == len(m)})
    summary = summary.merge(pd.DataFrame(counts), on="question", how="left")
    summary = summary.astype({c: "int64" for c in COUNT_COLUMNS})
    return summary, matched.drop(columns="key").reset_index(drop=True)


def _verdict(r: Any) -> str:
    if not r["n_rows"]:
        return "no decided row found on every model"
    if r["holds"]:
        return f"holds: all {r['n_rows']} rows alike"
    parts = [f"{r['n_hold']} of {r['n_rows']} rows alike"]
    if r["n_differ"]:
        parts.append(f"{r['n_differ']} differ")
    if r["n_undecided"]:
        parts.append(f"{r['n_undecided']} undecided on a model")
    return "; ".join(parts)


def render(summary: pd.DataFrame, rows: pd.DataFrame, names: Sequence[str], slugs: Sequence[str]) -> str:
    """``models.md``: which answers hold on every model, then each question's answers side by side and the rows
    that differ."""
    from .answers import CONFIDENCE_WORDS

    lines = ["# Which answers hold on every model", "",
             "Models: " + "; ".join(f"{n} ([report]({s}/report.md))" for n, s in zip(names, slugs)) + ".", "",
             "A question's answer holds when each of its decided rows (matched by what it measures, a layer by its "
             "rank) reaches the same decision, with the same sign, on every model; \"cannot tell\" on a model is "
             "counted as undecided, neither holding nor differing.", "",
             "| question | " + " | ".join(f"answer on {n}" for n in names) + " | rows alike |",
             "|---|" + "---|" * len(names) + "---|"]
    for _, r in summary.iterrows():
        cells = [f"{str(r[f'answer_{i}']).replace('|', '/')} *({CONFIDENCE_WORDS.get(r[f'confidence_{i}'], '')})*"
                 for i in range(len(names))]
        lines.append(f"| **{r['question']}** | " + " | ".join(cells) + f" | {_verdict(r)} |")
    differ = rows[rows["holds"] == False]  # noqa: E712
    if len(differ):
        lines += ["", "## Rows that differ", "", "| question | row | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for _, r in differ.iterrows():
            row = r["label"] + (f" ({r['facets']})" if r["facets"] else "")
            lines.append(f"| {r['question']} | {row} | "
                         + " | ".join(str(r[f"finding_{i}"]) for i in range(len(names))) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(runs: Mapping[str, str | Path], out: str | Path) -> Path:
    """:func:`compare` the runs and write ``<out>/models.md``, ``<out>/tables/models.csv`` and
    ``models_rows.csv``; returns the Markdown path."""
    from analyses.results import write_table

    from ..cache_writer import atomic_write

    out = Path(out)
    summary, rows = compare(runs)
    names = list(runs)
    slugs = [Path(os.path.relpath(Path(runs[n]).resolve(), out.resolve())).as_posix() for n in names]
    write_table(summary, out / "tables" / f"{SUMMARY}.csv")
    write_table(rows, out / "tables" / f"{ROWS}.csv")
    text = render(summary, rows, names, slugs)
    atomic_write(out / "models.md", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return out / "models.md"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m probing.study.across RUN RUN [...] --out DIR``: compare finished studies."""
    from ..cli import ArgumentParser

    p = ArgumentParser(prog="python -m probing.study.across",
                       description="Which answers hold on every model: compare finished studies of one config run on "
                                   "different models (each output directory holds tables/answers.csv and the "
                                   "questions' decisions) and write DIR/models.md, DIR/tables/models.csv and "
                                   "models_rows.csv. `python -m probing.study CONFIG --model A --model B` runs the "
                                   "studies and this comparison in one command.")
    p.add_argument("runs", nargs="+", help="two or more study output directories")
    p.add_argument("--out", required=True, help="where models.md and tables/ go")
    p.add_argument("--names", default=None,
                   help="comma list, one name per run, for the table's columns (default: each run's model)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and (len(names) != len(args.runs) or len(set(names)) != len(names) or "" in names):
        p.error(f"--names: give {len(args.runs)} different names, one per run, got {args.names!r}")
    try:
        runs: dict[str, Path] = {}
        for i, d in enumerate(args.runs):
            answers = Path(d) / "tables" / f"{ANSWERS}.csv"
            model = str(pd.read_csv(answers)["model"].iloc[0]) if answers.is_file() else Path(d).name
            model = names[i] if names else model
            runs[model if model not in runs else f"{model} ({d})"] = Path(d)
        path = write_comparison(runs, args.out)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
