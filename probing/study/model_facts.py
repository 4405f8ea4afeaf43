"""What the report may say about a model: how it was trained, so what its [CLS]/[SEP] findings mean.

:data:`MODEL_FACTS` is the one declaration, keyed by the model's name without its organisation
(``sentence-transformers/all-MiniLM-L6-v2`` and ``all-MiniLM-L6-v2`` are the same entry),
lower-cased. A model not listed (a local path, a random-init test model) gets a neutral sentence
that claims nothing about its training, unless it is a directory written by ``probing.pretrain``, whose
``training.json`` records how it was pretrained (:func:`pretrained_here`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: The checkpoint a claim about BERT's own [CLS]/[SEP] needs, named in every caveat.
BERT_CHECKPOINT = "bert-base-uncased"


@dataclass(frozen=True)
class ModelFacts:
    """``description``: what the model is, one clause; ``nsp``: pre-trained with next-sentence
    prediction (the objective that trains BERT's [CLS]); ``pooling``: the pooling it was trained to
    produce sentence vectors with (None: not a sentence encoder)."""

    description: str
    nsp: bool
    pooling: str | None = None


def _bert(what: str) -> ModelFacts:
    return ModelFacts(f"{what}, pre-trained with masked language modelling and next-sentence prediction on [CLS]",
                      nsp=True)


MODEL_FACTS: dict[str, ModelFacts] = {
    "all-minilm-l6-v2": ModelFacts(
        "a sentence encoder (6-layer BERT architecture, distilled from MiniLM) fine-tuned with mean pooling "
        "and a contrastive objective on sentence pairs, never with next-sentence prediction", nsp=False,
        pooling="mean"),
    "all-mpnet-base-v2": ModelFacts(
        "a sentence encoder (MPNet) fine-tuned with mean pooling and a contrastive objective, never with "
        "next-sentence prediction", nsp=False, pooling="mean"),
    "bert-base-uncased": _bert("BERT-base (12 layers)"),
    "bert-base-cased": _bert("BERT-base, cased (12 layers)"),
    "bert-large-uncased": _bert("BERT-large (24 layers)"),
    "roberta-base": ModelFacts(
        "RoBERTa-base, pre-trained with masked language modelling only (no next-sentence prediction; <s> plays "
        "[CLS]'s part)", nsp=False),
}


def model_facts(name: str | None) -> ModelFacts | None:
    """The facts of ``name`` (a Hugging Face id, alias or path), or None for an unknown model.

    >>> model_facts("sentence-transformers/all-MiniLM-L6-v2").pooling
    'mean'
    >>> model_facts("/tmp/my-model") is None
    True
    """
    if not name:
        return None
    return pretrained_here(name) or MODEL_FACTS.get(PurePosixPath(str(name).replace("\\", "/")).name.lower())


#: The pretraining objectives in words (``probing.pretrain``'s ``[variant] objective``).
_OBJECTIVES = {"mlm": "masked language modelling alone", "mlm+nsp": "masked language modelling and next-sentence "
               "prediction on [CLS]", "mlm+sop": "masked language modelling and sentence-order prediction on [CLS]"}


def pretrained_here(name: str) -> ModelFacts | None:
    """The facts of a model directory written by ``python -m probing.pretrain`` (its ``training.json``), or None
    for any other name."""
    record = Path(str(name)) / "training.json"
    try:
        r = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
        if r is None:
            return None
        v, m, held = r["variant"], r["model"], r["heldout"]
        layout = (f"[CLS] {v['cls_position']}, {'a' if v['sep'] else 'no'} [SEP] between the segments, "
                  f"{'with' if v['segments'] else 'without'} segment embeddings")
        scores = f"held-out MLM accuracy {held['mlm_accuracy']:.2f}"
        if "pair_accuracy" in held:
            scores += f", sentence-pair accuracy {held['pair_accuracy']:.2f}"
        text = (f"a BERT-architecture encoder pretrained here (`probing.pretrain`, the `{r['preset']}` preset: "
                f"{m['layers']} layers, hidden {m['hidden']}, {r['tokens_seen']:,} training tokens, seed {r['seed']}) "
                f"with {_OBJECTIVES.get(v['objective'], v['objective'])}; {layout}; {scores}")
        if r["preset"] != "base":
            text += "; a small stand-in for BERT, not BERT itself"
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not a record this version can read: claim nothing
    return ModelFacts(text, nsp=v["objective"] == "mlm+nsp")


def model_sentence(name: str) -> str:
    """What the model is, for the top of the report."""
    facts = model_facts(name)
    if facts is None:
        return (f"Model: {name}. This report has no record of how it was trained; read its [CLS]/[SEP] findings "
                "as facts about this model only.")
    s = f"Model: {name}, {facts.description}."
    if not facts.nsp:
        s += (f" What its [CLS] and [SEP] do is not evidence about BERT's: for BERT, run the same config with "
              f"{HOW_TO_RUN_BERT}.")
    return s


#: How a reader runs a study on BERT itself, said once: a Hugging Face id needs a download (or a local copy).
HOW_TO_RUN_BERT = (f"`--model {BERT_CHECKPOINT}` (downloaded from the Hugging Face hub on first use, or a local "
                   f"directory holding a copy) or with a BERT pretrained here with next-sentence prediction "
                   f"(`python -m probing.pretrain`, docs/PRETRAIN.md)")


def cls_caveat(name: str) -> str:
    """The caveat a section that makes [CLS]/[SEP] claims repeats; empty for an NSP-trained BERT."""
    facts = model_facts(name)
    if facts is None:
        return (f"These [CLS]/[SEP] findings are about {name}; how it was trained decides whether they carry over "
                "to another model.")
    if facts.nsp:
        return ""
    return (f"These [CLS]/[SEP] findings are about {name}, which was never trained with next-sentence prediction; "
            "they do not carry over to BERT (the model line at the top says how to run BERT).")
