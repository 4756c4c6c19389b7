"""The ``[engine]`` table: which engine runs the step, on which device and backend, and how its
communication runs (overlap, balancer, transport, all-to-all). ``auto`` values are resolved per run
by ``engine_choices.py``; the world-dependent checks (whole nodes) are methods here, called by it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from freescale.trainer.config_checks import check, choice

ENGINES = ("freescale", "torchrec")
DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
TORCHREC_PIPELINES = ("auto", "sparse_dist", "base", "none")
OVERLAPS = ("auto", "pec", "none")
BALANCERS = ("none", "online", "auto")
TRANSPORTS = ("auto", "torch", "copy_engine")  # kernels.transport.TRANSPORTS, without importing torch here
ALL_TO_ALLS = ("flat", "hierarchical", "auto")


@dataclass
class EngineConfig:
    """Which engine runs the step and on what."""

    name: str = "freescale"
    device: str = "cpu"
    backend: str = "auto"  # auto: gloo on CPU, nccl on CUDA
    threads: int = 1  # torch.set_num_threads per rank (benchmarks: 1)
    seed: int = 0  # model and table initialisation
    instrument: bool = True  # per-stage timers (CUDA: synchronises at stage boundaries)
    torchrec_pipeline: str = "auto"  # auto: TrainPipelineSparseDist (runs on CPU too), see torchrec_engine
    pin_cpus: bool = False  # CPU runs: each local rank on its own slice of the host's cores
    overlap: str = "auto"  # freescale engine: pec (prioritized embedding communication, exact) | none | auto
    max_nonfinite_skips: int = 0  # steps with a NaN/inf loss or gradient skipped (no update) before the run stops
    collective_timeout_s: float = 300.0  # a collective waiting this long for a rank ends the job (torch: 30 min)
    transport: str = "auto"  # freescale engine's all-to-alls: auto | torch | copy_engine (SM-free, one CUDA node)
    # flat: one all-to-all over every rank | hierarchical: within the node first, then one exchange per
    # pair of nodes (engine.transport inside a node; kernels/transport_hierarchical.py)
    all_to_all: str = "flat"
    ranks_per_node: int = 0  # hierarchical all-to-all: ranks per node; 0 = the launcher's LOCAL_WORLD_SIZE
    balancer: str = "none"  # freescale engine: online = move samples between ranks per step | none | auto (predicted)
    auto_profile: str = "h100_nvlink_ib400"  # overlap/balancer "auto": hardware profile the prediction uses
    balancer_cost_model: str = ""  # online balancer: calibrated cost file (prepare's --cost-model); "" = analytic
    balancer_min_gain: float = 0.02  # online balancer: move samples only if the step's max rank cost drops > 2%
    # CUDA: let ranks of a node share GPUs (local rank r on cuda:(r % GPUs)). NCCL refuses two ranks on one
    # GPU, so collectives run on gloo (auto backend) and the all-to-alls on copy engines through CUDA IPC
    # (engine.transport auto). For checks on a one-GPU machine, not for speed.
    share_gpus: bool = False
    deterministic: bool = False  # torch.use_deterministic_algorithms: bitwise-repeatable CUDA runs, slower

    def __post_init__(self) -> None:
        choice("engine.name", self.name, ENGINES)
        choice("engine.device", self.device, DEVICES)
        choice("engine.backend", self.backend, BACKENDS)
        choice("engine.torchrec_pipeline", self.torchrec_pipeline, TORCHREC_PIPELINES)
        choice("engine.overlap", self.overlap, OVERLAPS)
        choice("engine.transport", self.transport, TRANSPORTS)
        choice("engine.all_to_all", self.all_to_all, ALL_TO_ALLS)
        check(self.ranks_per_node >= 0, "engine.ranks_per_node", "must be >= 0 (0: the launcher's ranks per node)",
               self.ranks_per_node)  # fmt: skip
        if self.ranks_per_node and self.all_to_all == "flat":
            raise ValueError(
                "engine.ranks_per_node is used only with engine.all_to_all 'hierarchical' or 'auto', got 'flat'"
            )
        choice("engine.balancer", self.balancer, BALANCERS)
        check(self.threads >= 1, "engine.threads", "must be >= 1", self.threads)
        check(self.seed >= 0, "engine.seed", "must be >= 0", self.seed)
        check(self.max_nonfinite_skips >= 0, "engine.max_nonfinite_skips", "must be >= 0", self.max_nonfinite_skips)
        check(self.collective_timeout_s > 0, "engine.collective_timeout_s", "must be > 0", self.collective_timeout_s)
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("engine.backend 'nccl' needs engine.device 'cuda' (use gloo on CPU)")
        if self.share_gpus and self.device != "cuda":
            raise ValueError("engine.share_gpus needs engine.device 'cuda' (it places several CUDA ranks on one GPU)")
        if self.share_gpus and self.backend == "nccl":
            raise ValueError(
                "engine.share_gpus cannot run on engine.backend 'nccl' (NCCL refuses two ranks on one GPU); "
                "leave engine.backend = 'auto' (gloo when GPUs are shared) or set 'gloo'"
            )
        if self.transport == "copy_engine" and self.device != "cuda":
            raise ValueError(
                "engine.transport 'copy_engine' needs engine.device 'cuda' (copy engines are GPU DMA engines); "
                "use 'auto' or 'torch'"
            )
        check(0.0 <= self.balancer_min_gain < 1.0, "engine.balancer_min_gain", "must be in [0, 1)",
               self.balancer_min_gain)  # fmt: skip
        if self.balancer_cost_model and self.balancer == "none":
            raise ValueError(
                "engine.balancer_cost_model is used only with engine.balancer 'online' or 'auto', "
                f"got {self.balancer!r}"
            )
        check(isinstance(self.auto_profile, str) and bool(self.auto_profile.strip()), "engine.auto_profile",
               "must name a shipped hardware profile or a profile TOML", self.auto_profile)  # fmt: skip
        if self.balancer != "none" and self.name == "torchrec":
            raise ValueError(
                f"engine.balancer {self.balancer!r} applies to the freescale engine; "
                "engine.name 'torchrec' has no online balancer (leave engine.balancer = 'none')"
            )
        if self.transport != "auto" and self.name == "torchrec":
            raise ValueError(
                f"engine.transport {self.transport!r} applies to the freescale engine; "
                "engine.name 'torchrec' runs TorchRec's own all-to-alls (leave engine.transport = 'auto')"
            )
        if self.all_to_all != "flat" and self.name == "torchrec":
            raise ValueError(
                f"engine.all_to_all {self.all_to_all!r} applies to the freescale engine; "
                "engine.name 'torchrec' runs TorchRec's own all-to-alls (leave engine.all_to_all = 'flat')"
            )

    def resolved_backend(self) -> str:
        """gloo on CPU and for ranks sharing GPUs (``share_gpus``), else nccl on CUDA."""
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.device == "cuda" and not self.share_gpus else "gloo"

    def nodes_of(self, world_size: int, local_world_size: int) -> int:
        """Ranks per node of the ``all_to_all = "hierarchical"`` exchange (0 for ``"flat"``):
        ``ranks_per_node``, or when 0 the launcher's ranks per node (``local_world_size``). A world
        that does not split into whole nodes is one line naming where the node size came from;
        for ``"auto"`` it is 0 (auto then stays flat)."""
        if self.all_to_all == "flat":
            return 0
        per_node = self.ranks_per_node or local_world_size
        if per_node < 1 or world_size % per_node:
            if self.all_to_all == "auto":
                return 0
            source = "engine.ranks_per_node" if self.ranks_per_node else "the launcher's ranks per node, --nproc"
            raise ValueError(
                f"engine.all_to_all 'hierarchical': {world_size} ranks do not split into nodes of {per_node} ({source})"
            )
        return per_node

    def all_to_all_candidates(self, world_size: int, local_world_size: int) -> tuple[str, ...]:
        """What ``engine.all_to_all`` may resolve to for this world: as given, or for ``"auto"`` flat
        and hierarchical where the ranks form two or more whole nodes (else flat)."""
        if self.all_to_all != "auto":
            return (self.all_to_all,)
        per_node = self.nodes_of(world_size, local_world_size)
        return ("flat", "hierarchical") if per_node and world_size // per_node > 1 else ("flat",)

    def resolved(self, balancer: str, all_to_all: str) -> EngineConfig:
        """This config with the balancer and all-to-all its ``auto`` resolved to (``ranks_per_node``
        dropped for flat); the overlap is passed to the engine on its own (``runner.make_engine``)."""
        per_node = self.ranks_per_node if all_to_all == "hierarchical" else 0
        return replace(self, balancer=balancer, all_to_all=all_to_all, ranks_per_node=per_node)
