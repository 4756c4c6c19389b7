"""The run config (trainer/config.py): errors name the option, TOML round trip and overrides."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from run_toml import write_config

from freescale.model_config import ModelConfig
from freescale.trainer.config import RunConfig

ZCH = {"ids": "zch", "zch_size": 1024}


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"model": {"d_model": 30, "num_heads": 4}}, "model.d_model"),
        ({"model": {"layers": 2}}, r"unknown option\(s\) \['layers'\] in \[model\]"),
        ({"model_extra": {"architecture": "bert"}}, "model_extra.architecture"),
        ({"model_extra": {"temperature": 0}}, "model_extra.temperature"),
        ({"optimizer": {"sparse": "sgd"}}, "optimizer.sparse"),
        ({"optimizer": {"dense_lr": -1}}, "optimizer.dense_lr"),
        ({"engine": {"name": "megatron"}}, "engine.name"),
        ({"engine": {"backend": "nccl"}}, "engine.backend"),
        ({"data": {"path": ""}}, "data.path"),
        ({"data": {"path": "x", "max_steps": -2}}, "data.max_steps"),
        ({"checkpoint": {"every": 5}}, "checkpoint.dir"),
        ({"engine": {"name": "torchrec"}, "checkpoint": {"dir": "/tmp/c"}}, "checkpoint.dir must be empty"),
        ({"logging": {"log_every": 0}}, "logging.log_every"),
        ({"eval": {"k": 0}}, "eval.k"),
        ({"eval": {"catalogue": "skus"}}, "eval.catalogue must be one of"),
        ({"trainer": {"x": 1}}, r"unknown table\(s\) \['trainer'\]"),
        ({"optimizer": {"dense_lr": math.inf}}, "optimizer.dense_lr must be finite"),
        ({"optimizer": {"sparse_lr": math.inf}}, "optimizer.sparse_lr must be finite"),
        ({"optimizer": {"weight_decay": math.inf}}, "optimizer.weight_decay must be finite"),
        ({"optimizer": {"betas": [0.9, math.nan]}}, "optimizer.betas must be finite"),
        ({"model_extra": {"length_group_ratio": math.inf}}, "model_extra.length_group_ratio must be finite"),
        ({"data": {"path": "x", "max_seconds": math.inf}}, "data.max_seconds must be finite"),
        ({"data": {"path": "x", "max_steps": 1.5}}, "data.max_steps must be an integer, got 1.5"),
        ({"engine": {"threads": 2.0}}, "engine.threads must be an integer"),
        ({"engine": {"collective_timeout_s": 0}}, "engine.collective_timeout_s"),
        ({"engine": {"max_nonfinite_skips": -1}}, "engine.max_nonfinite_skips"),
        ({"engine": {"name": "torchrec", "max_nonfinite_skips": 2}}, "engine.max_nonfinite_skips must be 0"),
        ({"engine": {"transport": "nvlink"}}, "engine.transport"),
        ({"engine": {"balancer": "online", "balancer_min_gain": 1.0}}, "engine.balancer_min_gain must be in"),
        ({"engine": {"transport": "copy_engine"}}, "engine.transport 'copy_engine' needs engine.device 'cuda'"),
        ({"engine": {"name": "torchrec", "transport": "torch"}}, "engine.transport 'torch' applies to the freescale"),
        ({"engine": {"all_to_all": "ring"}}, "engine.all_to_all"),
        ({"engine": {"name": "torchrec", "all_to_all": "auto"}}, "engine.all_to_all 'auto' applies to the freescale"),
        ({"engine": {"ranks_per_node": 2}}, "engine.ranks_per_node is used only with engine.all_to_all 'hierarchical'"),
        ({"engine": {"all_to_all": "hierarchical", "ranks_per_node": -1}}, "engine.ranks_per_node must be >= 0"),
        ({"model_extra": {"ids": "zch"}}, r"model_extra.zch_size must be set \(>= 1\)"),
        ({"model_extra": ZCH | {"zch_size": 100}}, "model_extra.zch_size must be a multiple of zch_bucket_size 64"),
        ({"model_extra": ZCH | {"zch_max_probe": -1}}, r"model_extra.zch_max_probe must be in \[0, zch_bucket_size 64"),
        ({"model_extra": ZCH | {"zch_max_probe": 65}}, r"model_extra.zch_max_probe must be in \[0, zch_bucket_size 64"),
        ({"model_extra": ZCH | {"zch_policy": "fifo"}}, "model_extra.zch_policy must be one of"),
        ({"model_extra": ZCH | {"zch_policy": "ttl"}}, "model_extra.zch_ttl must be > 0 seconds of event time"),
        ({"model_extra": ZCH | {"zch_ttl": 60}}, "model_extra.zch_ttl applies to zch_policy 'ttl' only"),
        ({"model_extra": ZCH | {"zch_admission_threshold": 3}}, "model_extra.zch_admission_threshold applies to"),
        ({"model_extra": ZCH | {"zch_lfu_halflife": 50}}, "model_extra.zch_lfu_halflife applies to zch_policy 'lfu'"),
        ({"model_extra": ZCH | {"zch_policy": "lfu", "zch_lfu_halflife": -1}}, "model_extra.zch_lfu_halflife must be"),
        ({"model_extra": ZCH | {"num_items": 1000}}, "model_extra.num_items must be 0 with model_extra.ids 'zch'"),
        ({"model_extra": {"zch_size": 1024}}, "model_extra.zch_size applies to model_extra.ids 'zch' only"),
        ({"model_extra": ZCH, "eval": {"num_candidates": 100}}, "eval.num_candidates must be 0 with model_extra.ids"),
        ({"model_extra": ZCH, "engine": {"name": "torchrec"}}, "model_extra.ids 'zch' runs on engine.name 'freescale'"),
        ({"model_extra": {"embedding_init": "normal"}}, "model_extra.embedding_init must be one of"),
        ({"model_extra": {"embedding_init_gain": -1.0}}, "model_extra.embedding_init_gain must be >= 0"),
    ],
)
def test_config_errors_name_the_option(tmp_path: Path, tables: dict, message: str) -> None:
    path = write_config(tmp_path / "run.toml", **tables)
    with pytest.raises(ValueError, match=message):
        RunConfig.from_toml(path)


def test_nodes_of_a_hierarchical_all_to_all() -> None:
    """Whole nodes from ``engine.ranks_per_node`` or the launcher's ranks per node; flat is 0 nodes."""
    from freescale.trainer.engine_config import EngineConfig

    assert EngineConfig().nodes_of(8, 4) == 0
    assert EngineConfig(all_to_all="hierarchical").nodes_of(8, 4) == 4
    assert EngineConfig(all_to_all="hierarchical", ranks_per_node=2).nodes_of(8, 8) == 2
    with pytest.raises(ValueError, match=r"6 ranks do not split into nodes of 4 \(engine.ranks_per_node\)"):
        EngineConfig(all_to_all="hierarchical", ranks_per_node=4).nodes_of(6, 6)
    with pytest.raises(ValueError, match="nodes of 4 \\(the launcher's ranks per node, --nproc\\)"):
        EngineConfig(all_to_all="hierarchical").nodes_of(6, 4)
    auto = EngineConfig(all_to_all="auto")
    assert auto.nodes_of(6, 4) == 0 and auto.all_to_all_candidates(6, 4) == ("flat",)  # no whole nodes: flat
    assert auto.all_to_all_candidates(8, 8) == ("flat",)  # one node
    assert auto.all_to_all_candidates(16, 8) == ("flat", "hierarchical")
    assert EngineConfig(all_to_all="hierarchical").all_to_all_candidates(16, 8) == ("hierarchical",)
    picked = EngineConfig(all_to_all="auto", ranks_per_node=4, balancer="auto")
    assert picked.resolved("none", "flat") == EngineConfig(balancer="none")
    assert picked.resolved("online", "hierarchical").ranks_per_node == 4


