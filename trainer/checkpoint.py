"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

One checkpoint holds the sharded tables and their optimizer state (each rank writes its own rows as
a ``DTensor`` ``Shard(0)`` piece, so DCP can reshard on load), the replicated dense parameters and
dense optimizer state (written once), and the loader position (the step counter: the reader maps it
to micro-batches, and every random draw is keyed by it). A resumed run therefore replays exactly the
steps the uninterrupted run would have taken.

Layout: ``<checkpoint.dir>/step_00000012/`` (DCP files). ``checkpoint.resume = "latest"`` picks the
highest finished step; a path picks that one. A checkpoint is finished when DCP's ``.metadata`` is
there (written last by the coordinator).

Trust: DCP unpickles a checkpoint's ``.metadata``, and unpickling runs code. A checkpoint must come
from a trusted place; resume refuses a step directory (or a file in it) that this user does not own
or that group/other can write, since whoever can write it can make the resuming job run their code.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

STEP_DIR = re.compile(r"step_(\d{8})$")


def step_dir(root: str, step: int) -> str:
    return str(Path(root) / f"step_{step:08d}")


def finished_steps(root: str) -> list[int]:
    """Steps with a complete checkpoint under ``root``, ascending."""
    base = Path(root)
    if not base.is_dir():
        return []
    steps = []
    for child in base.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / ".metadata").exists():
            steps.append(int(match.group(1)))
    return sorted(steps)


def resolve_resume(root: str, resume: str) -> str | None:
    """The checkpoint directory ``checkpoint.resume`` names, or None (fresh start)."""
    if not resume:
        return None
    if resume == "latest":
        steps = finished_steps(root)
        if not steps:
            return None
        check_trusted(step_dir(root, steps[-1]))
        return step_dir(root, steps[-1])
    path = Path(resume)
    if not (path / ".metadata").exists():
        raise ValueError(f"checkpoint.resume: {resume} is not a finished checkpoint (no .metadata)")
    check_trusted(str(path))
    return str(path)


def check_trusted(path: str) -> None:
    """Refuse a checkpoint another user owns or group/other can write (see the module docstring)."""
    me = os.getuid()
    base = Path(path)
    for entry in [base, *sorted(base.iterdir())]:
        info = entry.lstat()
        if info.st_uid != me:
            raise ValueError(
                f"checkpoint.resume: {entry} is owned by uid {info.st_uid}, not by this user (uid {me}); "
                "resuming unpickles checkpoint metadata, so only checkpoints you wrote are loaded"
            )
        if stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(
                f"checkpoint.resume: {entry} is writable by group/other (mode {stat.S_IMODE(info.st_mode):o}); "
                f"resuming unpickles checkpoint metadata: run `chmod -R go-w {base}` if you trust its contents"
            )


def _sharded(local: torch.Tensor, shape: tuple[int, ...], mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor, Shard

    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)


class FreeScaleCheckpointer:
    """DCP save/load of a ``FreeScaleEngine``'s full training state plus the loader step."""

    def __init__(self, engine: Any) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.engine = engine
        self.mesh = init_device_mesh(engine.device.type, (engine.world_size,))
        self._options = StateDictOptions(full_state_dict=False)

    def _state(self, step: int) -> dict[str, Any]:
        engine = self.engine
        shapes = engine.tables.global_shapes()
        tables = {key: _sharded(tensor, shapes[key], self.mesh) for key, tensor in engine.tables.local_state().items()}
        return {
            "model": engine.model.state_dict(),
            "dense_optimizer": get_optimizer_state_dict(engine.model, engine.dense_optimizer, options=self._options),
            "tables": tables,
            "loader": {"step": torch.tensor(step), "world_size": torch.tensor(engine.world_size)},
        }

    def save(self, root: str, step: int) -> str:
        """Write the state after ``step`` steps; returns the checkpoint directory."""
        path = step_dir(root, step)
        self.engine.settle()  # PEC: deferred gradients belong to the saved state
        dcp.save(self._state(step), checkpoint_id=path)
        dist.barrier()
        return path

    def load(self, path: str, check_world_size: bool = True) -> int:
        """Restore everything in place; returns the step to continue from. ``check_world_size=False``
        (``freescale evaluate``): any world size, since DCP reshards the tables and nothing is resumed."""
        state = self._state(0)
        dcp.load(state, checkpoint_id=path)
        saved_world = int(state["loader"]["world_size"])
        if check_world_size and saved_world != self.engine.world_size:
            raise ValueError(
                f"checkpoint {path} was written by {saved_world} ranks; resume with the same "
                f"--nproc (the loader's step → micro-batch map depends on it)"
            )
        self.engine.model.load_state_dict(state["model"])
        set_optimizer_state_dict(
            self.engine.model, self.engine.dense_optimizer, state["dense_optimizer"], options=self._options
        )
        for key, tensor in self.engine.tables.local_state().items():
            tensor.copy_(state["tables"][key].to_local())
        return int(state["loader"]["step"])
