"""The study config is one declared schema (probing.study.config), checked before any work: every key's type
and range, unknown keys refused with a suggestion, the [quick] table and the command line's overrides checked the
same way; the resolved config recorded; one device and one seed reaching extraction, probes and fine-tuning."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import probing.study.runner as runner
from probing import schema
from probing.study import config as C
from probing.study.config import (SCHEMA, StudyConfig, StudyError, load_config, packaged_configs,
                                  to_toml, toml_value)


class Touched(Exception):
    """Work started: a corpus, a model or an extraction was asked for."""


@pytest.fixture()
def no_work(monkeypatch):
    """Loading a corpus or a model, or extracting, raises :class:`Touched` (and is counted)."""
    import probing.corpora
    import probing.extract
    import probing.models

    calls = []

    def touched(what):
        def fail(*args, **kwargs):
            calls.append(what)
            raise Touched(what)
        return fail

    monkeypatch.setattr(runner, "load_corpora", touched("load_corpora"))
    monkeypatch.setattr(probing.corpora, "load_corpus", touched("load_corpus"))
    monkeypatch.setattr(probing.models, "load_model", touched("load_model"))
    monkeypatch.setattr(probing.extract, "extract", touched("extract"))
    return calls


def _fields():
    for section, cls in SCHEMA.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            yield section, f.name, hints[f.name], f.metadata


def _base(hint):
    inner = schema.optional(hint)
    return inner if inner is not None else hint


#: A value outside each checked field's range, where a bound or a registry does not say it.
SPECIAL = {"study.device": "gpu", "study.questions": ["Q1", "Q9"], "corpus.pairs": "nosuch:n=3",
           "papers.clark_format": "[CLS] {1", "finetune.poolings": ["cls", "sep"], "study.bootstrap_resamples": 99,
           "segments.donor_share": 1.5, "finetune.next_poolings": ["cls", "sep"]}


def _wrong_type(hint):
    base = _base(hint)
    if typing.get_origin(base) is tuple:
        return "x" if typing.get_args(base)[0] is not str else 3
    return {bool: "yes", int: "many", float: "x", str: 5}[base]


def _out_of_range(section, name, hint, meta):
    key = f"{section}.{name}"
    if key in SPECIAL:
        return [SPECIAL[key]]
    if key.startswith("corpus."):
        return ["generated:n=x"]
    base = _base(hint)
    listed = typing.get_origin(base) is tuple
    out = []
    if "ge" in meta:
        out.append([meta["ge"] - 1] if listed else meta["ge"] - 1)
    if "gt" in meta:
        out.append([meta["gt"]] if listed else meta["gt"])
    if "choices" in meta:
        out.append("nonsense")
    if meta.get("nonempty"):
        out.append([] if listed else "")
    return out


BAD_VALUES = ([(f"{s}.{n}", _wrong_type(h), "type") for s, n, h, m in _fields()]
              + [(f"{s}.{n}", v, "range") for s, n, h, m in _fields() for v in _out_of_range(s, n, h, m)])


def _run_main(argv, capsys):
    code = runner.main(argv)
    return code, capsys.readouterr().err


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_every_field_is_checked_and_its_default_passes():
    """Each field of each table has a wrong-type case below, each bounded one an out-of-range case, and every
    default is a value its own field accepts (unchanged)."""
    assert {k for k, _, kind in BAD_VALUES if kind == "type"} == set(C.dotted_keys())
    for section, name, hint, meta in _fields():
        default = getattr(SCHEMA[section](), name)
        assert schema.check_value(default, hint, meta) == default, (section, name)
        if meta.keys() & {"ge", "gt", "choices", "check", "nonempty"}:
            assert any(k == f"{section}.{name}" for k, _, kind in BAD_VALUES if kind == "range"), (section, name)


@pytest.mark.parametrize("key, value, kind", BAD_VALUES, ids=[f"{k}-{kind}-{v!r}" for k, v, kind in BAD_VALUES])
def test_bad_value_is_refused_before_any_work(key, value, kind, tmp_path, no_work, capsys):
    section, _, name = key.partition(".")
    toml = tmp_path / "bad.toml"
    toml.write_text(f"[{section}]\n{name} = {toml_value(value)}\n")
    before = _files(tmp_path)
    code, err = _run_main([str(toml), "--out", str(tmp_path / "out"), "--caches", str(tmp_path / "caches")], capsys)
    assert code == 2, err
    first = err.splitlines()[0]
    assert first.startswith(f"error: config: {key} = {value!r}: "), first
    if kind == "type":
        assert ": expected " in first, first
    assert no_work == [] and _files(tmp_path) == before  # no corpus, no model, no out/ or caches/


def test_the_messages_name_the_key_the_value_and_what_was_expected():
    with pytest.raises(StudyError) as err:
        load_config(None, overrides={"study.bootstrap_resamples": "many"})
    assert str(err.value) == "config: override study.bootstrap_resamples = 'many': expected an integer >= 100"
    with pytest.raises(StudyError) as err:
        load_config(None, overrides={"probes.Cs": [0.1, -1.0]})
    assert str(err.value) == "config: override probes.Cs = [0.1, -1.0]: expected a non-empty list of numbers > 0"
    with pytest.raises(StudyError) as err:
        load_config(None, overrides={"study.questions": ["Q1", "Q9"]})
    assert str(err.value).startswith("config: override study.questions = ['Q1', 'Q9']: unknown questions ['Q9']; "
                                     "known: Q1, Q2")
    with pytest.raises(StudyError, match=r"^config: papers\.max_contexts = 3: expected an integer >= "
                                         r"papers\.min_contexts \(5\)$"):
        load_config(None, overrides={"papers.max_contexts": 3})


UNKNOWN_KEYS = [(s, n[:-1] if len(n) > 2 else n + "x", n) for s, n, _, _ in _fields()]


@pytest.mark.parametrize("section, bad, meant", UNKNOWN_KEYS, ids=[f"{s}.{b}" for s, b, _ in UNKNOWN_KEYS])
def test_unknown_key_is_refused_with_a_suggestion(section, bad, meant, tmp_path, no_work, capsys):
    toml = tmp_path / "typo.toml"
    toml.write_text(f"[{section}]\n{bad} = 1\n")
    code, err = _run_main([str(toml), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert err.splitlines()[0] == f"error: config: unknown key {section}.{bad}; did you mean {section}.{meant}?"
    assert no_work == [] and _files(tmp_path) == {"typo.toml"}


@pytest.mark.parametrize("text, first", [
    ("[probe]\nfolds = 3\n", "error: config: unknown section [probe]; did you mean [probes]?; known: study, model"),
    ("[extract]\ndevice = 'cpu'\n", "error: config: unknown key extract.device; did you mean study.device?"),
    ("study = 3\n", "error: config: study = 3: expected a table [study]"),
    ("[study]\ncolour = 'red'\n", "error: config: unknown key study.colour"),
])
def test_unknown_sections_and_moved_keys(text, first, tmp_path, no_work, capsys):
    toml = tmp_path / "c.toml"
    toml.write_text(text)
    code, err = _run_main([str(toml), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err.splitlines()[0].startswith(first), err
    assert no_work == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize("entry, first", [
    ('"probes.folds" = "five"', "error: config: [quick] probes.folds = 'five': expected an integer >= 2"),
    ('"probes.fold" = 3', "error: config: [quick] unknown key probes.fold; did you mean probes.folds?"),
    ('folds = 3', "error: config: [quick] unknown key folds; did you mean probes.folds?"),
    ('"study.bootstrap_resamples" = 20', ("error: config: [quick] study.bootstrap_resamples = 20: a 95% interval "
                                          "needs at least 100 resamples (5 of them outside it; fewer give an "
                                          "interval of no width that can exclude its own estimate)")),
])
def test_the_quick_table_is_checked_with_or_without_quick(entry, first, quick, tmp_path, no_work, capsys):
    """A typo in [quick] is found on a full run too, not only when --quick finally reads it."""
    toml = tmp_path / "c.toml"
    toml.write_text(f"[quick]\n{entry}\n")
    code, err = _run_main([str(toml), "--out", str(tmp_path / "out")] + (["--quick"] if quick else []), capsys)
    assert code == 2 and err.splitlines()[0] == first, err
    assert no_work == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, first", [
    (["--questions", "Q1,Q9"], "error: config: override study.questions = ['Q1', 'Q9']: unknown questions ['Q9']"),
    (["--questions", "Q1,Q"], "error: config: override study.questions = ['Q1', 'Q']: unknown questions ['Q']"),
    (["--device", "gpu"], "error: config: override study.device = 'gpu': expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    (["--model", ""], None),  # an empty --model is no override (the config's model)
])
def test_command_line_overrides_are_checked(args, first, tmp_path, no_work, capsys):
    code_err = None
    try:
        code_err = _run_main(["seed_questions", "--quick", "--out", str(tmp_path / "out"), *args], capsys)
    except Touched:
        assert first is None  # valid: work started
        return
    code, err = code_err
    assert code == 2 and err.splitlines()[0].startswith(first), err
    assert no_work == [] and not (tmp_path / "out").exists()


def test_a_device_that_is_not_here_is_refused_before_any_work(tmp_path, no_work, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    code, err = _run_main(["seed_questions", "--quick", "--device", "cuda", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err.splitlines()[0].startswith("error: --device 'cuda': CUDA is not available here"), err
    assert no_work == [] and not (tmp_path / "out").exists()


def test_a_valid_config_reaches_the_work(tmp_path, no_work, capsys):
    """The control of the tests above: with a valid config the same patches are hit, so "not called" there
    means the config was refused first."""
    with pytest.raises(Touched):
        runner.main(["seed_questions", "--quick", "--out", str(tmp_path / "out"), "--caches", str(tmp_path / "c")])
    assert no_work == ["load_corpora"]


# ---------------------------------------------------------------------------------------------------
# The packaged configs, the typed object and the resolved config


@pytest.mark.parametrize("name", packaged_configs())
@pytest.mark.parametrize("quick", [False, True])
def test_packaged_configs_load_and_round_trip(name, quick, tmp_path):
    cfg = load_config(name, quick=quick)
    assert isinstance(cfg, StudyConfig) and cfg.quick is quick
    assert cfg.study.bootstrap_resamples >= C.MIN_BOOTSTRAP_RESAMPLES and cfg.probes.folds >= 2
    written = tmp_path / "resolved.toml"
    written.write_text(to_toml(cfg, name))
    assert load_config(written) == dataclasses.replace(cfg, quick=False)  # every value, typed the same


def test_the_config_is_frozen_and_typed():
    cfg = load_config("seed_questions", quick=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.study.seed = 3
    assert cfg.probes.Cs == (0.1,) and cfg.finetune.poolings == ("cls", "mean") and cfg.finetune.seeds == (0,)
    assert load_config(None, overrides={"probes.Cs": [1, 10]}).probes.Cs == (1.0, 10.0)  # integers where numbers are
    assert cfg.with_values(**{"study.seed": 3}).study.seed == 3 and cfg.study.seed == 0


def test_every_section_reads_corpora_the_schema_declares():
    corpus_keys = {f.name for f in dataclasses.fields(C.CorpusSettings)}
    for key, spec in C.section_specs().items():
        assert set(spec.corpora) <= corpus_keys, key


def test_resolved_config_and_provenance():
    cfg = load_config("seed_questions", quick=True, overrides={"study.out": "runs/x"})
    prov = runner.config_provenance(cfg, "seed_questions.toml", {"study.out": "runs/x"})
    assert prov["config"] == ("seed_questions.toml with its [quick] table; overrides study.out = 'runs/x'; "
                              "resolved in config.resolved.toml")
    assert "study.bootstrap_resamples = 200; " in prov["resolved config"]
    assert "probes.Cs = [0.1]; " in prov["resolved config"] and "extract.batch_tokens unset" in prov["resolved config"]


@pytest.mark.slow
def test_the_study_writes_its_resolved_config(quick_study):
    """The session's --quick study writes config.resolved.toml (after [quick] and the overrides) and its
    report's provenance lists every resolved key."""
    first = quick_study["first_run"]
    resolved = load_config(first / "config.resolved.toml")
    assert resolved.study.bootstrap_resamples == 100 and resolved.study.name == "tiny"  # the [quick] value
    assert resolved.study.questions == tuple(runner.QUESTIONS) and resolved.probes.Cs == (0.1, 1.0)
    report = (first / "report.md").read_text()
    assert "- **resolved config**: study.name = \"tiny\"; " in report
    assert "study.bootstrap_resamples = 100" in report and "- **device**: cpu (study.device = 'auto')" in report
    # the third run of the fixture overrode the questions: the file says so
    assert load_config(quick_study["out"] / "config.resolved.toml").study.questions == ("Q2",)


