"""JSON Lines parsing: pyarrow on whole pieces, Python only for the lines pyarrow cannot take.

pyarrow's JSON reader fails a whole block on one invalid line or one value whose type differs from
the rest of its column, and it reads a truncated line as continuing on the next one. So:

1. lines that cannot be an object (first non-blank byte not ``{`` or last not ``}``) or are not valid
   UTF-8 (pyarrow reads invalid bytes into string columns unchecked) are malformed at once; after this
   no line can run into the next, so "rows == lines" proves rows align with lines;
2. the rest is parsed by pyarrow; its error names the row that failed, and that line alone moves to
   the per-line parser (``json.loads``), then pyarrow retries without it;
3. a piece that keeps failing is halved, and small ones are parsed line by line.

A clean piece costs one pyarrow call; a piece with k bad lines costs about k calls, not a Python
loop over every line. Clean stretches are first tried in pieces of ``JSON_CLEAN_LINES`` lines
(``json_pieces``); steps 1-3 run on ``JSON_PIECE_LINES`` pieces once a stretch fails.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pjson

from .convert import BAD_TYPE
from .textlines import Lines, RawPiece, valid_utf8
from .usersample import UserSample, sample_piece

__all__ = ["JSON_CLEAN_LINES", "JSON_PIECE_LINES", "json_pieces"]

JSON_PIECE_LINES = 8192
JSON_CLEAN_LINES = 65536
MIN_FAST_LINES = 256
RETRIES = 8
_ROW = re.compile(r"in row (\d+)")
_SPACE = (9, 11, 12, 13, 32)


def _object_shaped(lines: Lines, chosen: np.ndarray) -> np.ndarray:
    """Lines whose first and last non-blank bytes are ``{`` and ``}``; others cannot be objects."""
    data = np.frombuffer(lines.block, dtype=np.uint8)
    starts, ends = lines.starts[chosen], lines.ends[chosen]
    last_at = np.maximum(ends - 1, starts)
    last_at = np.where((data[last_at] == 13) & (last_at > starts), last_at - 1, last_at)  # CRLF files
    first, last = data[starts], data[last_at]
    ok = (first == 123) & (last == 125)
    unsure = np.isin(first, _SPACE) | np.isin(last, _SPACE)
    for i in np.flatnonzero(unsure):
        text = lines.block[starts[i] : ends[i]].strip()
        ok[i] = text[:1] == b"{" and text[-1:] == b"}"
    return ok


def _parse(buf: bytes, schema: pa.Schema | None = None) -> pa.Table | int | None:
    """A table, or the failing row number pyarrow reported, or ``None`` if it named none.
    ``schema``: read only these fields, with these types (the others are still parsed as JSON)."""
    try:
        options = pjson.ReadOptions(use_threads=False, block_size=max(len(buf) + 1, 1 << 16))
        parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore") if schema else None
        return pjson.read_json(io.BytesIO(buf), read_options=options, parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        match = _ROW.search(str(exc))
        return int(match.group(1)) if match else None


def _fast(lines: Lines, chosen: np.ndarray) -> tuple[list[tuple[np.ndarray, pa.Table]], list[int]]:
    """pyarrow tables for most of ``chosen`` and the lines left for the per-line parser."""
    slow: list[int] = []
    for _ in range(RETRIES):
        if not len(chosen):
            return [], slow
        result = _parse(lines.joined(chosen))
        if isinstance(result, pa.Table) and result.num_rows == len(chosen):
            return [(chosen, result)], slow
        if not isinstance(result, int) or result >= len(chosen):
            break
        slow.append(int(chosen[result]))
        chosen = np.delete(chosen, result)
    if len(chosen) <= MIN_FAST_LINES:
        return [], slow + chosen.tolist()
    half = len(chosen) // 2
    left, left_slow = _fast(lines, chosen[:half])
    right, right_slow = _fast(lines, chosen[half:])
    return left + right, slow + left_slow + right_slow


def _json_value(value: object) -> tuple[str | None, bool]:
    """A JSON value as the string the converters read, and whether its type is wrong for a field."""
    if value is None:
        return None, False
    if isinstance(value, str):
        return value, False
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, True
    if isinstance(value, float) and not np.isfinite(value):
        return None, True
    return (str(value) if isinstance(value, int) else repr(value)), False


def _load(raw: bytes) -> dict | None:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError:  # includes UnicodeDecodeError
        return None
    return obj if isinstance(obj, dict) else None


def _slow(lines: Lines, chosen: np.ndarray, mapping: tuple, row: int) -> RawPiece:
    """Per-line parse: invalid JSON or non-objects are malformed; booleans/arrays/objects bad_type."""
    values: dict[str, list] = {key: [] for key, _ in mapping}
    wrong: dict[str, list] = {key: [] for key, _ in mapping}
    good, bad = [], []
    for line in chosen:
        obj = _load(lines.block[lines.starts[line] : lines.ends[line]])
        if obj is None:
            bad.append(line)
            continue
        good.append(line)
        for key, raw in mapping:
            text, is_wrong = _json_value(obj.get(raw))
            values[key].append(text)
            wrong[key].append(BAD_TYPE if is_wrong else 0)
    good_lines = np.array(good, dtype=np.int64)
    return RawPiece(
        columns={key: pa.array(v, pa.string()) for key, v in values.items()},
        rows=row + good_lines,
        raw_text=lambda pos: [lines.text(i) for i in good_lines[pos]],
        bad_rows=row + np.array(bad, dtype=np.int64),
        bad_raw=[lines.text(i) for i in bad],
        forced={key: np.array(v, dtype=np.uint8) for key, v in wrong.items() if any(v)},
    )


def _table_piece(lines: Lines, chosen: np.ndarray, table: pa.Table, mapping: tuple, row: int) -> RawPiece:
    names = set(table.column_names)
    n = table.num_rows
    return RawPiece(
        columns={key: table.column(raw) if raw in names else pa.nulls(n) for key, raw in mapping},
        rows=row + chosen,
        raw_text=lambda pos: [lines.text(i) for i in chosen[pos]],
    )


def _lost_text(table: pa.Table, mapping: tuple) -> bool:
    """True when pyarrow turned an id/action string into a timestamp: its text must be read as is.

    (Timestamps themselves survive the round trip: ``convert_ts`` reads typed values as ISO text.)
    """
    for key, raw in mapping:
        if key != "timestamp" and raw in table.column_names:
            kind = table.schema.field(raw).type
            if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
                return True
    return False


def _exact_types(table: pa.Table, mapping: tuple) -> bool:
    """True when no mapped column depends on which lines shared a parse: a float column holding
    integers beyond 2**53 would have kept them exact as int64 in a piece without fractions."""
    for _, raw in mapping:
        if raw in table.column_names and pa.types.is_floating(table.schema.field(raw).type):
            extremes = pc.max(pc.abs(table.column(raw))).as_py()
            if extremes is not None and not abs(extremes) <= 2**53:
                return False
    return True


def _clean_piece(lines: Lines, chosen: np.ndarray, mapping: tuple, row: int) -> RawPiece | None:
    """A long stretch of lines in one pyarrow call, or ``None`` when any line needs the careful path."""
    if not _object_shaped(lines, chosen).all():
        return None
    buf = lines.joined(chosen)
    if not valid_utf8(buf):  # pyarrow would read invalid bytes into string columns: the careful path
        return None
    table = _parse(buf)
    if not isinstance(table, pa.Table) or table.num_rows != len(chosen):
        return None
    if _lost_text(table, mapping) or not _exact_types(table, mapping):
        return None
    return _table_piece(lines, chosen, table, mapping, row)


def _careful_pieces(lines: Lines, chosen: np.ndarray, mapping: tuple, row: int) -> Iterator[RawPiece]:
    """Pieces of ``chosen`` (at most ``JSON_PIECE_LINES``) with every bad line isolated."""
    shaped = _object_shaped(lines, chosen) & lines.utf8(chosen)  # invalid UTF-8: json.loads rejects it
    tables, slow = _fast(lines, chosen[shaped])
    for part, table in tables:
        if _lost_text(table, mapping):
            slow.extend(part.tolist())
        else:
            yield _table_piece(lines, part, table, mapping, row)
    slow_lines = np.sort(np.concatenate([chosen[~shaped], np.array(slow, dtype=np.int64)]))
    if len(slow_lines):
        yield _slow(lines, slow_lines, mapping, row)


def _user_kind(lines: Lines, line: int, name: str) -> pa.DataType:
    """The type to read the user field as: int64 when the first line holds an integer there, else
    string (pyarrow fails a string field on a number; either failure sends a stretch to the full parse)."""
    value = (_load(lines.block[lines.starts[line] : lines.ends[line]]) or {}).get(name)
    return pa.int64() if isinstance(value, int) and not isinstance(value, bool) else pa.string()


def _user_first(
    lines: Lines, chosen: np.ndarray, mapping: tuple, row: int, sample: UserSample
) -> list[RawPiece] | None:
    """A clean stretch with a user sample: the user field alone is parsed for every line, the other
    fields only for the kept lines (a user inside the sample, or a user id that will be rejected).

    ``None`` (the stretch then takes the full parse) unless every line is an object whose user field
    pyarrow reads alone: so each line is valid JSON, as the full parse would find (bytes are checked
    as UTF-8 first: pyarrow does not check fields it skips, ``json.loads`` does), and its user value
    is the one the full parse would convert. Rows, rejects and ``sampled_users`` are then those of a
    full parse followed by ``UserSample.apply``."""
    name = dict(mapping)["user"]
    if not _object_shaped(lines, chosen).all():
        return None
    buf = lines.joined(chosen)
    if not valid_utf8(buf):
        return None
    table = _parse(buf, pa.schema([(name, _user_kind(lines, int(chosen[0]), name))]))
    if not isinstance(table, pa.Table) or table.num_rows != len(chosen):
        return None
    out, ids = sample.outside(table.column(name))
    kept = chosen[~out]
    pieces = list(_all_pieces(lines, kept, mapping, row))
    if not pieces:
        empty = pa.array([], pa.string())
        pieces = [RawPiece({key: empty for key, _ in mapping}, np.zeros(0, np.int64), lambda pos: [])]
    pieces[0].sampled_users = ids[out].astype(np.int64, copy=False)
    return pieces


def _all_pieces(lines: Lines, chosen: np.ndarray, mapping: tuple, row: int) -> Iterator[RawPiece]:
    """Every field of ``chosen``: one pyarrow call when it is clean, else the careful path."""
    piece = _clean_piece(lines, chosen, mapping, row) if len(chosen) else None
    if piece is not None:
        yield piece
        return
    for start in range(0, len(chosen), JSON_PIECE_LINES):
        yield from _careful_pieces(lines, chosen[start : start + JSON_PIECE_LINES], mapping, row)


def json_pieces(lines: Lines, row: int, mapping: tuple, sample: UserSample | None = None) -> Iterator[RawPiece]:
    """Raw pieces for the non-blank lines of a block (row of line i is ``row + i``).

    Clean data goes in stretches of ``JSON_CLEAN_LINES`` (one pyarrow call each: per-piece overhead
    was a third of a JSON read). The first stretch that fails sends the rest of the block through
    the careful path, so dirty data pays for at most one wasted parse per block. With a user
    ``sample``, clean stretches parse the user field first (``_user_first``); other pieces are
    sampled after the full parse (``UserSample.apply``).
    """
    keep, start, careful = lines.keep, 0, False
    while start < len(keep):
        if not careful:
            chosen = keep[start : start + JSON_CLEAN_LINES]
            pieces = _user_first(lines, chosen, mapping, row, sample) if sample is not None else None
            if pieces is None:
                piece = _clean_piece(lines, chosen, mapping, row)
                pieces = None if piece is None else [sample_piece(piece, sample)]
            if pieces is not None:
                yield from pieces
                start += len(chosen)
                continue
            careful = True
        chosen = keep[start : start + JSON_PIECE_LINES]
        yield from (sample_piece(piece, sample) for piece in _careful_pieces(lines, chosen, mapping, row))
        start += len(chosen)
