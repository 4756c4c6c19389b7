"""Trace-driven bubble simulator (docs/design.md#scale-model): per-rank bubbles for W ranks without W machines.

A step on W ranks is modelled the way the trainer runs it and the way ``bubbles.analyze`` measures
it: every rank is busy for ``(step_overhead + compute(its samples)) × jitter`` seconds, then waits
at the step's collective for the slowest rank (its *idle* time: ``straggler_pct``), then the
communication left on the critical path runs (``exposed_comm_pct``). The per-rank work comes from
the sample lengths through the same code the product runs:

* ``random`` — random batching, k samples per rank (or a prepared ``--strategy random`` dataset's
  own micro-batches);
* ``online`` — the same random steps, samples re-placed by ``trainer.balancer.place_samples`` (the
  online balancer's own placement: the planner's ``lpt_free`` per step, ``workload.balancer_min_gain``
  as in the trainer); its dispatch and combine all-to-alls are charged to the critical path on steps
  that move samples (the lengths ride the routing, which costs nothing extra);
* ``plan`` — the offline planner ``pipeline.balance.plan_step_groups`` with G = W (what ``prepare
  --group-size W`` would write) over at least ``PLAN_MIN_STEPS`` steps of samples, or a prepared
  dataset's own plan when W divides its G;
* ``plan_online`` — the plan, then the online placement on each of its steps.

Communication per step (per rank, bytes from the rank's looked-up ids; ``NetworkModel`` times each
collective): ``overlap = none`` runs TorchRec's schedule as the trainer does — the next step's id
routing (counts and ids all-to-alls) one step ahead, exposed only where it outlasts the compute —
and puts the row all-to-all and the embedding-gradient all-to-all (in flight during the dense
all-reduce, sharing the link: ``side_by_side``) on the critical path. ``pec`` leaves the OL share
(``batch_overlap_rate``) of the embedding gradients and the dense all-reduce there; the rest
(routing: counts, ids, then the rows with their optimizer state and the owners' marks in one
exchange; the NOL gradients) runs one step ahead and is exposed only where it outlasts the previous
step's compute. ``COLLECTIVES_PER_STEP`` counts them as the engines issue them.

Compute per rank and step: the per-sample cost (calibrated or analytic FLOPs), plus the fixed costs
FLOPs do not see (``compute.per_micro_batch_s``, ``per_layer_s`` per layer, ``step_overhead_s``).

Ranks need not leave a collective together (``network.completion_spread``): a rank released early
starts its next step early and waits for the others at the next collective, so that share of the
exposed communication is idle time (``completion_leads``).

Compute overlapped with communication can run slower (``network.overlap_slowdown`` per second of
overlap: SM kernels; ``overlap_slowdown_s_per_mbyte`` per megabyte moved meanwhile: host CPU
network work), unevenly over a step's ranks (``overlap_slowdown_spread``): the rank slowed most
arrives late and the others idle, unless (PEC) they first wait on the next batch's routing
(``prefetch_waits``). PEC's prefetch also ends ``compute.prefetch_host_s`` later than its exchanges
alone: the worker gets the next batch after the step's data stage and does lookups and the cold
sparse update itself (exposed only where that outlasts the compute).

What is not modelled (and why it is small for the cases validated, see ``benchmarks/bench_simulate.py``):
the online balancer's placement compute and its negatives exchange, pipelining of the dense
all-reduce with backward, and congestion between jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from freescale.pipeline.balance import BalanceConfig, plan_step_groups
from freescale.trainer.engines.balancer import place_samples
from freescale.trainer.simulate.network_model import NetworkModel
from freescale.trainer.simulate.sample_cost import SampleCost, sample_cost
from freescale.trainer.simulate.sim_config import JitterConfig, SimConfig
from freescale.trainer.simulate.sim_inputs import LengthSource, OwnLayout

SCHEMA_VERSION = 1
ID_BYTES = 8
# PEC's prefetch exchange carries, besides each row: its optimizer state (row-wise Adagrad: one
# float32), its OL flag (one float32) and the readers bitmask of a step-n id (int64)
PREFETCH_MARK_BYTES = 4 + 4 + ID_BYTES
# Collectives per step in steady state, as the engines issue them (tests/trainer/engines/
# test_collective_counts.py pins both): none (TorchRec's pipeline schedule) counts, ids, rows,
# gradients, dense all-reduce; pec counts, ids, prefetch (rows + state + marks), hot gradients,
# dense all-reduce, cold gradients. ``time_steps`` charges one latency for each.
COLLECTIVES_PER_STEP = {"none": 5, "pec": 6}
JITTER_SOLVE_STEPS = 4096
# The planner's outlier budget (max_outlier_fraction) is a share of the samples it plans: a pool of a
# few steps would hide what it does over an epoch, so it always plans at least this many steps.
PLAN_MIN_STEPS = 64


# ------------------------------------------------------------------------------------------ jitter
def lognormal_factors(sigma: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Mean-one lognormal factors ``exp(σz − σ²/2)``."""
    if sigma == 0:
        return np.ones(shape)
    return np.exp(sigma * rng.standard_normal(shape) - 0.5 * sigma * sigma)


