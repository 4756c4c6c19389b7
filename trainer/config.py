"""The trainer's run config: one TOML file, validated on load, errors that name the option.

Tables: ``[model]`` is ``freescale.model_config.ModelConfig`` unchanged, so the same file can be
passed to ``freescale prepare --model-config`` and the planner costs samples with the dimensions the
trainer runs. Options only the trainer needs live in ``[model_extra]`` (a separate dataclass, so
``ModelConfig.from_dict`` keeps reading ``[model]``). ``[data]``, ``[optimizer]``, ``[engine]``,
``[eval]``, ``[checkpoint]`` and ``[logging]`` follow. Unknown tables or keys are errors: a typo
must not silently fall back to a default in a benchmark.

Every dataclass validates itself in ``__post_init__`` and raises ``ValueError`` naming
``table.option``; ``RunConfig.from_toml`` adds the file name. The tables live by role:
``learning_config.py`` (``[model_extra]``, ``[optimizer]``), ``engine_config.py`` (``[engine]``),
``loop_config.py`` (``[data]``, ``[eval]``, ``[checkpoint]``, ``[logging]``), ``table_config.py``
(``[user_tables]``), their shared checks ``config_checks.py``. This module reads the file, builds the
tables and checks them against each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from freescale import storage
from freescale.model_config import ModelConfig
from freescale.overrides import apply_overrides
from freescale.trainer.config_checks import check, check_types
from freescale.trainer.config_toml import tables_to_toml
from freescale.trainer.engine_config import EngineConfig
from freescale.trainer.learning_config import ModelExtraConfig, OptimizerConfig
from freescale.trainer.loop_config import CheckpointConfig, DataConfig, EvalConfig, LoggingConfig
from freescale.trainer.table_config import UserTableConfig, ZchOptions, check_zch_world

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "model_extra": ModelExtraConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "engine": EngineConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}


def _section(cls: type, values: Any, name: str) -> Any:
    if not isinstance(values, dict):
        raise ValueError(f"[{name}] must be a table, got {values!r}")
    check_types(cls, values, name)
    if cls is ModelConfig:
        return ModelConfig.from_dict(values, where=name)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} in [{name}]; known: {sorted(known)}")
    try:
        return cls(**values)
    except TypeError as error:  # a wrong type that the comparison in __post_init__ trips over
        raise ValueError(f"[{name}]: {error}") from error


def _user_tables(values: Any) -> dict[str, UserTableConfig]:
    """``[user_tables]`` (``{feature: {option: value}}``) → one ``UserTableConfig`` per feature
    (``_section`` each, the feature being the table's name)."""
    if not isinstance(values, dict):
        raise ValueError(f"[user_tables] must hold tables ([user_tables.<feature>]), got {values!r}")
    tables = {}
    for feature, options in values.items():
        if not isinstance(options, dict):
            raise ValueError(f"user_tables.{feature} must be a table ([user_tables.{feature}]), got {options!r}")
        named = options.get("feature", feature)
        check(named == feature, f"user_tables.{feature}.feature", f"must be {feature!r} (the table's name)", named)
        tables[feature] = _section(UserTableConfig, {**options, "feature": feature}, f"user_tables.{feature}")
    return tables


@dataclass
class RunConfig:
    """A whole training run; ``RunConfig.from_toml(path)`` or ``from_dict``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    model_extra: ModelExtraConfig = field(default_factory=ModelExtraConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(path="data/prepared"))
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    user_tables: dict[str, UserTableConfig] = field(default_factory=dict)  # by profile feature

    def __post_init__(self) -> None:
        for name, kind in SECTIONS.items():  # also configs built in code, not read from TOML
            check_types(kind, asdict(getattr(self, name)), name)
        for feature, table in self.user_tables.items():
            check(table.feature == feature, f"user_tables.{feature}.feature", f"must be {feature!r}", table.feature)
            check_types(UserTableConfig, asdict(table), table.where)
        if self.engine.name == "torchrec" and self.engine.max_nonfinite_skips:
            raise ValueError(
                "engine.max_nonfinite_skips must be 0 with engine.name 'torchrec': its pipeline applies the "
                "update inside the step, so a non-finite step cannot be skipped, only stop the run"
            )
        if self.engine.name == "torchrec" and self.checkpoint.dir:
            raise ValueError(
                "checkpoint.dir must be empty with engine.name 'torchrec': checkpoint/resume is "
                "implemented for the FreeScale engine; the TorchRec baseline runs without checkpoints"
            )
        for where, _ in self.zch_tables():
            self._check_zch_run(where)
        if self.model.num_negatives + self.model_extra.inbatch_negatives < 1:
            raise ValueError(
                "model.num_negatives + model_extra.inbatch_negatives must be >= 1 "
                "(the sampled softmax needs at least one negative)"
            )

    def id_tables(self) -> list[tuple[str, ZchOptions]]:
        """Every table's id options with the TOML table they are in: the item table's ``model_extra``
        and each ``user_tables.<feature>``."""
        return [("model_extra", self.model_extra), *((t.where, t) for t in self.user_tables.values())]

    def zch_tables(self) -> list[tuple[str, ZchOptions]]:
        """``id_tables`` with ``ids = "zch"``."""
        return [(where, options) for where, options in self.id_tables() if options.ids == "zch"]

    def check_world(self, world_size: int) -> None:
        """Every zch table splits into whole buckets per rank (the launcher, before any rank starts)."""
        for where, options in self.zch_tables():
            check_zch_world(where, options, world_size)

    def _check_zch_run(self, where: str) -> None:
        """What ``ids = "zch"`` does not run with yet (one line naming the option)."""
        if self.engine.name != "freescale":
            raise ValueError(f"{where}.ids 'zch' runs on engine.name 'freescale' (the TorchRec baseline has no "
                             f"identity table), got {self.engine.name!r}")  # fmt: skip
        if where != "model_extra":
            return
        if self.model_extra.loss != "sampled_softmax":
            raise ValueError("model_extra.loss must be 'sampled_softmax' with model_extra.ids 'zch' (the catalogue "
                             f"is open: no full softmax over it), got {self.model_extra.loss!r}")  # fmt: skip
        if self.eval.num_candidates:
            raise ValueError("eval.num_candidates must be 0 with model_extra.ids 'zch' (full ranking over the "
                             f"table's rows), got {self.eval.num_candidates}")  # fmt: skip
        if self.eval.exclude_history:
            raise ValueError("eval.exclude_history is not supported with model_extra.ids 'zch' (history items "
                             "are raw ids, ranked rows are slots)")  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        unknown = sorted(set(data) - set(SECTIONS) - {"user_tables"})
        if unknown:
            raise ValueError(f"unknown table(s) {unknown}; known: {sorted([*SECTIONS, 'user_tables'])}")
        if "data" not in data:
            raise ValueError("[data] is required (data.path: the prepared dataset)")
        sections = {name: _section(kind, data.get(name, {}), name) for name, kind in SECTIONS.items()}
        return cls(**sections, user_tables=_user_tables(data.get("user_tables", {})))

    @classmethod
    def from_toml(cls, path: str, overrides: list[str] | None = None) -> RunConfig:
        """Read and validate ``path``; ``overrides`` are ``table.option=value`` strings (TOML values)."""
        data = storage.read_toml(path, "run config")
        apply_overrides(data, overrides or [])
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from error

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_toml(self) -> str:
        """The resolved config as TOML (written next to the run's logs)."""
        return tables_to_toml(self.to_dict())
