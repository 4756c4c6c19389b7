"""Gradients of dispatch/combine and torch.compile tracing of the ``freescale::`` custom ops.

Dispatch's gradient is combine of the gradient and vice versa; gradcheck (float64) verifies the
reference, and every implementation must produce bit-identical gradients (they are all copies).
"""

from __future__ import annotations

import pytest
import torch

from freescale.kernels import KERNELS, JaggedRows, combine, combine_jagged, dispatch, dispatch_jagged

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module", autouse=True)
def _triton_interpreter():
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE.type == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield


def _batch(seed: int, n: int = 23, world: int = 6, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (n,), generator=gen)
    lengths[:3] = 0
    values = torch.randn(int(lengths.sum()), 3, generator=gen, dtype=dtype).to(DEVICE)
    dense = torch.randn(n, 2, generator=gen, dtype=dtype).to(DEVICE)
    dest = torch.randint(0, world, (n,), generator=gen).to(DEVICE)
    return values, lengths.to(DEVICE), dense, dest, world


def test_gradcheck_reference() -> None:
    values, lengths, dense, dest, world = _batch(0)
    plan = dispatch(dense, dest, world, kernel="pytorch").plan

    def fixed(x: torch.Tensor) -> torch.Tensor:
        return dispatch(x, dest, world, kernel="pytorch").buffer

    def back(y: torch.Tensor) -> torch.Tensor:
        return combine(y, plan, kernel="pytorch")

    def jagged(v: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = dispatch_jagged(JaggedRows(v, lengths, d), dest, world, kernel="pytorch").buffer
        home = combine_jagged(JaggedRows(out.values * 3, out.lengths, out.dense.sin()),
                              dispatch_jagged(JaggedRows(v, lengths, d), dest, world, kernel="pytorch").plan,
                              kernel="pytorch")  # fmt: skip
        return out.values, home.dense

    d = dense.clone().requires_grad_()
    v = values.clone().requires_grad_()
    assert torch.autograd.gradcheck(fixed, (d,))
    assert torch.autograd.gradcheck(back, (d,))
    assert torch.autograd.gradcheck(jagged, (v, d))
    assert torch.autograd.gradgradcheck(fixed, (d,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_identical_across_kernels(dtype: torch.dtype) -> None:
    values, lengths, dense, dest, world = _batch(1, n=140, dtype=dtype)
    gen = torch.Generator().manual_seed(2)
    g_vals = torch.randn(values.shape, generator=gen).to(dtype).to(DEVICE)
    g_dense = torch.randn(dense.shape, generator=gen).to(dtype).to(DEVICE)
    grads = {}
    for k in KERNELS:
        v, d = values.clone().requires_grad_(), dense.clone().requires_grad_()
        res = dispatch_jagged(JaggedRows(v, lengths, d), dest, world, kernel=k)
        torch.autograd.backward([res.buffer.values, res.buffer.dense], [g_vals, g_dense])
        # dispatch's gradient is combine of the gradient
        expect = combine_jagged(JaggedRows(g_vals, res.buffer.lengths, g_dense), res.plan, kernel=k)
        assert torch.equal(v.grad, expect.values) and torch.equal(d.grad, expect.dense), k
        y = res.buffer.dense.detach().clone().requires_grad_()
        combine(y, res.plan, kernel=k).backward(g_dense)
        # combine's gradient is dispatch of the gradient
        assert torch.equal(y.grad, dispatch(g_dense, dest, world, kernel=k).buffer), k
        grads[k] = (v.grad, d.grad, y.grad)
    for k in KERNELS:
        for a, b in zip(grads[k], grads["pytorch"]):
            assert torch.equal(a, b), k


def _round_trip(x: torch.Tensor, dest: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor):
    """A model-like step: dispatch, compute on the balanced placement, combine back."""
    res = dispatch(x, dest, 4)
    y = combine(res.buffer * 2 + 1, res.plan)
    jag = dispatch_jagged(JaggedRows(v, lengths, x), dest, 4)
    back = combine_jagged(JaggedRows(jag.buffer.values.sin(), jag.buffer.lengths, jag.buffer.dense),
                          jag.plan)  # fmt: skip
    return y, back.values, jag.plan.value_counts


def test_torch_compile_fullgraph_inductor_cpu() -> None:
    """``torch.compile(fullgraph=True)`` with the default (inductor) backend traces the custom ops.

    On this CPU host inductor compiles the surrounding graph with its C++ backend; the custom ops
    stay opaque calls with fake implementations supplying shapes. Backward is compiled too.
    """
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(12, 3, generator=gen).requires_grad_()
    lengths = torch.tensor([0, 2, 1, 3, 0, 1, 0, 0, 2, 1, 4, 0])
    v = torch.randn(int(lengths.sum()), 2, generator=gen).requires_grad_()
    dest = torch.randint(0, 4, (12,), generator=gen)
    compiled = torch.compile(_round_trip, fullgraph=True)
    y, vals, vcounts = compiled(x, dest, v, lengths)
    (y.sum() + vals.sum()).backward()
    assert torch.equal(y, x * 2 + 1)
    assert torch.allclose(vals, v.sin())
    assert torch.equal(vcounts, torch.zeros(4, dtype=torch.int64).index_add_(0, dest, lengths))
    assert torch.allclose(x.grad, torch.full_like(x, 2.0))
    assert torch.allclose(v.grad, v.detach().cos())


def test_torch_compile_aot_eager_triton() -> None:
    """The Triton implementation traces the same way (fake kernels do not depend on the kernel)."""
    torch._dynamo.reset()

    def step(x: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
        res = dispatch(x, dest, 8, kernel="triton")
        return combine(res.buffer.cos(), res.plan, kernel="triton")

    x = torch.randn(10, 4).to(DEVICE).requires_grad_()
    dest = torch.randint(0, 8, (10,)).to(DEVICE)
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(x, dest)
    out.sum().backward()
    assert torch.allclose(out, x.cos()) and torch.allclose(x.grad, -x.detach().sin())


@pytest.mark.parametrize("kernel", ["pytorch", "triton"])
def test_custom_ops_opcheck(kernel: str) -> None:
    """``torch.library.opcheck``: schema, fake kernels, autograd registration, AOT dispatch."""
    from freescale.kernels import dispatch_ops as ops

    values, lengths, dense, dest, world = _batch(4, n=9, dtype=torch.float32)
    _, _, perm, inverse = ops.dispatch_plan(dest, world, kernel)
    fields = ops.jagged_dispatch_plan(dest, lengths, world, kernel)
    svoff, hoff = fields[7], fields[8]
    torch.library.opcheck(ops.dispatch_plan, (dest, world, kernel))
    torch.library.opcheck(ops.jagged_dispatch_plan, (dest, lengths, world, kernel))
    torch.library.opcheck(ops.gather_rows, (dense.clone().requires_grad_(), perm, inverse, kernel))
    torch.library.opcheck(ops.jagged_gather, (values.clone().requires_grad_(), hoff, svoff, perm, inverse, kernel))
    assert torch.equal(ops.gather_rows(dense, perm, inverse, kernel), dense[perm])
