"""The CUDA code paths against the CPU: extraction (float32, bfloat16, float16, attention summaries, an
intervention), streaming drift/CKA, the batched probes, frozen and fine-tuned pooling. Skipped where
torch sees no GPU (CI); ``benchmarks/gpu_check.sh`` runs them on a GPU machine. The CKA paths on CUDA
are in tests/test_cka.py (its ``DEVICES``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from analyses.probes import probe_many_results
from analyses.drift import stream_compare
from probing.cache import Cache
from probing.extract import extract
from probing.interventions import Intervention
from probing.models import BF16_TOLERANCE, prepare_model, relative_errors

from .conftest import make_tiny_bert, sample_examples

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: float32 on the GPU (cuBLAS, SDPA kernels, other summation orders, padding to a multiple of 8) against
#: float32 on the CPU: per-row relative error of a hidden state. TF32 is off by default in torch.
FP32_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def small_bert(bert_tokenizer):
    """Wider than the tiny model (hidden 128, 4 layers) so the GPU's matrix kernels really tile."""
    model = make_tiny_bert(bert_tokenizer, seed=3, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=512, max_position_embeddings=128)
    return prepare_model(model, bert_tokenizer, name="small-bert")


def _extract(lm, examples, tmp_path, device, dtype="float32", **kw):
    (path,) = extract(examples, ["pair"], model=lm, out=tmp_path / f"{device}-{dtype}", roles="all", device=device,
                      dtype=dtype, progress=False, log=lambda *a: None, **kw)
    return Cache.open(path)


def _same_rows(a: Cache, b: Cache) -> None:
    assert a.tokens[["example", "position", "role"]].equals(b.tokens[["example", "position", "role"]])


@pytest.mark.parametrize("which", ["tiny_bert", "small_bert"])
def test_float32_states_on_the_gpu_equal_the_cpus(tmp_path, request, which, examples):
    lm = request.getfixturevalue(which)
    cpu, gpu = _extract(lm, examples, tmp_path, "cpu"), _extract(lm, examples, tmp_path, "cuda")
    _same_rows(cpu, gpu)
    for layer in cpu.layers:
        err = relative_errors(cpu.states(layer), gpu.states(layer))
        assert err.max() <= FP32_TOLERANCE, (layer, err.max())


def test_many_small_batches_through_the_pinned_staging_buffer_equal_the_cpu(tmp_path, small_bert, examples):
    """Small batches: every batch's states pass through the one page-locked buffer, which grows when a
    later batch has more rows; float32 and float16 caches equal the CPU's within their tolerances."""
    kw = {"batch_tokens": 64, "max_batch": 3}
    cpu = _extract(small_bert, examples, tmp_path / "ref", "cpu", **kw)
    for dtype, tol in (("float32", FP32_TOLERANCE), ("float16", BF16_TOLERANCE["max"])):
        gpu = _extract(small_bert, examples, tmp_path / dtype, "cuda", dtype, **kw)
        _same_rows(cpu, gpu)
        for layer in cpu.layers:
            assert relative_errors(cpu.states(layer), gpu.states(layer)).max() <= tol, (dtype, layer)


def test_the_staging_buffer_is_pinned_reused_and_grown():
    from probing.shard_pass import HostStaging

    staging = HostStaging()
    a = torch.randn(5, 3, 8, device="cuda", dtype=torch.float16)
    got = staging.take(a)
    np.testing.assert_array_equal(got, a.cpu().numpy())
    assert staging.buffer.is_pinned()
    ptr = staging.buffer.data_ptr()
    b = torch.randn(2, 3, 8, device="cuda", dtype=torch.float16)
    np.testing.assert_array_equal(staging.take(b), b.cpu().numpy())
    assert staging.buffer.data_ptr() == ptr  # a smaller batch reuses the buffer
    c = torch.randn(9, 3, 8, device="cuda", dtype=torch.float16)
    np.testing.assert_array_equal(staging.take(c), c.cpu().numpy())
    assert staging.buffer.numel() >= c.numel() and staging.buffer.is_pinned()
    d = torch.randn(4, 3, 8, device="cuda", dtype=torch.float32)  # another dtype: its own buffer
    np.testing.assert_array_equal(staging.take(d), d.cpu().numpy())
    assert staging.buffer.dtype == torch.float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_the_gpu_is_within_the_stated_tolerance(tmp_path, small_bert, examples, dtype):
    cpu, gpu = _extract(small_bert, examples, tmp_path, "cpu"), _extract(small_bert, examples, tmp_path, "cuda", dtype)
    _same_rows(cpu, gpu)
    assert gpu.manifest["dtype"] == dtype
    for layer in cpu.layers:
        err = relative_errors(cpu.states(layer), gpu.states(layer))
        assert np.median(err) <= BF16_TOLERANCE["median"] and err.max() <= BF16_TOLERANCE["max"], (layer, err.max())
    assert next(small_bert.model.parameters()).dtype == torch.float32  # the caller's model is left as it was


