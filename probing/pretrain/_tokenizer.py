"""The WordPiece tokenizer a run set trains on its own text, saved as a fast BERT tokenizer.

Uncased, as bert-base-uncased: BERT's normaliser (lower-casing, accents kept as they are), BERT's
pre-tokeniser (whitespace and punctuation) and WordPiece (Schuster & Nakajima 2012; Wu et al. 2016) trained by
the ``tokenizers`` library, with the five special tokens [PAD] [UNK] [CLS] [SEP] [MASK] first (ids 0-4) and
every printable ASCII character in the alphabet, so ordinary English never becomes [UNK] whole words at a
time. The trainer chooses the same set of tokens on every run but may number tokens of equal count in a
different order; the ids are therefore assigned afterwards, by sorting the tokens, so that two runs on the same
text give the same tokenizer byte for byte (and the same weights).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Iterable

__all__ = ["SPECIAL_TOKENS", "TOKENIZER_RECORD", "load_tokenizer", "train_tokenizer"]

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: Beside the tokenizer files: what it was trained on (corpus fingerprint, vocabulary size).
TOKENIZER_RECORD = "pretrain_tokenizer.json"


def _backend(vocab: dict[str, int]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def train_tokenizer(sentences: Iterable[str], vocab_size: int, *, max_length: int):
    """A fast BERT tokenizer (transformers' ``BertTokenizerFast``) with a WordPiece vocabulary of at most
    ``vocab_size`` entries trained on ``sentences``; ``model_max_length`` = ``max_length``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizerFast

    draft = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    draft.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                  lowercase=True)
    draft.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                        initial_alphabet=sorted(set(string.printable.lower()) - set(string.whitespace)),
                                        continuing_subword_prefix="##", show_progress=False)
    draft.train_from_iterator(sentences, trainer)
    learned = sorted(set(draft.get_vocab()) - set(SPECIAL_TOKENS))
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *learned])}
    return BertTokenizerFast(tokenizer_object=_backend(vocab), do_lower_case=True, unk_token="[UNK]",
                             sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                             model_max_length=max_length)


def load_tokenizer(directory: str | Path):
    """The fast tokenizer saved in ``directory`` (``tokenizer.json``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), use_fast=True)


def read_record(directory: str | Path) -> dict | None:
    path = Path(directory) / TOKENIZER_RECORD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
