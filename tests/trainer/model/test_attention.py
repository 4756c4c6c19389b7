"""The model's two HSTU attentions (``model_extra.attention``) compute the same thing.

The length-grouped PyTorch attention and the jagged Triton kernel (interpreter on CPU) give the
same outputs and parameter gradients through a whole ``SequentialTransducer``; the length-grouped
path also matches the per-sample oracle; ``auto`` resolves by device, and what cannot run is one
line naming the option.
"""

from __future__ import annotations

import pytest
import torch

from freescale.kernels.hstu_attention import hstu_attention
from freescale.model_config import ModelConfig
from freescale.trainer.data.jagged import build_layout
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.model.transducer import SequentialTransducer, resolve_attention

LENGTHS = [5, 17, 0, 2, 1, 40, 16]


def _inputs(seed: int = 0, d: int = 16) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)
    items, actions = torch.randn(n, d, generator=gen) * 0.3, torch.randn(n, d, generator=gen) * 0.3
    times = torch.cumsum(torch.randint(1, 50_000, (n,), generator=gen), 0)
    return items, actions, times, times + torch.randint(1, 50_000, (n,), generator=gen)


def _model(attention: str) -> SequentialTransducer:
    torch.manual_seed(3)
    model = SequentialTransducer(
        ModelConfig(d_model=16, num_layers=2, num_heads=2, max_uih_len=32),  # distances past 31 clamp
        ModelExtraConfig(attention=attention, time_buckets=16),
    )
    with torch.no_grad():  # non-zero biases, so their gradients and lookups are exercised
        for layer in model.layers:
            layer.pos_bias.normal_(0, 0.3)
            layer.time_bias.normal_(0, 0.3)
    return model


def _run(attention: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = _model(attention)
    items, actions, times, queries = _inputs()
    items.requires_grad_()
    out = model(items, actions, build_layout(torch.tensor(LENGTHS)), times, queries)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    grads["items"] = items.grad.clone()
    return out.detach(), grads


def test_triton_attention_matches_the_length_grouped_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out_torch, grads_torch = _run("torch")
    out_triton, grads_triton = _run("triton")
    torch.testing.assert_close(out_triton, out_torch, atol=2e-5, rtol=2e-5)
    assert grads_torch.keys() == grads_triton.keys()
    for name, grad in grads_torch.items():
        torch.testing.assert_close(grads_triton[name], grad, atol=5e-5, rtol=5e-5, msg=name)


def test_length_grouped_attention_matches_the_oracle() -> None:
    """One layer's PyTorch attention (groups, padding) equals the per-sample oracle."""
    layer = _model("torch").layers[0]
    items, _, times, queries = _inputs(seed=1)
    layout = build_layout(torch.tensor(LENGTHS))
    q, k, v = (items @ torch.randn(16, 16, generator=torch.Generator().manual_seed(s)) for s in range(3))
    from freescale.trainer.model.transducer import attention_contexts

    contexts = attention_contexts(layout, times, queries, 32, 16)
    grouped = layer._attention(q, k, v, layout, contexts)
    oracle = hstu_attention(q, k, v, layout.offsets, times, queries, layer.pos_bias, layer.time_bias, 2,
                            max(LENGTHS), kernel="reference")  # fmt: skip
    torch.testing.assert_close(grouped, oracle, atol=1e-5, rtol=1e-5)


def test_auto_resolves_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    assert resolve_attention("auto", "hstu", cpu) == "torch"
    assert resolve_attention("auto", "sasrec", torch.device("cuda")) == "torch"
    assert resolve_attention("torch", "hstu", torch.device("cuda")) == "torch"
    with pytest.raises(ValueError, match=r"model_extra\.attention 'triton' cannot run here"):
        resolve_attention("triton", "hstu", cpu)


def test_config_refuses_triton_for_sasrec_and_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"model_extra\.attention 'triton' is the HSTU kernel"):
        ModelExtraConfig(architecture="sasrec", attention="triton")
    with pytest.raises(ValueError, match=r"model_extra\.attention"):
        ModelExtraConfig(attention="flash")


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_bf16_precision_runs_the_layers_in_bf16_and_stays_close(attention: str, monkeypatch) -> None:
    """``model_extra.precision = "bf16"``: bf16 products under autocast, float32 out, parameters and
    their gradients float32; the result stays within bf16 rounding of the float32 model."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reference = _run(attention)
    model = _model(attention)
    model.precision = "bf16"
    items, actions, times, queries = _inputs()
    out = model(items, actions, build_layout(torch.tensor(LENGTHS)), times, queries)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    scale = reference[0].abs().max()
    assert (out.detach() - reference[0]).abs().max() <= 0.05 * scale
