"""Two emulated hosts on one machine: network namespaces joined by a veth pair, optionally rate-capped.

Why: multi-node behaviour (torchrun's c10d rendezvous across addresses, gloo over a real network
hop, cross-host clock alignment, slow links) must be shown without a second machine. Each host is a
network namespace holding one end of a veth pair with its own address; ``node_command`` wraps a
command so it runs inside a host, with a private ``/dev/shm`` (separate machines do not share
mosaicml-streaming's shared memory) and on its own slice of this machine's cores (``Host.cpus``:
separate machines do not share CPUs either; with both hosts' processes free to run on every core, one
rank's forward pass of a micro-batch took 27 to 152 ms, as the peer host's compute and network work
landed on its core or not). ``cap_bandwidth`` puts a token-bucket (``tc ... tbf``) on both ends, so
each direction is limited to the rate (this kernel has no ``netem``: latency comes only from the cap
and its queue). Used by ``tests/trainer/test_multinode.py`` and ``benchmarks/bench_network.py``.

Building namespaces needs root, iproute2 (``ip netns``, veth, ``tc``) and util-linux's ``unshare`` and ``taskset``;
``unavailable_reason`` says what is missing. Namespaces (and with them the veth pair and its
qdiscs) are removed when ``two_hosts`` exits, whatever happened inside. Traffic stays on the veth
pair between the two namespaces this process made.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class HostsUnavailableError(RuntimeError):
    """Emulated hosts cannot be built here (not root, tools missing, namespaces refused)."""


@dataclass(frozen=True)
class Host:
    namespace: str
    interface: str
    address: str
    cpus: tuple[int, ...] = ()  # the cores its processes run on; () = all of this machine's


def cpu_slices(n_hosts: int) -> list[tuple[int, ...]]:
    """This process's cores split evenly over ``n_hosts`` (a host gets all of them when there are
    fewer cores than hosts: sharing is then unavoidable)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < n_hosts:
        return [tuple(cpus)] * n_hosts
    share = len(cpus) // n_hosts
    return [tuple(cpus[i * share : (i + 1) * share]) for i in range(n_hosts)]


def unavailable_reason() -> str | None:
    """Why two hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building two hosts needs root (ip netns)"
    missing = [tool for tool in ("ip", "tc", "unshare", "taskset") if shutil.which(tool) is None]
    if missing:
        return f"building two hosts needs {', '.join(missing)} (iproute2, util-linux)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _remove(namespaces: list[str]) -> None:
    for name in namespaces:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextmanager
def two_hosts(split_cpus: bool = True) -> Iterator[list[Host]]:
    """Two namespaces joined by a veth pair on a random /24 of 10.213.0.0/16, each on its own half of
    the cores (``split_cpus``; else both on all of them); removed on exit."""
    reason = unavailable_reason()
    if reason is not None:
        raise HostsUnavailableError(reason)
    tag = uuid.uuid4().hex[:6]
    subnet = f"10.213.{int(tag, 16) % 250 + 1}"
    slices = cpu_slices(2) if split_cpus else [(), ()]
    hosts = [
        Host(f"fs{tag}{side}", f"v{tag}{side}", f"{subnet}.{n}", cpus)
        for (n, side), cpus in zip(((1, "a"), (2, "b")), slices, strict=True)
    ]
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
        raise HostsUnavailableError(f"cannot build network namespaces here: {error.stderr.strip()}") from None
    try:
        yield hosts
    finally:
        _remove([host.namespace for host in hosts])


def cap_bandwidth(hosts: list[Host], mbit: float | None) -> None:
    """Limit each direction of the link to ``mbit`` Mbit/s (token bucket on both ends); None: uncapped.

    The bucket holds 1 ms at the rate (at least 16 KiB: a few full-size frames; larger GSO packets
    are split by the qdisc), the queue up to 50 ms of data: a burst longer than that waits in the
    queue, it is not dropped. Why a small bucket: a real link sends at its rate, it does not save up
    credit while idle. A training step's exchanges follow tens of ms of compute, so a 10 ms bucket
    (what this used before) sent them faster than the cap, faster than any back-to-back probe of the
    same link measured: the emulated link was not one bandwidth but two.
    """
    for host in hosts:
        base = ["ip", "netns", "exec", host.namespace, "tc", "qdisc"]
        subprocess.run([*base, "del", "dev", host.interface, "root"], capture_output=True)
        if mbit is None:
            continue
        if mbit <= 0:
            raise ValueError(f"bandwidth cap must be > 0 Mbit/s, got {mbit}")
        burst = max(16 * 1024, int(mbit * 1e6 / 8 * 0.001))
        command = [*base, "add", "dev", host.interface, "root", "tbf", "rate", f"{mbit}mbit",
                   "burst", str(burst), "latency", "50ms"]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, text=True)


def node_command(host: Host, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run ``command`` inside ``host``: its namespace, a private /dev/shm, its cores,
    gloo bound to its veth interface."""
    if host.cpus:
        command = ["taskset", "-c", ",".join(map(str, host.cpus)), *command]
    private_shm = f"mount -t tmpfs tmpfs /dev/shm && exec {shlex.join(command)}"
    argv = ["ip", "netns", "exec", host.namespace, "unshare", "--mount", "sh", "-c", private_shm]
    return argv, dict(os.environ, GLOO_SOCKET_IFNAME=host.interface)


def train_on_hosts(
    hosts: list[Host], freescale: list[str], config: str, cwd: str, run_id: str, extra: list[str] | None = None,
    timeout_s: float = 600.0, port: int = 29531, nproc: int = 1,
) -> list[tuple[int, str]]:  # fmt: skip
    """``freescale train --nnodes 2`` with ``nproc`` ranks per host; returns (exit code, output) per node.

    Node 0 hosts the c10d rendezvous on its veth address. A node still running after ``timeout_s``
    is killed with its peer (a hung collective must not hang the caller).
    """
    endpoint = f"{hosts[0].address}:{port}"
    nodes = []
    for rank, host in enumerate(hosts):
        train = [*freescale, "train", "--config", config, "--nproc", str(nproc), "--nnodes", str(len(hosts))]
        train += ["--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
        train += ["--local-addr", host.address, *(extra or [])]
        argv, env = node_command(host, train)
        nodes.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    results = []
    for node in nodes:
        try:
            output = node.communicate(timeout=timeout_s)[0]
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
            output = node.communicate()[0]
        results.append((node.returncode, output))
    return results
