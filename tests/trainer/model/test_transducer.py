"""``SequentialTransducer`` (trainer/model/transducer.py): jagged batches equal each sample alone, and
HSTU's time bias reads the predicted event's time."""

from __future__ import annotations

import pytest
import torch

from freescale.model_config import ModelConfig
from freescale.trainer.data.jagged import build_layout
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.model.transducer import SequentialTransducer


@pytest.mark.parametrize("architecture", ["hstu", "sasrec"])
def test_jagged_batch_equals_each_sample_alone(architecture: str) -> None:
    """Length groups and padding must not change any sample's output (no batch-max padding)."""
    torch.manual_seed(0)
    model = SequentialTransducer(
        ModelConfig(d_model=16, num_layers=2, num_heads=2, max_uih_len=64),
        ModelExtraConfig(architecture=architecture, length_group_ratio=1.5),
    ).eval()
    lengths = [5, 17, 2, 9, 30, 16]
    layout = build_layout(torch.tensor(lengths), ratio=1.5)
    n = sum(lengths)
    items, actions = torch.randn(n, 16), torch.randn(n, 16)
    times = torch.cumsum(torch.randint(1, 5000, (n,)), 0)
    queries = times + torch.randint(1, 5000, (n,))
    together = model(items, actions, layout, times, queries)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        alone = model(items[rows], actions[rows], build_layout(torch.tensor([length])), times[rows], queries[rows])
        torch.testing.assert_close(together[rows], alone, atol=1e-5, rtol=1e-5)
        start += length


@pytest.mark.parametrize("architecture", ["hstu", "sasrec"])
def test_time_bias_reads_the_predicted_events_time(architecture: str) -> None:
    """HSTU's time bias buckets t_{i+1} - t_j (GR): moving only the last target's time changes only the
    last position's output, moving every time alike changes nothing; SASRec reads no timestamps."""
    torch.manual_seed(0)
    model = SequentialTransducer(
        ModelConfig(d_model=16, num_layers=2, num_heads=2, max_uih_len=64), ModelExtraConfig(architecture=architecture)
    ).eval()
    for layer in model.layers:  # zero-initialised biases would hide the dependence
        for name, param in layer.named_parameters():
            if name in ("pos_bias", "time_bias"):
                param.data.normal_()
    n = 12
    items, actions = torch.randn(n, 16), torch.randn(n, 16)
    times = torch.cumsum(torch.randint(1, 100, (n,)), 0)
    queries = torch.cat([times[1:], times[-1:] + 50])
    later = queries.clone()
    later[-1] += 10 * 86_400  # the last target comes after a long gap
    layout = build_layout(torch.tensor([n]))
    before, after = model(items, actions, layout, times, queries), model(items, actions, layout, times, later)
    torch.testing.assert_close(before[:-1], after[:-1])
    assert torch.equal(before[-1], after[-1]) == (architecture == "sasrec")
    shifted = model(items, actions, layout, times + 5_000, later + 5_000)  # only gaps count
    torch.testing.assert_close(shifted, after)
