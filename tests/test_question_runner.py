"""A question module end to end through the one runner: derived corpora, caches, the shared fine-tuning runs
(each once), analyses, decided rows, the one page of answers, the HTML report's contents and collapsible
evidence, and the provenance's command and code."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from probing.examples import Example

from .conftest import make_tiny_bert, quick_study_config


def _replaced_s2(cfg, corpora):
    pairs = corpora["pairs"]
    n = len(pairs)
    return {"pairs_s2": [Example(e.id, (e.sentences[0], pairs[(i + 7) % n].sentences[1]), e.labels)
                         for i, e in enumerate(pairs)]}


def _question(calls: list):
    from analyses.finetune import RunSpec, compare_runs, make_task
    from probing.study.answers import Answer
    from probing.study.questions import Question
    from probing.study.rules import Rule
    from probing.study.sections import Job

    def tasks(cfg, corpora):
        return {"topic": make_task(corpora["pairs"], "topic", 0.3, cfg.study.seed)}

    def runs(cfg):
        return [RunSpec("topic", fmt, "cls", seed=s) for fmt in ("pair", "concat") for s in (0, 1)]

    def analyse(ctx):
        calls.append("analyse")
        cache = ctx.caches.get("pairs_s2", "pair")
        P = ctx.tables["finetune_predictions"]
        row = compare_runs(P, {"format": "pair"}, {"format": "concat"}, n_resamples=ctx.cfg.study.bootstrap_resamples)
        return {"q1_toy": pd.DataFrame([{**row, "n_tokens": len(cache.tokens)}])}

    def rows(T):
        r = T["q1_toy"].iloc[0]
        return pd.DataFrame([{"measure": "acc", "family": "formats", "label": "concat − pair", "value": r["value"],
                              "se": r["se"]}])

    def answer(T, decided, cfg):
        d = decided.iloc[0]
        return Answer(f"Fine-tuned accuracy changes by {100 * d['value']:+.1f} points without [SEP] "
                      f"(threshold 2 points).", d["confidence"])

    return Question(
        key="Q1", asked="What changes if I drop the [SEP]?", title="Dropping [SEP]", corpora=("pairs",),
        jobs=lambda cfg, corpora: [Job("pairs_s2", "pair")], analyse=analyse,
        rules={"acc": Rule("fine-tuned accuracy, concat − pair", "accuracy points", 0.02)}, rows=rows,
        answer=answer, evidence=lambda T, decided, cfg: f"The toy table has {len(T['q1_toy'])} row.",
        notes=lambda cfg: "A constructed question for the runner's test.", derive=_replaced_s2, tasks=tasks,
        runs=runs, tables=("q1_toy",), background="Nothing to add.")


@pytest.mark.slow
def test_a_question_module_runs_end_to_end(tmp_path, bert_tokenizer, monkeypatch):
    from probing.study import questions
    from probing.study.runner import run_study

    calls: list = []
    monkeypatch.setitem(questions.QUESTIONS, "Q1", _question(calls))
    model_dir = tmp_path / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    cfg = quick_study_config(tmp_path, model_dir)
    logs: list[str] = []
    report = run_study(cfg, quick=True, overrides={"study.questions": ["Q1", "Q2"]}, log=logs.append)
    out = report.parent
    md = report.read_text(encoding="utf-8")
    html = (out / "report.html").read_text(encoding="utf-8")
    # the answers come first, in the asker's words, with the confidence word; Q2 (its own module) follows
    assert md.index("## Answers") < md.index("## Q1. What changes if I drop the [SEP]?") < md.index("## Q2.")
    answer = re.search(r"\*\*Q1\. What changes if I drop the \[SEP\]\?\*\* \[evidence\]\(#q1\)  \n(.*)\n", md)
    assert answer and "Fine-tuned accuracy changes by" in answer.group(1) and "*(" in answer.group(1)
    assert "How to read this report" in md and "fine-tuned accuracy, concat − pair: 2.0 accuracy points" in md
    assert md.index("## How to read this report") < md.index("## Provenance")
    assert "**code**: probing" in md and "**command**:" in md
    # HTML: contents, anchors, answers first, evidence collapsible
    assert "<nav><h2>Contents</h2>" in html and 'href="#q1"' in html and '<section id="q1">' in html
    assert html.index('id="answers"') < html.index('<section id="q1">')
    assert "<details><summary>Evidence, figures and notes for Q1</summary>" in html
    # the shared runs ran once each, and their predictions and the decided rows are tables of the study
    P = pd.read_csv(out / "tables" / "finetune_predictions.csv")
    assert P["run"].nunique() == 4 and set(P["format"]) == {"pair", "concat"}
    decided = pd.read_csv(out / "tables" / "q1_decisions.csv")
    assert decided.loc[0, "decision"] in ("yes", "yes_small", "no_difference", "inconclusive")
    assert (decided["ci_low"] <= decided["value"]).all() and (decided["value"] <= decided["ci_high"]).all()
    stages = pd.read_csv(out / "tables" / "stages.csv")
    assert "fine-tuning" in set(stages["stage"])
    assert calls == ["analyse"]
    # a second run reuses every fine-tuning run from the store
    logs2: list[str] = []
    run_study(cfg, quick=True, overrides={"study.questions": ["Q1"]}, log=logs2.append)
    assert not any(line.endswith(tuple(f"fine-tuning topic/{f}/cls/nall/seed{s}" for f in ("pair", "concat")
                                       for s in (0, 1))) for line in logs2)
