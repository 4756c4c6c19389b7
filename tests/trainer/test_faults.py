"""Training that fails loudly: pessimistic evaluation of ties and NaN, non-finite steps, launcher
validation, empty steps, metrics on resume, checkpoint trust, hung and orphaned ranks, a second run
into locked folders, signals to the launcher, a rendezvous port another program holds.

One-process pieces run on a single-rank gloo group in this process; multi-rank cases start
``freescale train`` with 2 gloo ranks on the ``tiny`` preset (``train_cli``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.engines.engine import ItemShard
from freescale.trainer.eval.evaluate import evaluate

NUM_ITEMS = 50


def eval_samples(users: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    samples = []
    for user in range(users):
        n = int(rng.integers(3, 9))
        samples.append(
            {
                "item_ids": rng.integers(0, NUM_ITEMS, n),
                "actions": rng.integers(0, 3, n),
                "timestamps": np.cumsum(rng.integers(1, 1000, n)),
                "cost": float(n * n),
                "user_id": user,
                "window": 0,
                "length": n,
            }
        )
    return samples


class TableEngine:
    """An engine stand-in whose item table and queries the test chooses (``evaluate``'s hooks only)."""

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor, query: str) -> None:
        self.table, self.query = table, query

    def encode(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        last = batch.last_input_rows()
        target_ids = batch.item_ids[batch.target_index[last]]
        targets = self.table[target_ids]
        queries = targets.clone() if self.query == "target" else torch.full_like(targets, float("nan"))
        return queries, targets, target_ids

    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]

    def local_item_rows(self) -> ItemShard:
        return ItemShard(0, self.table)


def run_eval(table: torch.Tensor, query: str, num_candidates: int) -> dict[str, Any]:
    cfg = CollateConfig(num_items=NUM_ITEMS, num_actions=4, max_len=64, num_negatives=4, inbatch_negatives=0)
    return evaluate(TableEngine(table, query), eval_samples(40), cfg, num_candidates, k=10)


@pytest.mark.parametrize("num_candidates", [0, 30])
def test_tied_and_nan_scores_are_not_hits(one_rank_group, num_candidates: int) -> None:
    torch.manual_seed(0)
    distinct = torch.randn(NUM_ITEMS, 8)
    exact = run_eval(distinct, "target", num_candidates)  # query = target row: the unique best
    assert exact["hr@10"] == 1.0 and exact["ndcg@10"] == 1.0
    tied = run_eval(torch.ones(NUM_ITEMS, 8), "target", num_candidates)  # every item scores the same
    assert tied["hr@10"] == 0.0 and tied["ndcg@10"] == 0.0
    diverged = run_eval(distinct, "nan", num_candidates)
    assert diverged["users"] == 40 and diverged["hr@10"] == 0.0 and diverged["ndcg@10"] == 0.0


# non-finite steps --------------------------------------------------------------------------------
def tiny_run_config(overlap: str, temperature: float) -> Any:
    from freescale.trainer.config import RunConfig

    return RunConfig.from_dict(
        {
            "model": {"d_model": 16, "num_layers": 1, "num_heads": 2, "num_negatives": 4, "max_uih_len": 64},
            "model_extra": {"num_items": NUM_ITEMS, "num_actions": 4, "temperature": temperature},
            "data": {"path": "unused"},
            "engine": {"overlap": overlap},
        }
    )


