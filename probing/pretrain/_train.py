"""The pretraining loop: one run per (variant, seed) of a config, resumable, deterministic on the CPU.

A run's randomness comes from three places, each reproducible after a kill: the weights' initialisation and
dropout (torch's global generator, seeded by the run's seed, its state saved with every checkpoint), the pairs
of each epoch (seeded by seed and epoch, :func:`probing.pretrain._data.epoch_instances`) and each step's MLM
positions (a generator seeded by seed and step). So a CPU run killed and resumed ends with the same weights,
bit for bit, as one that was never interrupted (with the same number of torch threads).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from probing import __version__
from probing.cache_writer import write_json
from probing.models import native_bfloat16, pick_device

from ._checkpoint import clear_checkpoints, find_checkpoint, load_checkpoint, save_checkpoint
from ._config import ConfigError, ModelConfig, PretrainConfig, TrainConfig, Variant, check_config
from ._data import (SPECIALS_BUDGET, Corpus, Layout, epoch_instances, heldout_instances, make_batch, read_corpus,
                    tokenize_documents)
from ._model import build_model, pretraining_logits, save_model_dir
from ._tokenizer import TOKENIZER_RECORD, load_tokenizer, read_record, train_tokenizer

__all__ = ["RUN_RECORD", "TRAINING_RECORD", "evaluate", "pretrain", "run_dir", "snapshot_dir", "train_run",
           "train_step"]

#: Written when a run finishes (its presence means the run is complete); see docs/PRETRAIN.md.
TRAINING_RECORD = "training.json"
#: Written when a run starts: what defines it; a directory holding another run's record is refused.
RUN_RECORD = "run.json"
#: Held-out batches: pairs per forward pass.
EVAL_BATCH = 64


def run_dir(out: str | os.PathLike, variant: Variant, seed: int) -> Path:
    """Where the run of ``variant`` with ``seed`` lives: ``<out>/<variant name>/seed<seed>``."""
    return Path(out) / variant.name / f"seed{seed}"


def _seed_int(*parts) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") & (2 ** 63 - 1)


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"probing": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__, "python": platform.python_version()}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------------
# the run set's tokenizer


def run_set_tokenizer(out: Path, corpus: Corpus, arch: ModelConfig, *, force: bool, log: Callable[[str], None]):
    """``<out>/tokenizer``: trained on the training documents once, then shared by every run of the set (the same
    vocabulary for every variant and seed). An existing one trained on other text or to another size is refused."""
    directory = out / "tokenizer"
    want = {"corpus_fingerprint": corpus.fingerprint, "vocab_size": arch.vocab_size, "max_length": arch.max_length}
    record = read_record(directory)
    if record is not None and not force:
        if record != want:
            raise ConfigError(f"{str(directory)!r} holds a tokenizer trained for {record}, not {want}; give another "
                              f"[run] out, or --force to train it again (and every run of the set)")
        return load_tokenizer(directory)
    log(f"training a WordPiece vocabulary of {arch.vocab_size} on {len(corpus.train)} documents")
    tok = train_tokenizer((s for d in corpus.train for s in d.sentences), arch.vocab_size, max_length=arch.max_length)
    tmp = out / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(tmp)
    (tmp / TOKENIZER_RECORD).write_text(json.dumps(want, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
    return load_tokenizer(directory)


# --------------------------------------------------------------------------------------------------
# one step, evaluation


def _autocast(device: torch.device, setting: bool | str) -> bool:
    return native_bfloat16(device) if setting == "auto" else bool(setting)


def _losses(model, batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(total loss, MLM loss, pair loss or None, MLM logits) of one batch."""
    ctx = torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with ctx:
        mlm_logits, pair_logits = pretraining_logits(model, batch)
    targets = batch.labels.flatten()[batch.masked]
    mlm = (torch.nn.functional.cross_entropy(mlm_logits.float(), targets) if len(targets)
           else mlm_logits.float().sum() * 0.0)
    pair = None if pair_logits is None else torch.nn.functional.cross_entropy(pair_logits.float(), batch.pair_labels)
    return (mlm if pair is None else mlm + pair), mlm, pair, mlm_logits


def train_step(model, batch, optimizer, scheduler, *, grad_clip: float,
               autocast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One optimizer step on ``batch`` (gradient norm clipped to ``grad_clip``); the losses, detached."""
    loss, mlm, pair, _ = _losses(model, batch, autocast)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()
    return loss.detach(), mlm.detach(), None if pair is None else pair.detach()


def non_special_ids(tokenizer) -> torch.Tensor:
    """Every token id but the special tokens: where BERT's 10% random replacements are drawn from."""
    special = set(tokenizer.all_special_ids)
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special], dtype=torch.long)


