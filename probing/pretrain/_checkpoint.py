"""Checkpoints of a pretraining run, in safetensors and JSON only (nothing pickled, no ``torch.save``).

``<run>/checkpoint/`` holds ``model.safetensors`` (the whole pretraining model, tied weights stored once),
``optimizer.safetensors`` (AdamW's moments and step counts, and the random generators' states as byte
tensors) and ``state.json`` (the step, the data position, the scheduler, the optimizer's hyperparameters, the
loss curve so far). A new checkpoint is written to ``checkpoint.tmp/`` and swapped in by renames, so a kill at
any moment leaves one complete checkpoint (``checkpoint/``, or ``checkpoint.old/`` between the two renames).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT", "clear_checkpoints", "find_checkpoint", "load_checkpoint", "save_checkpoint"]

CHECKPOINT = "checkpoint"
_TMP, _OLD = "checkpoint.tmp", "checkpoint.old"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = state
    return out


def save_checkpoint(run_dir: Path, model, optimizer, scheduler, state: dict[str, Any]) -> None:
    """Write the checkpoint of ``model``, ``optimizer``, ``scheduler``, the random generators and ``state`` (JSON
    values: step, data position, loss curve, ...) and make it the run's checkpoint."""
    from safetensors.torch import save_file, save_model

    tmp, final, old = run_dir / _TMP, run_dir / CHECKPOINT, run_dir / _OLD
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    opt = optimizer.state_dict()
    tensors = {f"state.{i}.{name}": value.detach().cpu().contiguous()
               for i, entries in opt["state"].items() for name, value in entries.items()}
    tensors.update(_rng_tensors())
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in opt["param_groups"]]
    record = {"state": state, "scheduler": sched, "param_groups": groups,
              "optimizer_state_keys": {str(i): sorted(e) for i, e in opt["state"].items()}}
    (tmp / "state.json").write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
        with open(tmp / name, "rb+") as f:
            os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(run_dir: Path) -> Path | None:
    """The run's complete checkpoint directory, if any (an interrupted write's ``checkpoint.tmp`` is not one)."""
    for name in (CHECKPOINT, _OLD):
        d = run_dir / name
        if (d / "state.json").is_file():
            return d
    return None


def load_checkpoint(directory: Path, model, optimizer, scheduler) -> dict[str, Any]:
    """Restore ``model``, ``optimizer``, ``scheduler`` and the random generators from ``directory``; return the
    saved ``state``."""
    from safetensors.torch import load_file, load_model

    load_model(model, str(directory / "model.safetensors"))
    record = json.loads((directory / "state.json").read_text(encoding="utf-8"))
    tensors = load_file(str(directory / "optimizer.safetensors"))
    opt_state = {int(i): {name: tensors[f"state.{i}.{name}"] for name in names}
                 for i, names in record["optimizer_state_keys"].items()}
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in record["param_groups"]]
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})  # moves moments to the device
    scheduler.load_state_dict({**record["scheduler"], "lr_lambdas": [None] * len(record["scheduler"]["base_lrs"])})
    torch.set_rng_state(tensors["rng.cpu"])
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    return record["state"]


def clear_checkpoints(run_dir: Path) -> None:
    for name in (CHECKPOINT, _TMP, _OLD):
        shutil.rmtree(run_dir / name, ignore_errors=True)
