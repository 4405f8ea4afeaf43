"""One command-line vocabulary (docs/CLI.md): every command's parser is built and checked for the
forbidden synonyms, ``--no-progress`` on the long-running ones, and a rendered help without ``%%``."""

from __future__ import annotations

import argparse
import re

import pytest

#: module with a ``main(argv)`` -> whether its work is long (it must take --no-progress).
COMMANDS: dict[str, bool] = {
    "probing.extract": True, "probing.study.runner": True, "probing.study.across": False,
    "analyses.drift": True, "analyses.cka": True, "analyses.probes": True, "analyses.attention": True,
    "analyses.contextuality": True, "analyses.neighbours": True, "analyses.paired": True,
    "analyses.interventions": True, "analyses.finetune": True, "probing.pretrain": True, "analyses.calibration": True,
    "probing.study.why": True,
    "figures.drift": False, "figures.cka": False, "figures.probes": False, "figures.attention": False,
    "figures.pooling": False, "figures.contextuality": False, "figures.interventions": False,
}
#: Options replaced by the vocabulary -> what replaces them.
FORBIDDEN: dict[str, str] = {
    "--label": "--targets", "--target": "--targets", "--choice": "--choices", "--role": "--choices",
    "--roles": "--choices (only extraction keeps --roles)", "--n-splits": "--folds", "--split-seed": "--seed",
    "--debiased": "--metrics linear_cka_debiased", "--layer": "--layers", "--metric": "--metrics",
    "--seeds": "--train-seeds",
}
#: Where an option of FORBIDDEN is the vocabulary's own word.
ALLOWED = {("probing.extract", "--roles")}


from probing.study.cli_reference import parsers  # noqa: E402


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_every_console_command_is_checked():
    from probing.study.console import COMMANDS as CONSOLE

    checked = {"probing.study" if m == "probing.study.runner" else m for m in COMMANDS}
    reached = {m for m, _ in CONSOLE.values()} - {"figures.__main__"}
    assert reached <= checked, f"commands the vocabulary test misses: {sorted(reached - checked)}"


@pytest.mark.parametrize("module", list(COMMANDS))
def test_command_follows_the_vocabulary(module):
    found = parsers(module)
    for name, parser in found.items():
        opts = options(parser)
        bad = {o: FORBIDDEN[o] for o in opts if o in FORBIDDEN and (module, o) not in ALLOWED}
        assert not bad, f"{name} uses {bad} (old option -> the vocabulary's)"
        rendered = parser.format_help()
        assert "%%" not in rendered and "%(" not in rendered, f"{name}: rendered help shows a %% or %("
        if COMMANDS[module] and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            assert "--no-progress" in opts, f"{name} is long-running but has no --no-progress"


def test_the_checks_can_fail():
    """The checks above catch a parser that breaks the vocabulary."""
    from probing.cli import ArgumentParser

    p = ArgumentParser(prog="bad", description="95%% of it")
    p.add_argument("--layer")
    p.add_argument("--debiased", action="store_true")
    assert {"--layer", "--debiased"} <= options(p) and set(FORBIDDEN) & options(p) == {"--layer", "--debiased"}
    assert "%%" in p.format_help()


def test_interventions_has_both_subcommands_checked():
    found = parsers("analyses.interventions")
    assert set(found) == {"analyses.interventions", "analyses.interventions knockout",
                          "analyses.interventions patching"}
    knockout = options(found["analyses.interventions knockout"])
    assert {"--choices", "--targets", "--layers", "--folds", "--no-progress"} <= knockout


def test_docs_cli_is_generated_from_the_parsers():
    """docs/CLI.md's command reference is what the parsers say now (regenerate it with
    ``python -m probing.study.cli_reference``)."""
    from probing.study.cli_reference import DOC, updated_doc

    text = DOC.read_text(encoding="utf-8")
    assert updated_doc(text) == text, "docs/CLI.md is out of date: python -m probing.study.cli_reference"


def test_docs_cli_lists_every_command_and_option():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "CLI.md").read_text(encoding="utf-8")
    for module in COMMANDS:
        shown = "probing.study" if module == "probing.study.runner" else module
        assert f"python -m {shown}" in doc, module
        for name, parser in parsers(module).items():
            for opt in options(parser) - {"-h", "--help"}:
                assert re.search(rf"`{re.escape(opt)}\b", doc), f"docs/CLI.md does not mention {opt} of {name}"
