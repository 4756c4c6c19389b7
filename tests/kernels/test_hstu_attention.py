"""Jagged HSTU attention: the Triton kernels (interpreter on CPU) against the PyTorch oracle.

Hypothesis draws jagged batches with empty and length-1 samples, distances beyond the position bias
(clamped), no time bias or one bucket, non-power-of-two head sizes and strided q/k/v; forward and
every gradient must match the oracle. The GPU file runs the same checks at real sizes.
"""

from __future__ import annotations

import pytest
import torch
from hstu_attention_cases import assert_close, make_case, run, run_tiles
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freescale.kernels.hstu_attention import hstu_attention
from freescale.kernels.hstu_attention_ref import time_bucket

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


pytestmark = pytest.mark.usefixtures("triton_interpreter")


@SETTINGS
@given(
    lengths=st.lists(st.one_of(st.just(0), st.just(1), st.integers(2, 70)), min_size=1, max_size=4),
    num_heads=st.integers(1, 2),
    head_dim=st.sampled_from([4, 8, 12]),
    num_pos=st.integers(1, 80),
    buckets=st.sampled_from([0, 1, 7, 64]),
    fused=st.booleans(),
    max_gap=st.sampled_from([2, 1000, 10**6]),
    seed=st.integers(0, 2**16),
)
def test_triton_matches_reference_fp32(lengths, num_heads, head_dim, num_pos, buckets, fused, max_gap, seed) -> None:
    case = make_case(lengths, num_heads, head_dim, num_pos, buckets, seed, fused=fused, max_gap=max_gap)
    want = run(case, "reference")
    got = run(case, "triton")
    assert_close(got, want, rel=2e-5, context=f"lengths={lengths}")


# Tiles of the long cases: still many per sample, a sixteenth of the interpreter's programs at 16x16.
LONG_CASE_TILES = dict(fwd_block_m=64, fwd_block_n=64, bwd_block=64, fwd_warps=1, bwd_warps=1)


def test_long_samples_fp32() -> None:
    """A few hundred positions: many tiles per sample, distances past the bias table."""
    from freescale.kernels import hstu_attention_triton as tri

    case = make_case([300, 5, 129], num_heads=2, head_dim=8, num_pos=200, buckets=64, seed=3)
    want = run(case, "reference")
    assert_close(run_tiles(case, tri.AttentionKernelConfig(**LONG_CASE_TILES)), want, rel=2e-5)


def test_other_tile_shapes() -> None:
    """Forward tiles taller than wide (the GPU default's shape) and 32-row backward tiles."""
    from freescale.kernels import hstu_attention_triton as tri

    case = make_case([70, 1, 33], num_heads=2, head_dim=8, num_pos=64, buckets=64, seed=9)
    config = tri.AttentionKernelConfig(fwd_block_m=32, fwd_block_n=16, bwd_block=32, fwd_warps=1, bwd_warps=1)
    assert_close(run_tiles(case, config), run(case, "reference"), rel=2e-5)


def test_tiles_of_one_time_bucket() -> None:
    """Seconds between events, minutes of history: far tiles see one bucket (the kernels' shortcut),
    near ones several; both must match the oracle, gradients of the time bias included."""
    from freescale.kernels import hstu_attention_triton as tri

    case = make_case([400, 90], num_heads=2, head_dim=8, num_pos=512, buckets=64, seed=8, max_gap=2)
    want = run(case, "reference")
    assert_close(run_tiles(case, tri.AttentionKernelConfig(**LONG_CASE_TILES)), want, rel=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype: torch.dtype) -> None:
    """bf16/fp16 inputs, float32 accumulation: within the inputs' rounding of the float32 oracle."""
    case = make_case([40, 1, 0, 77], num_heads=2, head_dim=16, num_pos=64, buckets=64, seed=11, dtype=dtype)
    got, want = run(case, "triton"), run(case, "reference")
    assert_close(got, want, rel=2e-2 if dtype == torch.bfloat16 else 4e-3)


def test_empty_batches() -> None:
    for lengths in ([0], [0, 0, 0]):
        case = make_case(lengths, num_heads=2, head_dim=8, num_pos=4, buckets=8, seed=0)
        got = run(case, "triton")
        assert all(t.numel() == 0 or not t.any() for t in got), lengths
        assert got[4].shape == (4,) and got[5].shape == (8,)


def test_gradients_repeat_bit_for_bit() -> None:
    case = make_case([33, 17, 50], num_heads=2, head_dim=8, num_pos=64, buckets=64, seed=5)
    first, second = run(case, "triton"), run(case, "triton")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_time_bucket_formula_is_pinned() -> None:
    """GR's log bucketing (what the kernel reproduces): zero, negative and huge gaps."""
    gaps = torch.tensor([0, 1, 2, 3, -4, 59, 3600, 86_400, 10**7, -(10**9), 2**40])
    buckets = time_bucket(gaps, 64)
    assert buckets.tolist() == [0, 0, 2, 3, 4, 13, 27, 37, 53, 63, 63]


def test_bad_inputs_name_the_argument() -> None:
    case = make_case([3, 2], num_heads=2, head_dim=4, num_pos=4, buckets=4, seed=0)
    args = list(case.args())
    with pytest.raises(ValueError, match="num_heads"):
        hstu_attention(*args[:8], 3, case.max_len)
    args[4] = case.timestamps.float()
    with pytest.raises(ValueError, match="timestamps must be a 1-d int64"):
        hstu_attention(*args)
    with pytest.raises(ValueError, match="kernel must be one of"):
        hstu_attention(*case.args(), kernel="cuda")


def test_custom_ops_opcheck() -> None:
    """``torch.library.opcheck``: schema, fake kernels, autograd registration, AOT dispatch."""
    from freescale.kernels import hstu_attention as ops

    case = make_case([5, 0, 9], num_heads=2, head_dim=4, num_pos=8, buckets=8, seed=2)
    torch.library.opcheck(ops.hstu_attention_op, case.args())
    grad = torch.randn(case.v.shape)
    torch.library.opcheck(ops.hstu_attention_backward_op, (grad, *(t.detach() for t in case.args()[:8]),
                                                           case.num_heads, case.max_len))  # fmt: skip


def test_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()
    case = make_case([6, 11], num_heads=2, head_dim=4, num_pos=16, buckets=8, seed=4)

    def layer(q, k, v):
        return hstu_attention(q.sin(), k, v, *case.args()[3:]).square()

    eager = layer(case.q, case.k, case.v)
    eager.sum().backward()
    expect = [t.grad.clone() for t in (case.q, case.k, case.v)]
    for t in case.leaves():
        t.grad = None
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(case.q, case.k, case.v)
    compiled.sum().backward()
    assert torch.allclose(compiled, eager, atol=1e-6)
    assert all(torch.allclose(t.grad, e, atol=1e-6) for t, e in zip((case.q, case.k, case.v), expect))
