"""Fine-tuning (Q8) on the toolkit's one collation and forward pass (probing.forward), and the bf16
mixed-precision option: fp32 runs give the predictions and losses of the code before the move, the
option runs the forward in bfloat16 with float32 weights, and it is part of the result's key."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import analyses.finetune._train as FT
from analyses.finetune import PooledClassifier, experiment_config, finetune, get_pooling, pooling_mask, training_inputs
from analyses.finetune._config import PRESETS, TrainConfig, native_bfloat16, preset_config, resolve_autocast
from probing.examples import Example
from probing.formats import Format

from .test_pooling import _render, keyword_examples, one_thread, tiny

FIXTURES = (one_thread, tiny)  # one torch thread for every test (autouse); the tiny random-init BERT

#: One run per pooling: 64 keyword examples, seed 1, 6 epochs of batch 8 (42 steps), evaluation in
#: batches of 5.
PINNED = dict(seed=1, epochs=6, batch_size=8, lr=3e-3, head_lr=1e-2, max_train=10_000, device="cpu",
              preset="quick", eval_batch_size=5)
#: Test predictions, first and last step loss and the sum of the 42 step losses of PINNED, recorded
#: with the code of commit e207821 (its own _collate and encoder call, before fine-tuning moved onto
#: probing.forward.collate / last_hidden): the fp32 path must give the same run.
BEFORE = {
    "mean": ([1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0], 0.695117, 0.402012, 25.05805),
    "max": ([1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0], 0.701536, 0.338175, 25.57441),
}


@pytest.mark.parametrize("pooling", sorted(BEFORE))
def test_fp32_run_is_the_run_before_the_move(tiny, pooling):
    pred, first, last, total = BEFORE[pooling]
    r = finetune(keyword_examples(64), "kind", model=tiny, pooling=pooling, **PINNED)
    assert r["test_pred"].tolist() == pred
    assert len(r["train_loss_steps"]) == 42
    assert r["train_loss_steps"][0] == pytest.approx(first, abs=2e-6)
    assert r["train_loss_steps"][-1] == pytest.approx(last, abs=2e-6)
    assert sum(r["train_loss_steps"]) == pytest.approx(total, abs=1e-4)


def test_training_inputs_are_the_toolkits_collation(bert_tokenizer, tiny):
    """The classifier's batch is probing.forward.collate's, the pooling mask is over its padded length,
    and the logits equal the head on the explicitly pooled last layer."""
    ex = [Example("a", ("The cat sat on the mat.", "It purred loudly.")), Example("b", ("Hi.", "Yo."))]
    rendered = _render(bert_tokenizer, ex)
    p = get_pooling("mean")
    inputs, mask = training_inputs(rendered, tiny, p, torch.device("cpu"))
    assert set(inputs.tensors) == {"input_ids", "attention_mask", "token_type_ids"}
    np.testing.assert_array_equal(mask.numpy(), pooling_mask(rendered, p, inputs.T))
    old = FT._collate(rendered, p, bert_tokenizer.pad_token_id, torch.device("cpu"))
    for k, v in inputs.tensors.items():
        assert torch.equal(v, old[k]), k
    clf = PooledClassifier(tiny.model, p, 3, tiny.hidden_size).eval()
    with torch.no_grad():
        h = tiny.model(**inputs.tensors).last_hidden_state
        ref = clf.head((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True))
        torch.testing.assert_close(clf(inputs, mask), ref, rtol=1e-5, atol=1e-6)


def test_autocast_runs_the_forward_in_bfloat16_with_float32_weights(tiny, monkeypatch):
    seen = []
    forward = PooledClassifier.forward

    def spy(self, inputs, pool_mask):
        logits = forward(self, inputs, pool_mask)
        seen.append((logits.dtype, {p.dtype for p in self.parameters()}))
        return logits

    monkeypatch.setattr(PooledClassifier, "forward", spy)
    kw = {**PINNED, "epochs": 1}
    fp32 = finetune(keyword_examples(32), "kind", model=tiny, pooling="mean", **kw)
    assert {d for d, _ in seen} == {torch.float32}
    seen.clear()
    bf16 = finetune(keyword_examples(32), "kind", model=tiny, pooling="mean", autocast=True, **kw)
    assert {d for d, _ in seen} == {torch.bfloat16}  # training and evaluation
    assert all(w == {torch.float32} for _, w in seen)  # master weights stay float32
    assert np.isfinite(bf16["train_loss_steps"]).all()
    assert bf16["train_loss_steps"] != fp32["train_loss_steps"]
    assert bf16["train_loss_steps"][0] == pytest.approx(fp32["train_loss_steps"][0], abs=0.02)


def test_autocast_is_an_option_of_the_config_and_the_result_key(tiny):
    assert preset_config("quick", autocast=False).autocast is False
    assert preset_config("full").autocast is False  # the GPU preset: fp32 unless asked
    with pytest.raises(ValueError, match="autocast"):
        TrainConfig(autocast="yes")
    ex = keyword_examples(8)
    keys = [experiment_config(tiny, ex, "kind", Format.parse("pair"), ["mean"], [0],
                              preset_config("quick", autocast=a)) for a in (False, True)]
    assert keys[0]["train"]["autocast"] is False and keys[1]["train"]["autocast"] is True
    assert all(PRESETS[p]["train"].get("autocast", False) in (False, True, "auto") for p in PRESETS)
    assert preset_config("default").autocast == "auto"  # the study's preset: bfloat16 only where it is native


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(False, False, False), (True, False, True),
                                                        (False, True, True)])
def test_auto_autocast_is_on_only_where_the_cpu_computes_bfloat16(monkeypatch, avx512_bf16, amx, expected):
    """On a CPU without AVX512-BF16 or AMX, bfloat16 autocast made a fine-tuning step 14x slower than float32:
    "auto" leaves it off there; True and False are kept as given."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert native_bfloat16("cpu") is expected
    assert resolve_autocast(TrainConfig(autocast="auto"), torch.device("cpu")).autocast is expected
    for explicit in (True, False):
        assert resolve_autocast(TrainConfig(autocast=explicit), "cpu").autocast is explicit
    assert native_bfloat16("meta") is False  # neither CPU nor CUDA: float32


