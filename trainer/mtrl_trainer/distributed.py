"""torchrun integration. Rank 0 owns the queues, generation and checkpoints; after collecting a
step it broadcasts the training rows, every rank trains on its shard of each micro-batch, and
DDP all-reduces the LoRA gradients. One process (no torchrun) is world size 1."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Followers wait in a broadcast while rank 0 collects a step's rollouts, which can take long.
COLLECTIVE_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def init_world() -> World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(0, 1, 0)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return World(dist.get_rank(), size, int(os.environ.get("LOCAL_RANK", "0")))


def device_for(world: World, override: str | None) -> torch.device:
    if override:
        return torch.device(override)
    if torch.cuda.is_available():
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    return torch.device("cpu")


def broadcast(obj: Any, world: World) -> Any:
    """Rank 0's `obj` on every rank."""
    if world.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def close_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
