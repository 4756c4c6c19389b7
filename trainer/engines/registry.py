"""Engine registry: ``engine.name`` -> the factory that builds that engine for one rank.

The runner asks ``make_engine`` and never names an engine class; a new engine is one factory here
(and its name in ``engine_config.ENGINES``). Factories import their engine lazily, so TorchRec is imported
only for ``engine.name = "torchrec"``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from freescale.trainer.config import RunConfig
from freescale.trainer.engines.engine import Engine
from freescale.trainer.errors import TrainingError

EngineFactory = Callable[[RunConfig, int, int, torch.device, str], Engine]


def freescale_engine(cfg: RunConfig, rank: int, world_size: int, device: torch.device, overlap: str) -> Engine:
    """FreeScale's engine: online balancing (``engine.balancer``) and PEC (the resolved ``overlap``) pick the class."""
    if cfg.engine.balancer == "online":
        from freescale.trainer.engines.online import OnlineEngine, OnlinePECEngine

        online = OnlinePECEngine if overlap == "pec" else OnlineEngine
        return online(cfg, rank, world_size, device)
    if overlap == "pec":
        from freescale.trainer.engines.pec import PECEngine

        return PECEngine(cfg, rank, world_size, device)
    from freescale.trainer.engines.engine import FreeScaleEngine

    return FreeScaleEngine(cfg, rank, world_size, device)


def torchrec_engine(cfg: RunConfig, rank: int, world_size: int, device: torch.device, overlap: str) -> Engine:
    """The vanilla TorchRec baseline; one line naming what is missing when TorchRec cannot be imported."""
    from freescale.optional import torchrec_unavailable

    reason = torchrec_unavailable("engine.name 'torchrec'")
    if reason:  # the launcher says so first; a rank started by torchrun directly says it in one line too
        raise TrainingError(reason)
    from freescale.trainer.engines.torchrec_engine import TorchRecEngine

    return TorchRecEngine(cfg, rank, world_size, device)


ENGINE_FACTORIES: dict[str, EngineFactory] = {"freescale": freescale_engine, "torchrec": torchrec_engine}


def make_engine(cfg: RunConfig, rank: int, world_size: int, device: torch.device, overlap: str) -> Engine:
    """The engine ``engine.name`` (and the resolved ``engine.overlap``) selects."""
    factory = ENGINE_FACTORIES.get(cfg.engine.name)
    if factory is None:
        raise TrainingError(f"engine.name {cfg.engine.name!r} has no factory (known: {', '.join(ENGINE_FACTORIES)})")
    return factory(cfg, rank, world_size, device, overlap)
