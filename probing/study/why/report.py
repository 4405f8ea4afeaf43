"""The why study's report: ``<out>/report.md`` (answers on one page, then the evidence per question, the
pretraining runs, how to read it and provenance) and ``<out>/tables/*.csv``."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import pandas as pd

from probing.study.answers import CONFIDENCE_WORDS, word_count
from probing.study.report import _md_table, machine
from probing.study.rules import describe, display

from .study import QUESTIONS, RULES, TASK_WORDS, TOKENS, WhyResult, pretraining_records

__all__ = ["MAX_WORDS", "write_report"]

#: At most this many words per answer, as the seed questions' page.
MAX_WORDS = 60

EVIDENCE = {
    "first": "A model pretrained with the classification token last (`{1} [SEP] <1> {2} [SEP] [CLS]`, XLNet's "
             "place) against the reference (first), each fine-tuned on the `next` task and probed frozen, reading "
             "the token at its own position and at the other's. If first mattered in itself, the last-pretrained "
             "model read last would fall short of the reference read first.",
    "nsp": "Frozen probes (logistic regression on the last layer) at [CLS], the middle [SEP] and the mean of the "
           "tokens of models pretrained with MLM alone, MLM + next-sentence prediction (the reference) and MLM + "
           "sentence-order prediction, every other setting equal. `next`: is_next with sentence 2 of the negatives "
           "from another topic, as NSP posed it; `next_article`: from the same article (coherence alone).",
    "sep": "`pair` (`[CLS] s1 [SEP] s2 [SEP]`) against `concat_segments` (`[CLS] s1 s2 [SEP]`, the same tokens and "
           "segment ids without the middle [SEP]), on the reference and on a model pretrained without the middle "
           "[SEP]: each model's change, and how much more the first changes than the second. Beside the accuracies, "
           "the seed questions' Q1 and Q2 on each model's last layer: how far dropping the middle [SEP] moves "
           "sentence 1's words, sentence 2's words and [CLS], and how far sentence 1's words move when sentence 2 "
           "is replaced by a same-topic sentence of another held-out article, with and without the [SEP] (each as "
           "a share of the way to another input: 1 − cos over the spread between two different examples).",
    "learning": "Frozen [CLS] probes on the reference variant's weights at its snapshots, from the initial "
                "(random) weights to the end of pretraining, each step compared with the first.",
}


def _pct(x: float, sign: str = "%") -> str:
    """A share in percent, with two decimals below 1% (a move of 0.04% is not 0.0%).

    >>> _pct(0.00107), _pct(0.1594), _pct(-0.0006, "")
    ('0.11%', '15.9%', '-0.06')
    """
    return f"{x * 100:.2f}{sign}" if abs(x) < 0.01 else f"{x * 100:.1f}{sign}"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _accuracy_view(acc: pd.DataFrame, question: str) -> pd.DataFrame:
    if question == "first":
        sel = acc[acc["role"].isin(["reference", "last"]) & acc["format"].isin(["pair", "cls_last"])
                  & (acc["pooling"] == "cls") & (acc["step"] == acc["step"].max())
                  & acc["task"].isin(["next", "topic", "next_article"])]
    elif question == "nsp":
        sel = acc[acc["role"].isin(["reference", "mlm", "sop"]) & (acc["format"] == "pair") & acc["frozen"]
                  & (acc["step"] == acc["step"].max())]
    elif question == "sep":
        sel = acc[acc["role"].isin(["reference", "nosep"]) & acc["format"].isin(["pair", "concat_segments"])
                  & (acc["pooling"] == "cls") & (acc["task"] == "next") & (acc["step"] == acc["step"].max())]
    else:
        sel = acc[(acc["role"] == "reference") & (acc["format"] == "pair") & (acc["pooling"] == "cls") & acc["frozen"]]
    if sel.empty:
        return sel
    return pd.DataFrame({
        "model": sel["role"], "step": sel["step"].astype(int), "task": sel["task"], "format": sel["format"],
        "token": sel["pooling"], "kind": ["frozen probe" if f else "fine-tuned" for f in sel["frozen"]],
        "accuracy": [f"{a * 100:.1f}% ({lo * 100:.1f}–{hi * 100:.1f})" for a, lo, hi in
                     zip(sel["accuracy"], sel["ci_low"], sel["ci_high"])],
        "items": sel["n_items"], "seeds": sel["n_seeds"]}).reset_index(drop=True)


def write_report(cfg, result: WhyResult, models, command: str = "") -> Path:
    out = result.out
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    records = pretraining_records(models)
    result.rows.to_csv(tables / "why_rows.csv", index=False)
    result.accuracy.to_csv(tables / "why_accuracy.csv", index=False)
    result.shares.to_csv(tables / "why_representation.csv", index=False)
    records.to_csv(tables / "why_pretraining.csv", index=False)
    result.predictions.to_parquet(tables / "why_predictions.parquet", index=False)
    arch = cfg.pretrain.model
    seeds = list(cfg.pretrain.run.seeds)
    preset = cfg.pretrain.run.preset
    lines = ["# Why: BERT-like encoders pretrained here, one choice changed at a time", ""]
    lines += [f"**These answers come from the `{preset}` pretraining preset**: {arch.layers}-layer, "
              f"{arch.hidden}-wide BERT encoders pretrained for {cfg.pretrain.train.steps:,} steps of "
              f"{cfg.pretrain.train.batch_size} pairs on BBC News, pretraining seeds {seeds}. Models this small "
              f"learn little language (held-out masked-word accuracy below); the answers say what these pretrainings "
              f"cause, and a run of the `small` preset on a GPU is the check at a larger scale.", ""]
    lines += ["## Answers", ""]
    for key, question in QUESTIONS.items():
        text, conf = result.answers[key]
        lines += [f"**{question}** [evidence](#{key})  ", f"{text} *({CONFIDENCE_WORDS[conf]})*", ""]
    for key, question in QUESTIONS.items():
        lines += [f"## {question}", "", f'<a id="{key}"></a>', "", EVIDENCE[key], ""]
        view = _accuracy_view(result.accuracy, key)
        if not view.empty:
            lines += ["Accuracy on the held-out test items (mean over pretraining seeds; 95% interval over seeds and "
                      "documents; for `content_s1` and `content_s2` the share of a sentence's content words read back, "
                      "R-precision, with `frequency` the decoder that knows word frequencies only):", "",
                      _md_table(view), ""]
        if key == "sep" and len(result.shares):
            sh = result.shares
            lines += ["How far each model's last-layer vectors move (mean share of the way to another input over "
                      "the held-out pairs, 95% interval over pretraining seeds and documents):", "",
                      _md_table(pd.DataFrame({
                          "model": sh["role"], "what moves": sh["what"],
                          "share": [f"{_pct(v)} ({_pct(lo, '')}–{_pct(hi, '')})" for v, lo, hi in
                                    zip(sh["value"], sh["ci_low"], sh["ci_high"])],
                          "items": sh["n_items"], "seeds": sh["n_seeds"]})), ""]
        rows = result.rows[result.rows["question"] == key] if len(result.rows) else result.rows
        if len(rows):
            shown = display(rows, RULES)
            lines += ["Comparisons:", "", _md_table(shown), ""]
    lines += ["## The pretraining runs", "",
              "Held-out masked-word accuracy and loss (against the unigram entropy of the masked words: a model "
              "knowing only word frequencies), and the held-out accuracy of the sentence-pair head:", ""]
    if len(records):
        shown = records.assign(**{c: records[c].map(lambda v: f"{v:.3f}") for c in
                                  ("mlm_accuracy", "mlm_loss", "unigram_entropy", "pair_accuracy")},
                               wall_seconds=records["wall_seconds"].map(lambda v: f"{v:.0f}"))
        lines += [_md_table(shown), ""]
    n_words = sum(word_count(t) for t, _ in result.answers.values())
    lines += ["## How to read this report", "",
              f"Every interval resamples the pretraining seeds ({len(seeds)}), then the test documents (a "
              "two-stage bootstrap, `analyses.finetune.seed_document_ci`), so a difference holds across "
              "pretrainings, not for one model; with few seeds that stage is crude and errs narrow. "
              + describe(RULES), "",
              "Tasks: " + "; ".join(f"`{k}`: {v}" for k, v in TASK_WORDS.items()) + ". Tokens: "
              + "; ".join(f"`{k}`: {v}" for k, v in TOKENS.items()) + ". Every item is a pair of BBC News "
              "sentences from an article the pretraining held out; the split keeps documents on one side.", "",
              f"The answers hold {n_words} words.", "",
              "## Provenance", "",
              f"- command: `{command or 'python -m probing.study.why'}`",
              f"- commit {_git_commit()}, {datetime.date.today().isoformat()}, {machine()}",
              "- time of this invocation (pretraining and fine-tuning runs found finished are reused, not timed "
              "again; each pretraining run's own time is in the table above): "
              + ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items()),
              f"- pretraining runs: `{cfg.pretrain.run.out}`; results: `{out}`", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
