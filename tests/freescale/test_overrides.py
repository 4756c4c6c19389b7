"""The one ``--set KEY=VALUE`` parser (``freescale.overrides``) and its three callers' spellings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_type_hints

import pytest

from freescale.overrides import apply_overrides, parse_override, parse_value, typed_overrides


@dataclass
class Options:
    name: str = "x"
    count: int = 1
    ratio: float = 0.5
    flag: bool = False


TYPES = get_type_hints(Options)


def test_values_are_toml_or_bare_text() -> None:
    assert parse_value("20") == 20 and parse_value("1e6") == 1e6 and parse_value("true") is True
    assert parse_value('"s3://b/p"') == "s3://b/p" and parse_value("[1, 2]") == [1, 2]
    assert parse_value("/data/run 1") == "/data/run 1"  # not TOML: the text as typed
    override = parse_override('data.path="s3://b/p?x=1"')
    assert (override.keys, override.value) == (("data", "path"), "s3://b/p?x=1")


def test_table_overrides_and_nested_keys() -> None:
    tables: dict = {"data": {"path": "a"}}
    apply_overrides(tables, ["data.max_steps=20", "engine.name=torchrec", "model.extra.depth=3"])
    assert tables == {"data": {"path": "a", "max_steps": 20}, "engine": {"name": "torchrec"},
                      "model": {"extra": {"depth": 3}}}  # fmt: skip


@pytest.mark.parametrize(
    ("item", "known", "needle"),
    [
        ("max_steps=3", None, r"'max_steps=3': expected table\.option=value"),
        ("data.max_steps", None, r"'data\.max_steps': expected table\.option=value"),
        ("data.=3", None, "expected table.option=value"),
        ("nope.x=1", {"data"}, r"'nope\.x=1': unknown table 'nope'; known: \['data'\]"),
        ("data.path.deeper=1", None, "'path' is an option, not a table"),
    ],
)
def test_bad_table_keys_are_one_line_errors(item: str, known: set[str] | None, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as error:
        apply_overrides({"data": {"path": "a"}}, [item], known=known)
    assert "\n" not in str(error.value)


def test_typed_values() -> None:
    items = ["name=123", "count=1e6", "ratio=2", "flag=yes"]
    assert typed_overrides(items, TYPES) == {"name": "123", "count": 1_000_000, "ratio": 2.0, "flag": True}
    assert typed_overrides(["flag=false", 'name="a b"'], TYPES) == {"flag": False, "name": "a b"}
    assert typed_overrides(["flag=0"], TYPES) == {"flag": False}


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("count=2.5", "count expects int, got '2.5'"),
        ("count=many", "count expects int"),
        ("ratio=fast", "ratio expects float"),
        ("flag=maybe", "flag expects bool"),
        ("count=true", "count expects int"),
        ("colour=1", "unknown key 'colour'"),
        ("count", "expected KEY=VALUE"),
    ],
)
def test_bad_typed_values_name_the_key(item: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as error:
        typed_overrides([item], TYPES)
    assert str(error.value).startswith(f"--set {item!r}") and "\n" not in str(error.value)


def test_every_command_uses_this_parser() -> None:
    from freescale.tools.commands.generate import generator_overrides
    from freescale.trainer import config
    from freescale.trainer.simulate import sim_report

    assert config.apply_overrides is apply_overrides and sim_report.apply_overrides is apply_overrides
    assert generator_overrides(["n_users=10", "sessions=true", "zipf=1.3"]) == {
        "n_users": 10, "sessions": True, "zipf": 1.3}  # fmt: skip
    with pytest.raises(ValueError, match="n_users expects int"):
        generator_overrides(["n_users=ten"])
