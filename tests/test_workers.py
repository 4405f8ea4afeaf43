"""Single-threaded CPU workers (probing.workers): extraction and batched probes give the same results
with one worker as with several, interventions included (each worker hooks its own model replica)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from analyses.probes import probe_many_results
from probing.cache import Cache
from probing.extract import extract
from probing.interventions import Intervention, Knockout, Patch
from probing.workers import cpu_workers, split, thread_map

QUIET = dict(progress=False, log=lambda *a: None)


def test_thread_map_keeps_order_runs_side_by_side_and_restores_torch_threads():
    before = torch.get_num_threads()
    seen_threads, inside = set(), []

    def work(x):
        seen_threads.add(threading.get_ident())
        inside.append(torch.get_num_threads())
        time.sleep(0.05 * (5 - x))  # later items finish first: the order must still be the input's
        return x * 10

    assert thread_map(work, range(5), workers=2) == [0, 10, 20, 30, 40]
    assert len(seen_threads) == 2
    assert inside == [1] * 5
    assert torch.get_num_threads() == before
    seen_threads.clear()
    assert thread_map(work, [1], workers=None) == [10]
    assert seen_threads == {threading.get_ident()}


def test_thread_map_passes_a_worker_error_on_and_still_restores_threads():
    before = torch.get_num_threads()

    def work(x):
        if x == 3:
            raise ValueError("item 3 is bad")
        return x

    with pytest.raises(ValueError, match="item 3 is bad"):
        thread_map(work, range(6), workers=2)
    assert torch.get_num_threads() == before


def test_split_and_worker_count():
    assert split([1, 2, 3, 4, 5], 2) == [[1, 4, 5], [2, 3]]
    assert split(list(range(9)), 3) == [[0, 5, 6], [1, 4, 7], [2, 3, 8]]
    assert split([1, 2], 5) == [[1], [2]]
    assert cpu_workers(3) == 3
    assert cpu_workers(None) == torch.get_num_threads()
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        cpu_workers(0)


def _extract(examples, lm, out, threads, **kw):
    (path,) = extract(examples, ["pair"], model=lm, out=out, roles="all", batch_tokens=40, max_batch=3,
                      num_threads=threads, **QUIET, **kw)
    return Cache.open(path)


def _same_cache(a: Cache, b: Cache) -> None:
    np.testing.assert_array_equal(a.states(), b.states())
    assert a.tokens.equals(b.tokens)
    if a.has_attention:
        np.testing.assert_array_equal(a.attention()[1], b.attention()[1])


@pytest.mark.parametrize("attention", [False, True])
def test_extraction_with_two_workers_equals_one(tmp_path, tiny_bert, examples, attention):
    one = _extract(examples, tiny_bert, tmp_path / "one", 1, attention=attention)
    two = _extract(examples, tiny_bert, tmp_path / "two", 2, attention=attention)
    assert len(np.unique(one.tokens["example"])) == len(examples)
    _same_cache(one, two)


def test_interventions_with_two_workers_equal_one(tmp_path, tiny_bert, examples):
    """Knockout and patch hooks are installed per batch: with two workers each runs its own replica (made
    once, used for every shard), and the caches equal the one-worker run's byte for byte (a shared model
    would mix the batches' hooks)."""
    (source,) = extract(examples, ["concat"], model=tiny_bert, out=tmp_path / "src", roles="all", **QUIET)
    iv = Intervention(knockouts=(Knockout("all", "sep", (1, 2)),), patches=(Patch("cls", 1, str(source)),))
    one = _extract(examples, tiny_bert, tmp_path / "one", 1, intervention=iv, attention_norm=True)
    two = _extract(examples, tiny_bert, tmp_path / "two", 2, intervention=iv, attention_norm=True, shard_mb=0.02)
    assert len(two.manifest["shards"]) > 1  # the replicas serve every shard
    _same_cache(one, two)
    np.testing.assert_array_equal(one.attention("norm")[1], two.attention("norm")[1])
    clean = _extract(examples, tiny_bert, tmp_path / "clean", 2)
    assert np.abs(clean.states(2) - two.states(2)).max() > 1e-4  # the intervention did act
    # the caller's model carries no hook afterwards
    blocks = tiny_bert.model.encoder.layer
    assert not any(b.attention.self._forward_pre_hooks for b in blocks)


def test_batched_probes_with_two_workers_equal_one():
    rng = np.random.default_rng(0)
    n, groups = 160, np.arange(160) // 2
    y = rng.integers(0, 3, n)
    feats = {(layer, c): (rng.normal(size=(n, 12)) + (0.3 * layer + 0.1 * c) * np.eye(3, 12)[y]).astype(np.float32)
             for layer in range(3) for c in range(2)}
    kw = dict(Cs=(0.01, 0.1, 1.0), inner_splits=2, control_types=groups, device="cpu")
    one = probe_many_results(feats, y, groups, num_threads=1, **kw)
    two = probe_many_results(feats, y, groups, num_threads=2, **kw)
    for k in feats:
        assert one[k].mean == pytest.approx(two[k].mean, abs=1e-9)
        np.testing.assert_array_equal(one[k].chosen_Cs, two[k].chosen_Cs)
        assert one[k].control_score == pytest.approx(two[k].control_score, abs=1e-9)


@pytest.mark.parametrize("module", ["probing.workers", "probing.study.stages"])
def test_doctests(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
