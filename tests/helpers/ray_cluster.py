"""Test helpers: a real two-node Ray cluster on 127.0.0.1, and byte-level output comparison.

``benchmarks/bench_prepare.py`` starts its attached arm's one-node cluster with ``start_cluster`` too
(one way to run a private cluster on a shared host).

Each node is a ``ray start --block`` process in its own session, with every port chosen here (two
clusters of other users on the same host must not collide) and its own short temp dir. Teardown
kills those process groups only (never ``ray stop``, which would stop every Ray of this user on the
host), then kills any process still naming this cluster's temp dir, by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
NODE_CPUS = 1
OBJECT_STORE_BYTES = 100 * 2**20


_HANDED_OUT: set[int] = set()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, none handed out before by this process. Why: a port bound and
    released is free again at once, so asking the OS one at a time can return the same port twice,
    and ``ray start`` refuses two components given one port (seen in CI: metrics export and the
    dashboard agent both on 34503). Every socket stays bound until all are chosen."""
    sockets, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                ports.append(port)
    finally:
        for sock in sockets:
            sock.close()
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def _node_ports() -> list[str]:
    names = (
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-grpc-port",
        "dashboard-agent-listen-port",
        "metrics-export-port",
        "runtime-env-agent-port",
    )
    return [f"--{name}={port}" for name, port in zip(names, free_ports(len(names)), strict=True)]


@dataclass
class RayCluster:
    """A head and ``workers`` worker nodes, ``node_cpus`` CPUs each; ``address`` is what ``--ray-address`` takes.

    Ray >= 2.5x enables token authentication for a new cluster; its own token (``env``, for the
    nodes and every driver) keeps Ray from reading or writing ``~/.ray/auth_token``."""

    temp_dir: str
    node_cpus: int = NODE_CPUS
    object_store_bytes: int = OBJECT_STORE_BYTES
    address: str = ""
    nodes: list[subprocess.Popen] = field(default_factory=list)
    env: dict[str, str] = field(
        default_factory=lambda: {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    )

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a ``prepare``/``stats`` driver that joins this cluster."""
        return {**os.environ, **self.env, **extra}

    def start(self, worker_nodes: int = 1) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        head = [
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--temp-dir={self.temp_dir}",
        ]
        self._start_node(head)
        self._wait_for_nodes(1)
        for _ in range(worker_nodes):
            self._start_node([f"--address={self.address}"])
        self._wait_for_nodes(1 + worker_nodes)

    def _start_node(self, role: list[str]) -> None:
        command = [
            RAY,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.node_cpus}",
            f"--object-store-memory={self.object_store_bytes}",
            *_node_ports(),
            *role,
        ]
        log = open(Path(self.temp_dir) / f"node{len(self.nodes)}.log", "wb")  # noqa: SIM115 (kept by the node)
        self.nodes.append(
            subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.driver_env()
            )
        )

    def _wait_for_nodes(self, count: int, timeout: float = 120) -> None:
        """Until the cluster reports ``count`` alive nodes (``ray status`` exits 0 and lists them)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.poll() is not None:
                    raise RuntimeError(f"a ray node exited early: {self.logs()}")
            status = subprocess.run(
                [RAY, "status", f"--address={self.address}"],
                capture_output=True,
                text=True,
                timeout=60,
                env=self.driver_env(),
            )
            if status.returncode == 0 and status.stdout.count("node_") >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"ray cluster did not reach {count} nodes: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in Path(self.temp_dir).glob("node*.log"))

    def worker_pids(self) -> list[int]:
        """Ray worker processes of this cluster (their command line names its temp dir)."""
        return [pid for pid, command in _processes_naming(self.temp_dir) if "default_worker.py" in command]

    def stop(self) -> None:
        """SIGKILL each node's process group and any process left naming the temp dir, then remove it.

        Not SIGTERM first: ``ray start --block`` outlived a SIGTERM by more than 10 s (measured: a
        two-node stop took 20 s, each node waited out its 10 s), and a throwaway cluster has nothing
        to flush. Its shared memory is unlinked files of its processes, freed with them."""
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
        for node in self.nodes:
            node.wait()
        for pid, _ in _processes_naming(self.temp_dir):  # a worker that left the group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _processes_naming(text: str) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in command:
                found.append((int(entry.name), command))
    return found


def start_cluster(
    worker_nodes: int = 1, node_cpus: int = NODE_CPUS, object_store_bytes: int = OBJECT_STORE_BYTES
) -> RayCluster:
    cluster = RayCluster(tempfile.mkdtemp(prefix="fsrt-", dir="/tmp"), node_cpus, object_store_bytes)
    try:
        cluster.start(worker_nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def dataset_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` (relative path -> bytes) with the manifest's run-only fields dropped: the engine
    that wrote it (the one field the engines differ in) and the output path."""
    files = dict(files)
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("engine")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def local_files(directory: str) -> dict[str, bytes]:
    root = Path(directory)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def s3_files(prefix: str) -> dict[str, bytes]:
    import pyarrow.fs as pafs

    from freescale import storage

    fs, path = storage.filesystem(prefix)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return {
        info.path[len(path) + 1 :]: storage.read_bytes(f"{prefix}/{info.path[len(path) + 1 :]}")
        for info in infos
        if info.type == pafs.FileType.File
    }
