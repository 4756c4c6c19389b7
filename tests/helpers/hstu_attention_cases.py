"""Random jagged HSTU attention inputs and a parity check, shared by the CPU and GPU kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freescale.kernels.hstu_attention import hstu_attention


@dataclass
class AttentionCase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    offsets: torch.Tensor
    timestamps: torch.Tensor
    query_times: torch.Tensor
    pos_bias: torch.Tensor
    time_bias: torch.Tensor
    num_heads: int
    max_len: int

    def leaves(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k, self.v, self.pos_bias, self.time_bias

    def args(self) -> tuple:
        return (self.q, self.k, self.v, self.offsets, self.timestamps, self.query_times, self.pos_bias,
                self.time_bias, self.num_heads, self.max_len)  # fmt: skip


def make_case(lengths: list[int], num_heads: int, head_dim: int, num_pos: int, buckets: int, seed: int,
              dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", max_gap: int = 10**6,
              fused: bool = False) -> AttentionCase:  # fmt: skip
    """Inputs at the scale the model sees (q·k of order 1); ``fused``: q/k/v are strided views of one
    ``[N, 3·H·D]`` projection, as the model's ``split`` hands them over."""
    gen = torch.Generator().manual_seed(seed)
    n, width = sum(lengths), num_heads * head_dim
    scale = head_dim**-0.5
    if fused:
        fused_rows = (torch.randn(n, 3 * width, generator=gen) * scale).to(dtype).to(device)
        q, k, v = (t.detach().requires_grad_() for t in fused_rows.split(width, dim=1))
    else:
        q, k, v = (
            (torch.randn(n, width, generator=gen) * scale).to(dtype).to(device).requires_grad_() for _ in range(3)
        )
    gaps = torch.randint(0, max_gap, (n,), generator=gen)
    timestamps = torch.cat([g.cumsum(0) for g in gaps.split(lengths)]) if n else gaps
    query_times = timestamps + torch.randint(0, max_gap, (n,), generator=gen)
    pos_bias = (torch.randn(num_pos, generator=gen) * 0.5).to(device).requires_grad_()
    time_bias = (torch.randn(buckets, generator=gen) * 0.5).to(device).requires_grad_()
    offsets = torch.tensor([0, *lengths]).cumsum(0).to(device)
    return AttentionCase(q, k, v, offsets, timestamps.to(device), query_times.to(device), pos_bias, time_bias,
                         num_heads, max(lengths, default=0))  # fmt: skip


def run(case: AttentionCase, kernel: str, grad_seed: int = 7) -> list[torch.Tensor]:
    """Output and the gradients of q, k, v, pos_bias, time_bias for a fixed random output gradient."""
    for t in case.leaves():
        t.grad = None
    out = hstu_attention(*case.args(), kernel=kernel)
    gen = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn(out.shape, generator=gen).to(out.dtype).to(out.device)
    out.backward(grad)
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in case.leaves()]
    return [out.detach().clone(), *(g.clone() for g in grads)]


def run_tiles(case: AttentionCase, config: object, grad_seed: int = 7) -> list[torch.Tensor]:
    """``run(case, "triton")`` through the kernels themselves with the tile ``config``
    (``hstu_attention_triton.AttentionKernelConfig``): output and the same gradients."""
    from freescale.kernels import hstu_attention_triton as tri

    args = case.args()
    out = tri.forward(*args, config)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.dtype).to(out.device)
    return [out, *tri.backward(grad, *args, config)]


NAMES = ("out", "dq", "dk", "dv", "dpos", "dtime")


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor], rel: float, context: str = "") -> None:
    """Every tensor within ``rel`` of the reference's largest magnitude (plus a tiny floor)."""
    for name, a, b in zip(NAMES, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
        scale = float(b.float().abs().max()) if b.numel() else 0.0
        err = float((a.float() - b.float()).abs().max()) if b.numel() else 0.0
        assert err <= rel * scale + 1e-6, f"{context} {name}: max error {err:.3g} vs scale {scale:.3g}"
