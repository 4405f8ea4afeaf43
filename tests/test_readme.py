"""The ```python blocks of the README and of the docs they point to run as they stand, in order, in one
namespace per file, from an empty directory; and no document or source file dates a number by an internal
work counter instead of a commit and a date."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The files whose Python blocks are examples to run (docs/CHANGES.md holds none: it is history).
DOCS_WITH_BLOCKS = ("README.md", "docs/EXTRACTION.md", "docs/ANALYSES.md", "docs/STUDY.md")
#: A number's origin is a commit and a date, not a work counter ("session" and a number; the pattern of
#: git grep -E "sessions? [0-9]")
WORK_COUNTER = re.compile(r"\bsessions? [0-9]", re.IGNORECASE)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def run_blocks(name: str) -> dict:
    namespace: dict = {}
    for i, block in enumerate(python_blocks((ROOT / name).read_text(encoding="utf-8"))):
        exec(compile(block, f"{name} python block {i + 1}", "exec"), namespace)
    return namespace


def test_python_blocks_are_found():
    for name in DOCS_WITH_BLOCKS:
        blocks = python_blocks((ROOT / name).read_text(encoding="utf-8"))
        assert len(blocks) >= 1 and all(b.strip() for b in blocks), name
    assert python_blocks("```python\nx = 1\n```\n```bash\nls\n```\n") == ["x = 1\n"]


def test_readme_has_the_answers_section():
    """The README's answers at a glance are the regenerated report's, word for word: one line per question."""
    text = README.read_text(encoding="utf-8")
    assert "\n## Answers at a glance\n" in text and "docs/seed_questions/report.md" in text
    glance = text[text.index("\n## Answers at a glance\n"):]
    glance = glance[:glance.index("\n## ", 5)]
    report = (ROOT / "docs" / "seed_questions" / "report.md").read_text(encoding="utf-8")
    page = report[report.index("## Answers\n"):report.index("\n## Q1.")]
    answers = re.findall(r"^- \*\*(Q\d)\. .+\*\*  \n  (.+)$", glance, flags=re.M)
    assert [q for q, _ in answers] == [f"Q{i}" for i in range(1, 9)], answers
    for q, answer in answers:
        assert f"\n{answer}\n" in page, (q, answer)


@pytest.mark.pretrained
def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks("README.md")
    assert namespace["same"].path == namespace["pair"].path
    drift = namespace["drift_table"].query("metric == 'drift_mean'")
    assert set(drift["layer"]) == {6} and len(drift) >= 3
    assert np.isfinite(drift["value"]).all() and (drift["ci_low"] <= drift["ci_high"]).all()
    probes = namespace["probe_table"]
    assert set(probes["choice"]) >= {"cls", "mean"} and len(probes) > 0


@pytest.mark.pretrained
def test_extraction_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks("docs/EXTRACTION.md")
    # the cache block: 50 examples' [CLS] at layer 6 of the default model, and one drift per aligned token
    assert namespace["X"].shape == (50, 384)
    drift = namespace["drift"]
    assert drift.shape == (len(namespace["ra"]),) and len(drift) > 50
    assert np.isfinite(drift).all() and (drift > -1e-6).all() and (drift < 2).all()


@pytest.mark.pretrained
def test_analyses_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks("docs/ANALYSES.md")
    assert list(namespace["mine"].examples["sentence_1"]) == ["The cat sat.", "Rain fell."]


def test_study_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no study here: the block defines design_effect and finds no tables
    design_effect = run_blocks("docs/STUDY.md")["design_effect"]
    # items in groups of their own: no clustering, a design effect of exactly 1
    assert design_effect([0.3, -1.2, 2.0, 0.5, -0.1], ["a", "b", "c", "d", "e"]) == pytest.approx(1.0)
    # two documents whose items agree within each: the mean's variance is 3 times the independent one's
    assert design_effect([1, 1, -1, -1], ["a", "a", "b", "b"]) == pytest.approx(3.0)


def test_no_work_counter_in_docs_or_code():
    """Every kind of text the project writes: docs, configs, code comments and docstrings, tests."""
    skip = {"caches", "runs", "build", "dist", "__pycache__"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix not in {".md", ".py", ".toml", ".sh", ".cfg", ".txt"} and name != "Makefile":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if WORK_COUNTER.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "cite a commit and a date instead:\n" + "\n".join(found)


def test_the_bad_input_paragraph_is_checked_against_the_tests():
    """docs/EXTRACTION.md's paragraph of what is refused (the README points to it) names only refusals the
    tests hold: each kind of input it lists has a case in tests/test_bad_input.py's matrix, each spelling of a
    missing cell it quotes is one the loader refuses, and each test file it cites exists."""
    from probing.examples import MISSING_TEXT

    from .test_bad_input import CASES

    doc = (ROOT / "docs" / "EXTRACTION.md").read_text(encoding="utf-8")
    para = doc[doc.index("Bad input of every command"):]
    para = para[:para.index("\n\n")]
    ids = [c[0] for c in CASES]
    listed = {"a missing or malformed corpus file": "corpus-missing-file", "more or fewer fields": "corpus-short-row",
              "unknown format": "format-unknown-name",
              "role": "roles-unknown", "layer": "layers-out-of-range", "device": "device-unknown",
              "dtype": "dtype-unknown", "an `--out` that cannot be written": "out-through-a-file",
              "a directory that is not a cache": "cka-not-a-cache"}
    for words, case in listed.items():
        assert words in para and case in ids, (words, case)
    for spelling in re.findall(r"`([^`]+)`", para[para.index("spells as missing"):para.index("what pandas")]):
        assert spelling in MISSING_TEXT, spelling
    for cited in re.findall(r"`(tests/[a-z_]+\.py)`", para):
        assert (ROOT / cited).is_file(), cited
