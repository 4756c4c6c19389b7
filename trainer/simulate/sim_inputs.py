"""Sample lengths for ``freescale simulate``: a named distribution, a prepared dataset, raw sources or
a ``.npy`` file of lengths.

The simulator needs, per world size W, a pool of ``steps × W × k`` sample lengths. A named
distribution draws them fresh; data that has fewer samples than a pool needs is resampled with
replacement (the report says ``resampled``), so 1,024 ranks can be projected from a dataset
prepared for 8. A prepared dataset also carries its own plan (micro-batches in plan order, group
size G, strategy): for a W dividing G the simulator uses exactly what the trainer would read.

Raw sources go through ``prepare``'s own phases (scan → k-core → samples, as ``freescale stats``
does), so the lengths are the ones ``prepare`` would balance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

DISTRIBUTIONS = {
    "lognormal": {"median": None, "sigma": None, "cap": None, "min": 2},
    "pareto": {"scale": None, "alpha": None, "cap": None, "min": 2},
}


@dataclass
class OwnLayout:
    """A prepared dataset's plan: ``lengths`` in plan order, micro-batch ``offsets``, group size."""

    lengths: np.ndarray
    offsets: np.ndarray
    group_size: int
    strategy: str


@dataclass
class LengthSource:
    """Where lengths come from: a distribution (``params``) or observed ``values``."""

    origin: str
    kind: str  # lognormal | pareto | data
    params: dict[str, float] | None = None
    values: np.ndarray | None = None
    layout: OwnLayout | None = None

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
        """``n`` lengths and whether data had to be resampled with replacement."""
        if self.kind == "data":
            v = self.values
            assert v is not None
            if v.size >= n:
                return v[rng.permutation(v.size)[:n]], False
            return v[rng.integers(0, v.size, n)], True
        p = self.params
        assert p is not None
        if self.kind == "lognormal":
            x = np.exp(np.log(p["median"]) + p["sigma"] * rng.standard_normal(n))
        else:  # pareto: P(X > x) = (scale / x)^alpha for x >= scale
            x = p["scale"] * (1.0 - rng.random(n)) ** (-1.0 / p["alpha"])
        return np.clip(np.round(x), p["min"], p["cap"]).astype(np.int64), False

    def summary(self, rng: np.random.Generator) -> dict[str, Any]:
        """count (data), mean, p50/p90/p99, max: on the data, or on 100k draws of a distribution."""
        x = self.values if self.kind == "data" else self.draw(100_000, rng)[0]
        assert x is not None
        out: dict[str, Any] = {"origin": self.origin, "kind": self.kind}
        if self.params:
            out["params"] = self.params
        if self.kind == "data":
            out["samples"] = int(x.size)
        pct = np.percentile(x, (50, 90, 99))
        out.update(mean=float(x.mean()), p50=float(pct[0]), p90=float(pct[1]), p99=float(pct[2]), max=int(x.max()))
        if self.layout is not None:
            out["own_plan"] = {"group_size": self.layout.group_size, "strategy": self.layout.strategy}
        return out


def parse_distribution(spec: str) -> LengthSource:
    """``lognormal:median=300,sigma=1.2,cap=21000`` or ``pareto:scale=50,alpha=1.1,cap=21000``
    (``min`` optional, default 2: next-item training needs two events)."""
    name, _, rest = spec.partition(":")
    if name not in DISTRIBUTIONS:
        raise ValueError(f"--lengths {spec!r}: unknown distribution {name!r}; known: {sorted(DISTRIBUTIONS)}")
    params: dict[str, Any] = dict(DISTRIBUTIONS[name])
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in params:
            raise ValueError(f"--lengths {spec!r}: expected KEY=VALUE with KEY one of {sorted(params)}, got {item!r}")
        try:
            params[key] = float(value)
        except ValueError as error:
            raise ValueError(f"--lengths {spec!r}: {key} must be a number, got {value!r}") from error
    missing = sorted(k for k, v in params.items() if v is None)
    if missing:
        raise ValueError(f"--lengths {spec!r}: missing {missing}")
    for key, value in params.items():
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"--lengths {spec!r}: {key} must be > 0, got {value}")
    if params["min"] > params["cap"]:
        raise ValueError(f"--lengths {spec!r}: min ({params['min']:g}) exceeds cap ({params['cap']:g})")
    return LengthSource(origin=spec, kind=name, params=params)


def read_prepared(uri: str, verify: bool = True, progress: bool = False) -> LengthSource:
    """Lengths of a prepared dataset in plan order, with its plan (offsets, G, strategy)."""
    from tqdm import tqdm

    from freescale.pipeline.dataset.reader import PreparedDataset

    dataset = PreparedDataset(uri, verify=verify)
    n = int(dataset.offsets[-1])
    lengths = np.empty(n, dtype=np.int64)
    _ = dataset.rows  # opened before the progress bar (the import is heavy)
    for i in tqdm(range(n), desc="simulate: lengths", unit="sample", disable=not progress, leave=False):
        lengths[i] = int(dataset.row(i)["length"])
    if n == 0:
        raise ValueError(f"{uri}: the prepared dataset holds no samples")
    strategy = dataset.info.layout.strategy or "planned"
    layout = OwnLayout(lengths, dataset.offsets.astype(np.int64), dataset.group_size, strategy)
    return LengthSource(origin=uri, kind="data", values=lengths, layout=layout)


def read_sources(toml: str, samples: Any, workers: int = 1, progress: bool = False) -> LengthSource:
    """Raw sources through ``prepare``'s count-only path (scan → k-core → per-user counts → the
    planned sample lengths, ``planned_samples``): what ``stats`` costs, without building a sample."""
    from freescale.pipeline.planned_lengths import planned_lengths  # polars & pyarrow: only for raw sources

    lengths = planned_lengths(toml, samples, workers=workers, progress=progress)
    if lengths.size == 0:
        raise ValueError(f"{toml}: the sources yield no samples")
    return LengthSource(origin=toml, kind="data", values=lengths.astype(np.int64))


def read_npy(path: str) -> LengthSource:
    """A 1-D array of integer lengths >= 1 saved with ``np.save``."""
    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise ValueError(f"--lengths {path}: not a readable .npy file ({error})") from error
    if x.ndim != 1 or x.size == 0 or not np.issubdtype(x.dtype, np.integer) or x.min() < 1:
        raise ValueError(f"--lengths {path}: expected a non-empty 1-D array of integer lengths >= 1")
    return LengthSource(origin=path, kind="data", values=x.astype(np.int64))


def load_lengths(spec: str, samples: Any = None, workers: int = 1, verify: bool = True, progress: bool = False):
    """A distribution spec, a ``.npy`` file, a prepared dataset or a source config (or its folder)."""
    if re.match(r"^[a-z]+:", spec) and not spec.startswith("s3:"):
        return parse_distribution(spec)
    if spec.endswith(".npy"):
        return read_npy(spec)
    from freescale.pipeline.stats import input_kind

    kind, uri = input_kind(spec)
    if kind == "prepared":
        return read_prepared(uri, verify=verify, progress=progress)
    from freescale.pipeline.config import SampleConfig

    return read_sources(uri, samples or SampleConfig(), workers=workers, progress=progress)


__all__ = ["LengthSource", "OwnLayout", "load_lengths", "parse_distribution", "read_prepared", "read_sources"]
