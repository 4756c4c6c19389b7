"""CopyEngineTransport against the gloo result: two processes sharing one GPU (CUDA IPC).

Skipped without a CUDA device. The processes are this file run as a script (see test_transport.py).
Each rank runs the same exchanges through gloo on CPU tensors and through the copy-engine transport
on the GPU and requires identical bytes, across staging growth, zero-row splits, bf16/int/float
payloads with several trailing dims, and both the copying and the zero-copy (view) receive modes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from freescale.kernels.transport import TorchDistTransport, TransportConfig, make_transport

if __name__ != "__main__":  # the pytest side (collected on CPU too, so a moved helper fails there); ranks run this file
    from rank_workers import run_workers

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False (the copy-engine transport uses CUDA IPC)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
WORLD = 2


def _payload(rank: int, counts: list[int], shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn((sum(counts), *shape), generator=gen) * 100
    return x.to(dtype)


def worker(rank: int, world: int, init_file: str) -> None:
    from freescale.kernels.transport_copy_engine import CopyEngineTransport

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    device = torch.device("cuda", 0)  # both ranks share one GPU
    torch.cuda.set_device(device)
    try:
        gloo = TorchDistTransport()
        auto = make_transport(TransportConfig(transport="auto", capacity_bytes=1 << 20), device=device)
        assert isinstance(auto, CopyEngineTransport), type(auto)
        view_mode = CopyEngineTransport(device=device, capacity_bytes=1 << 20, copy_out=False)
        cases = [([3, 0], (4,), torch.float32), ([0, 0], (2, 3), torch.bfloat16), ([5, 7], (), torch.int64),
                 ([70000, 1], (16,), torch.bfloat16),  # 2.2 MB: grows the 2 MiB staging
                 ([1, 2 + rank], (256,), torch.bfloat16), ([0, 4], (3,), torch.float64)]  # fmt: skip
        for i, (counts, shape, dtype) in enumerate(cases * 2):
            counts = counts if rank == 0 else counts[::-1]
            send = _payload(rank, counts, shape, dtype, i)
            expect = gloo.start(send, counts).wait()
            for transport in (auto, view_mode):
                handle = transport.start(send.to(device), counts)
                got = handle.wait()
                assert got.device == device and got.dtype == dtype
                assert torch.equal(got.cpu(), expect), (i, counts, shape, dtype)
                assert handle.recv_counts == gloo.exchange_counts(counts)
        torch.cuda.synchronize()
        auto.close()
        view_mode.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_copy_engine_matches_gloo(tmp_path: Path) -> None:
    run_workers(__file__, WORLD, tmp_path)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
