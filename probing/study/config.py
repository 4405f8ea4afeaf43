"""The study config: one declared schema, checked before any work.

A study config is a TOML file of tables ``[study]``, ``[model]``, ``[corpus]``, ``[extract]``, ``[probes]``,
``[finetune]``, ``[segments]`` and ``[papers]``, and a ``[quick]`` table of dotted keys that ``--quick`` applies.
Each table
is one frozen dataclass below, and each of its fields declares its type, default and range
(:func:`setting`). :func:`load_config` checks every key and value against them: the file's, the ``[quick]``
table's (also when ``--quick`` is not given, so a typo there is found on a full run) and the command
line's overrides, before a corpus is loaded or a model touched. A misspelt key or a value of the wrong type
fails in a second with the key, the value and what was expected, not after minutes of extraction.
Everything downstream reads the typed object (``cfg.study.bootstrap_resamples``), never a nested dict.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from analyses.stats import MIN_RESAMPLES

from .legacy_questions import QUESTION_SECTIONS
from .questions import QUESTIONS as NEW_QUESTIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


class StudyError(ValueError):
    """A study config is malformed."""


#: The study configs shipped inside the package (package data), found by name.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "seed_questions"
QUESTIONS = tuple(dict.fromkeys([*QUESTION_SECTIONS, *NEW_QUESTIONS]))
#: The fewest bootstrap resamples a study may ask for (:data:`analyses.stats.MIN_RESAMPLES`, the one floor):
#: below it a 95% percentile interval rests on a handful of draws in each tail.
MIN_BOOTSTRAP_RESAMPLES = MIN_RESAMPLES


def section_specs() -> dict:
    """Every declared section by key: the questions Q1-Q8 (a :class:`probing.study.questions.Question` where a
    question module answers it, else the :class:`probing.study.sections.StudySection` of
    :mod:`probing.study.legacy_questions`), then the paper reproductions."""
    from .reproductions import PAPERS

    return {**{k: NEW_QUESTIONS.get(k, QUESTION_SECTIONS.get(k)) for k in QUESTIONS}, **PAPERS}


def sections() -> tuple[str, ...]:
    """Every section a study can hold: the questions Q1-Q8, then the paper reproductions."""
    return tuple(section_specs())


# ---------------------------------------------------------------------------------------------------
# Declaring a field


def setting(default: Any, *, ge: float | None = None, gt: float | None = None, nonempty: bool = False,
            choices: Callable[[], Any] | None = None, check: Callable[[Any], None] | None = None,
            expect: str | None = None) -> Any:
    """A config field: its default, and what a value must be beyond its type. ``ge``/``gt``: a lower bound
    (of each element, for a list); ``nonempty``: a string or list may not be empty; ``choices``: a function
    giving the allowed values (called when checking, so the registries load only then); ``check``: a
    function raising ValueError with the reason a (typed) value is refused; ``expect``: what to say a
    value must be, where the type and bounds do not say it."""
    given = {"ge": ge, "gt": gt, "nonempty": nonempty, "choices": choices, "check": check, "expect": expect}
    meta = {k: v for k, v in given.items() if v is not None and v is not False}
    return field(default=default, metadata=meta)


def _device_name(value: str) -> None:
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        raise ValueError("expected 'auto', 'cpu', 'cuda' or 'cuda:N' (or 'mps')")


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


def _presets():
    from analyses.finetune import PRESETS

    return tuple(PRESETS)


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
    device: str = setting("auto", check=_device_name)


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
    groups: str = setting("generated:n=100,k=4,pairing=consecutive", check=_corpus_spec)
    swap: str = setting("generated:n=200,k=2,seed=1,swap=1", check=_corpus_spec)
    # the paper reproductions (probing.study.reproductions)
    sentences: str = setting("generated:n=300,k=1", check=_corpus_spec)
    paragraphs: str = setting("generated:n=100,k=4,pairing=consecutive", check=_corpus_spec)
    swap_sentences: str = setting("generated:n=300,k=1,seed=1,swap=1", check=_corpus_spec)

    def specs(self) -> dict[str, str]:
        """Corpus key -> spec, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
    """``[finetune]``: Q8's fine-tuning experiment (:func:`analyses.pooling.run_pooling_experiment`)."""

    preset: str = setting("default", choices=_presets)
    label: str = setting("topic", nonempty=True)
    poolings: tuple[str, ...] = setting(("cls", "mean", "max", "sep1", "first_word"), nonempty=True,
                                        check=_poolings)
    seeds: tuple[int, ...] = setting((0, 1, 2), ge=0, nonempty=True)


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
    ``finetune_formats`` the formats it is fine-tuned in (``control``: a comma where each inner [SEP] was)."""

    ks: tuple[int, ...] = setting((2, 3, 5), ge=2, nonempty=True, check=_segment_ks)
    layer: int = setting(-1)
    donor_share: float = setting(0.15, check=_share)
    finetune_k: int = setting(4, ge=2)
    finetune_formats: tuple[str, ...] = setting(("multi", "concat", "control"), nonempty=True,
                                                check=_segment_formats)


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
                           "segments": SegmentSettings, "papers": PaperSettings}


@dataclass(frozen=True)
class StudyConfig:
    """A checked study config (:func:`load_config`); ``quick``: whether the ``[quick]`` table was applied."""

    study: StudySettings = field(default_factory=StudySettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    extract: ExtractSettings = field(default_factory=ExtractSettings)
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
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


# ---------------------------------------------------------------------------------------------------
# Checking values against the declared types


class _Refused(Exception):
    """A value is not what its field declares; ``reason`` says what was expected."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_TYPE_WORDS = {bool: ("true or false", "true or false values"), int: ("an integer", "integers"),
               float: ("a number", "numbers"), str: ("a string", "strings")}


