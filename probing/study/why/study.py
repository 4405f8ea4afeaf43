"""The why study: pretraining variants measured on the same held-out text, the pretraining seed a unit of every
interval (docs/WHY.md).

Each pretrained model (variant x seed, and the reference variant's snapshots) goes through the seed questions'
fine-tuning protocol (:func:`analyses.finetune.run_protocol`) on one document-grouped split of BBC pairs drawn
from the articles the pretraining held out: frozen probes (a logistic regression on the frozen last layer at a
token) and fine-tuned runs (every weight), each predicting the same test items. The predictions of all models
form one table whose ``seed`` column is the *pretraining* seed, so :func:`analyses.finetune.compare_runs`
resamples pretraining seeds, then test documents: what a comparison says holds across pretrainings, not for
one.

The four questions, each a family of comparison rows decided by :mod:`probing.study.rules`:

* ``first``: why is [CLS] first? A model pretrained with the classification token last against the reference
  (first), each fine-tuned and probed with the token at its own position and at the other's.
* ``nsp``: what does next-sentence prediction put into [CLS] and [SEP]? The reference (MLM + NSP) and MLM +
  SOP against MLM alone: frozen probes at [CLS], the middle [SEP] and the mean of the tokens for ``next``
  (other-topic negatives), ``next_article`` (same-article negatives) and ``topic``.
* ``sep``: does dropping [SEP] matter more to a model pretrained with it? ``pair`` against ``concat_segments``
  (the same tokens without the middle [SEP]) on the reference and on a model pretrained without it: each
  model's change and the difference of the two changes.
* ``learning``: how does [CLS] learn? Frozen [CLS] probes on the reference's snapshots, from its initial
  weights to the end of pretraining.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from probing.study.report import pick
from probing.study.rules import LABELS, Rule, display, weakest

from .config import WhyConfig

__all__ = ["QUESTIONS", "RULES", "WhyResult", "comparison_rows", "model_runs", "specs_for"]

#: The questions in the askers' words (the threads the toolkit's questions come from).
QUESTIONS: dict[str, str] = {
    "first": "Why is [CLS] always the first token? Why not the last?",
    "nsp": "What does next-sentence prediction put into [CLS] and [SEP]?",
    "sep": "Does dropping [SEP] matter more to a model that was pretrained with it?",
    "learning": "How does [CLS] learn to represent the sequence?",
}

RULES: dict[str, Rule] = {
    "finetuned": Rule("fine-tuned accuracy difference", "accuracy points", 0.02,
                      why="below 2 points practitioners do not change a format or a pretraining (the seed "
                          "questions' Q6 yardstick)"),
    "frozen": Rule("frozen-probe accuracy difference", "accuracy points", 0.02,
                   why="the same yardstick as the fine-tuned rows"),
    "content": Rule("difference in the share of content words read back (R-precision)", "points", 0.02,
                    why="2 points of the words a decoder recovers, the accuracy rows' yardstick"),
    "representation": Rule("difference in how far the same last-layer vectors move", "points of the way to another "
                           "input", 0.05, why="5% of the distance between two different inputs, the seed questions' "
                                              "Q1 yardstick"),
}

#: Tasks: name -> (the [why] corpus key, the label).
TASKS = {"next": ("pairs", "is_next"), "topic": ("pairs", "topic"), "topic_s2": ("pairs", "topic_s2"),
         "next_article": ("pairs_article", "is_next")}
#: Word order (the seed questions' Q7 minimal pairs, :func:`analyses.recovery.minimal_pair_scores`): task -> what
#: is read. From the frozen [CLS] of a pair and of the same pair with two adjacent words of sentence 1 swapped, a
#: decoder cross-fitted over the same folds tells which is the original (per item right or wrong; chance 50%).
ORDER = {"order_s1": "the original pair told from its copy with two adjacent words of sentence 1 swapped, from "
                     "[CLS] (minimal pairs; chance 50%)"}
ORDER_CHANCE = 0.5
TASK_WORDS = {"next": "is_next (other-topic negatives)", "next_article": "is_next (same-article negatives)",
              "topic": "topic (of sentence 1)", "topic_s2": "topic of sentence 2 (another topic in the negatives)",
              "content_s1": "the content words of sentence 1 read back (R-precision; yardstick: word frequency alone)",
              "content_s2": "the content words of sentence 2 read back", **ORDER}
#: Content readouts (the seed questions' Q5 and Q7 decoder, :mod:`analyses.recovery`): task -> the sentence whose
#: content words (the :data:`CONTENT_VOCAB` most frequent of the pairs) are read back from the frozen [CLS],
#: scored per item by R-precision, cross-fitted over :data:`CONTENT_FOLDS` document-grouped folds; the
#: frequency-only decoder (pooling ``frequency``) is its yardstick.
CONTENT = {"content_s1": 0, "content_s2": 1}
CONTENT_VOCAB = 100
CONTENT_FOLDS = 5
#: Where the classification token is read: format -> words.
POSITION = {"pair": "first", "cls_last": "last"}
TOKENS = {"cls": "[CLS]", "sep1": "the middle [SEP]", "mean": "the mean of the tokens"}


@dataclass(frozen=True)
class Model:
    """One pretrained model of the study: its role (``reference`` or a key of :data:`probing.study.why.ROLES`), the
    pretraining seed, the snapshot step (None: the finished run) and its directory."""

    role: str
    seed: int
    step: int | None
    path: Path


def specs_for(role: str, snapshot: bool = False):
    """The protocol runs of a model in ``role`` (module docstring)."""
    from analyses.finetune import RunSpec

    frozen = [RunSpec(t, "pair", "cls", frozen=True) for t in TASKS]
    if snapshot:
        return frozen
    if role in ("reference", "mlm", "sop"):
        frozen += [RunSpec(t, "pair", p, frozen=True) for t in TASKS for p in ("sep1", "mean")]
    tuned = []
    if role in ("reference", "last"):
        frozen += [RunSpec(t, "cls_last", "cls", frozen=True) for t in TASKS]
        tuned += [RunSpec("next", "pair", "cls"), RunSpec("next", "cls_last", "cls")]
    if role in ("reference", "nosep"):
        frozen += [RunSpec("next", "concat_segments", "cls", frozen=True)]
        tuned += [RunSpec("next", "pair", "cls"), RunSpec("next", "concat_segments", "cls")]
    return list(dict.fromkeys(frozen + tuned))


def model_runs(cfg: WhyConfig) -> list[Model]:
    """Every model the study measures, finished runs and snapshots; the directories need not exist yet."""
    from probing.pretrain._train import run_dir, snapshot_dir

    from .config import ROLES

    out = cfg.pretrain.run.out
    roles = [("reference", cfg.reference)] + [(r, cfg.variant(r)) for r in ROLES if cfg.variant(r) is not None]
    models = [Model(role, seed, None, run_dir(out, v, seed)) for role, v in roles for seed in cfg.pretrain.run.seeds]
    models += [Model("reference", seed, step, snapshot_dir(run_dir(out, cfg.reference, seed), step))
               for seed in cfg.pretrain.run.seeds for step in sorted(cfg.pretrain.train.snapshots)]
    return models


def measuring_tasks(cfg: WhyConfig):
    """The tasks every model is measured on (:data:`TASKS`), from the articles the pretraining held out."""
    from analyses.finetune import make_task
    from probing.corpora import load_corpus

    held = cfg.pretrain.corpus.heldout_fraction
    corpora = {key: load_corpus(f"{getattr(cfg.why, key)},pretrain_heldout={held}")
               for key in ("pairs", "pairs_article")}
    return {name: make_task(corpora[key], label) for name, (key, label) in TASKS.items()}


def cls_vectors(model: str, examples, fmt: str, device: str = "auto") -> tuple[list[str], np.ndarray]:
    """The frozen last-layer [CLS] of each example in ``fmt`` (examples longer than the model's positions are left
    out): ``(ids, (n, hidden) float64)``."""
    import torch

    from analyses.finetune import (TrainConfig, get_pooling, pool, render_examples, sorted_batches,
                                   training_inputs)
    from probing.forward import last_hidden
    from probing.models import load_model, pick_device

    lm = load_model(model)
    dev = pick_device(device)
    kept, rendered, _, _ = render_examples(examples, "doc", lm.tokenizer, fmt, lm.model.config,
                                           config=TrainConfig(on_overflow="skip"), model_max_length=lm.max_length)
    cls = get_pooling("cls")
    X = np.zeros((len(rendered), int(lm.model.config.hidden_size)))
    model = lm.model.to(dev).eval()
    with torch.inference_mode():
        for part in sorted_batches(np.asarray([len(r) for r in rendered]), 64):
            inputs, mask = training_inputs([rendered[i] for i in part], lm, cls, dev)
            X[part] = pool(last_hidden(model, inputs).float(), mask, cls.reduce).double().cpu().numpy()
    return [e.id for e in kept], X


def content_predictions(model: str, examples, fmt: str = "pair", device: str = "auto") -> pd.DataFrame:
    """Per item and content task (:data:`CONTENT`), the cross-fitted R-precision of the decoder on the frozen
    [CLS] (``pooling`` ``cls``) and of the frequency-only decoder (``frequency``), in the prediction table's
    columns (``correct``: the score; items without a vocabulary word left out)."""
    from analyses.probes import content_vocabulary, presence
    from analyses.recovery import content_scores, grouped_folds, minimal_pair_scores
    from probing.study.questions._common import swap_in_every_example

    ids, X = cls_vectors(model, examples, fmt, device)
    by_id = {e.id: e for e in examples}
    kept = [by_id[i] for i in ids]
    docs = np.asarray([str(e.labels.get("doc", e.id)) for e in kept])
    folds = grouped_folds(docs, CONTENT_FOLDS, 0)
    frames = []
    for task, k in CONTENT.items():
        sentences = [e.sentences[k] for e in examples]  # the vocabulary is the corpus's, the same for every model
        Y = presence([e.sentences[k] for e in kept], content_vocabulary(sentences, CONTENT_VOCAB)).astype(float)
        decoder, frequency, _ = content_scores(X, Y, docs, folds)
        for pooling, score in (("cls", decoder), ("frequency", frequency)):
            ok = np.isfinite(score)
            frames.append(pd.DataFrame({"task": task, "format": fmt, "pooling": pooling, "frozen": True,
                                        "item": np.asarray(ids)[ok], "doc": docs[ok], "label": "",
                                        "correct": score[ok]}))
    swapped_ids, X_swapped = cls_vectors(model, swap_in_every_example(kept, seed=0), fmt, device)
    both, a, b = np.intersect1d(np.asarray(ids), np.asarray(swapped_ids), return_indices=True)
    pair_docs = docs[a]
    correct, _ = minimal_pair_scores(X[a], X_swapped[b], pair_docs, grouped_folds(pair_docs, CONTENT_FOLDS, 0))
    frames.append(pd.DataFrame({"task": "order_s1", "format": fmt, "pooling": "cls", "frozen": True, "item": both,
                                "doc": pair_docs, "label": "", "correct": correct}))
    return pd.concat(frames, ignore_index=True)


def predictions(cfg: WhyConfig, models: list[Model], *, force: bool = False, progress: bool = True,
                log: Callable[[str], None] = print, tasks: dict | None = None) -> pd.DataFrame:
    """Every model's protocol predictions in one table, ``seed`` the pretraining seed, with ``role`` and ``step``
    (the pretraining step: the run's last for a finished run). ``tasks``: :func:`measuring_tasks` of ``cfg``, read
    here when not given."""
    from analyses.finetune import run_protocol

    tasks = tasks if tasks is not None else measuring_tasks(cfg)
    frames = []
    final = cfg.pretrain.train.steps
    for m in models:
        log(f"measuring {m.role} seed {m.seed}" + (f" at step {m.step}" if m.step is not None else ""))
        P = run_protocol(tasks, specs_for(m.role, m.step is not None), model=str(m.path),
                         preset=cfg.why.finetune_preset, device=cfg.why.device, out=Path(cfg.why.out) / ".results",
                         force=force, progress=progress, log=None, epochs=cfg.why.epochs, lr=cfg.why.lr,
                         head_lr=cfg.why.head_lr)
        if m.role in ("reference", "mlm", "sop"):
            P = pd.concat([P, content_predictions(str(m.path), tasks["topic"].examples, "pair", cfg.why.device)],
                          ignore_index=True)
        P = P.assign(role=m.role, step=final if m.step is None else m.step, seed=m.seed)
        frames.append(P)
    out = pd.concat(frames, ignore_index=True)
    # one type per column (a content score beside a right-or-wrong prediction; labels of several tasks)
    return out.assign(correct=out["correct"].astype(float), label=out["label"].astype(str),
                      pred=out["pred"].astype(str))


# ---------------------------------------------------------------------------------------------------------------
# comparisons

def _where(role: str, task: str, fmt: str, pooling: str, frozen: bool, step: int) -> dict:
    return {"role": role, "task": task, "format": fmt, "pooling": pooling, "frozen": frozen, "step": step}


def _row(P, a: dict, b: dict, *, question: str, label: str, n_resamples: int, **facets) -> dict | None:
    from analyses.finetune import compare_runs

    if not (_has(P, a) and _has(P, b)):
        return None
    c = compare_runs(P, a, b, n_resamples=n_resamples)
    kind = "content" if a["task"] in CONTENT else "frozen" if a["frozen"] else "finetuned"
    return {"question": question, "family": f"{question}/{kind}", "measure": kind, "label": label,
            "representation": "frozen probe" if a["frozen"] else "fine-tuned", **facets,
            "value": c["value"], "se": c["se"], "value_a": c["value_a"], "value_b": c["value_b"],
            "n_items": c["n_items"], "n_seeds": c["n_seeds"], "n_groups": c["n_groups"]}


def _has(P: pd.DataFrame, where: dict) -> bool:
    return not _items_by_seed(P, where).empty


def _items_by_seed(P: pd.DataFrame, where: dict) -> pd.DataFrame:
    """``(items x pretraining seeds)`` correctness of the runs ``where`` selects."""
    return pick(P, **where).pivot_table(index="item", columns="seed", values="correct", aggfunc="mean")


def _interaction(P, a0: dict, a1: dict, b0: dict, b1: dict, *, question: str, label: str, n_resamples: int,
                 **facets) -> dict | None:
    """``(a1 − a0) − (b1 − b0)``: how much more one model's accuracy changes than another's, paired by item and
    pretraining seed, with the two-stage bootstrap (:func:`analyses.finetune.seed_document_ci`)."""
    from analyses.finetune import seed_document_ci

    if not all(_has(P, w) for w in (a0, a1, b0, b1)):
        return None
    parts = [_items_by_seed(P, w) for w in (a0, a1, b0, b1)]
    items = parts[0].index
    for p in parts[1:]:
        items = items.intersection(p.index)
    parts = [p.loc[items].to_numpy(float) for p in parts]
    if len({p.shape[1] for p in parts}) != 1:
        return None
    A, B = parts[1] - parts[0], parts[3] - parts[2]
    docs = P.drop_duplicates("item").set_index("item").loc[items, "doc"].to_numpy()
    value, _, _, se = seed_document_ci(A, B, docs, n_resamples=n_resamples)
    kind = "frozen" if a0["frozen"] else "finetuned"
    return {"question": question, "family": f"{question}/{kind}", "measure": kind, "label": label,
            "representation": "frozen probe" if a0["frozen"] else "fine-tuned", **facets, "value": value, "se": se,
            "value_a": float(A.mean()), "value_b": float(B.mean()), "n_items": len(items), "n_seeds": A.shape[1],
            "n_groups": len(np.unique(docs))}


def comparison_rows(P: pd.DataFrame, final_step: int, n_resamples: int = 1000) -> pd.DataFrame:
    """The comparison rows of the four questions (module docstring), before decisions."""
    rows: list[dict | None] = []
    R = n_resamples
    end = final_step
    for frozen in (False, True):
        tasks = ("next", "topic") if frozen else ("next",)
        for task in tasks:
            ref_first = _where("reference", task, "pair", "cls", frozen, end)
            ref_last = _where("reference", task, "cls_last", "cls", frozen, end)
            last_last = _where("last", task, "cls_last", "cls", frozen, end)
            last_first = _where("last", task, "pair", "cls", frozen, end)
            rows += [
                _row(P, ref_first, last_last, question="first", task=task, n_resamples=R,
                     label="pretrained last, read last − pretrained first, read first"),
                _row(P, ref_first, ref_last, question="first", task=task, n_resamples=R,
                     label="pretrained first: read last − read first"),
                _row(P, last_last, last_first, question="first", task=task, n_resamples=R,
                     label="pretrained last: read first − read last"),
            ]
        a0 = _where("reference", "next", "pair", "cls", frozen, end)
        a1 = _where("reference", "next", "concat_segments", "cls", frozen, end)
        b0 = _where("nosep", "next", "pair", "cls", frozen, end)
        b1 = _where("nosep", "next", "concat_segments", "cls", frozen, end)
        rows += [
            _row(P, a0, a1, question="sep", task="next", n_resamples=R,
                 label="pretrained with [SEP]: without − with"),
            _row(P, b0, b1, question="sep", task="next", n_resamples=R,
                 label="pretrained without [SEP]: without − with"),
            _interaction(P, a0, a1, b0, b1, question="sep", task="next", n_resamples=R,
                         label="change of the model pretrained with [SEP] − of the one without"),
        ]
    for other, words in (("reference", "MLM + NSP − MLM"), ("sop", "MLM + SOP − MLM")):
        for pooling in TOKENS:
            for task in [*TASKS, *CONTENT, *ORDER]:
                rows.append(_row(P, _where("mlm", task, "pair", pooling, True, end),
                                 _where(other, task, "pair", pooling, True, end), question="nsp", task=task,
                                 pooling=pooling, label=words, n_resamples=R))
    steps = sorted(set(P.loc[P["role"] == "reference", "step"]))
    for task in [*TASKS, *CONTENT, *ORDER]:
        for step in steps[1:]:
            rows.append(_row(P, _where("reference", task, "pair", "cls", True, steps[0]),
                             _where("reference", task, "pair", "cls", True, step), question="learning", task=task,
                             step=int(step), label=f"step {step} − step {steps[0]}", n_resamples=R))
    return pd.DataFrame([r for r in rows if r is not None])


def accuracy_table(P: pd.DataFrame, n_resamples: int = 1000) -> pd.DataFrame:
    """Accuracy of every (role, step, task, format, pooling, frozen) over pretraining seeds and test items, with
    the two-stage bootstrap interval."""
    from analyses.finetune import accuracy

    rows = []
    chance = chance_levels(P)
    keys = ["role", "step", "task", "format", "pooling", "frozen"]
    for values, _ in P.groupby(keys, sort=True):
        where = dict(zip(keys, values))
        a = accuracy(P, where, n_resamples=n_resamples)
        rows.append({**where, "accuracy": a["value"], "ci_low": a["ci_low"], "ci_high": a["ci_high"],
                     "chance": chance.get(where["task"], float("nan")), "n_items": a["n_items"],
                     "n_seeds": a["n_seeds"]})
    out = pd.DataFrame(rows)
    if len(out):
        out["learnt"] = out["ci_low"] > out["chance"]
    return out


def chance_levels(P: pd.DataFrame) -> dict[str, float]:
    """Task -> the accuracy of always guessing its most frequent test label (the floor a model must clear); for a
    content task, the frequency-only decoder's mean R-precision."""
    items = P.drop_duplicates(["task", "item"])
    out = {task: float(g["label"].astype(str).value_counts(normalize=True).iloc[0]) for task, g in
           items.groupby("task") if task not in CONTENT and task not in ORDER}
    out.update({task: ORDER_CHANCE for task in ORDER if (items["task"] == task).any()})
    for task in CONTENT:  # the frequency-only decoder's mean score
        freq = P[(P["task"] == task) & (P["pooling"] == "frequency")]
        if len(freq):
            out[task] = float(freq["correct"].mean())
    return out


# ---------------------------------------------------------------------------------------------------------------
# answers

def _pts(x: float) -> str:
    return f"{x * 100:+.1f}"


def _share(x: float) -> str:
    """A share of the way to another input in percent: one decimal below 10%.

    >>> _share(0.00107), _share(0.4028)
    ('0.1%', '40%')
    """
    return f"{x * 100:.1f}%" if abs(x) < 0.1 else f"{x * 100:.0f}%"


def _pick(rows: pd.DataFrame, **where) -> pd.Series | None:
    sel = pick(rows, **where)
    return None if sel.empty else sel.iloc[0]


def _ci(r: pd.Series) -> str:
    return f"CI {_pts(r['ci_low'])} to {_pts(r['ci_high'])}"


def _own(acc: pd.DataFrame, models: list[tuple[str, str]], poolings=("cls",), **where) -> pd.DataFrame:
    """The accuracy rows of each (role, format) in ``models`` at the end of pretraining, ``poolings``, ``where``."""
    sel = acc[(acc["step"] == acc["step"].max()) & acc["pooling"].isin(poolings)]
    for k, v in where.items():
        sel = sel[sel[k] == v]
    keep = [any(r == role and f == fmt for role, fmt in models) for r, f in zip(sel["role"], sel["format"])]
    return sel[keep]


def _unlearnt(who: str, accs: pd.DataFrame) -> str:
    """The answer when no model of a comparison cleared chance."""
    got = f"{accs['accuracy'].min() * 100:.0f}–{accs['accuracy'].max() * 100:.0f}%" if len(accs) > 2 else \
        " and ".join(f"{a * 100:.0f}%" for a in accs["accuracy"])
    return (f"Cannot tell at this scale: {who} beat chance ({got} against {accs['chance'].iloc[0] * 100:.0f}% "
            "for always guessing).")


def answers(rows: pd.DataFrame, acc: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """Question -> (answer text, confidence word), each from the decided rows."""
    out: dict[str, tuple[str, str]] = {}
    own = _pick(rows, question="first", representation="fine-tuned", task="next",
                label="pretrained last, read last − pretrained first, read first")
    moved = _pick(rows, question="first", representation="fine-tuned", task="next",
                  label="pretrained first: read last − read first")
    own_acc = _own(acc, [("reference", "pair"), ("last", "cls_last")], task="next", frozen=False)
    if own is None:
        out["first"] = ("Not measured: the config pretrains no model with [CLS] last.", "low")
    elif not own_acc["learnt"].any():
        out["first"] = (_unlearnt("fine-tuned on next-sentence pairs, neither the [CLS]-first nor the [CLS]-last "
                                  "model", own_acc), "low")
    else:
        text = (f"Fine-tuned on next-sentence pairs, a model pretrained with [CLS] last and read there scores "
                f"{_pts(own['value'])} points against BERT's layout ({_ci(own)}: {LABELS[own['decision']].lower()})")
        if moved is not None:
            text += (f"; moving [CLS] of a first-pretrained model to the end changes {_pts(moved['value'])} points "
                     f"({LABELS[moved['decision']].lower()})")
        out["first"] = (text + ".", weakest([own["confidence"]] + ([moved["confidence"]] if moved is not None else [])))
    parts, confs = [], []
    for pooling in ("cls", "sep1"):
        r = _pick(rows, question="nsp", label="MLM + NSP − MLM", task="next", pooling=pooling)
        if r is not None:
            parts.append(f"{TOKENS[pooling]} {_pts(r['value'])} points ({_ci(r)})")
            confs.append(r["confidence"])
    topic = _pick(rows, question="nsp", label="MLM + NSP − MLM", task="topic_s2", pooling="cls")
    nsp_acc = _own(acc, [("reference", "pair"), ("mlm", "pair")], poolings=tuple(TOKENS), task="next", frozen=True)
    content = _pick(rows, question="nsp", label="MLM + NSP − MLM", task="content_s1", pooling="cls")
    if parts and not nsp_acc["learnt"].any():
        text = _unlearnt("no frozen is_next probe ([CLS], middle [SEP], mean) of the MLM + NSP or MLM-only models",
                         nsp_acc)
        conf = "low"
        if content is not None:
            more = ("fewer" if content["value"] < 0 else "more") if content["decision"] in ("yes", "yes_small") \
                else "about as many"
            text += (f" But MLM + NSP leaves {more} of sentence 1's content words in [CLS] than MLM alone "
                     f"({_pts(content['value'])} points, {_ci(content)}).")
        order = _pick(rows, question="nsp", label="MLM + NSP − MLM", task="order_s1", pooling="cls")
        if order is not None and order["decision"] in ("yes", "yes_small"):
            text += f" Word order: {_pts(order['value'])} points ({_ci(order)})."
        out["nsp"] = (text, conf)
    elif parts:
        text = ("Against MLM alone, next-sentence prediction changes what a frozen probe reads of is_next from "
                + " and ".join(parts))
        if topic is not None:
            text += f"; sentence 2's topic from [CLS] {_pts(topic['value'])} points"
        words = _pick(rows, question="nsp", label="MLM + NSP − MLM", task="content_s2", pooling="cls")
        if words is not None:
            text += f", its content words {_pts(words['value'])}"
        out["nsp"] = (text + ".", weakest(confs))
    else:
        out["nsp"] = ("Not measured: the config pretrains no MLM-only model.", "low")
    ref = _pick(rows, question="sep", representation="fine-tuned", label="pretrained with [SEP]: without − with")
    inter = _pick(rows, question="sep", representation="fine-tuned",
                  label="change of the model pretrained with [SEP] − of the one without")
    nos = _pick(rows, question="sep", representation="fine-tuned", label="pretrained without [SEP]: without − with")
    sep_acc = _own(acc, [("reference", "pair"), ("nosep", "concat_segments")], task="next", frozen=False)
    if ref is None or inter is None or nos is None:
        out["sep"] = ("Not measured: the config pretrains no model without [SEP].", "low")
    elif not sep_acc["learnt"].any():
        out["sep"] = (_unlearnt("fine-tuned, neither the model pretrained with [SEP] nor the one without",
                                sep_acc), "low")
    else:
        out["sep"] = (f"Fine-tuned without the middle [SEP], a model pretrained with it changes {_pts(ref['value'])} "
                      f"points, one pretrained without {_pts(nos['value'])}: {_pts(inter['value'])} points apart "
                      f"({_ci(inter)}; {LABELS[inter['decision']].lower()}).", inter["confidence"])
    moved = _pick(rows, question="sep", measure="representation", task="drop_sep_s1")
    cls = _pick(rows, question="sep", measure="representation", task="drop_sep_cls")
    if moved is not None and cls is not None and ref is not None:
        text, conf = out["sep"]
        out["sep"] = (text + f" Dropping [SEP] moves sentence 1's last-layer words {_share(moved['value_a'])} of the "
                      f"way to another input after pretraining with it, {_share(moved['value_b'])} without; [CLS] "
                      f"{_share(cls['value_a'])} and {_share(cls['value_b'])} ({LABELS[cls['decision']].lower()}).",
                      weakest([conf, moved["confidence"], cls["confidence"]]))
    learn = acc[(acc["role"] == "reference") & (acc["format"] == "pair") & (acc["pooling"] == "cls") & acc["frozen"]]
    if learn["step"].nunique() < 2:
        out["learning"] = ("Not measured: the config keeps no snapshots ([pretrain.train] snapshots).", "low")
    else:
        bits = []
        short = {"topic": "topic", "next": "is_next", "next_article": "coherence", "content_s1": "content",
                 "order_s1": "word order"}
        for task in short:
            t = learn[learn["task"] == task].sort_values("step")
            path = " → ".join(f"{a * 100:.0f}%" for a in t["accuracy"])
            bits.append(f"{short[task]} {path}")
        floor = ", ".join(f"{short[t]} {learn.loc[learn['task'] == t, 'chance'].iloc[0] * 100:.0f}%"
                          for t in short if (learn["task"] == t).any())
        bits.append(f"chance: {floor}")
        steps = "/".join(str(int(s)) for s in sorted(learn["step"].unique()))
        final = _pick(rows, question="learning", task="topic", step=int(learn["step"].max()))
        conf = final["confidence"] if final is not None else "low"
        lead = (f"Frozen [CLS] readouts at steps {steps}: " if learn["learnt"].any() else
                f"Cannot tell at this scale: [CLS]'s frozen readouts stay at chance through pretraining "
                f"(steps {steps}: ")
        out["learning"] = (lead + "; ".join(bits) + ("." if learn["learnt"].any() else ")."), conf)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the run

@dataclass
class WhyResult:
    out: Path
    predictions: pd.DataFrame
    rows: pd.DataFrame
    accuracy: pd.DataFrame
    answers: dict[str, tuple[str, str]]
    seconds: dict[str, float] = field(default_factory=dict)
    #: each model's representation shares (:func:`probing.study.why.representation.representation_rows`)
    shares: pd.DataFrame = field(default_factory=pd.DataFrame)


def pretraining_records(models: list[Model]) -> pd.DataFrame:
    """One row per finished run: variant, seed, steps, tokens seen, held-out MLM and pair accuracy, wall time."""
    rows = []
    for m in models:
        if m.step is not None:
            continue
        rec = json.loads((m.path / "training.json").read_text(encoding="utf-8"))
        h = rec["heldout"]
        rows.append({"role": m.role, "variant": rec["variant"]["name"], "seed": m.seed, "steps": rec["steps"],
                     "tokens_seen": rec["tokens_seen"], "mlm_accuracy": h["mlm_accuracy"],
                     "mlm_loss": h["mlm_loss"], "unigram_entropy": h["unigram_entropy"],
                     "pair_accuracy": h.get("pair_accuracy", float("nan")), "wall_seconds": rec["wall_seconds"],
                     "device": rec["device_name"], "threads": rec["torch_threads"]})
    return pd.DataFrame(rows)


__all__ += ["accuracy_table", "answers", "predictions", "pretraining_records", "display"]
