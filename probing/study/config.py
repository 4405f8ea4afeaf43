"""The study config: one declared schema, checked before any work.

A study config is a TOML file of tables ``[study]``, ``[model]``, ``[corpus]``, ``[extract]``, ``[probes]``,
``[finetune]``, ``[recovery]``, ``[segments]`` and ``[papers]``, and a ``[quick]`` table of dotted keys that
``--quick`` applies. Each table
is one frozen dataclass below, and each of its fields declares its type, default and range
(:func:`probing.schema.setting`, the one schema mechanism, pretraining's config too). :func:`load_config` checks
every key and value against them (:class:`probing.schema.Schema`): the file's, the ``[quick]``
table's (also when ``--quick`` is not given, so a typo there is found on a full run) and the command
line's overrides, before a corpus is loaded or a model touched. A misspelt key or a value of the wrong type
fails in a second with the key, the value and what was expected, not after minutes of extraction.
Everything downstream reads the typed object (``cfg.study.bootstrap_resamples``), never a nested dict.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from analyses.stats import MIN_RESAMPLES

from ..schema import Schema, device_name, setting
from .errors import StudyError
from .questions import QUESTIONS as NEW_QUESTIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


#: The study configs shipped inside the package (package data), found by name.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "seed_questions"
QUESTIONS = tuple(NEW_QUESTIONS)
#: The fewest bootstrap resamples a study may ask for (:data:`analyses.stats.MIN_RESAMPLES`, the one floor):
#: below it a 95% percentile interval rests on a handful of draws in each tail.
MIN_BOOTSTRAP_RESAMPLES = MIN_RESAMPLES


def section_specs() -> dict:
    """Every declared section by key: the questions Q1-Q8 (each a :class:`probing.study.questions.Question`
    of its module), then the paper reproductions."""
    from .reproductions import PAPERS

    return {**NEW_QUESTIONS, **PAPERS}


def sections() -> tuple[str, ...]:
    """Every section a study can hold: the questions Q1-Q8, then the paper reproductions."""
    return tuple(section_specs())


# ---------------------------------------------------------------------------------------------------
# Checks of single fields (the types and ranges are declared with probing.schema.setting)


def _resamples(value: int) -> None:
    from analyses.stats import too_few_resamples

    problem = too_few_resamples(value)
    if problem is not None:  # the one wording of this refusal, the command lines' too
        raise ValueError(problem)


def _corpus_spec(value: str) -> None:
    from ..corpora import parse_corpus_spec

    parse_corpus_spec(value)


def _template(value: str) -> None:
    from ..formats import Format

    Format.parse(f"custom={value}")  # as a template, whatever it looks like


def _poolings(value: tuple[str, ...]) -> None:
    from analyses.finetune import get_pooling

    for name in value:
        get_pooling(name)


def _positions(value: tuple[str, ...]) -> None:
    _distinct(value)
    if "first" not in value or len(value) < 2:
        raise ValueError(f"expected 'first' (the reference) and at least one other position, got {list(value)}")


def _questions(value: tuple[str, ...]) -> None:
    known = sections()
    bad = [q for q in value if q not in known]
    if bad:
        close = [m for q in bad for m in difflib.get_close_matches(q, known, n=1)]
        raise ValueError(f"unknown questions {bad}; known: {', '.join(known)}"
                         + (f"; did you mean {', '.join(close)}?" if close else ""))


def _dtypes():
    from ..models import DTYPES

    return tuple(DTYPES)


def _negatives():
    from analyses.finetune import NEGATIVES

    return NEGATIVES


def _presets():
    from analyses.finetune import PRESETS, PROTOCOL_PRESETS

    return tuple(p for p in PROTOCOL_PRESETS if p in PRESETS)


def _distinct(value: tuple) -> None:
    if len(set(value)) != len(value):
        raise ValueError(f"expected distinct values, got {list(value)}")


# ---------------------------------------------------------------------------------------------------
# The schema: one dataclass per table


@dataclass(frozen=True)
class StudySettings:
    """``[study]``: what runs and where. ``device`` is the one device of extraction, probes and fine-tuning
    (:func:`probing.models.pick_device`; the study's ``--device``); ``seed`` every random choice of the
    analyses (splits, bootstrap, pairs, the knockout control's draws, fine-tuning's splits)."""

    name: str = setting("study", nonempty=True)
    out: str = setting("runs/study", nonempty=True)
    caches: str = setting("caches", nonempty=True)
    seed: int = setting(0, ge=0)
    bootstrap_resamples: int = setting(1000, check=_resamples, expect=f"an integer >= {MIN_BOOTSTRAP_RESAMPLES}")
    questions: tuple[str, ...] = setting(QUESTIONS, nonempty=True, check=_questions)
    title: str | None = setting(None)
    device: str = setting("auto", check=device_name)
    threads: int | None = setting(None, ge=1)


@dataclass(frozen=True)
class ModelSettings:
    """``[model]``: the encoder (a Hugging Face id or a local path; unset: the packaged default) and its
    random-init baseline. ``trust_remote_code`` comes from the command line only (:func:`load_config`)."""

    name: str | None = setting(None, nonempty=True)
    random_init_baseline: bool = setting(True)
    random_init_seed: int = setting(0, ge=0)
    trust_remote_code: bool = setting(False)


@dataclass(frozen=True)
class CorpusSettings:
    """``[corpus]``: one corpus spec (:mod:`probing.corpora`) per role; a section reads the ones it names."""

    pairs: str = setting("generated:n=200,k=2", check=_corpus_spec)
    # the same kind of pairs with next-sentence negatives from the same article (Q4: coherence, not topic)
    pairs_article: str = setting("generated:n=200,k=2,negatives=same_article", check=_corpus_spec)
    groups: str = setting("generated:n=100,k=4,pairing=consecutive", check=_corpus_spec)
    swap: str = setting("generated:n=200,k=2,seed=1,swap=1", check=_corpus_spec)
    # sentences that replace sentence 2 of the pairs (Q1's yardstick, Q2's interchange): one-sentence examples
    # with topic and doc labels; only those of articles the pairs do not hold are used
    replacements: str = setting("generated:n=300,k=1,seed=7", check=_corpus_spec)
    # the paper reproductions (probing.study.reproductions)
    sentences: str = setting("generated:n=300,k=1", check=_corpus_spec)
    paragraphs: str = setting("generated:n=100,k=4,pairing=consecutive", check=_corpus_spec)
    swap_sentences: str = setting("generated:n=300,k=1,seed=1,swap=1", check=_corpus_spec)

    # examples of the pairs (whole documents, seeded) that the derived corpora hold: two words swapped, sentence 2
    # replaced (probing.study.questions._common); unset: every example
    derived_examples: int | None = setting(None, ge=2)

    def specs(self) -> dict[str, str]:
        """Corpus key -> spec, in declaration order (the corpus specs only, not ``derived_examples``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("check") is _corpus_spec}


@dataclass(frozen=True)
class ExtractSettings:
    """``[extract]``: how hidden states are computed (the device is ``[study] device``)."""

    dtype: str = setting("float32", choices=_dtypes)
    batch_tokens: int | None = setting(None, ge=1)


@dataclass(frozen=True)
class ProbeSettings:
    """``[probes]``: the linear probes (:func:`analyses.probes.run_probes`)."""

    folds: int = setting(5, ge=2)
    vocab: int = setting(50, ge=1)
    max_tokens: int = setting(6000, ge=1)
    Cs: tuple[float, ...] = setting((1e-3, 1e-2, 1e-1, 1.0, 10.0), gt=0, nonempty=True)
    inner_splits: int = setting(3, ge=2)
    max_iter: int = setting(1000, ge=1)
    bow_Cs: tuple[float, ...] | None = setting(None, gt=0, nonempty=True)


@dataclass(frozen=True)
class FinetuneSettings:
    """``[finetune]``: the questions' shared fine-tuning protocol (:func:`analyses.finetune.run_protocol`):
    ``preset`` its training settings (:data:`analyses.finetune.PROTOCOL_PRESETS`), ``seeds`` the training seeds
    of every run (the seed is a unit of the intervals), ``poolings`` Q8's poolings on each of its tasks,
    ``learning_curve`` the training sizes of Q8's learning curve below the whole training split (sizes the
    split does not exceed are left out), ``pooling_tasks`` the shared tasks Q8 fine-tunes on (``next``,
    ``topic``), ``negatives`` where the ``next`` task's negatives take sentence 2 from
    (:data:`analyses.finetune.NEGATIVES`: ``other_topic`` as in BERT's next-sentence prediction, ``same_topic`` for
    coherence alone), ``next_poolings`` Q8's poolings on ``next`` when they differ from ``poolings`` (empty: the
    same), ``format_tasks`` the shared tasks Q1 and Q6 fine-tune in each of their formats (the answer reads the
    first one both formats learnt), ``positions`` the classification token's positions Q6 fine-tunes (``first``,
    ``middle``, ``last``; ``first`` is the reference). ``label`` is the target of the pooling experiment of
    :func:`analyses.finetune.run_pooling_experiment` (``python -m analyses.finetune``), which reads ``preset``,
    ``poolings`` and ``seeds`` too (its presets have the same names)."""

    preset: str = setting("default", choices=_presets)
    label: str = setting("topic", nonempty=True)
    poolings: tuple[str, ...] = setting(("cls", "mean", "sep1"), nonempty=True, check=_poolings)
    seeds: tuple[int, ...] = setting((0,), ge=0, nonempty=True, check=_distinct)
    learning_curve: tuple[int, ...] = setting((), ge=2, check=_distinct)
    pooling_tasks: tuple[str, ...] = setting(("next", "topic"), nonempty=True, choices=lambda: ("next", "topic"),
                                             check=_distinct)
    negatives: str = setting("other_topic", choices=_negatives)
    next_poolings: tuple[str, ...] = setting((), check=_poolings)
    format_tasks: tuple[str, ...] = setting(("next", "topic"), nonempty=True, choices=lambda: ("next", "topic"),
                                            check=_distinct)
    positions: tuple[str, ...] = setting(("first", "middle", "last"), nonempty=True,
                                         choices=lambda: ("first", "middle", "last"), check=_positions)


@dataclass(frozen=True)
class RecoverySettings:
    """``[recovery]``: Q7's decoders reading a sentence back from its vector (:mod:`analyses.recovery`, on the
    ``sentences`` corpus; folds and inner splits are ``[probes]``'s). ``vocab``: the content words a sentence's words
    are rebuilt over (the most frequent); ``pairs_per_sentence``: adjacent word pairs per sentence whose order is
    decoded."""

    vocab: int = setting(200, ge=1)
    pairs_per_sentence: int = setting(5, ge=1)


def _segment_ks(value: tuple[int, ...]) -> None:
    if len(set(value)) != len(value):
        raise ValueError(f"expected distinct numbers of sentences, got {list(value)}")


def _share(value: float) -> None:
    if not 0 < value < 1:
        raise ValueError("expected a share between 0 and 1 (exclusive)")


def _segment_formats(value: tuple[str, ...]) -> None:
    from analyses.sentence_content import SEGMENT_FORMATS

    bad = [v for v in value if v not in SEGMENT_FORMATS]
    if bad or len(set(value)) != len(value):
        raise ValueError(f"expected distinct formats among {', '.join(SEGMENT_FORMATS)}, got {list(value)}")


@dataclass(frozen=True)
class SegmentSettings:
    """``[segments]``: inputs of k sentences (Q3 and Q5), the first k sentences of the ``groups`` corpus's
    examples. ``ks``: the k of the frozen content readouts (the largest is also Q5's: its interchange and
    bertsum's per-sentence [CLS]); ``layer``: the layer they read (-1: the last); ``donor_share``: the share of
    each topic's documents held out of the items, whose sentences replace sentences (Q5's interchange, Q3's
    intruders); ``finetune_k``: sentences per example of Q3's fine-tuned intruder task, and
    ``finetune_formats`` the formats it is fine-tuned in (``control``: a comma where each inner [SEP] was);
    ``intruders``: where an intruder comes from, a held-out article of another topic (``other_topic``) or of the
    item's own topic (``same_topic``: coherence alone, which one epoch on a few hundred items does not teach)."""

    ks: tuple[int, ...] = setting((2, 3, 5), ge=2, nonempty=True, check=_segment_ks)
    layer: int = setting(-1)
    donor_share: float = setting(0.15, check=_share)
    finetune_k: int = setting(4, ge=2)
    finetune_formats: tuple[str, ...] = setting(("multi", "concat", "control"), nonempty=True,
                                                check=_segment_formats)
    intruders: str = setting("other_topic", choices=lambda: ("other_topic", "same_topic"))


@dataclass(frozen=True)
class PaperSettings:
    """``[papers]``: options of the paper reproductions (:mod:`probing.study.reproductions`)."""

    clark_format: str = setting("[CLS] {1} {2} [SEP] <1> {3} {4} [SEP]", nonempty=True, check=_template)
    min_contexts: int = setting(5, ge=2)
    max_contexts: int = setting(50, ge=2)
    label: str = setting("topic", nonempty=True)
    knn_k: int = setting(1, ge=1)


#: The tables of a config file, by name, and the dataclass of each (``[quick]`` is the dotted overrides).
SCHEMA: dict[str, type] = {"study": StudySettings, "model": ModelSettings, "corpus": CorpusSettings,
                           "extract": ExtractSettings, "probes": ProbeSettings, "finetune": FinetuneSettings,
                           "recovery": RecoverySettings, "segments": SegmentSettings, "papers": PaperSettings}


@dataclass(frozen=True)
class StudyConfig:
    """A checked study config (:func:`load_config`); ``quick``: whether the ``[quick]`` table was applied."""

    study: StudySettings = field(default_factory=StudySettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    extract: ExtractSettings = field(default_factory=ExtractSettings)
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    segments: SegmentSettings = field(default_factory=SegmentSettings)
    papers: PaperSettings = field(default_factory=PaperSettings)
    quick: bool = False

    def values(self) -> dict[str, dict[str, Any]]:
        """Table -> key -> value (lists as lists), every key of the schema, in declaration order."""
        return {name: {f.name: _plain(getattr(getattr(self, name), f.name)) for f in fields(cls)}
                for name, cls in SCHEMA.items()}

    def with_values(self, **dotted: Any) -> StudyConfig:
        """A copy with ``section.key`` values replaced, unchecked (for tests and callers that build one):
        ``cfg.with_values(**{"study.bootstrap_resamples": 300})``."""
        out = self
        for key, value in dotted.items():
            section, _, name = key.partition(".")
            out = replace(out, **{section: replace(getattr(out, section), **{name: value})})
        return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


#: The checker of a study config's tables (:mod:`probing.schema`): ``[quick]`` is read apart (dotted keys).
CHECKER = Schema(SCHEMA, StudyError, also=("quick",))


def dotted_keys() -> list[str]:
    """Every ``section.key`` of the schema."""
    return CHECKER.keys()


# ---------------------------------------------------------------------------------------------------
# Loading


def packaged_configs() -> list[str]:
    """Names of the configs shipped with the package, e.g. ``seed_questions``, ``clark2019_attention``."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def config_path(config: str | os.PathLike) -> Path:
    """A config argument -> its file: an existing path as given, else a packaged config's name
    (``seed_questions`` or ``seed_questions.toml``). Anything else is a StudyError listing the names."""
    path = Path(config)
    if path.is_file():
        return path
    name = path.name.removesuffix(".toml")
    if str(config) in (name, f"{name}.toml") and (CONFIG_DIR / f"{name}.toml").is_file():
        return CONFIG_DIR / f"{name}.toml"
    from probing.study.why.config import CONFIG_DIR as WHY_DIR

    if str(config) in (name, f"{name}.toml") and (WHY_DIR / f"{name}.toml").is_file():
        raise StudyError(f"{name!r} is the why study's config, which pretrains models: run "
                         f"python -m probing.study.why {name} (docs/WHY.md)")
    raise StudyError(f"config {str(config)!r} is neither a file nor a packaged config; "
                     f"packaged: {', '.join(packaged_configs())}")


def load_config(path: str | os.PathLike | None, quick: bool = False, overrides: Mapping[str, Any] | None = None,
                trust_remote_code: bool = False) -> StudyConfig:
    """Read a TOML study config over the schema's defaults; ``quick`` applies its ``[quick]`` table, then
    ``overrides`` (dotted keys: ``{"study.out": "runs/x"}``) apply. Every key and value is checked here,
    the ``[quick]`` table's whether or not ``quick`` is given; a bad one is a :class:`StudyError` naming it.

    ``path`` is a file or the name of a packaged config (:func:`config_path`). A model's own code runs
    only when ``trust_remote_code`` (the command line's ``--trust-remote-code``) is given: a config or
    override that sets ``model.trust_remote_code`` without it is a StudyError."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = config_path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise StudyError(f"config {path}: {err}") from None
    quick_table = raw.pop("quick", {})
    if not isinstance(quick_table, dict):
        raise StudyError(f"config: quick = {quick_table!r}: expected a table [quick] of \"section.key\" = value")
    tables = CHECKER.read(raw)
    later = CHECKER.dotted(quick_table, "[quick] ")
    if not quick:
        later = {}
    later.update(CHECKER.dotted(overrides or {}, "override "))
    for (section, key), value in later.items():
        tables.setdefault(section, {})[key] = value
    try:
        cfg = StudyConfig(**{s: SCHEMA[s](**tables.get(s, {})) for s in SCHEMA}, quick=quick)
    except TypeError as err:  # pragma: no cover - every key was checked against the schema above
        raise StudyError(f"config: {err}") from None
    if cfg.papers.max_contexts < cfg.papers.min_contexts:
        raise StudyError(f"config: papers.max_contexts = {cfg.papers.max_contexts}: expected an integer >= "
                         f"papers.min_contexts ({cfg.papers.min_contexts})")
    if cfg.model.trust_remote_code and not trust_remote_code:
        raise StudyError(f"config {str(path)!r} sets model.trust_remote_code = true: a model's own code runs only "
                         f"when you pass --trust-remote-code on the command line")
    return replace(cfg, model=replace(cfg.model, trust_remote_code=bool(trust_remote_code)))


# ---------------------------------------------------------------------------------------------------
# The resolved config, written beside the report

RESOLVED = "config.resolved.toml"


def toml_value(value: Any) -> str:
    """A config value in TOML syntax: ``true``, ``"text"``, ``[0.1, 1.0]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    return repr(value)


def resolved_lines(cfg: StudyConfig) -> list[str]:
    """``section.key = value`` (TOML syntax) for every key of ``cfg``; an unset key as ``section.key unset``."""
    return [f"{s}.{k} = {toml_value(v)}" if v is not None else f"{s}.{k} unset"
            for s, table in cfg.values().items() for k, v in table.items()]


def to_toml(cfg: StudyConfig, source: str = "") -> str:
    """``cfg`` as a TOML study config: :func:`load_config` of the text gives ``cfg`` back (with ``quick``
    False: the values already hold the ``[quick]`` table's). Unset keys are comments."""
    lines = [(f"# The resolved config of a study run{f' of {source}' if source else ''}: every key, after "
              f"{'its [quick] table and ' if cfg.quick else ''}the command line's overrides."),
             "# `python -m probing.study THIS_FILE` runs the same study again."]
    for section, table in cfg.values().items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {toml_value(v)}" if v is not None else f"# {k}: unset" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_resolved(cfg: StudyConfig, out: Path, source: str = "") -> Path:
    """Write ``<out>/config.resolved.toml`` (:func:`to_toml`); returns its path."""
    path = Path(out) / RESOLVED
    path.write_text(to_toml(cfg, source), encoding="utf-8")
    return path
