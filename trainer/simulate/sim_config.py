"""Configuration of ``freescale simulate`` (docs/design.md#scale-model): hardware, network, jitter, workload, arms.

Every component is a small dataclass validated in ``__post_init__``; an error names the option to
change (``network.inter_bandwidth_gbytes_s must be > 0``). A *hardware profile* is a TOML file with
``[compute]``, ``[network]`` and ``[jitter]`` tables (see ``trainer/simulate/profiles/``); the shipped ones
carry the public source of every number in a comment, and users write their own the same way.

Why the units are spelled out in the option names: a profile mixes datasheet figures given in
Gb/s (NICs), GB/s (NVLink) and TFLOPS, and a silent factor of 8 would make every projection wrong.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from freescale import storage

ARMS = ("random", "online", "plan", "plan_online")
OVERLAPS = ("none", "pec")
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "h100_nvlink_ib400"


def _positive(value: Any, option: str, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``allow_zero``); else ValueError naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{option} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{option} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _positive_int(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{option} must be an integer >= 1, got {value!r}")
    return int(value)


def _from_table(cls: type, values: dict[str, Any], where: str) -> Any:
    """``cls(**values)`` refusing unknown keys with a message naming the table."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} in [{where}]; known: {sorted(known)}")
    return cls(**values)


@dataclass
class ComputeConfig:
    """Per-sample compute time on the target hardware.

    Either a calibrated cost model (``freescale calibrate`` output, seconds; ``cost_model`` path) or
    the analytic FLOPs of docs/design.md#cost-model divided by ``peak_tflops × mfu``. ``mfu`` (the share of peak a
    real run reaches) is never a datasheet figure: profiles state it as an assumption. ``scale``
    multiplies the result (a calibration run on this host measures it: the trainer's forward and
    backward against what the cost model predicts for the same micro-batches).

    Fixed costs, which FLOPs do not see (a small model's GPU step is bound by kernel launches, not by
    its arithmetic): ``per_micro_batch_s`` per rank and step outside the layers (collate, embedding
    gathers, the loss) and ``per_layer_s`` per layer of ``workload.num_layers`` (each layer's forward
    and backward launches) complete the analytic model; a calibrated cost model measured its own
    model's fixed cost (the fit's constant ``d``, its file's ``per_micro_batch_s``) and uses that
    instead. ``step_overhead_s``: the rest of a step on every rank (the optimizer, data loading).
    ``cost_error_cv``: the cost model's
    per-sample error (``freescale calibrate`` reports the fit's mean relative error): the planner and
    the balancer place by predicted cost, the ranks spend the actual one. ``prefetch_host_s``
    (``overlap = pec`` only): seconds of each step's prefetch that are not its collectives — the
    step's data stage, after which the worker is handed the next batch, and the worker's own lookups
    and cold sparse update on the host's cores — so the prefetch ends that much later than its
    exchanges alone would (a ``none`` run of the same workload times these operations as its
    ``data``, ``embedding_lookup`` and ``sparse_update`` stages).
    """

    cost_model: str | None = None
    peak_tflops: float | None = None
    mfu: float = 0.4
    scale: float = 1.0
    per_micro_batch_s: float | None = None  # analytic model's fixed cost per micro-batch (None: 0)
    per_layer_s: float = 0.0  # analytic model's fixed cost per layer and micro-batch (launches)
    step_overhead_s: float = 0.0
    cost_error_cv: float = 0.0  # per-sample error of the cost model: samples are placed by predicted cost
    prefetch_host_s: float = 0.0  # PEC: the prefetch's non-collective seconds per step (see above)

    def __post_init__(self) -> None:
        if self.peak_tflops is not None:
            _positive(self.peak_tflops, "compute.peak_tflops")
        m = _positive(self.mfu, "compute.mfu")
        if m > 1:
            raise ValueError(f"compute.mfu is a share of peak and must be <= 1, got {m}")
        _positive(self.scale, "compute.scale")
        if self.per_micro_batch_s is not None:
            _positive(self.per_micro_batch_s, "compute.per_micro_batch_s", allow_zero=True)
        _positive(self.per_layer_s, "compute.per_layer_s", allow_zero=True)
        _positive(self.step_overhead_s, "compute.step_overhead_s", allow_zero=True)
        _positive(self.cost_error_cv, "compute.cost_error_cv", allow_zero=True)
        _positive(self.prefetch_host_s, "compute.prefetch_host_s", allow_zero=True)
        if self.cost_model is None and self.peak_tflops is None:
            raise ValueError(
                "compute needs a cost model (--cost-model, from `freescale calibrate`) or compute.peak_tflops"
            )


