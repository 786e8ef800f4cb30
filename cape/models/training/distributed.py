"""Multi-process training with ``torch.distributed`` (DDP), launched by ``torchrun``.

``torchrun --nproc_per_node N -m cape train ...`` (or any script calling :func:`init_from_env`) starts one process
per GPU (or CPU worker with gloo); :class:`~cape.models.CellTransformer` then wraps its model in
``DistributedDataParallel`` and shards the cells with ``DistributedSampler``. ``batch_size`` is per process, so
N processes with batch ``b`` train like one process with batch ``N·b``.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger("cape")


def is_active() -> bool:
    """True inside an initialised process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_active() else 1


def rank() -> int:
    return dist.get_rank() if is_active() else 0


def is_main_process() -> bool:
    """Rank 0 (or no process group): the process that writes outputs."""
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group described by torchrun's environment (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``...).

    Does nothing (returns False) when not launched by torchrun with more than one process or when already
    initialised. ``backend`` defaults to NCCL with CUDA, else gloo.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available():
        return False
    if dist.is_initialized():
        return True
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend=backend)
    logger.info("joined process group: rank %d of %d (%s)", dist.get_rank(), dist.get_world_size(), backend)
    return True


def shutdown() -> None:
    """Leave the process group (if any)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def device_for_rank(device: torch.device) -> torch.device:
    """Under DDP on CUDA, each process uses the GPU of its local rank."""
    if device.type == "cuda" and is_active() and device.index is None:
        return torch.device("cuda", local_rank())
    return device


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few floats over processes (identity without a process group)."""
    if not is_active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