def training_state(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter and optimizer state a step may touch, copied."""
    state = {f"model.{k}": v.clone() for k, v in engine.model.state_dict().items()}
    state.update({k: v.clone() for k, v in engine.tables.local_state().items()})
    for index, values in engine.dense_optimizer.state_dict()["state"].items():
        state.update({f"dense_optimizer.{index}.{k}": torch.as_tensor(v).clone() for k, v in values.items()})
    return state


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    return sorted(
        k for k in set(before) | set(after) if k not in before or k not in after or not torch.equal(before[k], after[k])
    )


@pytest.mark.parametrize("overlap", ["none", "pec"])
def test_nonfinite_step_updates_nothing(one_rank_group, overlap: str) -> None:
    from freescale.trainer.data.batches import collate
    from freescale.trainer.run_data import collate_config
    from freescale.trainer.runner import make_engine

    cfg = tiny_run_config(overlap, temperature=1e-45)  # logits overflow: the loss is NaN/inf
    engine = make_engine(cfg, 0, 1, torch.device("cpu"), cfg.engine.overlap)
    batches = iter([collate(eval_samples(8, seed=s), collate_config(cfg), s, 0) for s in range(3)])
    try:
        before = training_state(engine)
        engine.step(batches)
        engine.settle()
        assert engine.nonfinite
        assert changed(before, training_state(engine)) == []
        cfg.model_extra.temperature = 0.05  # a finite step afterwards trains as usual
        engine.step(batches)
        engine.settle()
        assert not engine.nonfinite
        touched = changed(before, training_state(engine))
        assert any(k.startswith("tables.item") for k in touched) and any(k.startswith("model.") for k in touched)
    finally:
        engine.close()


# 2-rank runs through `freescale train` -----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> str:
    from train_cli import prepare_tiny

    return prepare_tiny(tmp_path_factory.mktemp("faults-data"))


@pytest.mark.slow
def test_nonfinite_loss_stops_the_run_after_the_allowed_skips(tiny_dataset, tmp_path) -> None:
    from train_cli import run_toml, run_train

    config = run_toml(
        tmp_path / "run.toml",
        tiny_dataset,
        tmp_path / "out",
        model_extra={"temperature": 1e-45},  # logits overflow from the first step on
        engine={"max_nonfinite_skips": 2},
    )
    result = run_train(config, tmp_path)
    assert result.returncode != 0
    assert "step 2: non-finite loss or gradient" in result.stderr, result.stderr[-3000:]
    assert "engine.max_nonfinite_skips = 2" in result.stderr
    assert "step 0: non-finite loss or gradient, step skipped" in result.stdout
    assert "Traceback" not in result.stderr


def parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def job_processes(config: str) -> dict[str, list[int]]:
    """Pids of this job's torchrun agent, ranks and the ranks' loader workers (forked: same command
    line, a rank as parent), found by the config path on their command lines."""
    found: dict[str, list[int]] = {"agent": [], "rank": [], "worker": []}
    trainer = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if config.encode() not in argv:
            continue
        if b"freescale.trainer.lifetime" in argv or b"torch.distributed.run" in argv:
            found["agent"].append(int(entry.name))
        elif b"freescale.trainer" in argv:
            trainer.append(int(entry.name))
    for pid in trainer:
        found["worker" if parent_pid(pid) in trainer else "rank"].append(pid)
    return found


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_long_run(tiny_dataset: str, root: Path, **extra: dict) -> tuple[subprocess.Popen, str]:
    """``freescale train`` on 2 ranks for far longer than the test; returns when both ranks train."""
    from train_cli import FREESCALE, run_toml

    out = root / "out"
    data = {"max_steps": 1_000_000, **extra.pop("data", {})}
    config = run_toml(root / "run.toml", tiny_dataset, out, data=data, eval={"max_users": 0}, **extra)
    launcher = subprocess.Popen(
        [FREESCALE, "train", "--config", config, "--nproc", "2"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").exists():  # written at the first flush: both ranks are training
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.2)
    return launcher, str(Path(config).absolute())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_ranks_end_with_the_launcher(tiny_dataset, tmp_path, sig: int) -> None:
    launcher, config = start_long_run(tiny_dataset, tmp_path)
    job = job_processes(config)
    assert len(job["rank"]) == 2 and len(job["agent"]) == 1 and len(job["worker"]) == 2, job  # data.workers = 1
    everyone = job["rank"] + job["agent"] + job["worker"]
    try:
        launcher.send_signal(sig)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in everyone) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in everyone if alive(pid)]
        assert survivors == [], f"still running {signal.Signals(sig).name} + 10 s after the launcher: {survivors}"
        if sig != signal.SIGKILL:  # handled: one line (Ctrl-C: no rank's traceback), a signal's status
            err = launcher.stderr.read()
            assert launcher.returncode == 128 + sig, (launcher.returncode, err[-3000:])
            stopped = f"freescale train: stopped by {signal.Signals(sig).name}; every rank of the job was ended"
            assert err.strip().splitlines() == [stopped], err
    finally:
        for pid in everyone:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# launcher-side validation --------------------------------------------------------------------------
def test_launcher_refuses_what_ranks_would_trip_over(tiny_dataset, tmp_path, capsys) -> None:
    from train_cli import run_toml

    from freescale.tools.cli import main as cli_main

    cases = [
        ({}, ["--nproc", "3"], "world size 3 (--nproc x --nnodes) does not divide the group size 4"),
        ({}, ["--nproc", "1", "--nnodes", "3", "--rdzv-endpoint", "h:1"], "world size 3 (--nproc x --nnodes)"),
        ({}, ["--nproc", "1", "--nnodes", "2"], "--rdzv-endpoint must be HOST:PORT of node 0"),
        ({}, ["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank must be in [0, 2)"),
        ({"data": {"path": str(tmp_path / "missing")}}, [], "missing does not exist"),
        ({"data": {"max_steps": 1.5}}, [], "data.max_steps must be an integer, got 1.5"),
        ({"checkpoint": {"dir": str(tmp_path / "c"), "resume": str(tmp_path / "c" / "x")}}, [], "no .metadata"),
    ]
    for number, (tables, args, message) in enumerate(cases):
        config = run_toml(tmp_path / f"run{number}.toml", tiny_dataset, tmp_path / "out", **tables)
        started = time.monotonic()
        assert cli_main(["train", "--config", config, *(args or ["--nproc", "2"])]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert time.monotonic() - started < 5  # refused before any rank started


@pytest.mark.slow
def test_a_second_run_into_the_folders_of_a_running_one_is_refused(tiny_dataset, tmp_path) -> None:
    """Two real `freescale train` processes: while the first trains, a second one into its
    logging.out_dir, or into its checkpoint.dir, stops at once with one line naming the folder and
    the holder; the first run is not disturbed."""
    from train_cli import FREESCALE, run_toml

    ckpt = tmp_path / "ckpt"
    (tmp_path / "first").mkdir()
    launcher, config = start_long_run(tiny_dataset, tmp_path / "first", checkpoint={"dir": str(ckpt)})
    first_out = tmp_path / "first" / "out"
    job = job_processes(config)
    try:
        cases = [
            (run_toml(tmp_path / "same_out.toml", tiny_dataset, first_out), f"logging.out_dir {first_out}"),
            (
                run_toml(tmp_path / "same_ckpt.toml", tiny_dataset, tmp_path / "other", checkpoint={"dir": str(ckpt)}),
                f"checkpoint.dir {ckpt}",
            ),
        ]
        for second, folder in cases:
            started = time.monotonic()
            result = subprocess.run(
                [FREESCALE, "train", "--config", second, "--nproc", "2"],
                cwd=tmp_path, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1, result.stdout[-2000:] + result.stderr[-3000:]
            assert f"{folder} is being used by another run (pid {launcher.pid} on" in lines[0], lines
            assert time.monotonic() - started < 30
        assert launcher.poll() is None and all(alive(pid) for pid in job["rank"])  # the first one trains on
    finally:
        for pid in [launcher.pid, *job["rank"], *job["agent"], *job["worker"]]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=30)


def listening_socket() -> socket.socket:
    """Another program's port: bound on every address and listening, never answering."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(8)
    return sock


@pytest.mark.parametrize(
    ("node_rank", "message"),
    [(0, "is already in use on this machine, where node 0 hosts the rendezvous"), (1, "is not node 0's rendezvous")],
)
def test_a_rendezvous_port_held_by_another_program_fails_in_seconds(tiny_dataset, tmp_path, node_rank, message) -> None:
    """torchrun's node 0 gave a 45-line EADDRINUSE traceback after ~30 s, and node 1 waited silently in
    the store's handshake with that program until the job's timeout."""
    from train_cli import FREESCALE, run_toml

    config = run_toml(tmp_path / "run.toml", tiny_dataset, tmp_path / "out")
    with listening_socket() as taken:
        endpoint = f"127.0.0.1:{taken.getsockname()[1]}"
        started = time.monotonic()
        command = ["train", "--config", config, "--nproc", "1", "--nnodes", "2", "--node-rank", str(node_rank)]
        result = subprocess.run(
            [FREESCALE, *command, "--rdzv-endpoint", endpoint], cwd=tmp_path, capture_output=True, text=True, timeout=90
        )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert f"--rdzv-endpoint {endpoint}: " in lines[0] and message in lines[0], lines
    assert time.monotonic() - started < 30


def fake_checkpoint(root: Path, step: int) -> Path:
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"not really")
    (path / "__0_0.distcp").write_bytes(b"")
    for entry in (root, path, path / ".metadata", path / "__0_0.distcp"):
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    return path


