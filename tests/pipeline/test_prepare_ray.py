"""``prepare --executor ray`` on a real two-node Ray cluster (127.0.0.1, started and stopped here):
byte-identical to the local executor on local and s3:// data, through a worker killed during the scan
and during the write, and through a killed driver that is run again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_cluster import RayCluster, dataset_files, free_ports, local_files, s3_files, start_cluster
from s3_upload import upload_tree

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate

FREESCALE = str(Path(sys.executable).parent / "freescale")
# sliding windows of a tiny dataset give two parts (PART_SIZE samples each), so parts are written by
# parallel tasks and their indexes merged
OPTIONS = [
    "--group-size", "4", "--micro-batch-size", "4", "--max-uih-len", "64", "--window-stride", "1",
    "--seed", "1", "--shard-size-limit", "256KB", "--quiet",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    cluster = start_cluster(worker_nodes=1)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("ray-sources")
    generate(preset("tiny", seed=3, n_users=1500), str(out))
    return str(out / "sources.toml")


def run_prepare(sources: str, out: str, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    command = [FREESCALE, "prepare", "--sources", sources, "--output", out, *OPTIONS, *options]
    return subprocess.Popen(
        command, cwd=tempfile.gettempdir(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err


def on_cluster(cluster: RayCluster, sources: str, out: str, *options: str, **env: str) -> subprocess.Popen:
    return run_prepare(
        sources, out, "--executor", "ray", "--ray-address", cluster.address, *options, env=cluster.driver_env(**env)
    )


@pytest.fixture(scope="module")
def local_output(sources, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("local") / "ds"
    finish(run_prepare(sources, str(out), "--workers", "2"))
    files = local_files(str(out))
    assert sum(name.endswith("index.json") and name.startswith("part-") for name in files) >= 2, "want 2+ parts"
    return dataset_files(files)


def test_ray_cluster_writes_the_local_engines_bytes(cluster, sources, local_output, tmp_path) -> None:
    out = tmp_path / "ds"
    finish(on_cluster(cluster, sources, str(out)))
    files = local_files(str(out))
    assert b'"engine": "ray"' in files["manifest.json"]
    assert dataset_files(files) == local_output


def test_ray_runtime_started_for_the_job_and_stopped(sources, local_output, tmp_path) -> None:
    """No --ray-address: a Ray runtime on this host for the job only; nothing of it is left."""
    before = set(Path("/tmp").glob("fsray-*"))
    out = tmp_path / "ds"
    finish(run_prepare(sources, str(out), "--executor", "ray", "--workers", "2"))
    assert dataset_files(local_files(str(out))) == local_output
    assert set(Path("/tmp").glob("fsray-*")) == before


def test_s3_sources_and_output_on_the_cluster(cluster, sources, s3_bucket, tmp_path) -> None:
    """Tasks get the driver's S3 settings (moto's endpoint): each applies them before its call (no job runtime env)."""
    upload_tree(Path(sources).parent, s3_bucket, "raw")
    remote_sources = f"s3://{s3_bucket}/raw/sources.toml"
    finish(on_cluster(cluster, remote_sources, f"s3://{s3_bucket}/ray", "--work-dir", str(tmp_path / "w1")))
    finish(run_prepare(remote_sources, f"s3://{s3_bucket}/local", "--work-dir", str(tmp_path / "w2"), env=None))
    ray_files = s3_files(f"s3://{s3_bucket}/ray")
    assert b'"engine": "ray"' in ray_files["manifest.json"]
    assert dataset_files(ray_files) == dataset_files(s3_files(f"s3://{s3_bucket}/local"))


@pytest.mark.parametrize("step", ["run_scan_task", "write_part"])
def test_worker_killed_mid_job_is_retried_to_the_same_bytes(cluster, sources, local_output, tmp_path, step) -> None:
    marker = tmp_path / "killed"
    out = tmp_path / "ds"
    finish(on_cluster(cluster, sources, str(out), FREESCALE_KILL_TASK_ONCE=f"{step}:{marker}"))
    assert marker.exists(), f"no {step} task was killed"
    assert dataset_files(local_files(str(out))) == local_output


def test_killed_driver_resumes_from_completion_markers(cluster, sources, local_output, tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "ds"
    proc = on_cluster(cluster, sources, str(out), "--work-dir", str(work))
    deadline = time.monotonic() + 120
    while not list(work.glob("*/samples/p*.json")):  # the scan is done and a partition built
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    done = {path.name for path in work.glob("*/scan/t*.json")}
    assert done, "the scan records are the markers a resumed job skips tasks by"
    finish(on_cluster(cluster, sources, str(out), "--work-dir", str(work)))
    assert dataset_files(local_files(str(out))) == local_output


def test_stats_on_the_cluster_gives_the_local_figures(cluster, sources, tmp_path) -> None:
    """``stats --executor ray`` runs prepare's steps and the id pass as Ray tasks: the same figures."""
    reports = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        command = [FREESCALE, "stats", sources, "--output", str(out), "--quiet", "--no-plots", "--executor", engine]
        if engine == "ray":
            command += ["--ray-address", cluster.address]
        done = subprocess.run(
            command, cwd=tempfile.gettempdir(), env=cluster.driver_env(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        reports[engine] = json.loads((out / "stats.json").read_text())
    assert reports["ray"]["options"].pop("executor") == "ray"
    assert reports["local"]["options"].pop("executor") == "local"
    for report in reports.values():
        report.pop("runtime_s")
        report["options"].pop("ray_address")
    assert reports["ray"] == reports["local"]


def _objects(prefix: str) -> list[str]:
    """Relative names of the objects under an s3:// prefix."""
    import pyarrow.fs as pafs

    from freescale import storage

    fs, path = storage.filesystem(prefix)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return [info.path[len(path) + 1 :] for info in infos if info.type == pafs.FileType.File]


def test_s3_work_dir_on_the_cluster_resumes_from_its_markers(cluster, sources, local_output, s3_bucket, tmp_path):
    """``--work-dir s3://``: intermediates live under the prefix; a driver killed mid-job resumes on
    a machine with none of its local files (the mirror removed) from the markers in object storage,
    re-running only the calls without one, and writes the local executor's bytes."""
    from freescale.pipeline.workdir import mirror_path

    work, out, times = f"s3://{s3_bucket}/work", tmp_path / "ds", tmp_path / "times.jsonl"
    proc = on_cluster(cluster, sources, str(out), "--work-dir", work)
    deadline = time.monotonic() + 120
    while not any(name.endswith(".json") and "/samples/p" in name for name in _objects(work)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    scanned = [name for name in _objects(work) if "/scan/t" in name and name.endswith(".json")]
    assert scanned and any(name.endswith(".arrow") for name in _objects(work)), "spill files live on s3"
    shutil.rmtree(mirror_path(work), ignore_errors=True)  # another machine: only the prefix is left
    finish(on_cluster(cluster, sources, str(out), "--work-dir", work, FREESCALE_TASK_TIMES=str(times)))
    steps = [json.loads(line)["step"] for line in times.read_text().splitlines()]
    assert steps.count("scan") == 0, "scan tasks whose markers reached s3 ran again"
    assert dataset_files(local_files(str(out))) == local_output
    assert _objects(work) == [], "the finished job leaves no intermediate object behind"


def test_s3_work_dir_with_the_local_engine(sources, local_output, s3_bucket, tmp_path) -> None:
    """The local executor syncs the same files through the prefix and writes the same bytes."""
    out = tmp_path / "ds"
    finish(run_prepare(sources, str(out), "--workers", "2", "--work-dir", f"s3://{s3_bucket}/work"))
    assert dataset_files(local_files(str(out))) == local_output
    assert _objects(f"s3://{s3_bucket}/work") == []


def test_a_node_gets_distinct_ports_even_when_the_os_repeats_one(monkeypatch) -> None:
    """The OS may hand back a port it just released; each of a node's components needs its own."""
    import ray_cluster

    offered = iter([41001, 41001, 41002, 41002, 41003, 41004, 41005, 41006, 41007])

    class Socket:
        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

        def close(self) -> None:
            pass

    monkeypatch.setattr(ray_cluster.socket, "socket", Socket)
    monkeypatch.setattr(ray_cluster, "_HANDED_OUT", set(), raising=False)
    ports = [int(flag.split("=")[1]) for flag in ray_cluster._node_ports()]
    assert len(ports) == 6 and len(set(ports)) == 6, ports


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:{port}", "--ray-address 127.0.0.1:{port}: no Ray cluster answers there (Connection refused)"),
        (
            "ray://127.0.0.1:{port}",
            "--ray-address ray://127.0.0.1:{port}: no Ray cluster answers there (Connection refused)",
        ),
        ("no-port-given", "--ray-address must be auto, HOST:PORT or ray://HOST:PORT, got 'no-port-given'"),
    ],
)
def test_an_address_where_no_cluster_answers_is_one_line_at_once(sources, tmp_path, address, message) -> None:
    """Before: ray.init retried a refused address for minutes, printing its client's warnings (and
    a malformed one went to Ray as is); now the job ends in seconds with one line naming the option."""
    (port,) = free_ports(1)  # released: nothing listens there
    started = time.perf_counter()
    proc = run_prepare(sources, str(tmp_path / "ds"), "--executor", "ray", "--ray-address", address.format(port=port))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [f"freescale prepare: error: {message.format(port=port)}"], err
    assert time.perf_counter() - started < 30
    assert not (tmp_path / "ds").exists()