def _optional(hint: Any) -> Any | None:
    """The ``X`` of ``X | None``, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return None


def _bounds(meta: Mapping[str, Any]) -> str:
    return "".join(f" {op} {meta[k]:g}" for k, op in (("ge", ">="), ("gt", ">")) if k in meta)


def expected(hint: Any, meta: Mapping[str, Any]) -> str:
    """What a value of a field must be, in words: ``'an integer >= 100'``, ``'a non-empty list of numbers > 0'``."""
    if "expect" in meta:
        return meta["expect"]
    inner = _optional(hint)
    if inner is not None:
        return expected(inner, meta) + " (or leave the key out)"
    choices = f" among {', '.join(map(repr, meta['choices']()))}" if "choices" in meta else ""
    if typing.get_origin(hint) is tuple:
        words = _TYPE_WORDS[typing.get_args(hint)[0]][1]
        return f"a {'non-empty ' if meta.get('nonempty') else ''}list of {words}{_bounds(meta)}{choices}"
    if choices:
        return f"one of {', '.join(map(repr, meta['choices']()))}"
    word = _TYPE_WORDS[hint][0]
    if hint is str and meta.get("nonempty"):
        word = "a non-empty string"
    return word + _bounds(meta)


def _scalar(value: Any, hint: type, meta: Mapping[str, Any]) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        value = int(value) if ok else value
    elif hint is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if ok and hint in (int, float):
        ok = value >= meta.get("ge", -math.inf) and value > meta.get("gt", -math.inf)
    if ok and "choices" in meta:
        ok = value in meta["choices"]()
    if not ok:
        raise _Refused("expected " + expected(meta.get("_hint", hint), meta))
    return value


def check_value(value: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` as the field of type ``hint`` holds it (a list as a tuple, an integer as a float where a number
    is declared), or :class:`_Refused` with the reason."""
    meta = {**meta, "_hint": hint}
    inner = _optional(hint)
    if inner is not None:
        if value is None:
            return None
        hint = inner
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)) or (meta.get("nonempty") and not value):
            raise _Refused("expected " + expected(meta["_hint"], meta))
        value = tuple(_scalar(v, typing.get_args(hint)[0], meta) for v in value)
    else:
        value = _scalar(value, hint, meta)
        if hint is str and meta.get("nonempty") and not value.strip():
            raise _Refused("expected " + expected(meta["_hint"], meta))
    if "check" in meta:
        try:
            meta["check"](value)
        except ValueError as err:
            raise _Refused(str(err)) from None
    return value


def _fields(section: str) -> dict[str, Any]:
    cls = SCHEMA[section]
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in fields(cls)}


def dotted_keys() -> list[str]:
    """Every ``section.key`` of the schema."""
    return [f"{s}.{f.name}" for s, cls in SCHEMA.items() for f in fields(cls)]


def suggestion(dotted: str) -> str:
    """``'; did you mean probes.folds?'`` for ``probes.fold``, or ``''``. Tried in turn: a key of the same table
    that differs by a letter or two, the same key in another table (``extract.device`` -> ``study.device``), a
    less close key of the same table, a close key anywhere."""
    section, _, key = dotted.rpartition(".")
    own = [k for k in dotted_keys() if k.startswith(f"{section}.")]
    close = (difflib.get_close_matches(dotted, own, n=1, cutoff=0.8)
             or [k for k in dotted_keys() if k.endswith(f".{key}")][:1]
             or difflib.get_close_matches(dotted, own, n=1) or difflib.get_close_matches(dotted, dotted_keys(), n=1))
    return f"; did you mean {close[0]}?" if close else ""


def _unknown_key(dotted: str, where: str) -> StudyError:
    hint = suggestion(dotted)
    section = dotted.partition(".")[0]
    if not hint and section in SCHEMA:
        hint = f"; known: {', '.join(_fields(section))}"
    return StudyError(f"config: {where}unknown key {dotted}{hint}")


def _checked(section: str, key: str, value: Any, where: str) -> Any:
    hint, meta = _fields(section)[key]
    try:
        return check_value(value, hint, meta)
    except _Refused as refused:
        raise StudyError(f"config: {where}{section}.{key} = {value!r}: {refused.reason}") from None


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
    raise StudyError(f"config {str(config)!r} is neither a file nor a packaged config; "
                     f"packaged: {', '.join(packaged_configs())}")


def _tables(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The file's tables, every section and key checked against :data:`SCHEMA` (unknown ones refused with a
    suggestion)."""
    out: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        if section not in SCHEMA:
            close = difflib.get_close_matches(section, [*SCHEMA, "quick"], n=1)
            raise StudyError(f"config: unknown section [{section}]"
                             + (f"; did you mean [{close[0]}]?" if close else "")
                             + f"; known: {', '.join(SCHEMA)}, quick")
        if not isinstance(values, dict):
            raise StudyError(f"config: {section} = {values!r}: expected a table [{section}]")
        for key, value in values.items():
            if key not in _fields(section):
                raise _unknown_key(f"{section}.{key}", "")
            out.setdefault(section, {})[key] = _checked(section, key, value, "")
    return out


def _dotted(values: Mapping[str, Any], where: str) -> dict[tuple[str, str], Any]:
    """Dotted ``section.key`` overrides, each key and value checked as a file's."""
    out = {}
    for dotted, value in values.items():
        section, _, key = str(dotted).partition(".")
        if section not in SCHEMA or key not in _fields(section):
            raise _unknown_key(str(dotted), where)
        out[(section, key)] = _checked(section, key, value, where)
    return out


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
    tables = _tables(raw)
    later = _dotted(quick_table, "[quick] ")
    if not quick:
        later = {}
    later.update(_dotted(overrides or {}, "override "))
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
