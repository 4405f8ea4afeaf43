"""One extractor per process under ``torchrun`` (torch.distributed): rank, world size, barrier.

``torchrun --nproc-per-node N -m probing.extract ...`` sets RANK, WORLD_SIZE and LOCAL_RANK; each
process then takes a disjoint, deterministic set of shards (balanced by token count,
:func:`probing.extract.assign_shards`) and writes them into the same cache; rank 0 writes the manifest
after a barrier. Without those variables everything runs in one process and no process group is made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


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
            backend = "nccl" if torch.cuda.is_available() and os.environ.get("PROBING_DIST_BACKEND") != "gloo" else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(ctx.local_rank)
            dist.init_process_group(backend=backend)
            ctx.initialised_here = True
        return ctx

    def device(self, requested: str | None) -> str | None:
        """Under torchrun each process uses its own GPU (cuda:LOCAL_RANK) when CUDA is asked for."""
        if self.world_size > 1 and requested in (None, "auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested

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