# ---------------------------------------------------------------------------------------------------
# One device and one seed, from the config to extraction, probes and fine-tuning


def test_device_and_seed_reach_extraction_probes_and_finetuning(monkeypatch, tmp_path):
    import analyses.finetune
    import probing.extract
    import probing.models
    from probing.study.shared import probe_kw

    seen = {}
    monkeypatch.setattr(runner, "run_study", lambda config, **kw: seen.update(kw))
    assert runner.main(["seed_questions", "--quick", "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    cfg = load_config("seed_questions", quick=True, overrides={**seen["overrides"], "study.seed": 7,
                                                               "study.questions": ["Q1", "Q4"],
                                                               "model.random_init_baseline": False})
    assert cfg.study.device == "cpu"

    extracted = []

    def extract(examples, formats, **kw):
        extracted.append(kw)
        return [tmp_path / f"cache-{len(extracted)}-{i}" for i in range(len(formats))]

    monkeypatch.setattr(probing.extract, "extract", extract)
    monkeypatch.setattr(probing.models, "load_model", lambda *a, **kw: SimpleNamespace(n_layers=6))
    _, corpora, lm = runner.extract_all(cfg, log=lambda *a: None, progress=False)
    assert extracted and {kw["device"] for kw in extracted} == {"cpu"}
    # the probes of the paper reproductions take the study's device, seed and resamples
    kw = probe_kw(cfg, tmp_path)
    assert (kw["device"], kw["seed"], kw["n_resamples"], kw["n_splits"]) == ("cpu", 7, 200, cfg.probes.folds)
    # the fine-tuning stage: the device, the split's seed and every question's training seeds
    tuned = []
    monkeypatch.setattr(analyses.finetune, "run_protocol", lambda tasks, specs, **kw: tuned.append((specs, kw)))
    runner.finetune_all(cfg, corpora, lm, tmp_path, log=lambda *a: None, progress=False)
    (specs, kw), = tuned
    assert (kw["device"], kw["split_seed"]) == ("cpu", 7)
    assert {s.seed for s in specs if not s.frozen} == set(cfg.finetune.seeds)
