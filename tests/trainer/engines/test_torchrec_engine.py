"""The TorchRec engine (trainer/engines/torchrec_engine.py) waits for its read-ahead exchanges on close."""

from __future__ import annotations

import pytest
import torch


def test_torchrec_engine_close_waits_for_the_read_ahead_exchanges(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline ends with the next batch's all-to-alls in flight: ``close`` waits for them and
    drops the pipeline (detached) before the process group goes, instead of leaving gloo works to
    interpreter exit (a 2-host rank aborted there once)."""
    pytest.importorskip("torchrec")
    from types import SimpleNamespace

    import torch.distributed as dist

    from freescale.trainer.engines import torchrec_engine
    from freescale.trainer.metrics.instrument import StepTimer

    class Pending:
        def __init__(self) -> None:
            self.done = False

        def wait(self, *args, **kwargs) -> bool:
            self.done = True
            return True

        def is_completed(self) -> bool:
            return self.done

    launched: list[Pending] = []

    def fake_all_to_all(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        launched.append(Pending())
        return launched[-1]

    monkeypatch.setattr(dist, "all_to_all_single", fake_all_to_all)
    in_flight: list = []
    original = torchrec_engine._install_a2a_timing(StepTimer(0, torch.device("cpu"), True), in_flight)
    for _ in range(3):
        dist.all_to_all_single(torch.empty(1), torch.empty(1), async_op=True)
    launched[0].wait()  # finished ones are dropped at the next launch
    dist.all_to_all_single(torch.empty(1), torch.empty(1), async_op=True)
    assert in_flight == launched[1:]
    detached = []
    engine = SimpleNamespace(_in_flight=in_flight, _original_a2a=original, _batches=iter([]),
                             pipeline=SimpleNamespace(detach=lambda: detached.append(True)))  # fmt: skip
    engine.finish_training = lambda: torchrec_engine.TorchRecEngine.finish_training(engine)
    torchrec_engine.TorchRecEngine.close(engine)  # close finishes training first (the engine protocol)
    assert all(work.done for work in launched) and in_flight == []
    assert detached == [True] and engine.pipeline is None and engine._batches is None
    assert dist.all_to_all_single is fake_all_to_all