def test_attention_summaries_and_a_knockout_on_the_gpu_equal_the_cpus(tmp_path, small_bert, examples):
    knock = Intervention.parse(knockout=["from=all,to=sep,layers=1-3", "from=cls,to=word,layers=2,control=1"])
    for kw in ({"attention": True}, {"attention_norm": True}, {"intervention": knock}):
        cpu = _extract(small_bert, examples, tmp_path / str(sorted(kw)), "cpu", **kw)
        gpu = _extract(small_bert, examples, tmp_path / str(sorted(kw)), "cuda", **kw)
        _same_rows(cpu, gpu)
        for layer in cpu.layers:
            assert relative_errors(cpu.states(layer), gpu.states(layer)).max() <= FP32_TOLERANCE, (kw, layer)
        assert cpu.has_attention == gpu.has_attention == ("intervention" not in kw)
        for weighting in (["raw"] if "attention" in kw else ["raw", "norm"] if "attention_norm" in kw else []):
            (ea, a, ga), (eb, b, gb) = cpu.attention(weighting), gpu.attention(weighting)
            np.testing.assert_array_equal(ea, eb)
            assert ga == gb
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
            np.testing.assert_allclose(b[~np.isnan(b)], a[~np.isnan(a)], rtol=0, atol=1e-5, err_msg=weighting)