def _binomial(correct: int, n: int) -> dict[str, float]:
    from scipy.stats import binomtest

    test = binomtest(correct, n, 0.5)
    ci = test.proportion_ci(confidence_level=0.95, method="wilson")
    return {"pair_accuracy": correct / n, "pair_ci_low": float(ci.low), "pair_ci_high": float(ci.high),
            "pair_p_value": float(test.pvalue), "n_pairs": n}


@torch.inference_mode()
def evaluate(model, tokenizer, variant: Variant, heldout_tokens, heldout_docs, train: TrainConfig, arch: ModelConfig,
             device: torch.device, autocast: bool = False) -> dict:
    """Held-out MLM loss and accuracy, on the same pairs and masked tokens for every variant and seed of a run set
    (the ``mlm`` pairs: B follows A), beside the unigram entropy of those masked tokens (the loss of a model that
    knew their frequencies and nothing else); and, for NSP/SOP, the pair accuracy on the objective's own held-out
    pairs (half negatives) with a 95% Wilson interval and a two-sided binomial test against 0.5."""
    was_training = model.training
    model.eval()
    layout, ids = Layout(variant, tokenizer), non_special_ids(tokenizer)
    budget = arch.max_length - SPECIALS_BUDGET
    out: dict = {}
    pairs = heldout_instances(heldout_docs, heldout_tokens, objective="mlm", budget=budget, n=train.eval_pairs)
    gen = torch.Generator().manual_seed(_seed_int("heldout-mask"))
    loss_sum, correct, n, targets = 0.0, 0, 0, []
    for i in range(0, len(pairs), EVAL_BATCH):
        batch = make_batch(pairs[i:i + EVAL_BATCH], layout, mask_prob=train.mask_prob, mask_id=tokenizer.mask_token_id,
                           random_ids=ids, generator=gen).to(device)
        _, mlm, _, logits = _losses(model, batch, autocast)
        t = batch.labels.flatten()[batch.masked]
        loss_sum += float(mlm) * len(t)
        correct += int((logits.argmax(-1) == t).sum())
        n += len(t)
        targets.append(t.cpu())
    counts = torch.bincount(torch.cat(targets)).double()
    p = counts[counts > 0] / counts.sum()
    out.update({"mlm_loss": loss_sum / n, "mlm_accuracy": correct / n, "n_masked": n, "n_mlm_pairs": len(pairs),
                "unigram_entropy": float(-(p * p.log()).sum())})
    if variant.pair_head:
        pairs = heldout_instances(heldout_docs, heldout_tokens, objective=variant.objective, budget=budget,
                                  n=train.eval_pairs)
        right = 0
        for i in range(0, len(pairs), EVAL_BATCH):  # the pair head reads the pair unmasked
            batch = make_batch(pairs[i:i + EVAL_BATCH], layout, mask_prob=0.0, mask_id=tokenizer.mask_token_id,
                               random_ids=ids, generator=gen).to(device)
            ctx = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext()
            with ctx:
                _, pair_logits = pretraining_logits(model, batch)
            right += int((pair_logits.argmax(-1) == batch.pair_labels).sum())
        out.update(_binomial(right, len(pairs)))
    model.train(was_training)
    return out


# --------------------------------------------------------------------------------------------------
# one run


def make_optimizer(model, train: TrainConfig):
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=train.lr, betas=(0.9, 0.999), eps=1e-6)
    sched = get_linear_schedule_with_warmup(opt, int(train.warmup_fraction * train.steps), train.steps)
    return opt, sched


def _identity(cfg: PretrainConfig, variant: Variant, seed: int, corpus: Corpus, tokenizer_sha: str) -> dict:
    """What defines a run (written to ``run.json``): a directory holding a run with another identity is refused."""
    # checkpoints and snapshots change no number
    train = {k: v for k, v in asdict(cfg.train).items() if k not in ("checkpoint_every", "snapshots")}
    return {"variant": asdict(variant), "seed": seed, "model": asdict(cfg.model), "train": train,
            "corpus": {"sources": list(cfg.corpus.sources), "fingerprint": corpus.fingerprint},
            "tokenizer_sha256": tokenizer_sha}


