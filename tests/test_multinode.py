"""Two hosts on one machine: ``freescale train --nnodes 2`` across network namespaces.

Each host is a network namespace with one end of a veth pair and its own address; one rank runs in
each, the c10d rendezvous is hosted by node 0 on its veth address and gloo talks over the veth
(``GLOO_SOCKET_IFNAME``), so every byte between the ranks crosses a real network hop. The 2-host run
must train bitwise like the 2-rank run on one host, with PEC on, and its bubble analysis must go
through the cross-host clock alignment. Building namespaces needs root, iproute2 and unshare: the
test skips with that reason otherwise, and removes its namespaces (and so the veth pair) in every case.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from train_cli import FREESCALE, losses, prepare_tiny, run_toml, train

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Host:
    namespace: str
    interface: str
    address: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _remove(namespaces: list[str]) -> None:
    for name in namespaces:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def two_hosts() -> Iterator[list[Host]]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("building two hosts needs root, iproute2 (ip netns, veth) and unshare")
    tag = uuid.uuid4().hex[:6]
    subnet = f"10.213.{int(tag, 16) % 250 + 1}"
    hosts = [Host(f"fs{tag}{side}", f"v{tag}{side}", f"{subnet}.{n}") for n, side in ((1, "a"), (2, "b"))]
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
        _ip("link", "add", hosts[0].interface, "type", "veth", "peer", "name", hosts[1].interface)
        for host in hosts:
            _ip("link", "set", host.interface, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as error:
        _remove([host.namespace for host in hosts])
        pytest.skip(f"cannot build network namespaces here: {error.stderr.strip()}")
    try:
        yield hosts
    finally:
        _remove([host.namespace for host in hosts])


def _node(host: Host, rank: int, endpoint: str, config: str, cwd: Path) -> subprocess.Popen:
    """One host's ``freescale train``: in its network namespace, with a /dev/shm of its own (separate
    machines do not share mosaicml-streaming's shared memory: both nodes' rank 0 would claim it)."""
    train = [FREESCALE, "train", "--config", config, "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank)]
    train += ["--rdzv-endpoint", endpoint, "--rdzv-id", "twohosts", "--local-addr", host.address]
    private_shm = f"mount -t tmpfs tmpfs /dev/shm && exec {shlex.join(train)}"
    command = ["ip", "netns", "exec", host.namespace, "unshare", "--mount", "sh", "-c", private_shm]
    env = dict(os.environ, GLOO_SOCKET_IFNAME=host.interface)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_hosts_train_bitwise_like_one_host(two_hosts: list[Host], tmp_path: Path) -> None:
    prepared = prepare_tiny(tmp_path)
    common = {"data": {"max_steps": 20}, "eval": {"max_users": 0}, "engine": {"overlap": "pec"}}
    one_host = run_toml(tmp_path / "one.toml", prepared, tmp_path / "one", **common)
    train(one_host, tmp_path)
    two = run_toml(tmp_path / "two.toml", prepared, tmp_path / "two", **common)
    endpoint = f"{two_hosts[0].address}:29531"
    nodes = [_node(host, rank, endpoint, two, tmp_path) for rank, host in enumerate(two_hosts)]
    outputs = []
    for node in nodes:
        try:
            outputs.append(node.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
            outputs.append(node.communicate()[0])
    assert [node.returncode for node in nodes] == [0, 0], "\n---\n".join(out[-3000:] for out in outputs)
    expected, got = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(got) == 20 and list(got.values()) == list(expected.values())  # bitwise, PEC on
    report = json.loads((tmp_path / "two" / "bubbles.json").read_text())
    assert report["overlap"] == "pec" and report["world_size"] == 2
    summary = report["summary"]
    assert 0.0 <= summary["straggler_pct"] <= 100.0 and summary["samples_per_s"] > 0
    for part in report["rank_steps"]:  # clocks aligned across the hosts: parts tile each step
        measured = part["compute"] + part["data"] + part["comm"] + part["idle"]
        assert abs(measured - part["wall"]) <= 0.05 * part["wall"] and part["idle"] >= 0, part
