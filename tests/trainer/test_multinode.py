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
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_cli import FREESCALE, losses, prepare_tiny, run_toml, run_train, train

from freescale.tools.hosts import Host, HostsUnavailableError, train_on_hosts
from freescale.tools.hosts import two_hosts as build_two_hosts

pytestmark = pytest.mark.slow


@pytest.fixture
def two_hosts() -> Iterator[list[Host]]:
    try:
        with build_two_hosts() as hosts:
            yield hosts
    except HostsUnavailableError as error:
        pytest.skip(str(error))


def test_two_hosts_train_bitwise_like_one_host(two_hosts: list[Host], tmp_path: Path) -> None:
    prepared = prepare_tiny(tmp_path)
    common = {"data": {"max_steps": 8}, "eval": {"max_users": 0}, "engine": {"overlap": "pec"}}
    one_host = run_toml(tmp_path / "one.toml", prepared, tmp_path / "one", **common)
    train(one_host, tmp_path)
    two = run_toml(tmp_path / "two.toml", prepared, tmp_path / "two", **common)
    results = train_on_hosts(two_hosts, [FREESCALE], two, str(tmp_path), "twohosts", timeout_s=300)
    assert [code for code, _ in results] == [0, 0], "\n---\n".join(out[-3000:] for _, out in results)
    expected, got = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(got) == 8 and list(got.values()) == list(expected.values())  # bitwise, PEC on
    report = json.loads((tmp_path / "two" / "bubbles.json").read_text())
    assert report["overlap"] == "pec" and report["world_size"] == 2
    summary = report["summary"]
    assert 0.0 <= summary["straggler_pct"] <= 100.0 and summary["samples_per_s"] > 0
    for part in report["rank_steps"]:  # clocks aligned across the hosts: parts tile each step
        measured = part["compute"] + part["data"] + part["comm"] + part["idle"]
        assert abs(measured - part["wall"]) <= 0.05 * part["wall"] and part["idle"] >= 0, part


def test_two_hosts_of_two_ranks_train_like_four_ranks_on_one_host(two_hosts: list[Host], tmp_path: Path) -> None:
    """W = 4 as 2 hosts x 2 ranks: torchrun numbers the ranks of both nodes, and the bubble analysis
    aligns two ranks per host. The hosts' run routes every all-to-all through the host first
    (``engine.all_to_all = "hierarchical"``, nodes from the launcher's LOCAL_WORLD_SIZE) and must
    train bitwise like the flat all-to-all of 4 ranks on one host. The 4 ranks share this machine's
    cores, so only correctness is checked, not speed."""
    prepared = prepare_tiny(tmp_path)
    common = {"data": {"max_steps": 8}, "eval": {"max_users": 0}, "engine": {"overlap": "pec"}}
    one_host = run_toml(tmp_path / "one.toml", prepared, tmp_path / "one", **common)
    done = run_train(one_host, tmp_path, nproc=4)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    hierarchical = {**common, "engine": {**common["engine"], "all_to_all": "hierarchical"}}
    two = run_toml(tmp_path / "two.toml", prepared, tmp_path / "two", **hierarchical)
    results = train_on_hosts(two_hosts, [FREESCALE], two, str(tmp_path), "twobytwo", timeout_s=300, nproc=2)
    assert [code for code, _ in results] == [0, 0], "\n---\n".join(out[-3000:] for _, out in results)
    expected, got = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(got) == 8 and list(got.values()) == list(expected.values())  # bitwise, PEC on
    report = json.loads((tmp_path / "two" / "bubbles.json").read_text())
    assert report["transport"].startswith("hierarchical"), report["transport"]
    assert report["world_size"] == 4 and {part["rank"] for part in report["rank_steps"]} == {0, 1, 2, 3}
    for part in report["rank_steps"]:
        measured = part["compute"] + part["data"] + part["comm"] + part["idle"]
        assert abs(measured - part["wall"]) <= 0.05 * part["wall"] and part["idle"] >= 0, part
