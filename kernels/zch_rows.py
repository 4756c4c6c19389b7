"""The embedding side of a zero-collision table: a row given to a new id starts over.

When ``ZchTable.lookup`` hands a row to a new id (an empty slot or an evicted id's), the row still
holds what the previous id learned, and so does its optimizer state: Adagrad's accumulator keeps the
old id's squared gradients (a re-used row would barely move, the "rows go to zero" report against
TorchRec's managed-collision tables), Adam's moments and step count its old direction and bias
correction. ``reset_rows`` re-initialises the rows and zeroes every per-row optimizer tensor in the
same step, so the new id trains exactly like a never-used row.

The new values come from ``hashed_uniform``: a function of its key (the trainer keys a row by the raw
id it now holds: ``trainer/engines/zch_shard.py``), seed and table through the same fixed hash as the
ids, so the owner of a row and every rank holding a prefetched copy of it (PEC) compute the same bits
without sending them, on CPU and CUDA alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .zch_hash import GOLDEN, MASK64, as_signed, logical_shift_right, mix64, mix64_int


def hashed_uniform(
    rows: torch.Tensor, dim: int, *, bound: float, seed: int = 0, table: int = 0, step: int | torch.Tensor = 0
) -> torch.Tensor:
    """[len(rows), dim] float32 uniform in [-bound, bound), a pure function of (seed, table, key, step, column).

    ``rows``: the keys, any int64 (a row, or the raw id a row holds).
    24 bits of ``mix64`` per element, scaled exactly in float32, so every device gets the same values.
    ``step``: one for all rows, or an int64 tensor of one per row (the same values as row by row).
    """
    rows = rows.reshape(-1).to(torch.int64)
    # salts are filled on the device, not copied from host tensors: a blocking host-to-device copy waits, on
    # CUDA, for everything queued before it (a reset at the start of a step would wait for the last step)
    if isinstance(step, int):  # one salt: on the host (the same bits as the tensor form below, fewer launches)
        salt = torch.full((), as_signed(salt_int(seed, table, step)), dtype=torch.int64, device=rows.device)
    else:
        salt = torch.full((), seed, dtype=torch.int64, device=rows.device)
        for part in (table, step):
            salt = mix64(mix64(salt) + part)
    columns = torch.arange(dim, dtype=torch.int64, device=rows.device)
    h = mix64(mix64(rows[:, None] * as_signed(GOLDEN) + salt[..., None]) + columns)
    unit = logical_shift_right(h, 40).to(torch.float32) * (1.0 / (1 << 24))  # [0, 1), exact
    return unit * (2 * bound) - bound


def salt_int(seed: int, table: int, step: int) -> int:
    """``hashed_uniform``'s salt for one step, on Python ints (unsigned): ``mix64(mix64(s) + part)`` for the
    table, then the step, from the seed, every addition modulo 2**64."""
    salt = seed
    for part in (table, step):
        salt = mix64_int((mix64_int(salt) + part) & MASK64)
    return salt


@torch.no_grad()
def reset_rows(
    weight: torch.Tensor | torch.nn.Embedding,
    rows: torch.Tensor,
    *states: Mapping[str, torch.Tensor],
    values: torch.Tensor | None = None,
    bound: float | None = None,
    seed: int = 0,
    table: int = 0,
    step: int = 0,
) -> None:
    """Give ``rows`` fresh embeddings and zero their optimizer state, in place.

    ``weight``: the table (or this rank's shard, ``rows`` then local); ``states``: optimizer state per
    row, name -> tensor whose first dimension is the table's rows, such as ``RowWiseAdagrad.state``
    (``momentum``) and ``LazyAdam.state`` (``exp_avg``, ``exp_avg_sq``, ``steps``). A state tensor
    without one entry per row (torch.optim.Adam's shared scalar ``step``) cannot be reset per row and is
    refused. ``values`` default: ``hashed_uniform`` with ``bound`` (default sqrt(1/rows), the tables'
    initial range) keyed by ``seed``, ``table`` and ``step``.
    """
    if isinstance(weight, torch.nn.Embedding):
        weight = weight.weight
    rows = rows.reshape(-1).to(device=weight.device, dtype=torch.int64)
    for state in states:
        for name, tensor in state.items():
            if tensor.dim() == 0 or tensor.shape[0] != weight.shape[0]:
                raise ValueError(
                    f"optimizer state {name!r} has shape {tuple(tensor.shape)}, not one entry per row of the "
                    f"{weight.shape[0]}-row table: its rows cannot be reset"
                )
    if rows.numel() == 0:
        return
    if values is None:
        bound = (1.0 / weight.shape[0]) ** 0.5 if bound is None else bound
        values = hashed_uniform(rows, weight.shape[1], bound=bound, seed=seed, table=table, step=step)
    weight.index_copy_(0, rows, values.to(device=weight.device, dtype=weight.dtype))
    for state in states:
        for tensor in state.values():
            tensor.index_fill_(0, rows, 0)