@dataclass
class NetworkConfig:
    """Collectives as latency + bytes / bandwidth, NVLink-like inside a node and a NIC between nodes.

    Bandwidths are per rank and per direction, in GB/s (10⁹ bytes). An all-to-all sends a rank's
    payload uniformly to all W ranks (row-wise sharding by id): the share to ranks of its own node
    goes over the intra-node link, the rest over its NIC, in parallel; the slowest rank sets the
    time. ``overlap_slowdown``: compute overlapped with communication runs this much slower while
    the communication lasts (SM-based NCCL kernels: the paper reports 10–40%; copy engines: 0).
    ``all_reduce_latency_us`` replaces the all-reduce's derived latency where it was measured
    (gloo's CPU all-reduce costs several all-to-all latencies), ``all_reduce_bandwidth_gbytes_s``
    its bandwidth (nccl-tests reports the two collectives apart; a CPU ring and an all-to-all on a
    busy core differ by several times). ``completion_spread``: how much
    earlier than the slowest rank the mean rank leaves the embedding row exchange, as a share of its
    time (0: all leave together). Why: over a congested link the two directions of an exchange need
    not finish together (gloo over TCP serves them one after the other), so a rank released early
    computes ahead and then *waits* at the next collective it launches: that time is idle
    (``straggler_pct``), not communication. A per-rank probe measures it (``benchmarks/sim_hosts.py``);
    at most 0.5, when one rank leaves as the exchange starts. ``overlap_slowdown_s_per_mbyte``:
    seconds of compute lost per megabyte (10⁶ bytes, a rank's payload) that the overlapped exchanges
    move while the compute runs. Why per byte and not per second: where the host's CPU moves the
    data (gloo over TCP: kernel network work and copies on the cores that compute) the work is per
    byte, so a slower link spreads the same work over a longer exchange; on 2 emulated hosts a probe
    (``benchmarks/sim_hosts.py``) measured 1.0–1.6x the cost per byte at 50 Mbit/s as at 200, but
    0.45–0.6x the cost per second of overlap. ``overlap_slowdown_spread``: how unevenly the overlap slowdown
    (both kinds) falls on the ranks of a step (0: alike; 1: spread evenly from none to twice the
    mean, in a random order per step). Why: a rank whose compute is slowed more than the others'
    arrives late at the step's collectives and the others idle; where a rank next waits on
    communication of its own (PEC's routing of the next batch), that wait absorbs it first.
    """

    # generic defaults for scripted use; the shipped profiles set (and cite) real values
    ranks_per_node: int = 8
    intra_latency_us: float = 10.0
    intra_bandwidth_gbytes_s: float = 100.0
    inter_latency_us: float = 20.0
    inter_bandwidth_gbytes_s: float = 25.0
    per_peer_latency_us: float = 0.0
    overlap_slowdown: float = 0.0
    all_reduce_latency_us: float | None = None  # None: the tree formula of NetworkModel.all_reduce
    all_reduce_bandwidth_gbytes_s: float | None = None  # None: the link's (intra or inter) bandwidth
    completion_spread: float = 0.0  # mean rank's lead over the slowest at a collective's end, share of its time
    overlap_slowdown_spread: float = 0.0  # how unevenly the overlap slowdown falls on a step's ranks (0..1)
    overlap_slowdown_s_per_mbyte: float = 0.0  # compute seconds lost per MB an overlapped exchange moves
    # flat: one message per peer | hierarchical: the node first, then one message per other node
    # (engine.all_to_all; docs/design.md#hierarchical-all-to-all)
    all_to_all: str = "flat"

    def __post_init__(self) -> None:
        _positive_int(self.ranks_per_node, "network.ranks_per_node")
        if self.all_to_all not in ("flat", "hierarchical"):
            raise ValueError(f"network.all_to_all must be 'flat' or 'hierarchical', got {self.all_to_all!r}")
        if _positive(self.completion_spread, "network.completion_spread", allow_zero=True) > 0.5:
            raise ValueError(f"network.completion_spread must be <= 0.5, got {self.completion_spread}")
        if _positive(self.overlap_slowdown_spread, "network.overlap_slowdown_spread", allow_zero=True) > 1.0:
            raise ValueError(f"network.overlap_slowdown_spread must be <= 1, got {self.overlap_slowdown_spread}")
        if self.all_reduce_latency_us is not None:
            _positive(self.all_reduce_latency_us, "network.all_reduce_latency_us", allow_zero=True)
        if self.all_reduce_bandwidth_gbytes_s is not None:
            _positive(self.all_reduce_bandwidth_gbytes_s, "network.all_reduce_bandwidth_gbytes_s")
        names = ("intra_latency_us", "inter_latency_us", "per_peer_latency_us", "overlap_slowdown")
        for name in (*names, "overlap_slowdown_s_per_mbyte"):
            _positive(getattr(self, name), f"network.{name}", allow_zero=True)
        for name in ("intra_bandwidth_gbytes_s", "inter_bandwidth_gbytes_s"):
            value = getattr(self, name)
            if value != math.inf:
                _positive(value, f"network.{name}")