def straggler_of(busy: np.ndarray) -> float:
    """``straggler_pct`` (docs/definitions.md) of busy times ``[S, W]`` with no communication: Σ(max − mean)/Σ max."""
    top = busy.max(axis=1)
    return 100.0 * float((top - busy.mean(axis=1)).sum() / top.sum())


def jitter_sigma(cfg: JitterConfig, seed: int) -> tuple[float, str]:
    """σ of the lognormal factors: from ``cv``, or solved (bisection, fixed draws) so that identical
    work on ``noise_floor_world_size`` ranks straggles ``noise_floor_pct``."""
    if cfg.noise_floor_pct is None:
        return float(np.sqrt(np.log1p(cfg.cv**2))), f"cv {cfg.cv}"
    target = cfg.noise_floor_pct
    if target == 0:
        return 0.0, "noise floor 0%"
    z = np.random.default_rng([seed, 7_919]).standard_normal((JITTER_SOLVE_STEPS, cfg.noise_floor_world_size))

    def pct(sigma: float) -> float:
        return straggler_of(np.exp(sigma * z - 0.5 * sigma * sigma))

    lo, hi = 0.0, 4.0
    if pct(hi) < target:
        raise ValueError(f"jitter.noise_floor_pct {target} cannot be reached by lognormal jitter (max {pct(hi):.1f}%)")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if pct(mid) < target else (lo, mid)
    sigma = 0.5 * (lo + hi)
    return sigma, f"solved from noise floor {target}% at W={cfg.noise_floor_world_size}"


# ------------------------------------------------------------------------------------------ arms
@dataclass
class StepWork:
    """One arm at W ranks, per step and rank: compute seconds (no jitter), events whose ids the rank
    looks up (its home samples), samples computed, events dispatched by the online balancer."""

    compute: np.ndarray
    lookup_events: np.ndarray
    samples: np.ndarray
    moved_events: np.ndarray | None
    source: str

    @property
    def n_steps(self) -> int:
        return int(self.compute.shape[0])


def _per_rank(step: np.ndarray, rank: np.ndarray, values: np.ndarray, n_steps: int, w: int) -> np.ndarray:
    return np.bincount(step * w + rank, weights=values, minlength=n_steps * w).reshape(n_steps, w)


def _work(step, rank, lengths, seconds, cost: SampleCost, n_steps: int, w: int, source: str, home=None) -> StepWork:
    """Aggregate per-sample (step, computing rank, home rank) into ``StepWork``; ``home`` None: every
    sample is computed where it was read (nothing dispatched)."""
    moved = None
    if home is None:
        home = rank
    else:
        away = (home != rank).astype(np.float64) * lengths
        moved = np.maximum(_per_rank(step, home, away, n_steps, w), _per_rank(step, rank, away, n_steps, w))
    samples = _per_rank(step, rank, np.ones(step.size), n_steps, w)
    compute = _per_rank(step, rank, seconds, n_steps, w) + cost.per_micro_batch_s * (samples > 0)
    lookup = _per_rank(step, home, lengths.astype(np.float64), n_steps, w)
    return StepWork(compute, lookup, samples, moved, source)