def test_resume_refuses_checkpoints_others_can_write(tmp_path) -> None:
    from freescale.trainer.checkpoint_dirs import resolve_resume

    path = fake_checkpoint(tmp_path / "ckpt", 3)
    assert resolve_resume(str(tmp_path / "ckpt"), "latest") == str(path)
    (path / ".metadata").chmod(0o666)
    with pytest.raises(ValueError, match=r"\.metadata is writable by group/other \(mode 666\)"):
        resolve_resume(str(tmp_path / "ckpt"), "latest")
    (path / ".metadata").chmod(0o644)
    path.chmod(0o775)
    with pytest.raises(ValueError, match=r"step_00000003 is writable by group/other"):
        resolve_resume(str(tmp_path / "ckpt"), str(path))
    path.chmod(0o755)
    if os.getuid() == 0:  # root can hand the file to another user
        os.chown(path / "__0_0.distcp", 65534, 65534)
        with pytest.raises(ValueError, match=r"__0_0\.distcp is owned by uid 65534, not by this user"):
            resolve_resume(str(tmp_path / "ckpt"), str(path))


@pytest.mark.slow
def test_resume_into_the_same_out_dir_writes_each_step_once(tiny_dataset, tmp_path) -> None:
    from train_cli import run_toml, train

    ckpt = tmp_path / "ckpt"
    tables = {"data": {"max_steps": 6}, "eval": {"max_users": 0}, "logging": {"log_every": 2}}
    first = run_toml(
        tmp_path / "a.toml",
        tiny_dataset,
        tmp_path / "out",
        checkpoint={"dir": str(ckpt), "steps": [3], "at_end": False},
        **tables,
    )
    train(first, tmp_path)
    second = run_toml(
        tmp_path / "b.toml",
        tiny_dataset,
        tmp_path / "out",
        checkpoint={"dir": str(ckpt), "resume": "latest", "at_end": False},
        **tables,
    )
    train(second, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == list(range(6))


@pytest.mark.slow
def test_no_step_before_a_checkpoint_is_missing_from_metrics_after_a_kill(tiny_dataset, tmp_path) -> None:
    """A run killed between log flushes, resumed from its latest checkpoint: the steps before that
    checkpoint were logged with it, so every step is in ``metrics.jsonl`` once."""
    from train_cli import FREESCALE, run_toml, train

    from freescale.trainer.checkpoint_dirs import finished_steps

    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    tables = {"eval": {"max_users": 0}, "logging": {"log_every": 1000}}
    config = run_toml(
        tmp_path / "run.toml",
        tiny_dataset,
        out,
        data={"max_steps": 1_000_000},
        checkpoint={"dir": str(ckpt), "every": 2},
        **tables,
    )
    launcher = subprocess.Popen([FREESCALE, "train", "--config", config, "--nproc", "2"], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not (ckpt / "step_00000004").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint of step 4"
        time.sleep(0.1)
    launcher.kill()
    launcher.wait(timeout=30)
    time.sleep(2)  # the ranks end with the launcher (test_ranks_end_with_the_launcher)
    latest = finished_steps(str(ckpt))[-1]
    resumed = ["--set", "checkpoint.resume='latest'", "--set", f"data.max_steps={latest + 2}"]
    train(config, tmp_path, *resumed)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == list(range(latest + 2))


def test_resume_drops_a_metrics_line_torn_by_a_kill(tmp_path) -> None:
    from freescale.trainer.run_logs import keep_metrics_before

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step, "loss": 1.0}) for step in range(4)]
    path.write_text("\n".join([*lines, lines[0][:9]]))  # the killed run's last append, cut short
    assert keep_metrics_before(path, 2) == 1
    assert path.read_text().splitlines() == lines[:2]


def rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_naming_it(tiny_dataset, tmp_path) -> None:
    timeout = 5
    launcher, config = start_long_run(tiny_dataset, tmp_path, engine={"collective_timeout_s": timeout})
    job = job_processes(config)
    stopped = next(pid for pid in job["rank"] if rank_of(pid) == 1)
    try:
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        launcher.wait(timeout=timeout + 25)
        elapsed = time.monotonic() - started
        err = launcher.stderr.read()
        assert launcher.returncode != 0
        assert f"rank 1 (pid {stopped}, stopped) stopped answering" in err, err[-3000:]
        assert "engine.collective_timeout_s = 5 s" in err
        assert elapsed < timeout + 10, elapsed
    finally:
        for pid in job["rank"] + job["agent"] + job["worker"]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_steps_without_targets_are_reported_empty_and_left_out_of_the_loss() -> None:
    from freescale.trainer.metrics.bubbles import analyze, step_metrics
    from freescale.trainer.metrics.instrument import StageSpan, StepRecord

    def record(step: int, rank: int, loss: float, positions: int) -> StepRecord:
        stages = [StageSpan("forward", "compute", 0.0, 1.0)]
        return StepRecord(step, rank, 0.0, 1.0, stages, [], loss=loss, samples=4, positions=positions)

    mixed, empty = analyze([[record(0, 0, 2.0, 5), record(1, 0, 0.0, 0)], [record(0, 1, 0.0, 0), record(1, 1, 0.0, 0)]])
    assert step_metrics(mixed)["loss"] == 2.0 and "empty" not in step_metrics(mixed)
    assert step_metrics(empty)["loss"] is None and step_metrics(empty)["empty"] is True
    assert step_metrics(mixed)["rank_loss"] == [2.0, None] and step_metrics(empty)["rank_loss"] == [None, None]
    (diverged,) = analyze([[record(0, 0, float("nan"), 5)], [record(0, 1, 3.0, 5)]])
    assert step_metrics(diverged)["rank_loss"] == [None, 3.0]


def test_a_rank_whose_peer_ended_mid_collective_fails_in_one_line() -> None:
    """A rank waiting in a collective on a rank that exited (its own one-line error, a kill) says so in
    one line instead of a gloo traceback under the real error; other failures stay what they are."""
    from freescale.trainer.runner import collective_failure

    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
        "[127.0.0.1]:17281. This is typically caused by a remote worker crashing.\nCheck the logs"
    )
    failure = collective_failure(gloo, [], 300.0)
    assert failure is not None and "another rank ended while this one waited on it" in str(failure)
    assert "Connection closed by peer" in str(failure) and "\n" not in str(failure)
    stopped = collective_failure(RuntimeError("Timed out waiting 5000ms"), ["rank 1 (pid 7, stopped)"], 5.0)
    assert stopped is not None and "rank 1 (pid 7, stopped) stopped answering" in str(stopped)
    assert collective_failure(RuntimeError("a bug of ours"), [], 300.0) is None