def train_run(cfg: PretrainConfig, variant: Variant, seed: int, corpus: Corpus, tokenizer, tokens, heldout_tokens, *,
              device: torch.device, force: bool = False, progress: bool = True,
              log: Callable[[str], None] = print) -> Path:
    """Pretrain one run (or finish it from its checkpoint) and write its directory; return the directory."""
    from tqdm.auto import tqdm

    directory = run_dir(cfg.run.out, variant, seed)
    if force:
        shutil.rmtree(directory, ignore_errors=True)
    if (directory / TRAINING_RECORD).is_file():
        clear_checkpoints(directory)  # left by a kill between the last file and its removal
        log(f"{directory}: finished earlier, kept (--force trains it again)")
        return directory
    tok_dir = Path(cfg.run.out) / "tokenizer"
    identity = _identity(cfg, variant, seed, corpus, _sha256(tok_dir / "tokenizer.json"))
    if (directory / RUN_RECORD).is_file():
        before = json.loads((directory / RUN_RECORD).read_text(encoding="utf-8"))
        if before != identity:
            changed = sorted(k for k in identity if before.get(k) != identity[k])
            raise ConfigError(f"{str(directory)!r} holds a run with other settings ({', '.join(changed)} differ); "
                              f"--force starts it again")
    else:
        write_json(directory / RUN_RECORD, identity)

    train, arch = cfg.train, cfg.model
    autocast = _autocast(device, train.autocast)
    model = build_model(arch, variant, tokenizer, seed).to(device)
    model.train()
    optimizer, scheduler = make_optimizer(model, train)
    state = {"step": 0, "epoch": 0, "batch": 0, "epochs": 0.0, "tokens": 0, "sequences": 0, "curve": [], "wall": 0.0,
             "resumes": 0, "window": {"n": 0, "loss": 0.0, "mlm": 0.0, "pair": 0.0}}
    found = find_checkpoint(directory)
    if found is not None:
        state = load_checkpoint(found, model, optimizer, scheduler)
        state["resumes"] += 1
        log(f"{directory}: resuming at step {state['step']} of {train.steps}")
    layout, random_ids = Layout(variant, tokenizer), non_special_ids(tokenizer)
    budget = arch.max_length - SPECIALS_BUDGET
    started, wall_before = time.perf_counter(), state["wall"]

    pending: list[torch.Tensor] = []  # each step's losses, still on the device: one sync per log point

    def fold() -> None:
        """Add the pending steps' losses to the window, in step order, as Python floats (a step's float() of
        each loss, added one after another): the same sums whenever they are read."""
        w = state["window"]
        for loss, mlm, pair in torch.stack(pending).tolist() if pending else ():
            w["n"] += 1
            w["loss"] += loss
            w["mlm"] += mlm
            w["pair"] += pair
        pending.clear()

    def checkpoint() -> None:
        fold()
        state["wall"] = wall_before + time.perf_counter() - started
        save_checkpoint(directory, model, optimizer, scheduler, state)

    def snapshot() -> None:
        if state["step"] in train.snapshots and not (snapshot_dir(directory, state["step"]) / "config.json").is_file():
            _write_model_dir(snapshot_dir(directory, state["step"]), model, tokenizer, seed)

    snapshot()
    bar = tqdm(total=train.steps, initial=state["step"], disable=not progress, desc=f"{variant.name} seed {seed}",
               unit="step", dynamic_ncols=True)
    while state["step"] < train.steps:
        instances = epoch_instances(corpus.train, tokens, objective=variant.objective, budget=budget,
                                    short_seq_prob=train.short_seq_prob, seed=seed, epoch=state["epoch"])
        n_batches = len(instances) // train.batch_size
        if n_batches == 0:
            raise ValueError(f"the corpus gives {len(instances)} training pairs, fewer than one batch of "
                             f"batch_size={train.batch_size}; give more text or a smaller batch_size")
        for b in range(state["batch"], n_batches):
            gen = torch.Generator().manual_seed(_seed_int(seed, "mask", state["step"]))
            batch = make_batch(instances[b * train.batch_size:(b + 1) * train.batch_size], layout,
                               mask_prob=train.mask_prob, mask_id=tokenizer.mask_token_id, random_ids=random_ids,
                               generator=gen).to(device, non_blocking=True)
            loss, mlm, pair = train_step(model, batch, optimizer, scheduler, grad_clip=train.grad_clip,
                                         autocast=autocast)
            state["step"] += 1
            state["batch"] = b + 1
            state["epochs"] = state["epoch"] + state["batch"] / n_batches
            state["tokens"] += batch.n_tokens
            state["sequences"] += len(batch.pair_labels)
            pending.append(torch.stack([loss.float(), mlm.float(), torch.zeros_like(mlm, dtype=torch.float32)
                                        if pair is None else pair.float()]))
            if state["step"] % train.log_every == 0 or state["step"] == train.steps:
                fold()
                w = state["window"]
                point = {"step": state["step"], "tokens": state["tokens"], "loss": w["loss"] / w["n"],
                         "mlm_loss": w["mlm"] / w["n"], "lr": scheduler.get_last_lr()[0]}
                if variant.pair_head:
                    point["pair_loss"] = w["pair"] / w["n"]
                state["curve"].append(point)
                state["window"] = {"n": 0, "loss": 0.0, "mlm": 0.0, "pair": 0.0}
                bar.set_postfix(loss=f"{point['loss']:.3f}", refresh=False)
            bar.update(1)
            snapshot()
            if state["step"] % train.checkpoint_every == 0 or state["step"] == train.steps:
                checkpoint()
            if state["step"] == train.steps:
                break
        else:
            state["epoch"] += 1
            state["batch"] = 0
    bar.close()
    wall = wall_before + time.perf_counter() - started
    heldout = evaluate(model, tokenizer, variant, heldout_tokens, corpus.heldout, train, arch, device, autocast)
    _finish(directory, model, tokenizer, seed, {
        "format_version": 1,
        "variant": {**asdict(variant), "name": variant.name, "format": layout.format.to_json()},
        "seed": seed, "preset": cfg.run.preset, "model": asdict(arch), "train": {**asdict(train), "autocast": autocast},
        "corpus": {"sources": list(cfg.corpus.sources), **corpus.describe()},
        "tokenizer": {"vocab_size": len(tokenizer), "sha256": identity["tokenizer_sha256"]},
        "steps": state["step"], "epochs": state["epochs"],
        "tokens_seen": state["tokens"], "sequences_seen": state["sequences"], "loss_curve": state["curve"],
        "heldout": heldout, "wall_seconds": wall, "resumes": state["resumes"], "device": str(device),
        "device_name": _device_name(device), "torch_threads": torch.get_num_threads(), "versions": _versions(),
    })
    log(f"{directory}: {state['step']} steps, {state['tokens']:,} tokens in {wall:.0f} s; held-out MLM accuracy "
        f"{heldout['mlm_accuracy']:.3f}" + (f", pair accuracy {heldout['pair_accuracy']:.3f}" if variant.pair_head
                                            else ""))
    return directory


