"""Source config: stable ids, TOML round trip, bad options, unknown formats and missing files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from source_cases import one_source

from freescale.datasets.config import SourceError, SourcesConfig, SourceSpec
from freescale.datasets.ids import stable_id, stable_id_one
from freescale.datasets.sources import plan_read_tasks

# --- ids ---------------------------------------------------------------------------------------


def test_stable_id_is_deterministic_non_negative_and_hashes_unique_values():
    values = ["u1", "u2", "u1", None, "A2SUAM1J3GNN3B"]
    ids = stable_id(values)
    assert ids.dtype == np.int64
    assert ids[0] == ids[2] == stable_id_one("u1")
    assert ids[3] == -1
    assert (ids[[0, 1, 2, 4]] >= 0).all()
    assert (stable_id(pa.array(values).dictionary_encode()) == ids).all()
    assert all(0 <= stable_id_one(f"x{k}") < 2**63 for k in range(100))
    assert len(stable_id([])) == 0


# --- config ------------------------------------------------------------------------------------


def test_toml_round_trip(tmp_path: Path):
    config = one_source(tmp_path, "csv", "a.csv", 'timestamp_unit = "ms"\nid_types = { user = "string" }')
    again = SourcesConfig.from_toml(str(tmp_path / "sources.toml"))
    assert again.to_dict() == config.to_dict()
    (tmp_path / "copy.toml").write_text(config.to_toml())
    copy = SourcesConfig.from_toml(str(tmp_path / "copy.toml"))
    assert copy.to_dict() == config.to_dict()
    assert copy.sources[0].timestamp_unit == "ms"
    assert copy.sources[0].id_types == {"user": "string"}
    assert copy.resolve("a.csv") == str(tmp_path / "a.csv")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('colour = "red"', "colour"),
        ('timestamp_unit = "minutes"', "timestamp_unit"),
        ('variant = "dat"', "variant"),
        ("default_action = -1", "default_action"),
        ("header = 3", "header"),
    ],
)
def test_bad_options_name_the_option_and_the_file(tmp_path: Path, extra: str, needle: str):
    with pytest.raises(ValueError, match=needle) as info:
        one_source(tmp_path, "csv", "a.csv", extra)
    assert "sources.toml" in str(info.value)


_SOURCE = '[[sources]]\nname = "r"\nformat = "movielens"\npath = "r.dat"\n'


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("sources = [1, 2]", r"sources: use \[\[sources\]\] tables"),
        ('sources = ["a.csv"]', r"sources: use \[\[sources\]\] tables"),
        ('dataset = "shop"\n' + _SOURCE, r"option 'dataset' must be a table; got 'shop'"),
        ('users = "users.csv"\n' + _SOURCE, r"option 'users' must be a table; got 'users.csv'"),
        (_SOURCE + '[users]\npath = "u.csv"\ncolumns = "uid"', r"\[users\]: option 'columns' must be a table"),
    ],
)
def test_a_value_where_a_table_belongs_names_the_option(tmp_path: Path, body: str, needle: str):
    """A scalar or list where the config wants a table is a ValueError naming the option and the file
    (a list of numbers for [[sources]] was a TypeError traceback, a string for [dataset] or [users] said
    "dictionary update sequence element #0 has length 1")."""
    (tmp_path / "sources.toml").write_text(body + "\n")
    with pytest.raises(ValueError, match=needle) as info:
        SourcesConfig.from_toml(str(tmp_path / "sources.toml"))
    assert "sources.toml" in str(info.value)


def test_unknown_format_and_missing_columns_are_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="format"):
        one_source(tmp_path, "xlsx", "a.xlsx")
    with pytest.raises(ValueError, match=r"columns.*timestamp"):
        one_source(tmp_path, "csv", "a.csv", columns='[sources.columns]\nuser = "u"\nitem = "i"\n')
    with pytest.raises(ValueError, match="unique"):
        SourcesConfig(name="x", sources=[SourceSpec("a", "movielens", p) for p in ("x", "y")])


def test_missing_files_and_empty_globs_are_source_errors(tmp_path: Path):
    with pytest.raises(SourceError, match=r"'s'.*no file matches.*nothing"):
        plan_read_tasks(one_source(tmp_path, "csv", "nothing/*.csv"))
    with pytest.raises(SourceError, match=r"missing\.csv"):
        plan_read_tasks(one_source(tmp_path, "csv", "missing.csv"))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(SourceError, match=r"broken\.parquet"):
        plan_read_tasks(one_source(tmp_path, "parquet", "broken.parquet"))