def test_config_round_trip_overrides_and_model_table(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run.toml", model={"d_model": 32, "num_heads": 2, "max_uih_len": 128})
    cfg = RunConfig.from_toml(path, ["engine.name=torchrec", "data.max_steps=7", 'data.path="s3://b/p"'])
    assert (cfg.engine.name, cfg.data.max_steps, cfg.data.path) == ("torchrec", 7, "s3://b/p")
    assert ModelConfig.from_toml(path).d_model == 32  # [model] stays readable by `prepare --model-config`
    (tmp_path / "resolved.toml").write_text(cfg.to_toml())
    assert RunConfig.from_toml(str(tmp_path / "resolved.toml")) == cfg
    with pytest.raises(ValueError, match=r"table\.option=value"):
        RunConfig.from_toml(path, ["max_steps=3"])


def test_configs_built_in_code_refuse_non_finite_floats() -> None:
    from freescale.trainer.learning_config import OptimizerConfig
    from freescale.trainer.loop_config import DataConfig

    with pytest.raises(ValueError, match=r"optimizer\.sparse_lr must be finite"):
        RunConfig(data=DataConfig(path="x"), optimizer=OptimizerConfig(sparse_lr=math.inf))


def test_zch_buckets_must_split_among_the_ranks() -> None:
    cfg = RunConfig.from_dict({"data": {"path": "x"}, "model_extra": ZCH | {"zch_size": 192}})
    cfg.check_world(3)  # 3 buckets of 64 rows: one per rank
    with pytest.raises(
        ValueError, match=r"model_extra.zch_size 192 gives 3 buckets of 64 rows, not a multiple of the 2"
    ):
        cfg.check_world(2)


def test_a_zch_table_probes_its_whole_bucket_unless_told_otherwise() -> None:
    from freescale.trainer.engines.zch_shard import zch_config

    def probes(extra: dict) -> int:
        cfg = RunConfig.from_dict({"data": {"path": "x"}, "model_extra": ZCH | {"zch_size": 256} | extra})
        return zch_config(cfg.model_extra, 1).max_probe

    assert probes({}) == 64 and probes({"zch_bucket_size": 32}) == 32  # 0, the default: all of the bucket
    assert probes({"zch_max_probe": 16}) == 16


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"country": {"ids": "bloom"}}, r"user_tables.country.ids must be one of"),
        ({"country": {"ids": "hashed"}}, r"user_tables.country.rows must be set \(>= 1\) with user_tables.country.ids"),
        ({"country": {"rows": 1.5}}, r"user_tables.country.rows must be an integer"),
        ({"country": {"size": 8}}, r"unknown option\(s\) \['size'\] in \[user_tables.country\]"),
        ({"country": 3}, r"user_tables.country must be a table"),
        ({"user_id": {}}, r"user_tables.user_id.ids must be 'hashed' or 'zch': user ids have no vocabulary"),
        ({"user_id": {"ids": "zch", "zch_size": 100}}, r"user_tables.user_id.zch_size must be a multiple of"),
        ({"user_id": {"ids": "zch", "zch_size": 128, "zch_max_probe": 65}}, r"user_tables.user_id.zch_max_probe"),
        ({"user_id": {"ids": "zch", "zch_size": 128, "zch_policy": "ttl"}}, r"user_tables.user_id.zch_ttl must be > 0"),
        ({"user_id": {"ids": "hashed", "rows": 8, "zch_size": 64}}, r"user_tables.user_id.zch_size applies to"),
        ({"user_id": {"ids": "zch", "zch_size": 128, "zch_lfu_halflife": 9}}, r"user_tables.user_id.zch_lfu_halflife"),
    ],
)
def test_user_table_errors_name_the_table_and_option(tables: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict({"data": {"path": "x"}, "user_tables": tables})


def test_user_tables_round_trip_through_toml_and_set(tmp_path: Path) -> None:
    tables = {"country_id": {}, "user_id": {"ids": "zch", "zch_size": 256, "zch_policy": "lfu", "zch_lfu_halflife": 50}}
    cfg = RunConfig.from_dict({"data": {"path": "x"}, "user_tables": tables})
    path = tmp_path / "run.toml"
    path.write_text(cfg.to_toml())
    again = RunConfig.from_toml(str(path), ["user_tables.user_id.zch_size=512", "user_tables.age_bucket.rows=7"])
    assert (
        again.user_tables["user_id"].zch_size == 512
        and again.user_tables["user_id"].zch_lfu_halflife == 50
        and again.user_tables["country_id"] == cfg.user_tables["country_id"]
    )
    assert again.user_tables["age_bucket"].table == "user.age_bucket"
    torchrec = {"data": {"path": "x"}, "engine": {"name": "torchrec"}, "user_tables": {"user_id": tables["user_id"]}}
    with pytest.raises(ValueError, match=r"user_tables.user_id.ids 'zch' runs on engine.name 'freescale'"):
        RunConfig.from_dict(torchrec)
    cfg = RunConfig.from_dict({"data": {"path": "x"}, "user_tables": {"user_id": {"ids": "zch", "zch_size": 192}}})
    with pytest.raises(ValueError, match=r"user_tables.user_id.zch_size 192 gives 3 buckets of 64 rows, not a mult"):
        cfg.check_world(2)
