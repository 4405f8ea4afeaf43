"""One extractor per process under ``torchrun`` (torch.distributed): rank, world size, barrier.

``torchrun --nproc-per-node N -m probing.extract ...`` sets RANK, WORLD_SIZE and LOCAL_RANK; each
process then takes a disjoint, deterministic set of shards (balanced by token count,
:func:`probing.planning.assign_shards`) and writes them into the same cache; rank 0 writes the manifest
after a barrier, and every rank returns once the manifest is there. Without those variables
everything runs in one process and no process group is made.

One machine, 4 GPUs::

    torchrun --standalone --nproc-per-node 4 -m probing.extract --model bert-base-uncased --out caches

Several machines (here 2 x 8 GPUs; run the same line on each machine with its own ``--node-rank``;
``--out`` must be a directory every machine sees, e.g. NFS or Lustre)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr node0.example --master-port 29500 \\
        -m probing.extract --model bert-base-uncased --out /shared/caches

or, with torchrun's own rendezvous (the same line on every machine, no ``--node-rank``)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0.example:29500 \\
        --rdzv-id probing-1 -m probing.extract --model bert-base-uncased --out /shared/caches

Processes exchange no tensors, only barriers, so the process group uses the gloo backend (a CPU
barrier over TCP) even on GPUs: no NCCL communicators, no GPU memory for them, and two processes may
share one GPU. ``PROBING_DIST_BACKEND`` names another backend. A rank that finishes its shards early
waits at a barrier for the slowest one, which for a large corpus can be hours: the barrier timeout is
``PROBING_DIST_TIMEOUT_S`` seconds (default 24 hours), not torch's default (10 or 30 minutes). A rank
that dies is noticed by torchrun at once, which stops the others; running the same command again
resumes from the shards already written, with any number of processes.

The cache's bytes do not depend on how many processes wrote it: shard boundaries and the batches
inside a shard are fixed by the plan, not by the rank. (torchrun sets ``OMP_NUM_THREADS=1`` in each
worker when it starts several per machine; on the CPU this was tested on, MKL's results did not
depend on the thread count, 1 to 16.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from .models import pick_device

#: Environment variables torchrun sets in each worker that this module reads.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_TIMEOUT_S = 24 * 3600.0


def barrier_timeout() -> timedelta:
    """``PROBING_DIST_TIMEOUT_S`` (seconds) as a timedelta; the default is 24 hours."""
    raw = os.environ.get("PROBING_DIST_TIMEOUT_S")
    if raw is None:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"PROBING_DIST_TIMEOUT_S={raw!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"PROBING_DIST_TIMEOUT_S={raw!r} must be positive")
    return timedelta(seconds=seconds)


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialised_here: bool = False

    @classmethod
    def from_env(cls) -> "DistContext":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        ctx = cls(rank=int(os.environ["RANK"]), world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            backend = os.environ.get("PROBING_DIST_BACKEND", "gloo")
            if backend == "nccl":
                torch.cuda.set_device(ctx.device("cuda"))
            dist.init_process_group(backend=backend, timeout=barrier_timeout())
            ctx.initialised_here = True
        return ctx

    def device(self, requested: str | None) -> torch.device:
        """The device of this process (:func:`probing.models.pick_device`): under torchrun each process uses
        its own GPU (cuda:LOCAL_RANK, modulo the number of visible GPUs) when CUDA is asked for, or 'auto'
        finds it."""
        return pick_device(requested, local_rank=self.local_rank if self.world_size > 1 else None)

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def __enter__(self) -> "DistContext":
        return self

    def __exit__(self, *exc) -> None:
        if self.initialised_here:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
