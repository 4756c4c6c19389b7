"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

One checkpoint holds the sharded tables and their optimizer state (each rank writes its own rows as
a ``DTensor`` ``Shard(0)`` piece, so DCP can reshard on load; zero-collision tables add their
identity tables as of the trained batches, ``sharded.local_state``, which only the same world size
can load), the replicated dense parameters and dense optimizer state (written once), and the loader
position (the step counter: the reader maps it to micro-batches, and every random draw is keyed by it).
A resumed run therefore replays exactly the steps the uninterrupted run would have taken.

Where checkpoints live, when one is finished and which are trusted: ``checkpoint_dirs.py`` (no torch:
the launcher reads it). Every rank writes into ``.step_00000012.partial`` and rank 0, once DCP's
``.metadata`` is written (last, by the coordinator), adds the record (``checkpoint_record.py``) and
renames the directory to its step name. A save that fails (a full disk, a quota) removes the partial
directory and stops the run with one line naming the folder, so ``latest`` never meets a half-written
step.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from freescale.pipeline.output import disk_full, one_line
from freescale.trainer.checkpoint_dirs import OLD_SUFFIX, finished_steps, partial_dir, step_dir
from freescale.trainer.checkpoint_record import (
    CheckpointRecord,
    RunRecord,
    file_inventory,
    read_record,
    write_record,
)
from freescale.trainer.errors import TrainingError


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

    def save(self, root: str, step: int, run: RunRecord | None = None) -> str:
        """Write the state after ``step`` steps (with the trainer's ``run`` record) under its step name
        once complete; returns the checkpoint directory. A failed save raises ``TrainingError`` on every
        rank, after rank 0 removed the partial directory."""
        path, partial = step_dir(root, step), partial_dir(root, step)
        self.engine.settle()  # PEC: deferred gradients belong to the saved state
        rank = dist.get_rank()
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)  # a save of this step that died
        dist.barrier()
        state = self._state(step)
        failure: BaseException | None = None
        try:
            dcp.save(state, checkpoint_id=partial)
        except (Exception, CheckpointException) as error:  # DCP raises the same on every rank
            failure = error
        verdict = [""]
        if rank == 0:
            record = CheckpointRecord(step, self.engine.world_size, tensor_shapes(state), run)
            verdict[0] = publish(partial, path, record, failure, root, step)
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0]:
            raise TrainingError(verdict[0], everywhere=True)
        return path

    def load(self, path: str, check_world_size: bool = True) -> int:
        """Restore everything in place; returns the step to continue from. ``check_world_size=False``
        (``freescale evaluate``): any world size, since DCP reshards the tables and nothing is resumed."""
        state = self._state(0)
        record = read_record(path)
        if record is not None:  # the launcher checked the options; this catches any other shape change
            check_shapes(record, tensor_shapes(state), path)
        _load(state, path)  # reshards the tables to this world size
        saved_world = int(state["loader"]["world_size"])
        if check_world_size and saved_world != self.engine.world_size:  # the launcher says so first
            raise TrainingError(
                f"checkpoint {path} was written by {saved_world} ranks; resume with the same --nproc "
                "(the loader's step → micro-batch map depends on it)",
                everywhere=True,
            )
        self.engine.model.load_state_dict(state["model"])
        set_optimizer_state_dict(
            self.engine.model, self.engine.dense_optimizer, state["dense_optimizer"], options=self._options
        )
        for key, tensor in self.engine.tables.local_state().items():
            tensor.copy_(state["tables"][key].to_local())
        for shard in self.engine.tables.zch:  # zero-collision tables: hashed and bucketed like this run's
            if shard is not None:
                try:
                    shard.check_layout()
                except ValueError as error:
                    raise TrainingError(f"checkpoint {path}: {error}", everywhere=True) from None
        return int(state["loader"]["step"])


