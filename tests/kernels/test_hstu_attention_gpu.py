"""Jagged HSTU attention on a CUDA device at real sizes: the compiled Triton kernels vs the oracle.

Skipped without a CUDA device. The CPU file checks the same math through Triton's interpreter; this
one checks what only a GPU runs: the compiled kernels (wgmma/mma tiles, libdevice ``logf``, IEEE
division), lengths to 8,192, bit-for-bit repeatable gradients and the model's ``auto`` choice.
"""

from __future__ import annotations

import pytest
import torch
from hstu_attention_cases import assert_close, make_case, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False (the compiled Triton kernels run on GPUs)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
CUDA = "cuda"


def test_long_samples_bf16() -> None:
    """Lengths to 8,192 with empty and length-1 samples; distances past the 4,096-entry position bias."""
    case = make_case([8192, 1, 0, 3000, 517], num_heads=4, head_dim=64, num_pos=4096, buckets=64, seed=1,
                     dtype=torch.bfloat16, device=CUDA, max_gap=100_000, fused=True)  # fmt: skip
    assert_close(run(case, "triton"), run(case, "reference"), rel=3e-2, context="bf16 8192")


def test_float32_highest_precision_is_tight() -> None:
    """float32 inputs under the default matmul precision ("highest"): IEEE products, tight agreement,
    and time buckets identical to torch's (a bucket off by one would move a score by ~1)."""
    assert torch.get_float32_matmul_precision() == "highest"
    case = make_case(
        [700, 64, 1, 129], num_heads=2, head_dim=64, num_pos=1024, buckets=64, seed=2, device=CUDA, max_gap=10**6
    )  # fmt: skip  (a sample spans < 2^30 s: docs/kernels.md)
    with torch.no_grad():
        case.time_bias.copy_(torch.arange(64, dtype=torch.float32, device=CUDA) * 0.5)  # buckets far apart
    assert_close(run(case, "triton"), run(case, "reference"), rel=1e-4, context="fp32")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.one_of(st.just(0), st.just(1), st.integers(2, 1500)), min_size=1, max_size=6),
    num_pos=st.integers(1, 2000),
    seed=st.integers(0, 2**16),
)
def test_random_jagged_batches_bf16(lengths: list[int], num_pos: int, seed: int) -> None:
    case = make_case(lengths, num_heads=4, head_dim=64, num_pos=num_pos, buckets=64, seed=seed, dtype=torch.bfloat16,
                     device=CUDA)  # fmt: skip
    assert_close(run(case, "triton"), run(case, "reference"), rel=3e-2, context=f"lengths={lengths}")


def test_gradients_repeat_bit_for_bit_on_gpu() -> None:
    """No float atomics: two backward passes give identical bits (PEC's exactness relies on it)."""
    case = make_case([2048, 300, 5, 999], num_heads=4, head_dim=64, num_pos=2048, buckets=64, seed=4,
                     dtype=torch.bfloat16, device=CUDA)  # fmt: skip
    first, second = run(case, "triton"), run(case, "triton")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_model_picks_the_kernel_on_cuda() -> None:
    from freescale.trainer.model.transducer import resolve_attention

    assert resolve_attention("auto", "hstu", torch.device(CUDA)) == "triton"


def test_fast_silu_stays_within_bf16_rounding() -> None:
    """``fast_silu`` (the hardware tanh.approx for the sigmoid) at real sizes: forward and gradients
    within the same bf16 tolerance as the exact kernel."""
    from hstu_attention_cases import run_tiles

    from freescale.kernels import hstu_attention_triton as tri

    case = make_case([4096, 1, 700, 33], num_heads=4, head_dim=64, num_pos=4096, buckets=64, seed=6,
                     dtype=torch.bfloat16, device=CUDA, max_gap=100_000)  # fmt: skip
    fast = tri.AttentionKernelConfig(fast_silu=True)
    assert_close(run_tiles(case, fast), run(case, "reference"), rel=3e-2, context="fast_silu bf16")


def test_bucket_edges_match_the_cuda_log() -> None:
    """The edges searched on the GPU bucket every gap near them as ``time_bucket`` does on the GPU."""
    from freescale.kernels.hstu_attention_ref import time_bucket
    from freescale.kernels.time_bucket_edges import NEVER, bucket_edges

    edges = bucket_edges(64, 4, CUDA).to(torch.int64)
    reached = edges[:64][edges[:64] < NEVER]
    gaps = (reached[:, None] + torch.arange(-3, 4, device=CUDA)[None, :]).flatten().clamp(1, NEVER - 1)
    by_edges = (gaps[:, None] >= edges[None, 1:64]).sum(1)
    assert torch.equal(by_edges, time_bucket(gaps, 64))
