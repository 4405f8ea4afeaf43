"""The README's ```python blocks run as they stand, in order, in one namespace, from an empty directory."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_python_blocks_are_found():
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 1 and all(b.strip() for b in blocks)
    assert python_blocks("```python\nx = 1\n```\n```bash\nls\n```\n") == ["x = 1\n"]


@pytest.mark.pretrained
def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(python_blocks(README.read_text(encoding="utf-8"))):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    # the cache block: 50 examples' [CLS] at layer 6 of the default model, and one drift per aligned token
    assert namespace["X"].shape == (50, 384)
    drift = namespace["drift"]
    assert drift.shape == (len(namespace["ra"]),) and len(drift) > 50
    assert np.isfinite(drift).all() and (drift > -1e-6).all() and (drift < 2).all()