def test_streaming_drift_and_cka_on_the_gpu_equal_the_cpus(small_bert):
    examples = sample_examples(24, k=2)
    kw = dict(model=small_bert, choices=["cls", "mean", "sep_last"], n_resamples=100, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # [CLS] at layer 0 has no variance
        cpu = stream_compare(examples, "pair", "concat", device="cpu", **kw)
        gpu = stream_compare(examples, "pair", "concat", device="cuda", **kw)
    for table in ("drift", "cka"):
        c, g = cpu[table], gpu[table]
        assert list(c.columns) == list(g.columns) and len(c) == len(g) > 0
        cv, gv = c["value"].to_numpy(float), g["value"].to_numpy(float)
        np.testing.assert_array_equal(np.isnan(cv), np.isnan(gv))
        np.testing.assert_allclose(gv[~np.isnan(gv)], cv[~np.isnan(cv)], rtol=0, atol=1e-4, err_msg=table)


def test_batched_probes_on_the_gpu_agree_with_the_cpu():
    rng = np.random.default_rng(0)
    n, d, k = 300, 24, 3
    y = rng.integers(0, k, n)
    groups = np.arange(n) // 2
    means = rng.normal(size=(k, d))
    feats = {(s, "cls"): (rng.normal(size=(n, d)) + s * means[y]).astype(np.float32) for s in (0.0, 0.4, 2.0)}
    kw = dict(Cs=[0.01, 0.1, 1.0], control_types=groups, num_threads=1)
    cpu = probe_many_results(feats, y, groups, device="cpu", **kw)
    gpu = probe_many_results(feats, y, groups, device="cuda", **kw)
    for key in feats:
        # float32 sums in other orders: an item near a decision boundary may flip, one item = 1/60 of a fold
        # (the control task, 150 types in 300 items, has many near-ties: seen once on an H200, 1 item)
        assert abs(gpu[key].mean - cpu[key].mean) <= 1 / 300 + 1e-9, key
        assert abs(gpu[key].control_score - cpu[key].control_score) <= 2 / 300 + 1e-9, key
        np.testing.assert_array_equal(gpu[key].chosen_Cs, cpu[key].chosen_Cs)
    assert gpu[(2.0, "cls")].mean > 0.9 and gpu[(0.0, "cls")].mean < 0.6  # planted signal found, null not


def test_fine_tuning_on_the_gpu_learns_with_and_without_autocast(bert_tokenizer):
    from analyses.finetune import finetune

    from .test_pooling import keyword_examples

    tiny = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny-bert")
    kw = dict(seed=1, epochs=6, batch_size=8, lr=3e-3, head_lr=1e-2, max_train=10_000, preset="quick",
              eval_batch_size=5, device="cuda")
    for autocast in (False, True):
        r = finetune(keyword_examples(64), "kind", model=tiny, pooling="mean", autocast=autocast, **kw)
        losses = np.asarray(r["train_loss_steps"])
        assert np.isfinite(losses).all() and len(losses) == 42
        assert losses[-10:].mean() < losses[:10].mean()  # it learns
        assert 0 <= r["test_accuracy"] <= 1
    assert next(tiny.model.parameters()).device.type == "cpu"  # the caller's model stays where it was


def test_frozen_and_fine_tuned_pooling_on_the_gpu(bert_tokenizer):
    from analyses.finetune import run_pooling_experiment

    from .test_pooling import keyword_examples

    tiny = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny-bert")
    kw = dict(epochs=1, batch_size=8, lr=1e-3, max_length=None, preset="quick", folds=3, run_folds=3,
              max_train=10_000, model=tiny, progress=False)
    ex = keyword_examples(36)
    cpu = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0], device="cpu", **kw)
    gpu = run_pooling_experiment(ex, "kind", ["cls", "mean"], [0], device="cuda", **kw)

    def frozen(df):
        return df[df.metric == "frozen_test_accuracy"].sort_values(["pooling", "fold"]).value.to_numpy()

    np.testing.assert_allclose(frozen(gpu), frozen(cpu), atol=1 / 12 + 1e-9)  # at most one test item of 12 moves
    acc = gpu[gpu.metric == "test_accuracy"]
    assert len(acc) == 2 * 3 and acc.value.between(0, 1).all()


def test_pretraining_on_the_gpu_copies_batches_without_waiting_and_learns(tmp_path):
    """A batch copied through pinned memory without a sync holds what the CPU batch holds; a test-preset run
    on the GPU (losses read back only at log points) finishes, with a falling loss and its device recorded."""
    import json

    from probing.pretrain import Variant, parse_config, pretrain
    from probing.pretrain._data import Instance, Layout, make_batch
    from probing.pretrain._tokenizer import train_tokenizer
    from probing.pretrain._train import non_special_ids

    from .test_pretrain import config_dict, topic_text

    tok = train_tokenizer((f"w{i} w{i + 1} w{i + 2} ." for i in range(200)), 300, max_length=32)
    rng = np.random.default_rng(0)
    ids = non_special_ids(tok)
    insts = [Instance(rng.choice(ids.numpy(), 9), rng.choice(ids.numpy(), 12), i % 2, 0) for i in range(8)]
    batch = make_batch(insts, Layout(Variant(), tok), mask_prob=0.15, mask_id=tok.mask_token_id,
                       random_ids=ids, generator=torch.Generator().manual_seed(0))
    on_gpu = batch.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    for name in ("input_ids", "token_type_ids", "attention_mask", "labels", "pair_labels", "cls_index"):
        assert torch.equal(getattr(on_gpu, name).cpu(), getattr(batch, name)), name

    text = tmp_path / "topics.txt"
    text.write_text(topic_text(n_docs=120))
    raw = config_dict(text, tmp_path / "runs", steps=60, log_every=10, checkpoint_every=30)
    raw["run"]["device"] = "cuda"
    (run,) = pretrain(parse_config(raw), progress=False, log=lambda *a: None)
    record = json.loads((run / "training.json").read_text())
    assert record["device"] == "cuda" and record["steps"] == 60
    curve = [p["loss"] for p in record["loss_curve"]]
    assert len(curve) == 6 and curve[-1] < curve[0]
