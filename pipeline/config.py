"""Configuration of ``freescale prepare``: what to read, how to build samples, where to write.

Every option that changes the bytes of the output is part of the dataset fingerprint, so re-running
with the same config resumes or reports "up to date", and a different config refuses to overwrite an
existing dataset unless asked to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from freescale.model_config import ModelConfig
from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.memory import parse_size as parse_size  # re-exported: options are parsed with it

EXECUTORS = ("local", "ray")  # where prepare's and stats' steps run (--executor; ``executors``)


def parse_int_list(text: str | None, option: str) -> tuple[int, ...] | None:
    """Parse ``8,64, 256`` (None stays None: the option was not given); errors name the option."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError as error:
        raise ValueError(f"{option}: expected comma-separated integers, got {text!r}") from error


@dataclass
class SampleConfig:
    """How per-user sequences become training samples."""

    max_uih_len: int = 21000  # keep the most recent events
    window_stride: int = 0  # 0: one sample per user; >0: sliding windows ending every `stride` events
    min_len: int = 2  # next-item supervision needs at least two events
    kcore: int = 0  # 0: off; k: iteratively drop users and items with fewer than k events
    kcore_max_iterations: int = 50

    def __post_init__(self) -> None:
        if self.max_uih_len < 2:
            raise ValueError(f"--max-uih-len must be >= 2, got {self.max_uih_len}")
        if self.window_stride < 0:
            raise ValueError(f"--window-stride must be >= 0, got {self.window_stride}")
        if self.min_len < 1:
            raise ValueError(f"--min-len must be >= 1, got {self.min_len}")
        if self.min_len > self.max_uih_len:
            raise ValueError(f"--min-len ({self.min_len}) exceeds --max-uih-len ({self.max_uih_len})")
        if self.kcore < 0:
            raise ValueError(f"--kcore must be >= 0, got {self.kcore}")
        if self.kcore_max_iterations < 1:
            raise ValueError(f"kcore_max_iterations must be >= 1, got {self.kcore_max_iterations}")


DEFAULT_MAX_UIH_LEN = SampleConfig.max_uih_len


def sample_config(
    model: ModelConfig | None, max_uih_len: int | None, window_stride: int | None, **options: int
) -> SampleConfig:
    """``SampleConfig`` from the sample options a user gave (``None``: not given) and the model config.

    Samples must fit the model the plan is costed for: without ``--max-uih-len`` they take the model's
    ``max_uih_len``, and then (without ``--window-stride``) windows every half window, so older history
    becomes samples too instead of events the model never trains on (``targets.target_coverage``
    counts them when the options leave some out). Without a model the defaults stay: 21,000 events,
    one sample per user."""
    if max_uih_len is None and model is not None:
        if model.max_uih_len < 2:
            raise ValueError(f"model.max_uih_len must be >= 2 to build samples from it, got {model.max_uih_len}")
        stride = max(1, model.max_uih_len // 2) if window_stride is None else window_stride
        return SampleConfig(max_uih_len=model.max_uih_len, window_stride=stride, **options)
    length = DEFAULT_MAX_UIH_LEN if max_uih_len is None else max_uih_len
    return SampleConfig(max_uih_len=length, window_stride=window_stride or 0, **options)


@dataclass
class PrepareConfig:
    """Everything ``freescale prepare`` needs; ``fingerprint_fields`` decide dataset identity."""

    sources: str
    output: str
    samples: SampleConfig = field(default_factory=SampleConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cost_model_file: str | None = None
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    memory_limit: int = 2 * 2**30
    plan_memory: int = 4 * 2**30  # the planner's bound: past it, windows of step groups (balance.windows)
    workers: int = 2
    max_reject_fraction: float = 0.05
    quarantine_examples: int = 20  # per reason
    shard_size_limit: int = 64 * 2**20
    work_dir: str | None = None
    overwrite: bool = False
    progress: bool = True
    executor: str = "local"  # where the steps run (``executors``): not the dataset's identity
    ray_address: str | None = None  # --executor ray: a running cluster ("auto", "HOST:PORT"); None starts one
    # ``stats --sample-fraction`` (never prepare's CLI): the scan spills only the events of this share of
    # users (``datasets.ids.selected``), so the steps after it work on the sample alone
    user_fraction: float = 1.0
    # ``--time-range`` / one window of ``--time-window`` (``time_windows``): event-time seconds [start, end);
    # the scan keeps only these events and counts the others as filtered (``outside_time_range``)
    time_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("--sources is required (the source config TOML written by `freescale generate`)")
        if not self.output:
            raise ValueError("--output is required (a local directory or s3:// prefix)")
        if self.memory_limit < 256 * 2**20:
            raise ValueError(f"--memory-limit must be at least 256MB, got {self.memory_limit} bytes")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.plan_memory < 2**20:
            raise ValueError(f"--plan-memory must be at least 1MB, got {self.plan_memory} bytes")
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ValueError(f"--max-reject-fraction must be in [0, 1], got {self.max_reject_fraction}")
        if self.quarantine_examples < 0:
            raise ValueError(f"--quarantine-examples must be >= 0, got {self.quarantine_examples}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor must be local or ray, got {self.executor!r}")
        if self.ray_address and self.executor != "ray":
            raise ValueError("--ray-address needs --executor ray")
        f = self.user_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 < f <= 1.0:
            raise ValueError(f"user_fraction must be in (0, 1], got {f!r}")
        if f < 1.0 and self.samples.kcore:
            raise ValueError("user_fraction < 1 needs kcore = 0: k-core counts items over every user")
        self._check_time_range()
        if self.shard_size_limit < 2**16:
            raise ValueError(f"--shard-size-limit must be at least 64KB, got {self.shard_size_limit}")

    def _check_time_range(self) -> None:
        if self.time_range is None:
            return
        bounds = tuple(self.time_range)
        if len(bounds) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in bounds):
            raise ValueError(f"--time-range must be two integer event-time seconds START:END, got {self.time_range!r}")
        if not 0 <= bounds[0] < bounds[1]:
            raise ValueError(f"--time-range: START must be >= 0 and before END, got {bounds[0]}:{bounds[1]}")
        self.time_range = (int(bounds[0]), int(bounds[1]))

    def fingerprint_fields(self) -> dict[str, Any]:
        """The options that change the output bytes (not where or how fast it is computed)."""
        return {
            "samples": asdict(self.samples),
            "model": asdict(self.model),
            "cost_model_file": self.cost_model_file,
            "balance": asdict(self.balance),
            "shard_size_limit": self.shard_size_limit,
            "plan_memory": self.plan_memory,  # windows change the plan
            # only when sampling: full jobs keep the fingerprints (and work directories) they had
            **({"user_fraction": self.user_fraction} if self.user_fraction < 1.0 else {}),
            **({"time_range": list(self.time_range)} if self.time_range is not None else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
