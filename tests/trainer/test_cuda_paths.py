"""The trainer's CUDA-only decisions, checked on CPU: GPU sharing (``engine.share_gpus``), each rank's
device, the process group's options, what the stage timer synchronises, when the PEC worker hands
tensors to the main thread, and ``engine.deterministic``.

Nothing here needs a GPU: the CUDA calls are replaced by recorders where the code would make them.
"""

from __future__ import annotations

import os
import types
from concurrent.futures import Future

import pytest
import torch

from freescale.trainer.config import RunConfig
from freescale.trainer.engine_config import EngineConfig
from freescale.trainer.engines.overlap import CommWorker
from freescale.trainer.launch import check_cuda_devices
from freescale.trainer.metrics.instrument import StepTimer
from freescale.trainer.rank_process import cuda_index, process_group_options, use_deterministic
from freescale.trainer.runner import TrainingError


def run_config(**engine: object) -> RunConfig:
    return RunConfig.from_dict({"data": {"path": "x"}, "engine": engine})


def test_shared_gpus_run_gloo_and_refuse_nccl_or_cpu() -> None:
    assert EngineConfig(device="cuda", share_gpus=True).resolved_backend() == "gloo"
    assert EngineConfig(device="cuda").resolved_backend() == "nccl"
    assert EngineConfig(device="cuda", share_gpus=True, backend="gloo").resolved_backend() == "gloo"
    with pytest.raises(ValueError, match=r"engine.share_gpus cannot run on engine.backend 'nccl'"):
        EngineConfig(device="cuda", share_gpus=True, backend="nccl")
    with pytest.raises(ValueError, match=r"engine.share_gpus needs engine.device 'cuda'"):
        EngineConfig(share_gpus=True)
    with pytest.raises(ValueError, match=r"engine.share_gpus must be true or false"):
        run_config(device="cuda", share_gpus=1)


def test_the_launcher_explains_too_few_gpus() -> None:
    plain, shared = run_config(device="cuda"), run_config(device="cuda", share_gpus=True)
    with pytest.raises(ValueError, match=r"--nproc 2 needs 2 CUDA devices, 1 visible .*set engine.share_gpus = true"):
        check_cuda_devices(plain, 2, 1)
    with pytest.raises(ValueError, match=r"no CUDA device is visible"):
        check_cuda_devices(shared, 1, 0)
    check_cuda_devices(shared, 2, 1)
    check_cuda_devices(plain, 2, 2)
    check_cuda_devices(plain, 1, 1)


def test_each_rank_gets_its_gpu_or_shares_one() -> None:
    assert [cuda_index(r, 2, False) for r in range(2)] == [0, 1]
    assert [cuda_index(r, 1, True) for r in range(3)] == [0, 0, 0]
    assert [cuda_index(r, 2, True) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(TrainingError, match=r"local rank 1 has no GPU of its own \(1 visible\)"):
        cuda_index(1, 1, False)
    with pytest.raises(TrainingError, match=r"no CUDA device is visible"):
        cuda_index(0, 0, True)


def test_only_nccl_binds_the_process_group_to_the_gpu() -> None:
    gpu = torch.device("cuda", 0)
    assert process_group_options("nccl", gpu) == {"device_id": gpu}
    assert process_group_options("gloo", gpu) == {}
    assert process_group_options("gloo", torch.device("cpu")) == {}


class Recorder:
    """A stand-in CUDA stream that logs what is done to it."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def synchronize(self) -> None:
        self.log.append(f"sync {self.name}")


def test_the_stage_timer_synchronises_its_own_stream_not_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """PEC's worker has a stream of its own: a device-wide synchronize at each of the main thread's
    stage boundaries would wait for the worker's prefetch and serialise what PEC overlaps."""
    log: list[str] = []

    def device_wide() -> None:
        raise AssertionError("torch.cuda.synchronize() waits for every stream, the PEC worker's too")

    monkeypatch.setattr(torch.cuda, "synchronize", device_wide)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Recorder(log, f"current {device}"))
    timer = StepTimer(0, torch.device("cuda", 0))
    timer.begin_step(0)
    with timer.stage("forward", "compute"):
        pass
    timer.end_step()
    assert log == ["sync current cuda:0"] * 3
    log.clear()
    StepTimer(0, torch.device("cuda", 0), enabled=False).now()
    assert log == []


def test_the_pec_worker_publishes_after_its_stream_finished() -> None:
    """The routing the worker publishes is used on the main thread's stream while the task goes on."""
    log: list[str] = []
    worker = types.SimpleNamespace(stream=Recorder(log, "worker"))
    future: Future = Future()
    future.add_done_callback(lambda _: log.append("published"))
    CommWorker.publish(worker, future, 7)
    assert log == ["sync worker", "published"] and future.result() == 7
    cpu_future: Future = Future()
    CommWorker.publish(types.SimpleNamespace(stream=None), cpu_future, 8)
    assert cpu_future.result() == 8


def test_deterministic_mode_fixes_the_cublas_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode: calls.append(mode))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    use_deterministic(False)
    assert calls == [] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    use_deterministic(True)
    assert calls == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