def test_auto_autocast_is_decided_before_the_result_key(tiny, tmp_path, monkeypatch):
    """run_pooling_experiment keys and runs with the decided value: the stored result of an "auto" run on a
    CPU without native bfloat16 is the float32 run's, and the forward passes ran in float32."""
    from analyses.finetune import run_pooling_experiment

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    seen = []
    forward = PooledClassifier.forward

    def spy(self, inputs, pool_mask):
        logits = forward(self, inputs, pool_mask)
        seen.append(logits.dtype)
        return logits

    monkeypatch.setattr(PooledClassifier, "forward", spy)
    kw = dict(model=tiny, out=tmp_path, progress=False, device="cpu", preset="quick", epochs=1, max_train=12)
    ex = keyword_examples(24)
    auto = run_pooling_experiment(ex, "kind", "mean", "0", autocast="auto", **kw)
    assert seen and set(seen) == {torch.float32}
    fp32 = run_pooling_experiment(ex, "kind", "mean", "0", autocast=False, **kw)
    assert fp32.attrs["reused"] is True and fp32.attrs["result_path"] == auto.attrs["result_path"]
    seen.clear()
    bf16 = run_pooling_experiment(ex, "kind", "mean", "0", autocast=True, **kw)
    assert not bf16.attrs.get("reused") and set(seen) == {torch.bfloat16}


def test_rng_streams_give_each_run_its_own_seeded_sequence_whatever_the_interleaving():
    """Two runs' draws interleaved through RngStreams are the draws each run makes alone from
    torch.manual_seed(seed); the caller's generator state is left as it was."""
    def alone(seed, n):
        g = torch.Generator().manual_seed(seed)
        return [torch.rand(3, generator=g) for _ in range(n)]

    torch.manual_seed(123)
    caller = torch.get_rng_state()
    streams = FT.RngStreams()
    a, b = streams.stream(0), streams.stream(7)
    got = {0: [], 7: []}
    for s, stream in [(0, a), (7, b), (7, b), (0, a), (7, b), (0, a)]:
        with stream.turn():
            got[s].append(torch.rand(3))
    for seed in (0, 7):
        for x, y in zip(got[seed], alone(seed, 3)):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), caller)


def test_concurrent_fine_tuning_runs_equal_one_at_a_time(tiny):
    """Q8 with two CPU workers (runs side by side, dropout on) gives the table and predictions of one
    worker and of the default (runs one at a time, no workers), run by run: each run draws its own
    random stream."""
    from analyses.finetune import run_pooling_experiment

    from .test_pooling import keyword_examples

    assert tiny.model.config.hidden_dropout_prob > 0  # dropout draws random numbers in every forward pass
    kw = dict(model=tiny, progress=False, with_predictions=True, epochs=2, batch_size=8, lr=1e-3, max_length=None,
              device="cpu", preset="quick", folds=3, run_folds=3, max_train=10_000)
    ex = keyword_examples(36)
    one, p1 = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0, 1], num_threads=1, **kw)
    two, p2 = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0, 1], num_threads=2, **kw)
    alone, p0 = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0, 1], **kw)  # one at a time (one_thread)
    cols = [c for c in one.columns if c != "seconds"]
    for df, pred in ((two, p2), (alone, p0)):
        pd.testing.assert_frame_equal(p1, pred)
        pd.testing.assert_frame_equal(one[cols], df[cols])
    other, _ = run_pooling_experiment(ex, "kind", ["cls", "mean"], [2, 3], num_threads=2, **kw)

    def losses(df):
        return df[df.metric == "train_loss_epoch"]["value"].to_numpy()

    assert not np.array_equal(losses(one), losses(other))  # other seeds: other draws


