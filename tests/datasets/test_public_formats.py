"""Public dataset formats read as sources: MovieLens variants, RecBole atomic files, Amazon reviews."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from source_cases import one_source, read_all, reject_list

from freescale.datasets.ids import stable_id_one

# --- formats -----------------------------------------------------------------------------------

ML_ROWS = [(1, 1193, 5, 978300760), (1, 661, 3, 978302109), (2, 3408, 4, 978300275)]


def _ml_expected(events: pa.Table) -> list[tuple]:
    return list(zip(*(events[c].to_pylist() for c in ("user_id", "item_id", "action", "ts"))))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("ratings.dat", "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in ML_ROWS)),
        ("u.data", "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ML_ROWS)),
        (
            "ratings.csv",
            "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{r}.0,{t}\n" for u, i, r, t in ML_ROWS),
        ),
    ],
)
def test_movielens_variants(tmp_path: Path, name: str, text: str):
    (tmp_path / name).write_text(text)
    events, rejects, _ = read_all(one_source(tmp_path, "movielens", name, columns=""))
    assert rejects.num_rows == 0
    assert _ml_expected(events) == ML_ROWS
    assert events["row"].to_pylist() == [0, 1, 2]


def test_movielens_half_stars_need_rating_scale(tmp_path: Path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,3.5,978300760\n")
    _, rejects, _ = read_all(one_source(tmp_path, "movielens", "ratings.csv", columns=""))
    assert reject_list(rejects) == [(0, "bad_type", "action")]
    events, _, _ = read_all(one_source(tmp_path, "movielens", "ratings.csv", "rating_scale = 2", columns=""))
    assert events["action"].to_pylist() == [7]


def test_recbole_inter(tmp_path: Path):
    text = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    text += "196\t242\t3.0\t881250949.0\nA1B\t0000013714\t5\t881250950\n"
    (tmp_path / "ml.inter").write_text(text)
    events, rejects, _ = read_all(one_source(tmp_path, "recbole", "ml.inter", columns=""))
    assert rejects.num_rows == 0
    assert events["user_id"].to_pylist() == [196, stable_id_one("A1B")]
    assert events["item_id"].to_pylist() == [242, 13714]  # auto: all-digit strings are integers
    assert events["action"].to_pylist() == [3, 5]
    assert events["ts"].to_pylist() == [881250949, 881250950]


def test_recbole_without_rating_uses_default_action(tmp_path: Path):
    (tmp_path / "x.inter").write_text("user_id:token\titem_id:token\ttimestamp:float\n1\t2\t881250949\n")
    events, _, _ = read_all(one_source(tmp_path, "recbole", "x.inter", "default_action = 9", columns=""))
    assert events["action"].to_pylist() == [9]


def test_amazon_reviews(tmp_path: Path):
    rows = [
        {
            "reviewerID": "A2SUAM1J3GNN3B",
            "asin": "0000013714",
            "overall": 5.0,
            "unixReviewTime": 1382659200,
            "reviewText": "great",
            "style": {"Format:": " Hardcover"},
        },
        {
            "reviewerID": "A14VAT5EAX3D9S",
            "asin": "0000013714",
            "overall": 4.0,
            "unixReviewTime": 1367193600,
            "vote": "3",
        },
    ]
    (tmp_path / "Books.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events, rejects, _ = read_all(one_source(tmp_path, "amazon", "Books.json", columns=""))
    assert rejects.num_rows == 0
    assert events["user_id"].to_pylist() == [stable_id_one("A2SUAM1J3GNN3B"), stable_id_one("A14VAT5EAX3D9S")]
    assert events["item_id"].to_pylist() == [stable_id_one("0000013714")] * 2  # amazon ids are strings
    assert events["action"].to_pylist() == [5, 4]
    assert events["ts"].to_pylist() == [1382659200, 1367193600]
