"""Pretrain BERT-architecture encoders from scratch on offline text, one choice changed at a time.

A frozen model shows what one pretraining produced; pretraining again with one thing changed shows what that
thing causes. A config (TOML, :func:`load_config`) names the text (BBC News, the Penn Treebank, your files),
a preset size, seeds and the variants: the objective (``mlm``, ``mlm+nsp``, ``mlm+sop``), where [CLS] sits
(``first``, ``last``), whether a [SEP] separates the segments, whether segment embeddings are used. Every run
writes an ordinary Hugging Face model directory (``probing.models.load_model(DIR)``, ``--model DIR`` in every
command) with ``training.json`` beside it. The command::

    python -m probing.pretrain CONFIG [--preset tiny] [--train-seeds 0,1,2] [--out DIR]

docs/PRETRAIN.md describes the keys, the presets and the files.
"""

from ._cli import main
from ._config import (CLS_POSITIONS, OBJECTIVES, PRESETS, SOURCES, ConfigError, CorpusConfig, ModelConfig,
                      PretrainConfig, RunConfig, TrainConfig, Variant, check_config, load_config, parse_config)
from ._data import Corpus, Document, pretraining_format, pretraining_template, read_corpus
from ._model import HEADS_FILE, load_pretraining_model
from ._train import RUN_RECORD, TRAINING_RECORD, evaluate, pretrain, run_dir

__all__ = [
    "CLS_POSITIONS", "Corpus", "ConfigError", "CorpusConfig", "Document", "HEADS_FILE", "ModelConfig", "OBJECTIVES",
    "PRESETS", "PretrainConfig", "RUN_RECORD", "RunConfig", "SOURCES", "TRAINING_RECORD", "TrainConfig", "Variant",
    "check_config", "evaluate", "load_config", "load_pretraining_model", "main", "parse_config", "pretrain",
    "pretraining_format", "pretraining_template", "read_corpus", "run_dir",
]
