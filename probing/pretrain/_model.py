"""The models pretrained here: transformers' BERT with its pretraining heads, the pair head reading [CLS] where the
variant puts it, and the files a run writes.

``BertForPreTraining`` (MLM + a sentence-pair head, for ``mlm+nsp`` and ``mlm+sop``) or ``BertForMaskedLM``
(``mlm``). Their own forward passes are not used: :func:`pretraining_logits` runs the encoder, the MLM head on
the masked positions only (a 4,000-word decoder on every position would cost more than the encoder of a tiny
model) and the pair head on the hidden state of the [CLS] token at ``cls_index``: BERT's pooler (dense + tanh)
applied to that token, which for ``cls_position = "first"`` is exactly ``BertPooler`` (it reads position 0).

A run directory holds the base ``BertModel`` (``config.json`` + ``model.safetensors``, with the pooler, so
``AutoModel.from_pretrained`` reports no missing keys) and the tokenizer, as any Hugging Face model directory,
plus ``heads.safetensors`` (the MLM transform and bias, the pair classifier; the decoder is the word embeddings,
tied). With ``cls_position = "last"`` the saved pooler holds the weights the pair head applied to the last token;
``BertModel``'s ``pooler_output`` applies them to position 0, which is not what was trained. An ``mlm`` model's
pooler is never trained: it keeps its seeded initialisation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._config import ModelConfig, Variant
from ._data import Batch

__all__ = ["HEADS_FILE", "build_model", "load_pretraining_model", "pretraining_logits", "save_model_dir"]

HEADS_FILE = "heads.safetensors"


def bert_config(arch: ModelConfig, variant: Variant, tokenizer):
    from transformers import BertConfig

    return BertConfig(vocab_size=len(tokenizer), hidden_size=arch.hidden, num_hidden_layers=arch.layers,
                      num_attention_heads=arch.heads, intermediate_size=arch.intermediate,
                      max_position_embeddings=arch.max_length, type_vocab_size=2 if variant.segments else 1,
                      hidden_dropout_prob=arch.dropout, attention_probs_dropout_prob=arch.dropout,
                      initializer_range=arch.initializer_range,
                      pad_token_id=int(tokenizer.pad_token_id))


def build_model(arch: ModelConfig, variant: Variant, tokenizer, seed: int):
    """A freshly initialised pretraining model; the initialisation is drawn from ``torch.manual_seed(seed)``
    (the global generator, whose state then drives dropout and is saved with every checkpoint)."""
    from transformers import BertForMaskedLM, BertForPreTraining

    config = bert_config(arch, variant, tokenizer)
    torch.manual_seed(seed)
    model = BertForPreTraining(config) if variant.pair_head else BertForMaskedLM(config)
    return model


def pretraining_logits(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLM logits ``(n_masked, vocab)`` at the positions where ``batch.labels != -100`` (row-major order), and the
    pair head's logits ``(batch, 2)`` read at ``batch.cls_index`` (None for an ``mlm`` model). The positions come
    laid out (``batch.masked``): on a GPU no step waits for a mask's size."""
    seq = model.bert(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     token_type_ids=batch.token_type_ids).last_hidden_state
    mlm = model.cls.predictions(seq.flatten(0, 1)[batch.masked])
    if not hasattr(model.cls, "seq_relationship"):
        return mlm, None
    pooler = model.bert.pooler
    cls = seq[torch.arange(seq.shape[0], device=seq.device), batch.cls_index]
    return mlm, model.cls.seq_relationship(pooler.activation(pooler.dense(cls)))


def base_model(model, seed: int):
    """The encoder as a ``BertModel`` with a pooler: the model's own, or (``mlm``) one whose pooler keeps a
    seeded initialisation."""
    from transformers import BertModel

    if model.bert.pooler is not None:
        return model.bert
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base = BertModel(model.config)
    missing, unexpected = base.load_state_dict(model.bert.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("pooler.") for k in missing), (missing, unexpected)
    return base


def _heads_state(model) -> dict[str, torch.Tensor]:
    state = model.cls.state_dict()
    # the decoder's weight is the word-embedding table and its bias predictions.bias (both tied)
    return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()
            if not k.startswith("predictions.decoder.")}


def save_model_dir(model, tokenizer, directory: Path, seed: int) -> None:
    """Write the Hugging Face model directory (base model in safetensors, tokenizer) and ``heads.safetensors``."""
    from safetensors.torch import save_file

    base = base_model(model, seed)
    base.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    save_file(_heads_state(model), str(directory / HEADS_FILE), metadata={"architecture": type(model).__name__})


def load_pretraining_model(directory: str | Path, device: str | torch.device = "cpu"):
    """The pretraining model of a finished run (``BertForPreTraining`` or ``BertForMaskedLM`` with the saved
    heads) and its tokenizer, in eval mode: to evaluate the heads again, or to train further."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForPreTraining, BertModel

    directory = Path(directory)
    config = BertConfig.from_pretrained(directory)
    with safe_open(str(directory / HEADS_FILE), framework="pt") as f:
        arch = (f.metadata() or {}).get("architecture")
    cls = {"BertForPreTraining": BertForPreTraining, "BertForMaskedLM": BertForMaskedLM}.get(arch)
    if cls is None:
        raise ValueError(f"{str(directory / HEADS_FILE)!r} names architecture {arch!r}; expected BertForPreTraining "
                         f"or BertForMaskedLM")
    model = cls(config)
    base = BertModel.from_pretrained(directory, use_safetensors=True)
    own = model.bert.state_dict()
    model.bert.load_state_dict({k: v for k, v in base.state_dict().items() if k in own})
    missing, unexpected = model.cls.load_state_dict(load_file(str(directory / HEADS_FILE)), strict=False)
    assert not unexpected and all(k.startswith("predictions.decoder.") for k in missing), (missing, unexpected)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), use_fast=True)
    return model.to(device).eval(), tokenizer
