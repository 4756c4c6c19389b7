"""Exact id tables (pipeline/dataset/vocabulary.py): every reader format round-trips raw id -> row -> raw id,
vocabularies are deterministic and hash-checked, and the manifest records each table's size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prepare_configs import make_config

from freescale.datasets.ids import stable_id
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.vocabulary import UnknownIdError, Vocabulary, hash_collision_rate
from freescale.pipeline.integrity import IntegrityError
from freescale.pipeline.prepare import prepare

USERS, EVENTS = 6, 7  # 6 users of 7 events each
BASE_TS = 1_600_000_000
COLUMNS = '[sources.columns]\nuser = "uid"\nitem = "item"\ntimestamp = "ts"\naction = "act"\n'


def _events() -> list[tuple[int, int, int, int]]:
    """(user, item, rating/action, ts): items drawn from a sparse id range so folding would collide."""
    rng = np.random.default_rng(3)
    items = [10**12 + 7 * k for k in range(9)]
    return [
        (u + 1, int(items[rng.integers(len(items))]), int(rng.integers(1, 6)), BASE_TS + 60 * (u * EVENTS + e))
        for u in range(USERS)
        for e in range(EVENTS)
    ]


def _write_source(folder: Path, fmt: str) -> tuple[str, np.ndarray]:
    """One source in ``fmt`` holding ``_events()``; returns its config path and the raw item ids readers give."""
    rows = _events()
    items = np.array([r[1] for r in rows], np.int64)
    generic = f'[sources.action_map]\n"1" = 1\n"2" = 2\n"3" = 3\n"4" = 4\n"5" = 5\n{COLUMNS}'
    extra = ""
    if fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        name = f"a.{fmt}"
        text = sep.join(["uid", "item", "ts", "act"]) + "\n"
        text += "".join(sep.join(map(str, (u, i, t, a))) + "\n" for u, i, a, t in rows)
        (folder / name).write_text(text)
    elif fmt == "jsonl":
        name = "a.jsonl"
        (folder / name).write_text(
            "".join(json.dumps({"uid": u, "item": f"x{i}", "ts": t, "act": str(a)}) + "\n" for u, i, a, t in rows)
        )
        items = stable_id([f"x{i}" for i in items])
    elif fmt in ("parquet", "arrow"):
        name = f"a.{fmt}"
        table = pa.table(
            {"uid": [r[0] for r in rows], "item": items, "ts": [r[3] for r in rows], "act": [str(r[2]) for r in rows]}
        )
        if fmt == "parquet":
            pq.write_table(table, folder / name)
        else:
            with pa.ipc.new_file(str(folder / name), table.schema) as writer:
                writer.write_table(table)
    elif fmt == "movielens":
        name, generic = "ratings.dat", ""
        (folder / name).write_text("".join(f"{u}::{i}::{a}::{t}\n" for u, i, a, t in rows))
    elif fmt == "recbole":
        name, generic = "x.inter", ""
        text = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        (folder / name).write_text(text + "".join(f"{u}\t{i}\t{a}.0\t{t}\n" for u, i, a, t in rows))
    elif fmt == "amazon":
        name, generic = "Books.json", ""
        lines = [
            {"reviewerID": f"U{u}", "asin": f"B{i:012d}", "overall": float(a), "unixReviewTime": t}
            for u, i, a, t in rows
        ]
        (folder / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
        items = stable_id([f"B{i:012d}" for i in items])
    else:
        raise AssertionError(fmt)
    config = folder / "sources.toml"
    head = f'[dataset]\nname = "v"\n[[sources]]\nname = "s"\nformat = "{fmt}"\npath = "{name}"\n'
    config.write_text(head + extra + generic)
    return str(config), items


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv", "jsonl", "arrow", "movielens", "recbole", "amazon"])
def test_every_reader_format_round_trips_raw_id_row_raw_id(tmp_path: Path, fmt: str):
    sources, raw_items = _write_source(tmp_path, fmt)
    manifest = prepare(make_config(sources, str(tmp_path / "out")))
    dataset = PreparedDataset(str(tmp_path / "out"))
    vocab = dataset.vocabulary("item")
    assert vocab is not None and vocab.size == len(np.unique(raw_items))
    assert manifest["tables"]["item"]["size"] == vocab.size == dataset.table_sizes()["item"]
    assert np.array_equal(vocab.raw_ids, np.unique(raw_items))  # dense: rows 0..n-1, ascending raw ids
    assert {entry["path"] for entry in manifest["files"]} >= {"vocab/item.npy", "vocab/action.npy"}
    seen = []
    for m in range(dataset.n_micro_batches):
        for sample in dataset.micro_batch(m):
            rows = vocab.rows(sample["item_ids"])
            assert rows.min() >= 0 and rows.max() < vocab.size
            assert np.array_equal(vocab.raw(rows), sample["item_ids"])
            seen.append(sample["item_ids"])
    assert np.array_equal(np.unique(np.concatenate(seen)), vocab.raw_ids)  # no row that no sample uses
    actions = dataset.vocabulary("action")
    assert actions is not None and set(actions.raw_ids.tolist()) <= {1, 2, 3, 4, 5}


def test_vocabularies_are_deterministic_and_hash_checked(tmp_path: Path):
    sources, _ = _write_source(tmp_path, "csv")
    prepare(make_config(sources, str(tmp_path / "a")))
    prepare(make_config(sources, str(tmp_path / "b"), workers=2))  # other process layout, same bytes
    for table in ("item", "action"):
        assert (tmp_path / "a" / "vocab" / f"{table}.npy").read_bytes() == (
            tmp_path / "b" / "vocab" / f"{table}.npy"
        ).read_bytes()
    path = tmp_path / "a" / "vocab" / "item.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"item\.npy: xxh64 hash mismatch"):
        PreparedDataset(str(tmp_path / "a")).vocabulary("item")


def test_unknown_ids_are_named_and_collision_rate_is_exact():
    vocab = Vocabulary("item", np.array([3, 10, 12], np.int64))
    assert vocab.rows(np.array([12, 3])).tolist() == [2, 0]
    with pytest.raises(UnknownIdError, match="item id 11 is not in"):
        vocab.rows(np.array([3, 11]), where="sample")
    with pytest.raises(ValueError, match="distinct and ascending"):
        Vocabulary("item", np.array([3, 3], np.int64))
    # 10 % 7 = 3 % 7: two of four ids share a row
    assert hash_collision_rate(np.array([3, 10, 12, 6]), 7) == 0.5
    assert hash_collision_rate(np.array([3, 10, 12, 6]), 100) == 0.0


def test_user_profile_features_get_a_vocabulary_each(tmp_path: Path):
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate

    generate(preset("tiny", seed=5), str(tmp_path / "src"))
    manifest = prepare(make_config(str(tmp_path / "src" / "sources.toml"), str(tmp_path / "out")))
    dataset = PreparedDataset(str(tmp_path / "out"))
    features = manifest["layout"]["user_features"]
    assert features == ["age_bucket", "country_id"]
    values = np.concatenate(
        [
            np.asarray(s["user_features"]).reshape(1, -1)
            for m in range(dataset.n_micro_batches)
            for s in dataset.micro_batch(m)
        ]
    )
    for i, name in enumerate(features):
        vocab = dataset.vocabulary(f"user.{name}")
        assert manifest["tables"][f"user.{name}"]["file"] == f"vocab/user_feature_{i}.npy"
        assert np.array_equal(vocab.raw_ids, np.unique(values[:, i]))
        assert np.array_equal(vocab.raw(vocab.rows(values[:, i])), values[:, i])


@pytest.mark.parametrize("span", [10, 2**40])
def test_distinct_matches_numpy_unique_for_narrow_and_wide_id_ranges(span: int):
    from freescale.pipeline.steps.vocabularies import distinct

    rng = np.random.default_rng(span % 97)
    for n in (0, 1, 5, 3000):
        values = rng.integers(-span, span, n)
        assert np.array_equal(distinct(values), np.unique(values).astype(np.int64))
