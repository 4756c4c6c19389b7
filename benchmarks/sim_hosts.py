"""bench_simulate's second validation: 2 emulated hosts over a ``tc``-capped link (bench_network's runs).

Two network namespaces joined by a veth pair (``freescale.tools.hosts``), one gloo rank each, train
``bench_network``'s workload (bench_pec's generator and model with d_model 64, 128 samples per
micro-batch, Zipf 0.5 over 2M hashed rows) with ``overlap = none`` and ``pec`` at each link cap.
The simulator sees only what a user could measure before renting the cluster:

* **compute**: a cost model ``freescale.trainer.simulate.calibrate`` fits for this model on this host, scaled
  by the *uncapped* ``none`` run (its forward+backward against the cost model's prediction for the
  same micro-batches, and the rest of its busy time as per-step overhead); that run's
  ``straggler_pct`` as the noise floor (its data are planned, its lengths narrow: what is left is
  jitter), and the latency of the trainer's own collectives in it;
* **the link at each cap**: a probe between the two hosts (gloo ``all_to_all_single`` of 16 KB–2 MB
  per rank and an all-reduce of the dense gradient's size, barrier-started, the slowest rank's mean
  over 16 interleaved repetitions), fitted to latency + bytes/bandwidth, and how much earlier than
  the slowest rank the other leaves an exchange (``completion_spread``). Like ``nccl-tests`` on a
  real cluster, it is a property of the link, not of the training runs it predicts. Over gloo/TCP
  with a token bucket on each end the two directions of an exchange do not always overlap (the
  acknowledgements of one direction queue behind the other's data), so the fitted bandwidth is
  below the cap: that is why the cap itself is not used;
* **contention at each cap**: a probe on both hosts at once timing one micro-batch's forward+backward
  of the same model alone and beside an all-to-all of what PEC overlaps with a step's compute
  (``probe_contention``): the compute lost per megabyte the exchange moved meanwhile
  (``network.overlap_slowdown_s_per_mbyte``) and how unevenly it fell on the two ranks
  (``overlap_slowdown_spread``). On these hosts the kernel's network work and gloo's copies run on
  the core each rank computes on; on GPUs this is the SM contention the paper's SM-free transport
  removes;
* the data's ``batch_overlap_rate`` and distinct-id share.

Validated (never shown to the simulator): ``straggler_pct`` and ``exposed_comm_pct`` of ``pec`` on
the uncapped link and of ``none`` and ``pec`` at every cap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PROBE_REPS = 16
CONTENTION_REPS = 20
PROBE_PORT = 29561


# ------------------------------------------------------------------------------------------ link probe
def probe_rank(argv: list[str]) -> int:
    """Rank entry of the link probe (runs inside one host's namespace); rank 0 writes the JSON."""

    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--dense-bytes", type=int, required=True)
    parser.add_argument("--sizes", required=True, help="comma-separated all-to-all payloads, bytes per rank")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _join_pair(args)
    buffers = {f"all_to_all:{n}": (torch.empty(n // 4), torch.ones(n // 4)) for n in map(int, args.sizes.split(","))}
    dense = torch.ones(max(1, args.dense_bytes // 4))
    for y, x in buffers.values():
        dist.all_to_all_single(y, x)  # warm the connection
    dist.all_reduce(dense)
    times: dict[str, list[float]] = {key: [] for key in [*buffers, "all_reduce"]}
    for _ in range(PROBE_REPS):  # sizes interleaved: an exchange's mode tends to repeat in runs
        for key, (y, x) in buffers.items():
            times[key].append(_timed(dist, dist.all_to_all_single, y, x))
        times["all_reduce"].append(_timed(dist, dist.all_reduce, dense))
    return _leave_pair(args, times)


def _join_pair(args: argparse.Namespace) -> None:
    """A probe rank's start: one compute thread (as a trainer rank on these hosts), then the gloo
    group of the two hosts' ranks at ``args.master``."""
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=2)


def _leave_pair(args: argparse.Namespace, times: dict[str, list[float]]) -> int:
    """A probe rank's end: rank 0 writes both ranks' ``times`` to ``args.out``; the group is left."""
    import torch.distributed as dist

    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, times)
    if args.rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    dist.destroy_process_group()
    return 0


def _on_both_hosts(hosts: list, entry: str, extra: list[str], what: str) -> None:
    """Run this file's rank ``entry`` on both hosts (rank i on host i) and wait; raise with the logs."""
    from freescale.tools.hosts import node_command

    master = f"{hosts[0].address}:{PROBE_PORT}"
    procs = []
    for rank, host in enumerate(hosts):
        command = [sys.executable, str(Path(__file__).resolve()), entry, "--rank", str(rank), "--master", master]
        argv, env = node_command(host, command + extra)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{what} failed:\n" + "\n---\n".join(log[-2000:] for log in logs))


def _timed(dist: Any, collective: Any, *tensors: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    collective(*tensors)
    return time.perf_counter() - start


def probe_sizes(payload: dict[str, float]) -> tuple[int, ...]:
    """All-to-all sizes to probe: the workload's own, from its id exchange to its row exchange.

    Why not a generic sweep: a token-bucket link is linear only while a burst fits its queue; past
    it, drops and TCP recovery take over. Like a user running nccl-tests at the message sizes their
    job sends, the probe measures the link where the workload uses it.
    """
    rows = payload["embedding_comm.rows"]
    whole = (int(payload["input_dist.ids"]), int(rows / 4), int(rows / 2), int(rows))
    return tuple(sorted({max(8, n // 8 * 8) for n in whole}))  # float32 rows split evenly over 2 ranks


def probe_link(hosts: list, work: Path, tag: str, dense_bytes: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Latency + bandwidth of the link as it is now (cap applied), from ``probe_rank`` on both hosts.

    The slowest rank sets when a collective is over; the all-to-all sends half a rank's payload to
    the other rank, so the fit is ``α + (payload/2)/bw``. The all-reduce keeps its own latency.
    Means over repetitions, not medians: over TCP through a token bucket an exchange's two directions
    sometimes run together and sometimes one after the other (times of t or ~2t, in runs of one mode:
    hence the sizes interleaved), and a step's time adds up what its exchanges take on average; a
    median flips between the two modes.
    """
    out = work / f"probe-{tag}.json"
    extra = ["--dense-bytes", str(dense_bytes), "--out", str(out), "--sizes", ",".join(map(str, sizes))]
    _on_both_hosts(hosts, "--probe-rank", extra, f"link probe {tag}")
    per_rank = json.loads(out.read_text())
    slowest = {key: float(np.mean(np.max([r[key] for r in per_rank], axis=0))) for key in per_rank[0]}
    y = np.array([slowest[f"all_to_all:{n}"] for n in sizes])
    x = np.array(sizes, dtype=np.float64) / 2
    (beta, alpha), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)
    beta = max(float(beta), 1e-12)
    all_reduce = slowest["all_reduce"] - 2.0 * 0.5 * dense_bytes * beta  # ring term 2(W-1)/W at W = 2
    return {
        "completion_spread": completion_spread([[r[f"all_to_all:{n}"] for n in sizes] for r in per_rank]),
        "all_to_all_s": y.tolist(),
        "bytes": list(sizes),
        "latency_us": 1e6 * max(float(alpha), 0.0),
        "bandwidth_gbytes_s": 1e-9 / beta,
        "all_reduce_s": slowest["all_reduce"],
        "all_reduce_latency_us": 1e6 * max(float(all_reduce), 0.0),
    }


def completion_spread(times: list[list[list[float]]]) -> float:
    """``network.completion_spread`` from per-rank probe times ``[rank][size][rep]``: the mean
    rank's lead over the slowest rank, as a share of the slowest rank's time, summed over sizes and
    repetitions (so the long, bandwidth-bound exchanges dominate, as they do in the exposed time).

    Why per rank: over a congested TCP link one direction of an exchange finishes first; its rank
    goes back to compute and then waits at the next collective. The slowest rank's time alone (what
    a bandwidth probe reports) cannot say how much of a collective is spent by the average rank.
    """
    t = np.asarray(times, dtype=np.float64)  # [rank, size, rep]; all ranks start at a barrier
    slowest = t.max(axis=0)
    lead = (slowest - t).mean(axis=0)
    return float(min(0.5, lead.sum() / slowest.sum()))


# ------------------------------------------------------------------------------------------ contention probe
def contention_rank(argv: list[str]) -> int:
    """Rank entry of the contention probe: one micro-batch's forward+backward of the workload's model,
    alone and with an all-to-all of what PEC overlaps in flight (launched just before, as PEC
    does), both ranks at once, barrier-started, interleaved; rank 0 writes the per-rank times."""

    import torch
    import torch.distributed as dist

    from freescale.model_config import ModelConfig
    from freescale.pipeline.dataset.samples import CollateConfig
    from freescale.trainer.data.batches import collate
    from freescale.trainer.learning_config import ModelExtraConfig
    from freescale.trainer.simulate.calibrate import CALIBRATION_ITEMS, MicroBatchTimer, synthetic_samples

    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--spec", required=True, help="JSON: model, inbatch_negatives, lengths, exchange_bytes")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    _join_pair(args)  # first: one compute thread before the model is built
    model = ModelConfig(**spec["model"])
    extra = ModelExtraConfig(num_items=CALIBRATION_ITEMS, num_actions=8, inbatch_negatives=spec["inbatch_negatives"])
    samples = synthetic_samples(spec["lengths"], CALIBRATION_ITEMS, np.random.default_rng(args.rank))
    batch = collate(samples, CollateConfig.for_model(model, extra), 0, args.rank)
    timer = MicroBatchTimer(model, extra, seed=args.rank)
    x = torch.ones(max(2, int(spec["exchange_bytes"]) // 8 * 2))
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)  # warm the connection and the model
    timer.run(batch)
    times: dict[str, list[float]] = {"alone": [], "beside": [], "wait": []}
    for _ in range(CONTENTION_REPS):
        dist.barrier()
        start = time.perf_counter()
        timer.run(batch)
        times["alone"].append(time.perf_counter() - start)
        dist.barrier()
        work = dist.all_to_all_single(y, x, async_op=True)
        start = time.perf_counter()
        timer.run(batch)
        done = time.perf_counter()
        work.wait()
        times["beside"].append(done - start)
        times["wait"].append(time.perf_counter() - done)
    return _leave_pair(args, times)


def probe_contention(hosts: list, work: Path, tag: str, spec: dict[str, Any]) -> dict[str, Any]:
    """How much a running exchange slows compute on the two hosts at this cap (``contention_rank``).

    Why a probe: on these emulated hosts the kernel's TCP/veth/token-bucket work and gloo's copies
    run on the core each rank computes on (on GPUs: NCCL kernels on the SMs), so PEC's overlapped
    exchange slows compute, and unevenly: the rank that takes more of that work is late at the
    step's collectives. Like a compute benchmark run beside nccl-tests before renting, it measures
    the machines and the link, never the training runs it predicts.
    """
    spec_path = work / f"contention-{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    out = work / f"contention-{tag}.json"
    _on_both_hosts(hosts, "--contention-rank", ["--spec", str(spec_path), "--out", str(out)], f"contention {tag}")
    per_rank = json.loads(out.read_text())
    return contention_fit(per_rank, float(spec["exchange_bytes"]))


def contention_fit(per_rank: list[dict[str, list[float]]], exchange_bytes: float) -> dict[str, Any]:
    """``network.overlap_slowdown_s_per_mbyte`` and ``overlap_slowdown_spread`` from the probe's times.

    Slowdown: each rank's compute beside the exchange against its own mean alone. Per megabyte
    the exchange moved while the compute ran (its share ``compute / (compute + wait)`` of the
    payload: where it outlasts the compute, only that share of its bytes loaded the cores). Spread:
    how far apart the two ranks' slowdowns of one repetition are beyond their difference alone,
    against twice the mean (W = 2: the simulator's shares are ``1 ± spread``).
    """
    alone = np.array([r["alone"] for r in per_rank])  # [rank, rep]
    beside = np.array([r["beside"] for r in per_rank])
    wait = np.array([r["wait"] for r in per_rank])
    slowdown = beside - alone.mean(axis=1, keepdims=True)  # means: a stray slow repetition counts alike
    mean = float(slowdown.mean())
    moved = exchange_bytes * beside / (beside + wait)
    gap = float(np.abs(beside[0] - beside[1]).mean() - np.abs(alone[0] - alone[1]).mean())
    spread = 0.0 if mean <= 0 else float(np.clip(gap / (2.0 * mean), 0.0, 1.0))
    return {
        "compute_alone_ms": 1e3 * float(np.median(alone)),
        "compute_beside_ms": 1e3 * float(np.median(beside)),
        "wait_after_ms": 1e3 * float(np.median(wait)),
        "slowdown_ms": 1e3 * mean,
        "rank_gap_ms": 1e3 * gap,
        "moved_mbytes": 1e-6 * float(moved.mean()),
        "overlap_slowdown_s_per_mbyte": max(0.0, mean / (1e-6 * float(moved.mean()))),
        "overlap_slowdown_spread": spread,
        "per_rank": per_rank,
    }


def contention_spec(s: Any, data: str, payload: dict[str, float], overlap_rate: float) -> dict[str, Any]:
    """The probe's workload: the model, one micro-batch's lengths from the data (the first measured
    step's rank 0), and the bytes per rank PEC overlaps with a step's compute (the next batch's ids
    and rows, the NOL share of the gradients). Why those bytes and not a sweep: the slowdown is not
    linear in them (twice the row exchange slowed compute 1.3x as much at 200 Mbit/s), so, like the
    link probe, the probe measures at the size the workload sends."""
    from bench_pec import model_table

    from freescale.pipeline.dataset.reader import PreparedDataset

    ds = PreparedDataset(data)
    lengths = [int(x["length"]) for x in ds.micro_batch(ds.micro_batch_index(s.skip_steps, 0, 2))]
    return {
        "model": model_table(s),
        "inbatch_negatives": s.inbatch_negatives,
        "lengths": lengths,
        "exchange_bytes": int(
            payload["input_dist.ids"]
            + payload["embedding_comm.rows"]
            + (1.0 - overlap_rate) * payload["gradient_comm.embeddings"]
        ),
    }


# ------------------------------------------------------------------------------------------ calibration
def fit_cost_model(s: Any, work: Path) -> str:
    """The cost model of bench_network's model on this host (what ``freescale calibrate`` writes)."""
    import torch
    from bench_pec import model_table

    from freescale.model_config import ModelConfig
    from freescale.trainer.learning_config import ModelExtraConfig
    from freescale.trainer.simulate.calibrate import calibrate

    path = work / "cost-hosts.json"
    torch.set_num_threads(1)
    # num_items 0: calibrate's synthetic table size. The trainer's rows are sharded and updated
    # sparsely; a dense 2M-row table in the timing loop would be an optimizer step it never takes.
    extra = ModelExtraConfig(num_items=0, num_actions=8, inbatch_negatives=s.inbatch_negatives)
    calibrate(ModelConfig(**model_table(s)), extra, s.cap, str(path), micro_batch_size=s.micro_batch_size, rounds=4)
    return str(path)


# ------------------------------------------------------------------------------------------ measure
def measure(s: Any, data: str, caps: list[float | None], work: Path, payload: dict[str, float],
            overlap_rate: float, points: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Per cap: the link and contention probes, then ``none`` and ``pec`` trained on the two hosts;
    each cap one of ``points``' points (``measure.Points``: retried once, recorded), a failed cap left out."""
    from freescale.tools.hosts import two_hosts

    rows: list[dict[str, Any]] = []
    spec = contention_spec(s, data, payload, overlap_rate)
    with two_hosts() as hosts:
        for i, cap in enumerate(caps):
            tag = "uncapped" if cap is None else f"{cap:g}mbit"
            print(f"[hosts {i + 1}/{len(caps)}] link {tag}: probe, none, pec", flush=True)
            points.run(f"hosts link {tag}", measure_cap, hosts, s, data, cap, work, payload, spec, keep=rows.append)
    return rows


def measure_cap(hosts: list, s: Any, data: str, cap: float | None, work: Path, payload: dict[str, float],
                spec: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """One cap: the link capped, probed (link, contention), then ``none`` and ``pec`` trained over it."""
    from bench_network import one_run

    from freescale.tools.hosts import cap_bandwidth

    cap_bandwidth(hosts, cap)
    tag = "uncapped" if cap is None else f"{cap:g}mbit"
    link = probe_link(hosts, work, tag, int(payload["gradient_comm.dense"]), probe_sizes(payload))
    contention = probe_contention(hosts, work, tag, spec)
    link |= {k: contention.pop(k) for k in ("overlap_slowdown_s_per_mbyte", "overlap_slowdown_spread")}
    link["contention"] = contention
    runs = {o: one_run(hosts, s, data, s.points[0][1], o, "freescale", o, cap, work) for o in ("none", "pec")}
    return {"cap_mbit": cap, "link": link, "runs": runs}


def validate(s: Any, work: Path, caps: list[float | None], points: Any) -> dict[str, Any]:
    """The whole 2-host part: data, calibration, measurement (``points``: bench_simulate's
    ``measure.Points``), prediction; rows with errors in pp. Without the uncapped run (it failed) there
    is nothing to calibrate on: no rows, and the reason."""
    from bench_pec import model_table, prepare_point
    from bench_simulate import compare, predict
    from sim_calibration import calibration, data_facts, dense_params, own_source, payload_bytes
    from sim_network import insitu_network

    work.mkdir(parents=True, exist_ok=True)
    data = prepare_point(s, s.points[0][0], work)
    cost_path = fit_cost_model(s, work)
    params = dense_params(model_table(s), s.points[0][1])
    facts = data_facts(data, 2, s.steps)
    if None not in caps:
        caps = [None, *caps]  # the uncapped none run calibrates compute
    payload = payload_bytes(facts, s.d_model, s.num_negatives, params)
    measured = measure(s, data, caps, work, payload, facts["batch_overlap_rate"], points)
    uncapped = next((r for r in measured if r["cap_mbit"] is None), None)
    if uncapped is None:
        return {"skipped": "the uncapped calibration run failed (see failures)", "links": {}}
    calib = calibration(cost_path, data, uncapped["runs"]["none"], s.steps, ranks=(0, 1), skip=s.skip_steps)
    bubbles = work / "runs" / "none-uncapped" / "bubbles.json"
    insitu = insitu_network([bubbles], payload, {"all_to_all_fit": uncapped["link"]}, s.skip_steps)
    source = own_source(data, s.steps, s.skip_steps)
    rows: dict[str, list[dict[str, Any]]] = {"validation": [], "validation_without_contention": []}
    for r in measured:
        # latency: the trainer's own collectives in the calibration run; bandwidth: the probe at this cap
        net = {**r["link"], "latency_us": insitu["latency_us"]}
        # the same prediction without the contention probe's figures: what it changes, on the same runs
        alone = {k: v for k, v in net.items() if k not in ("overlap_slowdown_s_per_mbyte", "overlap_slowdown_spread")}
        for overlap in ("none", "pec"):
            if r["cap_mbit"] is None and overlap == "none":
                continue  # the calibration run
            tag = "uncapped" if r["cap_mbit"] is None else f"{r['cap_mbit']:g} Mbit/s"
            for key, link in (("validation", net), ("validation_without_contention", alone)):
                p = predict(s, cost_path, calib, link, facts, params, source, "plan", overlap, ranks_per_node=1)
                rows[key].append(compare(f"hosts {tag}/{overlap}", r["runs"][overlap], p))
    return {
        "calibration": {"compute": calib, "network_in_training": insitu, "data": facts, "dense_params": params},
        "links": {str(r["cap_mbit"]): r["link"] for r in measured},
        **rows,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe-rank"]:
        sys.exit(probe_rank(sys.argv[2:]))
    if sys.argv[1:2] == ["--contention-rank"]:
        sys.exit(contention_rank(sys.argv[2:]))
    sys.exit("sim_hosts.py is run by bench_simulate.py (the probe entry is --probe-rank)")
