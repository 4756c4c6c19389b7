"""Options of ``freescale stats`` (``StatsConfig``) and what its input is (raw sources or a prepared dataset)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from freescale import storage
from freescale.model_config import ModelConfig
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.manifest import MANIFEST_NAME, ManifestError, load_manifest

if TYPE_CHECKING:
    from freescale.pipeline.stats.zch_replay import ZchReplayConfig

SOURCES_CONFIG_NAME = "sources.toml"
DEFAULT_WORLD_SIZES = (8, 64, 256)
DEFAULT_K = 32


class StatsError(ValueError):
    """``freescale stats`` cannot run as asked; the message says what to change."""


def _positive_ints(values: Any, option: str, allow_empty: bool = False) -> tuple[int, ...]:
    out = tuple(values)
    if (not out and not allow_empty) or any(
        isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1 for v in out
    ):
        raise ValueError(f"{option} must be a list of integers >= 1, got {list(out)!r}")
    return tuple(int(v) for v in out)


@dataclass
class StatsConfig:
    """Options of ``freescale stats`` (``None`` = chosen from the data; see the CLI help)."""

    input: str
    output: str | None = "freescale-stats"  # None: compute only, write nothing
    world_sizes: tuple[int, ...] | None = None  # None: 8, 64, 256 (and a prepared dataset's G)
    micro_batch_size: int | None = None  # k; None: 32, or the prepared dataset's
    batch_size: int | None = None  # sparsity batch; None: k
    global_batch_size: int | None = None  # headline batch_overlap_rate; None: see _batch_sizes
    global_batch_sizes: tuple[int, ...] | None = None  # the curve; None: k·4^j up to n/2, and every W·k
    table_sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)
    length_thresholds: tuple[int, ...] = (256, 1024, 4096, 16384)
    sample_fraction: float = 1.0
    seed: int = 0
    histogram_bins: int = 60
    zipf_min_count: int = 10
    samples: SampleConfig = field(default_factory=SampleConfig)  # raw sources: how samples are cut
    model: ModelConfig = field(default_factory=ModelConfig)
    cost_model_file: str | None = None
    memory_limit: int = 2 * 2**30
    workers: int = 2
    executor: str = "local"  # raw sources: where prepare's steps and the id pass run (``executors``)
    ray_address: str | None = None  # --executor ray: a running cluster; None starts one
    work_dir: str | None = None  # raw sources: prepare's work files; kept there for a fast re-run
    max_reject_fraction: float = 0.05  # raw sources: prepare's limit on rejected rows
    cache_dir: str | None = None  # prepared dataset on s3://: local shard cache
    verify: bool = True  # prepared dataset: check shard hashes against the manifest (--no-verify skips)
    plots: bool = True
    progress: bool = True
    # --zch-size ...: replay the item ids through a ZCH table (raw sources only); ``table_sizes`` then
    # gains the zch_size, so modulo hashing is reported at the same rows
    zch: ZchReplayConfig | None = None

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("stats needs an input: a source config TOML or a prepared dataset")
        if self.world_sizes is not None:
            self.world_sizes = _positive_ints(self.world_sizes, "--world-sizes")
        self.table_sizes = _positive_ints(self.table_sizes, "--table-sizes")
        self.length_thresholds = _positive_ints(self.length_thresholds, "--length-thresholds", allow_empty=True)
        if self.global_batch_sizes is not None:
            self.global_batch_sizes = _positive_ints(self.global_batch_sizes, "--global-batch-sizes")
        for option in ("micro_batch_size", "batch_size", "global_batch_size"):
            value = getattr(self, option)
            if value is not None:
                _positive_ints([value], f"--{option.replace('_', '-')}")
        f = self.sample_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 < f <= 1.0:
            raise ValueError(f"--sample-fraction must be in (0, 1], got {f!r}")
        r = self.max_reject_fraction
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0.0 <= r <= 1.0:
            raise ValueError(f"--max-reject-fraction must be in [0, 1], got {r!r}")
        if self.histogram_bins < 2:
            raise ValueError(f"--histogram-bins must be >= 2, got {self.histogram_bins}")
        if self.zipf_min_count < 1:
            raise ValueError(f"--zipf-min-count must be >= 1, got {self.zipf_min_count}")
        if self.memory_limit < 256 * 2**20:
            raise ValueError(f"--memory-limit must be at least 256MB, got {self.memory_limit} bytes")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if self.zch is not None:
            self.table_sizes = tuple(sorted({*self.table_sizes, self.zch.table.zch_size}))
        if max(self.table_sizes) > self.memory_limit // 8:
            raise ValueError(
                f"--table-sizes: {max(self.table_sizes):,} rows need one byte per row and table in "
                f"memory; raise --memory-limit above {8 * max(self.table_sizes):,} bytes or use "
                "smaller sizes"
            )

    def options(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("input", "output", "progress", "work_dir", "cache_dir", "verify"):
            out.pop(key)
        return out


def input_kind(uri: str) -> tuple[str, str]:
    """``("sources", toml)`` or ``("prepared", dataset)``; clear errors for anything else."""
    if not storage.exists(uri):
        raise StatsError(f"{uri} does not exist (expected a source config TOML or a prepared dataset)")
    fs, path = storage.filesystem(uri)
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type == pafs.FileType.File:
        if uri.endswith(MANIFEST_NAME):
            return "prepared", uri[: -len(MANIFEST_NAME)].rstrip("/") or "."
        return "sources", uri
    if storage.exists(storage.join(uri, MANIFEST_NAME)):
        return "prepared", uri
    if storage.exists(storage.join(uri, SOURCES_CONFIG_NAME)):
        return "sources", storage.join(uri, SOURCES_CONFIG_NAME)
    load_manifest(uri)  # raises ManifestError: "manifest.json is missing: not a finished prepare output"
    raise ManifestError(f"{uri}: not a prepared dataset")  # pragma: no cover - load_manifest raised