def snapshot_dir(directory: str | os.PathLike, step: int) -> Path:
    """Where a run writes its snapshot at ``step`` (``[train] snapshots``): ``<run>/step<step>``."""
    return Path(directory) / f"step{step}"


def _write_model_dir(directory: Path, model, tokenizer, seed: int) -> None:
    """The model directory's files, each renamed into ``directory`` from a staging folder, ``config.json`` last
    (so a directory with ``config.json`` is complete). The model is put back in training mode."""
    staging = directory / ".final.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_model_dir(model, tokenizer, staging, seed)
    model.train()
    for path in sorted(staging.iterdir(), key=lambda p: p.name == "config.json"):
        os.replace(path, directory / path.name)
    staging.rmdir()


def _finish(directory: Path, model, tokenizer, seed: int, record: dict) -> None:
    """Write the model directory's files beside the run's records, ``training.json`` last, then drop the
    checkpoint: a kill before the last rename leaves the checkpoint, from which the run writes them again."""
    _write_model_dir(directory, model, tokenizer, seed)
    write_json(directory / TRAINING_RECORD, record)
    clear_checkpoints(directory)


# --------------------------------------------------------------------------------------------------
# a config


def pretrain(cfg: PretrainConfig, *, force: bool = False, progress: bool = True,
             log: Callable[[str], None] = print) -> list[Path]:
    """Pretrain every variant of ``cfg`` with every seed (a run set under ``cfg.run.out``); return the run
    directories, each a Hugging Face model directory that :func:`probing.models.load_model` loads. Finished runs
    are kept (``force``: everything trained again); interrupted ones resume from their checkpoint.

    Nothing is written before the corpus is read and the output directory checked: a missing corpus package
    (ImportError), a pattern matching no file (FileNotFoundError) and an unwritable ``[run] out`` (ValueError)
    leave the disk as it was; so does a config built in code with a value its schema refuses (ConfigError,
    :func:`check_config`)."""
    from probing.cli import check_output_dir

    cfg = check_config(cfg)
    check_output_dir(cfg.run.out, "[run] out")
    corpus = read_corpus(cfg.corpus)
    device = pick_device(cfg.run.device)
    threads = torch.get_num_threads()
    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)
    try:
        out = Path(cfg.run.out)
        out.mkdir(parents=True, exist_ok=True)
        tokenizer = run_set_tokenizer(out, corpus, cfg.model, force=force, log=log)
        tokens = tokenize_documents(tokenizer, corpus.train)
        heldout_tokens = tokenize_documents(tokenizer, corpus.heldout)
        log(f"corpus {', '.join(cfg.corpus.sources)}: {len(corpus.train)} training documents "
            f"({sum(len(s) for t in tokens for s in t):,} tokens), {len(corpus.heldout)} held out")
        return [train_run(cfg, variant, seed, corpus, tokenizer, tokens, heldout_tokens, device=device, force=force,
                          progress=progress, log=log)
                for variant in cfg.variants for seed in cfg.run.seeds]
    finally:
        torch.set_num_threads(threads)  # a caller's (a notebook's, a test process's) setting is theirs