def test_each_run_hands_its_freed_memory_back_after_it_is_freed(tiny, monkeypatch):
    import gc
    import weakref

    import analyses.finetune._train as F

    copies, seen = [], []
    real_deepcopy = F.copy.deepcopy

    def tracked(obj, *a, **k):
        out = real_deepcopy(obj, *a, **k)
        if isinstance(out, torch.nn.Module):
            copies.append(weakref.ref(out))
        return out

    def hand_back():
        gc.collect()
        seen.append([c() is None for c in copies])  # the run's model copy is gone when pages are handed back

    monkeypatch.setattr(F.copy, "deepcopy", tracked)
    monkeypatch.setattr(F, "hand_back_freed", hand_back)
    finetune(keyword_examples(32), "kind", model=tiny, pooling="mean", **{**PINNED, "epochs": 1})
    finetune(keyword_examples(32), "kind", model=tiny, pooling="cls", **{**PINNED, "epochs": 1})
    assert len(seen) == 2 and all(s and all(s) for s in seen)


def test_activation_checkpointing_is_the_same_run_with_layers_recomputed(tiny):
    """checkpoint_every recomputes each (every second) layer in the backward pass (its forward runs twice
    per training step) and gives the very same run: predictions and every step's loss, dropout on."""
    assert tiny.model.config.hidden_dropout_prob > 0
    calls = []
    # a module inside the layer: the layer's own hooks stay outside the checkpoint, its parts' run again
    assert tiny.model.config.num_hidden_layers == 2
    calls = {0: [], 1: []}
    hooks = [tiny.model.encoder.layer[i].intermediate.register_forward_hook(lambda *a, i=i: calls[i].append(1))
             for i in (0, 1)]
    runs = {}
    try:
        for every in (0, 1, 2):
            runs[every] = finetune(keyword_examples(64), "kind", model=tiny, pooling="mean", checkpoint_every=every,
                                   **PINNED)
            runs[every]["calls"] = [len(calls[0]), len(calls[1])]
            calls[0].clear(), calls[1].clear()
    finally:
        for h in hooks:
            h.remove()
    assert runs[0]["calls"] == [42 + 3, 42 + 3]  # 42 training steps, 3 evaluation batches of 5 (14 test items)
    assert runs[1]["calls"] == [2 * 42 + 3, 2 * 42 + 3]  # each layer again in each backward pass
    assert sorted(runs[2]["calls"]) == [42 + 3, 2 * 42 + 3]  # one of the two layers recomputed
    for every in (1, 2):
        assert runs[every]["test_pred"].tolist() == runs[0]["test_pred"].tolist() == BEFORE["mean"][0]
        assert runs[every]["train_loss_steps"] == runs[0]["train_loss_steps"]  # exactly
    assert not getattr(tiny.model, "is_gradient_checkpointing", False)  # only the run's copy was changed
    for bad in (True, -1, 1.5):
        with pytest.raises(ValueError, match="checkpoint_every"):
            TrainConfig(checkpoint_every=bad)
    assert preset_config("default").checkpoint_every == 0
    assert preset_config("full").checkpoint_every == 0
    assert preset_config("default", checkpoint_every=2).checkpoint_every == 2


def test_activation_checkpointing_with_concurrent_runs_equals_one_at_a_time(tiny):
    """Two workers, checkpointed: each backward pass replays its run's dropout from its own stream."""
    from analyses.finetune import run_pooling_experiment

    kw = dict(model=tiny, progress=False, with_predictions=True, epochs=2, batch_size=8, lr=1e-3, max_length=None,
              device="cpu", preset="quick", folds=3, run_folds=2, max_train=10_000)
    ex = keyword_examples(36)
    alone, p0 = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0, 1], **kw)
    two, p2 = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0, 1], num_threads=2,
                                     checkpoint_every=1, **kw)
    cols = [c for c in alone.columns if c != "seconds"]
    pd.testing.assert_frame_equal(p0, p2)
    pd.testing.assert_frame_equal(alone[cols], two[cols])


def test_a_model_without_checkpointing_is_refused(tiny):
    class Plain(torch.nn.Module):
        supports_gradient_checkpointing = False

    with pytest.raises(ValueError, match="does not support activation checkpointing; set checkpoint_every=0"):
        FT._checkpoint(Plain(), "plain", 1)


def test_checkpointing_every_second_layer_falls_back_to_every_layer_on_older_transformers():
    """A model without transformers 5's activation_checkpointing_enable: every layer, with a warning."""
    seen = []

    class Old(torch.nn.Module):
        supports_gradient_checkpointing = True

        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"use_cache": True})()

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            seen.append(gradient_checkpointing_kwargs)

    old = Old()
    with pytest.warns(RuntimeWarning, match="checkpointing every layer"):
        FT._checkpoint(old, "old", 2)
    assert seen == [{"use_reentrant": False}] and old.config.use_cache is False