def _online(
    step: np.ndarray, home: np.ndarray, seconds: np.ndarray, n_steps: int, w: int, min_gain: float = 0.0
) -> np.ndarray:
    """Destination of every sample: ``place_samples`` per step on (costs, homes) in home order."""
    order = np.lexsort((home, step))
    bounds = np.searchsorted(step[order], np.arange(n_steps + 1))
    dest = np.empty_like(home)
    for s in range(n_steps):
        idx = order[bounds[s] : bounds[s + 1]]
        dest[idx] = place_samples(seconds[idx], home[idx], w, min_gain)
    return dest


def random_steps(n_steps: int, w: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, rank) of consecutive samples of an already random pool: k per rank."""
    i = np.arange(n_steps * w * k)
    return i // (w * k), (i // k) % w


def plan_steps(seconds: np.ndarray, w: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The offline planner with G = W: (sample index, step, rank) per position, and the step count."""
    config = BalanceConfig(group_size=w, micro_batch_size=k, strategy="planned", seed=seed, compare_baselines=False)
    plan = plan_step_groups(seconds, config)
    mb = plan.micro_batch_ids()
    return plan.order, mb // w, mb % w, plan.n_micro_batches // w


def own_steps(layout: OwnLayout, w: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A prepared dataset read by W ranks (W divides G): step s reads micro-batches s·W … s·W + W − 1."""
    mb = np.repeat(np.arange(layout.offsets.size - 1), np.diff(layout.offsets))
    return mb // w, mb % w, (layout.offsets.size - 1) // w


def build_arm(arm: str, w: int, source: LengthSource, cfg: SimConfig, cost: SampleCost) -> tuple[StepWork, bool]:
    """Per-rank work of ``arm`` at ``w`` ranks and whether the lengths were resampled."""
    k, n_steps = cfg.workload.micro_batch_size, cfg.workload.steps
    layout = source.layout
    own_kind = None if layout is None else ("random" if layout.strategy == "random" else "plan")
    base = "plan" if arm.startswith("plan") else "random"
    if layout is not None and own_kind == base and layout.group_size % w == 0:
        lengths = layout.lengths
        step, rank, n_steps = own_steps(layout, w)
        seconds = cost.seconds(lengths)
        label, resampled = f"dataset's own {layout.strategy} layout (G={layout.group_size})", False
    else:
        rng = np.random.default_rng([cfg.seed, w, 3])
        pool_steps = n_steps if base == "random" else max(n_steps, PLAN_MIN_STEPS)
        lengths, resampled = source.draw(pool_steps * w * k, rng)
        seconds = cost.seconds(lengths)
        if base == "random":
            step, rank = random_steps(n_steps, w, k)
            label = "random batching"
        else:
            order, step, rank, n_steps = plan_steps(seconds, w, k, cfg.seed)
            lengths, seconds = lengths[order], seconds[order]
            label = "planner (G = W)"
    actual = actual_seconds(seconds, cfg.compute.cost_error_cv, np.random.default_rng([cfg.seed, w, 5]))
    if arm in ("online", "plan_online"):
        dest = _online(step, rank, seconds, n_steps, w, cfg.workload.balancer_min_gain)
        work = _work(step, dest, lengths, actual, cost, n_steps, w, label + " + online placement", home=rank)
        return work, resampled
    return _work(step, rank, lengths, actual, cost, n_steps, w, label), resampled


def actual_seconds(predicted: np.ndarray, cv: float, rng: np.random.Generator) -> np.ndarray:
    """What each sample really costs when the cost model is off by ``cv`` (lognormal, mean 1).

    Why: the planner and the online balancer place samples by *predicted* cost, and the ranks then
    compute the real one; a cost model's per-sample error is what leaves a planned step imbalanced
    beyond jitter. The same draw serves every arm at a world size, so arms compare on equal terms.
    """
    if cv <= 0 or predicted.size == 0:
        return predicted
    sigma = float(np.sqrt(np.log1p(cv * cv)))
    return predicted * np.exp(sigma * rng.standard_normal(predicted.size) - 0.5 * sigma * sigma)


# ------------------------------------------------------------------------------------------ timing
def time_steps(
    work: StepWork, overlap: str, cfg: SimConfig, net: NetworkModel, sigma: float, rng: np.random.Generator
) -> dict[str, Any]:
    """Bubbles of one (arm, W, overlap): see the module docstring for the model."""
    wl = cfg.workload
    n_steps, w = work.compute.shape
    busy = (cfg.compute.step_overhead_s + work.compute) * lognormal_factors(sigma, (n_steps, w), rng)
    unique = wl.unique_fraction * (work.lookup_events + wl.negatives * (work.samples > 0))
    rows = unique * wl.row_bytes
    dense = net.all_reduce(wl.dense_bytes)
    counts = net.all_to_all(np.full((n_steps, w), float(w * ID_BYTES)))
    balancer = np.zeros(n_steps)
    if work.moved_events is not None:  # dispatch and combine, on steps that move samples (lengths ride the routing)
        moves = work.moved_events.sum(axis=1) > 0
        # per moved event, the engine's unit row: item and action rows plus time and id (dispatch), their
        # gradients back (combine); rows are per event, not deduplicated (trainer/engines/online.py)
        dispatch = net.all_to_all(work.moved_events * (2 * wl.row_bytes + 2 * ID_BYTES))
        balancer = (dispatch + net.all_to_all(work.moved_events * 2 * wl.row_bytes)) * moves
    routing = None  # PEC: the next batch's routing, waited for by each rank right after its compute
    routing_bytes = w * ID_BYTES + unique * ID_BYTES  # counts and ids, per rank
    if overlap == "none":  # TorchRec's schedule: the next step's routing runs during this step's compute
        released = net.all_to_all(rows)  # the row exchange: ranks leave it one by one (completion_spread)
        # the gradient exchange (as large as the row exchange) in flight during the dense all-reduce
        critical = released + net.side_by_side(released, net.all_to_all(0.0), dense, net.all_reduce(0.0)) + balancer
        background = counts + net.all_to_all(unique * ID_BYTES)
        background_bytes = routing_bytes
        background_collectives = 2
    else:
        rate = float(wl.batch_overlap_rate or 0.0)
        released = net.all_to_all(rate * rows)  # the OL exchange; the dense all-reduce after it
        critical = released + dense + balancer
        # the rows ride with their state and the owners' marks (``overlap.prefetch_exchange``); the
        # main thread's hot gradients wait for that exchange, so it is part of the routing they wait on
        prefetch = rows + PREFETCH_MARK_BYTES * unique
        routing = counts + net.all_to_all(unique * ID_BYTES) + net.all_to_all(prefetch)
        background = routing + net.all_to_all((1.0 - rate) * rows)
        background_bytes = routing_bytes + prefetch + (1.0 - rate) * rows
        background_collectives = 4
    window = np.roll(busy.max(axis=1), 1)  # batch n+1's prefetch runs while batch n computes (steady state)
    hidden = np.minimum(background, window)
    # the bytes moved while compute runs: the hidden share of the background exchanges' payload
    hidden_share = np.divide(hidden, background, out=np.zeros_like(hidden), where=background > 0)
    hidden_mbytes = 1e-6 * background_bytes.mean(axis=1) * hidden_share
    busy = busy + overlap_slowdowns(np.roll(hidden, -1), np.roll(hidden_mbytes, -1), w, cfg.network, rng)
    exchanges = float(background.mean())  # the one-step-ahead collectives alone, before any host work
    if routing is not None:  # PEC's worker: its host work (data stage, lookups, cold update) comes first
        background, routing = background + cfg.compute.prefetch_host_s, routing + cfg.compute.prefetch_host_s
    own_wait, exposed_bg = prefetch_waits(busy, background, routing)
    exposed = critical[:, None] + own_wait + exposed_bg[:, None]  # until the slowest rank leaves the step
    lead = completion_leads(released, w, cfg.network.completion_spread, rng)
    arrival = busy + own_wait - np.concatenate([np.zeros((1, w)), lead[:-1]])  # released early: starts early
    idle = arrival.max(axis=1)[:, None] - arrival
    exposed_rank = exposed - lead
    wall_rank = busy + idle + exposed_rank
    total = float(wall_rank.sum()) / w
    straggler = 100.0 * float(idle.sum()) / (w * total)
    comm = 100.0 * float(exposed_rank.sum()) / (w * total)
    per_rank = 100.0 * idle.sum(axis=0) / wall_rank.sum(axis=0)
    mean = work.compute.mean(axis=1)
    imbalance = np.where(mean > 0, work.compute.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)
    return {
        "straggler_pct": round(straggler, 4),
        "exposed_comm_pct": round(comm, 4),
        "bubble_pct": round(straggler + comm, 4),
        "step_s": total / n_steps,
        "samples_per_s": float(work.samples.sum() / total),
        "steps": n_steps,
        "imbalance_mean": float(imbalance.mean()),
        "per_rank_straggler_pct": {
            "min": float(per_rank.min()),
            "p50": float(np.median(per_rank)),
            "max": float(per_rank.max()),
        },
        "comm_ms": {
            "critical": 1e3 * float(critical.mean()),
            "exposed_prefetch": 1e3 * float(exposed_bg.mean() + own_wait.mean()),
            "hidden_prefetch": 1e3 * float(hidden.mean()),
            "prefetch": 1e3 * exchanges,  # the collectives run one step ahead, all of them
            "prefetch_latency": 1e3 * background_collectives * float(net.all_to_all(0.0)),  # their latency part
            "balancer": 1e3 * float(balancer.mean()),
            "dense_all_reduce": 1e3 * dense,
        },
    }


def prefetch_waits(
    busy: np.ndarray, background: np.ndarray, routing: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Exposed prefetch per step: ``([S, W] each rank's own wait, [S] the wait all ranks share)``.

    ``routing`` None (``none``): batch n's background exchanges overlap the slowest rank's compute of
    step n-1 and what outlasts it is waited for by every rank. PEC: in step n each rank computes,
    then waits for the routing of batch n+1 (in flight since its compute began) before it launches
    the step's collectives, and for that batch's rows after them. A rank done computing early waits
    on the routing first, so where the routing outlasts the compute it absorbs the rank's lead
    instead of the lead turning into idle time at the collectives; the rows that outlast the last
    rank's arrival are waited for by all. With equal compute the sum is the ``none`` formula's.

    Steady state: the steps repeat (step 0's batch was fetched during the last step), so a run's
    two ends, which a long run amortises (the first batch fetched beside nothing, the last step's
    gradients sent at once), do not weigh on the per-step figures of a short simulated window."""
    top = busy.max(axis=1)
    if routing is None:
        return np.zeros_like(busy), np.maximum(0.0, background - np.roll(top, 1))
    own = np.maximum(0.0, np.roll(routing, -1)[:, None] - busy)
    shared = np.maximum(0.0, np.roll(background, -1) - (busy + own).max(axis=1))
    return own, shared


def overlap_slowdowns(
    hidden: np.ndarray, hidden_mbytes: np.ndarray, w: int, net: Any, rng: np.random.Generator
) -> np.ndarray:
    """``[S, W]`` seconds added to each rank's compute by the communication it overlaps, per step:
    ``overlap_slowdown`` of its duration (``hidden`` seconds: SM kernels busy while it lasts) plus
    ``overlap_slowdown_s_per_mbyte`` per megabyte it moves meanwhile (``hidden_mbytes``: host CPU
    work per byte), on average over the ranks; spread over them by ``overlap_slowdown_spread``
    (evenly, in a random order per step; no draw when 0)."""
    mean = net.overlap_slowdown * hidden + net.overlap_slowdown_s_per_mbyte * hidden_mbytes
    if not mean.any():
        return np.zeros((hidden.size, w))
    shares = np.ones((hidden.size, w))
    if net.overlap_slowdown_spread and w > 1:
        shares += net.overlap_slowdown_spread * (2.0 * _even_shares(hidden.size, w, rng) - 1.0)
    return mean[:, None] * shares


def _even_shares(n: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, W]``: 0 to 1 evenly over the ranks, in a random order per row."""
    return rng.permuted(np.tile(np.linspace(0.0, 1.0, w), (n, 1)), axis=1)


def completion_leads(released: np.ndarray, w: int, spread: float, rng: np.random.Generator) -> np.ndarray:
    """How much earlier than the slowest rank each rank leaves the exchange ``released`` (seconds per
    step) ``[S, W]``: evenly spaced from 0 (the slowest) to ``2·spread`` of it, in a random order per
    step, so the mean rank leads by ``spread`` of it (``network.completion_spread``).

    Which exchange: a lead turns into idle time only where the rank next *launches* a collective
    itself (it then waits for the others to arrive). The embedding row exchange (``none``; PEC's OL
    exchange) is followed by compute and a collective launched after it. The gradient exchange ends
    with the dense all-reduce in flight beside it, which releases all ranks together, and a wait on
    an exchange launched a step earlier (PEC's prefetch) absorbs an early rank's lead as more
    waiting on that exchange: neither leaves a lead.
    """
    if spread == 0 or w == 1:
        return np.zeros((released.size, w))
    return 2.0 * spread * released[:, None] * _even_shares(released.size, w, rng)


def simulate(cfg: SimConfig, source: LengthSource, progress: bool = False) -> dict[str, Any]:
    """Predicted ``straggler_pct``, ``exposed_comm_pct``, ``bubble_pct``, step time and samples/s for
    every (world size, arm, overlap); a JSON-serialisable report. Same inputs + seed → same report."""
    from tqdm import tqdm

    started = time.perf_counter()
    cost = sample_cost(cfg.compute, cfg.workload)
    sigma, sigma_origin = jitter_sigma(cfg.jitter, cfg.seed)
    rows: list[dict[str, Any]] = []
    units = [(w, arm) for w in cfg.world_sizes for arm in cfg.arms]
    bar = tqdm(units, desc="simulate", unit="arm", disable=not progress, leave=False)
    for w, arm in bar:
        bar.set_postfix_str(f"W={w} {arm}")
        work, resampled = build_arm(arm, w, source, cfg, cost)
        net = NetworkModel(cfg.network, w)
        for overlap in cfg.overlaps or ("none",):
            rng = np.random.default_rng([cfg.seed, w, 5])  # same jitter draws for every arm at this W
            figures = time_steps(work, overlap, cfg, net, sigma, rng)
            rows.append(
                {"world_size": w, "arm": arm, "overlap": overlap, "source": work.source, "resampled": resampled}
                | figures
            )
    bar.close()
    return {
        "schema_version": SCHEMA_VERSION,
        "created_by": "freescale simulate",
        "lengths": source.summary(np.random.default_rng([cfg.seed, 11])),
        "cost": cost.to_dict(),
        "jitter": {"sigma": sigma, "origin": sigma_origin},
        "config": cfg.to_dict(),
        "rows": rows,
        "runtime_s": round(time.perf_counter() - started, 3),
    }


def find(report: dict[str, Any], world_size: int, arm: str, overlap: str = "none") -> dict[str, Any]:
    """The row of ``report`` for (world_size, arm, overlap)."""
    for row in report["rows"]:
        if (row["world_size"], row["arm"], row["overlap"]) == (world_size, arm, overlap):
            return row
    raise KeyError(f"no row for W={world_size} arm={arm} overlap={overlap}")
