"""bench_simulate's calibration inputs: what the simulator is allowed to see of a measured 2-rank run.

* **Data facts** (``data_facts``, ``dense_params``, ``payload_bytes``): the data's ``batch_overlap_rate``
  and distinct-id share on the run's own global batches, the model's data-parallel parameters, and
  the bytes per rank and step each trainer collective carries.
* **Compute** (``calibration``): ``compute.scale``, per-step overhead, noise floor and PEC's prefetch
  host work from a measured run against the cost model.
* **Layout** (``own_source``): the dataset's own layout over a run's measured window.

Shared by bench_simulate's same-host validation and ``sim_hosts.py``'s 2-host one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SKIP_STEPS = 2  # bench_bubbles' logging.skip_steps: warm-up steps left out of the measured figures


# ------------------------------------------------------------------------------------------ data facts
def data_facts(path: str, group_size: int, steps: int) -> dict[str, Any]:
    """``batch_overlap_rate`` (docs/definitions.md) of the item table over the run's consecutive global batches
    (W = 2), the share of a micro-batch's item ids that are distinct (what ``input_dist`` sends) and
    the mean events of rank 0's micro-batches (what every rank trains in the noise-floor run)."""
    from freescale.pipeline.dataset.reader import PreparedDataset

    ds = PreparedDataset(path)
    rates, unique, events = [], 0, 0
    rank0 = [sum(int(x["length"]) for x in ds.micro_batch(ds.micro_batch_index(s, 0, 2))) for s in range(steps)]
    previous: set[int] | None = None
    for s in range(steps):
        batch: set[int] = set()
        for rank in range(2):
            ids = [int(i) for sample in ds.micro_batch(ds.micro_batch_index(s, rank, 2)) for i in sample["item_ids"]]
            unique += len(set(ids))
            events += len(ids)
            batch |= set(ids)
        if previous is not None and batch:
            rates.append(len(batch & previous) / len(batch))
        previous = batch
    return {
        "batch_overlap_rate": float(np.mean(rates)),
        "unique_fraction": unique / max(events, 1),
        "rank0_events": float(np.mean(rank0[SKIP_STEPS:])),
    }


def dense_params(model_table: dict[str, Any], items: int) -> int:
    """Data-parallel parameters of the model (what the dense all-reduce carries)."""
    from freescale.model_config import ModelConfig
    from freescale.trainer.learning_config import ModelExtraConfig
    from freescale.trainer.model.transducer import SequentialTransducer

    model = SequentialTransducer(ModelConfig(**model_table), ModelExtraConfig(num_items=items, num_actions=8))
    return int(sum(p.numel() for p in model.parameters()))


# ------------------------------------------------------------------------------------------ calibration
def own_source(path: str, steps: int, skip: int = SKIP_STEPS):
    """The dataset's own layout over the measured window of a ``steps``-step run: ``steady_figures``'
    (warm-up and the run's last, drain step left out)."""
    from freescale.trainer.simulate.sim_inputs import OwnLayout, read_prepared

    source = read_prepared(path)
    layout = source.layout
    lo, hi = 2 * skip, 2 * (steps - 1)  # micro-batches of steps [skip, steps - 1) at W = 2
    offsets = layout.offsets[lo : hi + 1]
    lengths = layout.lengths[offsets[0] : offsets[-1]]
    source.layout = OwnLayout(lengths, offsets - offsets[0], layout.group_size, layout.strategy)
    source.values = lengths
    return source


def calibration(
    cost_path: str, data: str, run: dict[str, Any], steps: int, ranks: tuple[int, ...] = (0,), skip: int = SKIP_STEPS
) -> dict[str, Any]:
    """``compute.scale`` and ``step_overhead_s`` from a measured 2-rank run: its mean forward+backward
    against the cost model's prediction for the micro-batches of ``ranks`` it trained (the noise-floor
    run trains rank 0's on both ranks), the rest of its busy time as per-step overhead; its
    ``straggler_pct`` as the noise floor; its data, lookup and sparse-update stages as PEC's prefetch
    host work (``compute.prefetch_host_s``: the PEC worker starts after the data stage and runs the
    lookups and the cold update itself; a ``none`` run times the same operations)."""
    from freescale.pipeline.cost import CostModel
    from freescale.pipeline.dataset.reader import PreparedDataset

    cost = CostModel.from_file(cost_path)
    per_mb = float(cost.details.get("per_micro_batch_s", 0.0))
    ds = PreparedDataset(data)
    predicted = []
    for step in range(skip, steps):
        for rank in ranks:
            lengths = np.array([int(x["length"]) for x in ds.micro_batch(ds.micro_batch_index(step, rank, 2))])
            predicted.append(float(cost.cost(lengths).sum()) + per_mb)
    measured_fb = 1e-3 * (run["stage_ms"]["forward"] + run["stage_ms"]["backward"])
    busy = 1e-3 * run["step_ms"] * (run["compute_pct"] + run["data_pct"]) / 100.0
    host = sum(run["stage_ms"].get(k, 0.0) for k in ("data", "embedding_lookup", "sparse_update"))
    return {
        "scale": measured_fb / float(np.mean(predicted)),
        "step_overhead_s": max(0.0, busy - measured_fb),
        "predicted_forward_backward_s": float(np.mean(predicted)),
        "measured_forward_backward_s": measured_fb,
        "noise_floor_pct": run["straggler_pct"],
        "prefetch_host_s": 1e-3 * host,
        # the fit's mean |relative error| as a normal spread's cv (E|x| = cv·sqrt(2/π))
        "cost_error_cv": float(cost.details.get("fit_relative_error_mean", 0.0)) * float(np.sqrt(np.pi / 2)),
    }


def payload_bytes(facts: dict[str, Any], d_model: int, negatives: int, params: int) -> dict[str, float]:
    """Bytes per rank and step of each trainer collective (distinct ids of a micro-batch and its
    shared negatives; in-batch negatives are targets, no new ids)."""
    unique = facts["unique_fraction"] * (facts["rank0_events"] + negatives)
    return {
        "input_dist.counts": 2 * 8.0,
        "input_dist.ids": 8.0 * unique,
        "embedding_comm.rows": 4.0 * d_model * unique,
        "gradient_comm.embeddings": 4.0 * d_model * unique,
        "gradient_comm.dense": 4.0 * params,
    }