@dataclass
class JitterConfig:
    """Spread of identical work across ranks (the noise floor): multiplicative lognormal factors,
    independent per rank and step, with coefficient of variation ``cv``.

    Or give the measured ``noise_floor_pct`` — the ``straggler_pct`` of a run in which every rank
    got the same batch — at ``noise_floor_world_size`` ranks; the simulator solves for the ``cv``
    that reproduces it. Why it matters: the expected maximum of W such factors grows like
    ``cv·sqrt(2 ln W)``, so jitter that costs 5% at 2 ranks costs far more at 1,024.
    """

    cv: float = 0.0
    noise_floor_pct: float | None = None
    noise_floor_world_size: int = 2

    def __post_init__(self) -> None:
        _positive(self.cv, "jitter.cv", allow_zero=True)
        _positive_int(self.noise_floor_world_size, "jitter.noise_floor_world_size")
        if self.noise_floor_pct is not None:
            p = _positive(self.noise_floor_pct, "jitter.noise_floor_pct", allow_zero=True)
            if p >= 100:
                raise ValueError(f"jitter.noise_floor_pct must be < 100, got {p}")
            if self.noise_floor_world_size < 2:
                raise ValueError("jitter.noise_floor_world_size must be >= 2 (one rank never straggles)")


@dataclass
class HardwareProfile:
    """A target cluster: ``[compute]``, ``[network]``, ``[jitter]`` of a profile TOML."""

    name: str
    compute: ComputeConfig
    network: NetworkConfig
    jitter: JitterConfig
    description: str = ""
    path: str | None = None

    @classmethod
    def load(cls, name_or_path: str) -> HardwareProfile:
        """A shipped profile by name (``h100_nvlink_ib400``) or a TOML file of the same shape."""
        path = Path(name_or_path)
        if not path.suffix and not path.exists():
            path = PROFILE_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            shipped = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
            raise ValueError(f"--profile {name_or_path}: no such file or shipped profile; shipped: {shipped}")
        text = storage.read_text(str(path), "--profile")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"--profile {path}: cannot parse ({error})") from error
        unknown = sorted(set(data) - {"profile", "compute", "network", "jitter"})
        if unknown:
            raise ValueError(f"--profile {path}: unknown table(s) {unknown}; known: profile, compute, network, jitter")
        try:
            meta = data.get("profile", {})
            return cls(
                name=str(meta.get("name", path.stem)),
                description=str(meta.get("description", "")),
                compute=_from_table(ComputeConfig, data.get("compute", {}), "compute"),
                network=_from_table(NetworkConfig, data.get("network", {}), "network"),
                jitter=_from_table(JitterConfig, data.get("jitter", {}), "jitter"),
                path=str(path),
            )
        except (ValueError, TypeError) as error:
            raise ValueError(f"--profile {path}: {error}") from error


