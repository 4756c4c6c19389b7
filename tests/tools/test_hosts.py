"""Emulated hosts (``freescale.tools.hosts``): a ``tc`` cap really limits the veth link, and goes away.

A TCP transfer of 1 MiB between the two namespaces is timed uncapped, at 8 Mbit/s (≥ 1 s by the
token bucket's arithmetic) and after the cap is lifted. Needs root, iproute2 and unshare: skips with
that reason otherwise; the namespaces are removed in every case.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from freescale.tools.hosts import Host, HostsUnavailableError, cap_bandwidth, two_hosts

pytestmark = pytest.mark.slow
BYTES = 1 << 20
PORT = 29577

SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((__import__('sys').argv[1], {PORT})); s.listen(1); print('ready', flush=True)
c, _ = s.accept(); n = 0
while n < {BYTES}:
    b = c.recv(1 << 16)
    if not b: break
    n += len(b)
c.sendall(b'k'); c.close()
"""

CLIENT = f"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], {PORT}), timeout=30)
t = time.perf_counter(); c.sendall(b'x' * {BYTES}); c.recv(1); print(time.perf_counter() - t)
"""


def transfer_seconds(sender: Host, receiver: Host) -> float:
    server = subprocess.Popen(
        ["ip", "netns", "exec", receiver.namespace, sys.executable, "-c", SERVER, receiver.address],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = subprocess.run(
            ["ip", "netns", "exec", sender.namespace, sys.executable, "-c", CLIENT, receiver.address],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return float(client.stdout.strip())
    finally:
        server.kill()
        server.wait()


def test_a_bandwidth_cap_slows_the_link_and_lifts() -> None:
    try:
        with two_hosts() as hosts:
            namespaces = [host.namespace for host in hosts]
            fast = transfer_seconds(*hosts)
            cap_bandwidth(hosts, 8.0)  # 1 MB/s: 1 MiB needs >= ~1 s
            start = time.perf_counter()
            capped = transfer_seconds(*hosts)
            assert time.perf_counter() - start < 30
            cap_bandwidth(hosts, None)
            lifted = transfer_seconds(*hosts)
    except HostsUnavailableError as error:
        pytest.skip(str(error))
    assert capped >= 0.8, (fast, capped)
    assert fast < capped / 4 and lifted < capped / 4, (fast, capped, lifted)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in namespaces)  # removed on exit


def test_bench_network_refuses_a_bad_cap() -> None:
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_network.py"
    result = subprocess.run([sys.executable, str(bench), "--caps", "none,-5"], capture_output=True, text=True)
    assert result.returncode == 2 and "a cap must be > 0 Mbit/s" in result.stderr


def test_each_host_runs_on_its_own_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Separate machines do not share CPUs: the cores are split evenly, one host per core on 2 cores;
    with fewer cores than hosts both get all of them (sharing cannot be avoided)."""
    from freescale.tools import hosts as hosts_module

    for cores, expected in (({0, 1}, [(0,), (1,)]), ({0, 1, 2, 3, 4}, [(0, 1), (2, 3)]), ({3}, [(3,), (3,)])):
        monkeypatch.setattr(hosts_module.os, "sched_getaffinity", lambda pid, cores=cores: cores)
        assert hosts_module.cpu_slices(2) == expected
    argv, _ = hosts_module.node_command(Host("ns", "if", "10.0.0.1", (2, 3)), ["python", "-c", "pass"])
    assert "taskset -c 2,3 python -c pass" in argv[-1]
    argv, _ = hosts_module.node_command(Host("ns", "if", "10.0.0.1"), ["python"])
    assert "taskset" not in argv[-1]


def test_a_command_inside_a_host_sees_only_that_hosts_cores() -> None:
    from freescale.tools.hosts import node_command

    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    try:
        with two_hosts() as hosts:
            seen = []
            for host in hosts:
                argv, env = node_command(host, show)
                result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
                seen.append(result.stdout.strip())
    except HostsUnavailableError as error:
        pytest.skip(str(error))
    assert seen == [str(list(host.cpus)) for host in hosts]
    if len(os.sched_getaffinity(0)) >= 2:
        assert set(hosts[0].cpus).isdisjoint(hosts[1].cpus)
