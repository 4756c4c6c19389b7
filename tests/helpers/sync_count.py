"""What one call costs a CUDA stream, counted on CPU at the aten dispatch seam (``TorchDispatchMode``).

On CUDA a small lookup is bound by per-call overhead, not arithmetic: each aten op that computes is
a kernel launch, and each host read of a device value drains the stream. ``counting_ops()`` counts,
while its block runs, in ``OpCounts``:

* ``syncs``: ``aten._local_scalar_dense`` (what ``.item()``, ``int()``, ``bool()`` and Python
  ``if tensor`` go through), ``Tensor.tolist`` and ``Tensor.numpy`` (a device-to-host copy on CUDA; on
  CPU they read memory without an op, so they are counted by wrapping them, as ``tolist``), plus
  every op whose output shape depends on the data
  (``nonzero``, ``masked_select``, ``unique``, ``bincount``, indexing with a boolean mask, ...): on
  CUDA each waits for the device to know the size;
* ``launches``: ops that compute (every op but views, wrapped Python numbers and the syncs' host
  reads), roughly the kernels a CUDA stream would run;
* ``ops``: every op by name, to show where the counts come from.

The counts are the same on CPU and CUDA: the instrument sees the ops Python asks for, not how a
backend runs them (a CUDA kernel may fuse none of them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
SCALAR_READ = aten._local_scalar_dense.default
DATA_DEPENDENT = {
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "bincount",
    "repeat_interleave",  # without output_size the output length is the sum of the repeats
}
HOST_ONLY = {"scalar_tensor"}  # a Python number wrapped for an op (a CPU scalar on CUDA too): no kernel
BOOL_INDEXED = {"index", "index_put", "index_put_", "_index_put_impl_"}  # a boolean mask: a nonzero inside


@dataclass
class OpCounts:
    """Ops seen by ``counting_ops``: host syncs, kernel-like launches, and every op by name."""

    syncs: int = 0
    launches: int = 0
    ops: Counter = field(default_factory=Counter)
    sync_ops: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        return f"{self.syncs} syncs {dict(self.sync_ops)}, {self.launches} launches"


def _bool_index(args: tuple, kwargs: dict) -> bool:
    leaves, _ = tree_flatten((args[1:], kwargs))
    return any(isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.uint8) for x in leaves)


def is_sync(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` reads a device value on the host or sizes its output from the data."""
    name = func.overloadpacket.__name__
    if func is SCALAR_READ or name in DATA_DEPENDENT:
        return not (name == "repeat_interleave" and kwargs.get("output_size") is not None)
    return name in BOOL_INDEXED and _bool_index(args, kwargs)


class _Counter(TorchDispatchMode):
    def __init__(self, counts: OpCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.counts.ops[name] += 1
        if is_sync(func, args, kwargs):
            self.counts.syncs += 1
            self.counts.sync_ops[name] += 1
        if func is not SCALAR_READ and not func.is_view and name not in HOST_ONLY:
            self.counts.launches += 1
        return func(*args, **kwargs)


def _host_read(counts: OpCounts, method: Any) -> Any:
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counts.syncs += 1
        counts.sync_ops["tolist"] += 1
        return method(self, *args, **kwargs)

    return read


def counting_in_this_thread(counts: OpCounts) -> TorchDispatchMode:
    """A mode counting this thread's aten ops into ``counts`` (another thread's ``counting_ops``, which
    must outlive it, counts the host reads ``tolist`` / ``numpy``): a worker thread's share of a step."""
    return _Counter(counts)


@contextmanager
def counting_ops() -> Iterator[OpCounts]:
    """Count the aten ops (syncs, launches, by name) and host reads that the block runs in this thread."""
    counts = OpCounts()
    methods = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
    try:
        for name, method in methods.items():
            setattr(torch.Tensor, name, _host_read(counts, method))
        with _Counter(counts):
            yield counts
    finally:
        for name, method in methods.items():
            setattr(torch.Tensor, name, method)
