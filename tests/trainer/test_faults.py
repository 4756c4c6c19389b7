"""Training processes that fail loudly: launcher validation, hung and orphaned ranks, a second run into
locked folders, signals to the launcher, a rendezvous port another program holds, a rank whose peer
ended mid-collective.

Multi-rank cases start ``freescale train`` with 2 gloo ranks on the ``tiny`` preset (``train_cli``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


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
