"""bench_simulate's network figures: what a collective between its two ranks costs, for the simulator.

* **Idle gloo** (``measure_gloo``): all-to-all and all-reduce times between two pinned processes
  (``comm_rank``) at several payload sizes, fitted to latency + bytes / bandwidth.
* **In training** (``insitu_network``): latency + bandwidth of the trainer's own collectives, fitted to
  a noise-floor run's exposed comm per collective name against the bytes each carries per rank
  (``sim_calibration.payload_bytes``); ``sim_hosts.py`` fits its uncapped run the same way.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from sim_calibration import SKIP_STEPS

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21)  # payload bytes per rank
REPS = 30


def comm_rank(rank: int, port: int, queue: Any) -> None:
    """One of two pinned gloo processes timing all_to_all_single and all_reduce per payload size."""
    import torch
    import torch.distributed as dist

    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = {}
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4)
        y = torch.empty_like(x)
        times = {"all_to_all": [], "all_reduce": []}
        for _ in range(REPS):
            dist.barrier()
            t = time.perf_counter()
            dist.all_to_all_single(y, x)
            times["all_to_all"].append(time.perf_counter() - t)
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            times["all_reduce"].append(time.perf_counter() - t)
        out[nbytes] = {k: float(np.median(v)) for k, v in times.items()}
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def measure_gloo() -> dict[str, Any]:
    """Median times per size and the latency + bytes/bandwidth fit the simulator's model uses:
    all-to-all ``α + (payload/2)/bw`` (half a rank's payload crosses to the other rank), all-reduce
    ``2α + bytes/bw``."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=comm_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    times = queue.get(timeout=300)
    for p in procs:
        p.join()
    sizes = np.array(SIZES, dtype=np.float64)
    a2a = np.array([times[n]["all_to_all"] for n in SIZES])
    ar = np.array([times[n]["all_reduce"] for n in SIZES])
    (beta, alpha), *_ = np.linalg.lstsq(np.stack([sizes / 2, np.ones_like(sizes)], 1), a2a, rcond=None)
    (beta_ar, alpha_ar), *_ = np.linalg.lstsq(np.stack([sizes, 2 * np.ones_like(sizes)], 1), ar, rcond=None)
    return {
        "bytes": list(SIZES),
        "all_to_all_s": a2a.tolist(),
        "all_reduce_s": ar.tolist(),
        "all_to_all_fit": {"latency_us": 1e6 * max(alpha, 0.0), "bandwidth_gbytes_s": 1e-9 / beta},
        "all_reduce_fit": {"latency_us": 1e6 * max(alpha_ar, 0.0), "bandwidth_gbytes_s": 1e-9 / beta_ar},
    }


def insitu_network(
    bubbles: list[Path], payload: dict[str, float], gloo: dict[str, Any], skip: int = SKIP_STEPS
) -> dict[str, Any]:
    """Latency + bandwidth of the trainer's own collectives, fitted to the noise-floor run's exposed
    comm per collective name (``comm_by_name``, seconds per rank and step, warm-up left out) against
    the bytes each carries per rank. On this host a collective inside a training step costs several
    times what it costs between two idle processes (``measure_gloo``): scheduling on a shared core,
    not bytes. The all-reduce keeps its own latency (gloo's CPU ring)."""
    totals: dict[str, float] = {}
    n = 0
    rank_steps = [x for path in bubbles for x in json.loads(path.read_text())["rank_steps"]]
    for rank_step in rank_steps:
        if rank_step["step"] < skip:
            continue
        n += 1
        for name, seconds in rank_step["comm_by_name"].items():
            totals[name] = totals.get(name, 0.0) + seconds
    per = {name: totals.get(name, 0.0) / max(n, 1) for name in payload}
    a2a = [name for name in payload if name != "gradient_comm.dense"]
    x = np.array([payload[name] / 2 for name in a2a])  # half a rank's payload crosses at W = 2
    y = np.array([per[name] for name in a2a])
    (beta, alpha), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)
    if beta <= 0:  # the bytes do not show through the latency: keep the idle-process bandwidth
        if "all_to_all_fit" not in gloo:
            raise RuntimeError("the in-training fit needs the idle gloo bandwidth, whose measurement failed")
        beta = 1e-9 / gloo["all_to_all_fit"]["bandwidth_gbytes_s"]
        alpha = float(np.mean(y - beta * x))
    # the all-reduce: gloo's ring between idle processes for the bytes, the rest of what the
    # training step measured as its latency (one payload size cannot separate the two)
    ar_fit = gloo.get("all_reduce_fit")
    ar_bandwidth = ar_fit["bandwidth_gbytes_s"] if ar_fit else 1e-9 / float(beta)
    dense = per["gradient_comm.dense"] - payload["gradient_comm.dense"] / (ar_bandwidth * 1e9)
    return {
        "seconds_by_collective": per,
        "payload_bytes": payload,
        "latency_us": 1e6 * max(float(alpha), 0.0),
        "bandwidth_gbytes_s": 1e-9 / float(beta),
        "all_reduce_latency_us": 1e6 * max(float(dense), 0.0),
        "all_reduce_bandwidth_gbytes_s": ar_bandwidth,
    }
