"""bfloat16 compute on the CPU: its states agree with float32 compute within the stated tolerance
(:data:`probing.models.BF16_TOLERANCE`), and its caches record the dtype and are keyed apart from float32 ones."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from probing.cache import Cache
from probing.extract import extract
from probing.models import BF16_TOLERANCE, relative_errors


def test_bfloat16_states_agree_with_float32_within_the_stated_tolerance(tmp_path, tiny_bert, examples):
    kw = dict(model=tiny_bert, out=tmp_path, roles="all", device="cpu", progress=False, log=lambda *a: None)
    (p32,) = extract(examples, ["pair"], dtype="float32", **kw)
    (p16,) = extract(examples, ["pair"], dtype="bfloat16", **kw)
    assert p32 != p16  # keyed apart: the dtype is part of the cache key
    a, b = Cache.open(p32), Cache.open(p16)
    assert (a.manifest["dtype"], b.manifest["dtype"]) == ("float32", "bfloat16")
    assert b.manifest["storage_dtype"] == "float16"
    assert a.tokens[["example", "position"]].equals(b.tokens[["example", "position"]])
    for layer in a.layers:
        x, y = a.states(layer), b.states(layer)
        err = relative_errors(x, y)
        assert np.median(err) <= BF16_TOLERANCE["median"] and err.max() <= BF16_TOLERANCE["max"], (layer, err.max())
        assert err.max() > 0  # bfloat16 really ran (float32 compute would agree exactly)


def test_relative_errors_fail_where_states_differ():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 16)).astype(np.float32)
    assert relative_errors(x, x).max() == 0
    y = x + 0.1 * rng.normal(size=x.shape).astype(np.float32)  # about 10% of each row's norm
    assert np.median(relative_errors(x, y)) > BF16_TOLERANCE["median"]


@pytest.mark.parametrize("native", [False, True])
def test_bfloat16_extraction_warns_where_the_cpu_has_no_bfloat16_hardware(tmp_path, tiny_bert, examples, monkeypatch,
                                                                          native):
    """On an AVX2-only CPU bfloat16 runs slower than float32 (a fine-tuning step took 14x as long): said, not
    refused."""
    import torch

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    kw = dict(model=tiny_bert, out=tmp_path, device="cpu", progress=False, log=lambda *a: None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        extract(examples[:4], ["pair"], dtype="bfloat16", **kw)
        extract(examples[:4], ["pair"], dtype="float32", **kw)
    slow = [w for w in seen if "neither AVX512-BF16 nor AMX" in str(w.message)]
    assert len(slow) == (0 if native else 1)  # bfloat16 only
