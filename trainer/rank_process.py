"""One rank's process around the run: its device, deterministic kernels, the process group's options,
and the groups' release at the end (``runner.main`` calls these).
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch
import torch.distributed as dist

from freescale.trainer.config import RunConfig
from freescale.trainer.errors import TrainingError


def device_for(cfg: RunConfig, local_rank: int) -> torch.device:
    """This rank's device: ``cuda:<local rank>`` (``engine.share_gpus``: modulo the GPUs visible), or the CPU."""
    if cfg.engine.device != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", cuda_index(local_rank, torch.cuda.device_count(), cfg.engine.share_gpus))
    torch.cuda.set_device(device)
    return device


def cuda_index(local_rank: int, visible: int, share: bool) -> int:
    """The GPU of local rank ``local_rank`` among ``visible`` ones; with ``share`` ranks wrap around."""
    if visible == 0:
        raise TrainingError("engine.device is 'cuda' but no CUDA device is visible")
    if local_rank < visible:
        return local_rank
    if share:
        return local_rank % visible
    raise TrainingError(
        f"local rank {local_rank} has no GPU of its own ({visible} visible); set engine.share_gpus = true "
        "to run several ranks per GPU"
    )


def process_group_options(backend: str, device: torch.device) -> dict[str, Any]:
    """``init_process_group`` keywords: NCCL binds its communicator to the rank's GPU (``device_id``);
    gloo, the backend of ranks sharing a GPU, takes CUDA tensors without one."""
    return {"device_id": device} if backend == "nccl" and device.type == "cuda" else {}


def use_deterministic(enabled: bool) -> None:
    """``engine.deterministic``: kernels that give the same bits on every run (cuBLAS needs a fixed
    workspace, set before its first use); an op without such a kernel raises instead of varying."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def release_process_groups() -> None:
    """Destroy every process group now, with nothing else still holding one, so that the groups'
    threads are joined while the interpreter is whole.

    Why: TorchRec's sharded modules (sharding env, KJT all-to-alls, device mesh) hold the default
    group in reference cycles. ``destroy_process_group`` alone only unregistered it: its gloo worker
    and transport threads, connections and the works holding tensors lived on until the interpreter's
    finalization destroyed them, in an unspecified order with the interpreter half torn down, and a
    TorchRec rank aborted there after its run had finished ("terminate called without an active
    exception", about 1 bench_pec run in 12). With the cycles collected first, the last reference
    goes with the registry's and the group is destroyed inside ``destroy_process_group``
    (``tests/trainer/test_rank_exit.py`` checks that no gloo thread reaches interpreter exit).
    """
    gc.collect()
    dist.destroy_process_group()
    gc.collect()  # anything that held a group only through the registry's cycles