class _WithoutMetadataFallbackTracebacks(logging.Filter):
    """Drops DCP's warnings, with tracebacks, that a damaged ``.metadata`` sends to the root logger: the
    failed load is said in one line (``_load``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "metadata is not found" not in str(record.msg)


def _load(state: dict[str, Any], path: str) -> None:
    """``dcp.load`` in place; a damaged or incomplete checkpoint (a record without ``files`` to check it
    before, or ranks started by torchrun directly) is one ``TrainingError``, not a traceback per rank."""
    quiet = _WithoutMetadataFallbackTracebacks()
    logging.getLogger().addFilter(quiet)
    try:
        dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as error:  # DCP gathers every rank's failure: the same verdict
        cause = first_cause(error)
        raise TrainingError(
            f"checkpoint {path} could not be read ({one_line(cause) or type(cause).__name__}): it is damaged "
            "or incomplete; load an earlier checkpoint",
            everywhere=True,
        ) from None
    finally:
        logging.getLogger().removeFilter(quiet)


def tensor_shapes(state: dict[str, Any], prefix: str = "") -> dict[str, list[int]]:
    """Global shape of every tensor in a (nested) state dict, by dotted key (DTensors: the whole table)."""
    shapes: dict[str, list[int]] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            shapes[name] = list(value.shape)
        elif isinstance(value, dict):
            shapes.update(tensor_shapes(value, f"{name}."))
    return shapes


def check_shapes(record: CheckpointRecord, mine: dict[str, list[int]], path: str) -> None:
    """Every tensor this rank would load must be in the checkpoint with the same shape (DCP raises a
    traceback per rank otherwise); the first that is not names itself."""
    for key, shape in mine.items():
        saved = record.shapes.get(key)
        if saved != shape:
            held = f"holds {key} with shape {saved}" if saved is not None else f"holds no {key}"
            raise TrainingError(
                f"checkpoint {path} {held}, this run's is {shape}: the model or optimizer options differ "
                "from the run that wrote it (model.*, model_extra.num_items/num_actions, optimizer.*)",
                everywhere=True,  # global shapes: every rank finds the same
            )


def publish(
    partial: str, path: str, record: CheckpointRecord, failure: BaseException | None, root: str, step: int
) -> str:
    """Rank 0 after DCP's save: add the record and give the complete directory its step name (replacing
    an older save of the same step); on any failure remove the partial directory. Returns the error
    message, "" on success."""
    try:
        if failure is not None:
            raise failure
        write_record(partial, replace(record, files=file_inventory(partial)))  # DCP's files, all written
        if os.path.exists(path):  # a resume from an earlier step writes this step again
            old = str(Path(root) / f".step_{step:08d}{OLD_SUFFIX}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
            os.rename(partial, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(partial, path)
        _fsync_dir(root)
        return ""
    except (Exception, CheckpointException) as error:
        shutil.rmtree(partial, ignore_errors=True)
        return save_failure_message(error, record, root, step)


def save_failure_message(error: BaseException, record: CheckpointRecord, root: str, step: int) -> str:
    """One line for a failed save: disk full named as such, else the first failing rank's error.

    A full disk does not always say so: torch's zip writer reports a short write as "enforce fail at
    inline_container.cc ... unexpected pos", without the errno. So a save that fails while the device
    has less room than the checkpoint's tensors need is reported as what it is."""
    cause = next((c for c in causes_of(error) if disk_full(c)), first_cause(error))
    finished = finished_steps(root)
    kept = f"the last complete checkpoint is {step_dir(root, finished[-1])}" if finished else "no checkpoint is kept"
    free, needed = shutil.disk_usage(root).free, tensor_bytes(record.shapes)
    if disk_full(cause) or free < needed:
        return (
            f"checkpoint step {step}: no space left on the device holding {root} (checkpoint.dir: {free // 1024} KiB "
            f"free, a checkpoint needs about {needed // 1024} KiB); the partial checkpoint was removed and {kept}: "
            "free some space and resume"
        )
    return f"checkpoint step {step} could not be written to {root} (checkpoint.dir): {one_line(cause)}; {kept}"


def causes_of(error: BaseException) -> list[BaseException]:
    """The ranks' own errors inside DCP's ``CheckpointException`` (by rank), else ``error`` itself."""
    if isinstance(error, CheckpointException):
        return [failure[0] for _, failure in sorted(error.failures.items())] or [error]
    return [error]


def first_cause(error: BaseException) -> BaseException:
    return causes_of(error)[0]


def tensor_bytes(shapes: dict[str, list[int]], element_bytes: int = 4) -> int:
    """About what a checkpoint of these (float32) tensors takes on disk."""
    return sum(element_bytes * math.prod(shape) for shape in shapes.values())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
