"""Data parallelism: one process per device (torchrun), gradients averaged by DDP.

`torchrun --nproc-per-node N -m strata.train ...` sets RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_ADDR/PORT; `strata train` alone is a world of one and never touches
torch.distributed. Every rank draws the same global batch (the same seeded stream) and
trains on its own contiguous slice of rows, so N processes see exactly the rows one process
would: with DDP averaging the gradients, the run equals one process with the same global
batch up to float summation order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from strata.errors import InputError

TIMEOUT = timedelta(minutes=30)  # a rank evaluating or checkpointing keeps the others waiting


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0 talks to the user, the DB and the disk."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1


def world_from_env() -> World:
    """The world torchrun describes in the environment (a world of one without it)."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise InputError(f"WORLD_SIZE/RANK/LOCAL_RANK must be integers ({exc})") from None
    return World(rank, size, local)


def init(world: World, device: torch.device) -> None:
    """Join the process group: NCCL between GPUs, gloo on CPU."""
    if not world.parallel or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives run on the current device
    dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=TIMEOUT)


def shutdown(world: World) -> None:
    if world.parallel and dist.is_initialized():
        dist.destroy_process_group()


def device_for(world: World, device: torch.device) -> torch.device:
    """Each rank on its own GPU (cuda:LOCAL_RANK); CPU ranks share the CPU."""
    if device.type == "cuda" and world.parallel and device.index is None:
        return torch.device("cuda", world.local_rank)
    return device


def check_batch(world: World, batch: int) -> None:
    if batch % world.size:
        raise InputError(f"--batch {batch} does not split over {world.size} processes: use a "
                         f"multiple of {world.size}")


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """DDP around the model (it broadcasts rank 0's weights, so every rank starts equal)."""
    if not world.parallel:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def mean(world: World, value: torch.Tensor) -> torch.Tensor:
    """The mean of a per-rank tensor over the ranks (the value itself in a world of one)."""
    if not world.parallel:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / world.size


def total(world: World, value: torch.Tensor) -> torch.Tensor:
    if not world.parallel:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def any_rank(world: World, flag: bool, device: torch.device) -> bool:
    """True on every rank when any rank says so: all ranks stop at the same step on Ctrl-C
    (a rank that stopped alone would leave the others waiting in the next all-reduce)."""
    if not world.parallel:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)  # NCCL: on GPU
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