@dataclass
class WorkloadConfig:
    """What a step moves and computes besides the sample lengths.

    ``micro_batch_size`` (k) samples per rank per step. Each sample of length L looks up about L ids
    in the item table (plus ``negatives`` shared per micro-batch); ``unique_fraction`` of them are
    distinct within a rank's micro-batch (1.0 is the upper bound; measure it on your data).
    Rows are ``embedding_dim × bytes_per_element`` bytes; ids 8 bytes. ``dense_params`` is the
    data-parallel parameter count (None: ``5·d²`` per layer of the model config, HSTU's uvqk and
    output projections). ``batch_overlap_rate`` (measured, e.g. by ``freescale stats``) sets what
    PEC leaves on the critical path.
    """

    micro_batch_size: int = 32
    steps: int = 16
    embedding_dim: int = 256
    num_layers: int = 4
    bytes_per_element: int = 4
    unique_fraction: float = 1.0
    negatives: int = 128
    dense_params: int | None = None
    batch_overlap_rate: float | None = None
    balancer_min_gain: float = 0.02  # the trainer's engine.balancer_min_gain

    def __post_init__(self) -> None:
        if not 0.0 <= self.balancer_min_gain < 1.0:
            raise ValueError(f"workload.balancer_min_gain must be in [0, 1), got {self.balancer_min_gain!r}")
        for name in ("micro_batch_size", "steps", "embedding_dim", "num_layers", "bytes_per_element"):
            _positive_int(getattr(self, name), f"workload.{name}")
        u = _positive(self.unique_fraction, "workload.unique_fraction")
        if u > 1:
            raise ValueError(f"workload.unique_fraction must be <= 1, got {u}")
        if isinstance(self.negatives, bool) or not isinstance(self.negatives, int) or self.negatives < 0:
            raise ValueError(f"workload.negatives must be an integer >= 0, got {self.negatives!r}")
        if self.dense_params is not None:
            _positive_int(self.dense_params, "workload.dense_params")
        if self.batch_overlap_rate is not None:
            r = _positive(self.batch_overlap_rate, "--batch-overlap-rate", allow_zero=True)
            if r > 1:
                raise ValueError(f"--batch-overlap-rate is a share and must be <= 1, got {r}")

    @property
    def dense_bytes(self) -> float:
        params = self.dense_params or 5 * self.embedding_dim**2 * self.num_layers
        return float(params * self.bytes_per_element)

    @property
    def row_bytes(self) -> float:
        return float(self.embedding_dim * self.bytes_per_element)


@dataclass
class SimConfig:
    """One simulation: world sizes × arms × overlap modes on one set of sample lengths."""

    world_sizes: tuple[int, ...] = tuple(2**i for i in range(1, 11))
    arms: tuple[str, ...] = ARMS
    overlaps: tuple[str, ...] | None = None  # None: none, and pec when a batch_overlap_rate is given
    seed: int = 0
    # defaults: the shipped default profile (the CLI's --profile), so no number here lacks a source
    compute: ComputeConfig = field(default_factory=lambda: HardwareProfile.load(DEFAULT_PROFILE).compute)
    network: NetworkConfig = field(default_factory=lambda: HardwareProfile.load(DEFAULT_PROFILE).network)
    jitter: JitterConfig = field(default_factory=lambda: HardwareProfile.load(DEFAULT_PROFILE).jitter)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)

    def __post_init__(self) -> None:
        self.world_sizes = tuple(_positive_int(w, "--world-sizes") for w in self.world_sizes)
        if not self.world_sizes:
            raise ValueError("--world-sizes must name at least one world size")
        self.arms = tuple(self.arms)
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"--arms must be a non-empty subset of {ARMS}, got {list(self.arms)}")
        if self.overlaps is None:
            self.overlaps = ("none", "pec") if self.workload.batch_overlap_rate is not None else ("none",)
        self.overlaps = tuple(self.overlaps)
        bad = [o for o in self.overlaps if o not in OVERLAPS]
        if bad or not self.overlaps:
            raise ValueError(f"--overlap must be a non-empty subset of {OVERLAPS}, got {list(self.overlaps)}")
        if "pec" in self.overlaps and self.workload.batch_overlap_rate is None:
            raise ValueError("--overlap pec needs --batch-overlap-rate (measure it with `freescale stats`)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed must be an integer >= 0, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["world_sizes"] = list(self.world_sizes)
        out["arms"] = list(self.arms)
        out["overlaps"] = list(self.overlaps or ())
        return out
