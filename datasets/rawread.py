"""Reading raw columns from one read task, in bounded pieces, with row numbers and raw text for rejects.

This layer only splits files into rows and picks the configured columns; turning values into canonical
integers is ``convert``'s job. Text is parsed by pyarrow on whole blocks (all columns as strings, so a
stray value never changes a column's type); Python touches single lines only where pyarrow cannot say
which line failed: rows with the wrong field count (pyarrow's invalid-row handler) and JSON pieces that
contain invalid JSON or conflicting types (parsed again line by line so only the bad lines are lost).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from freescale import storage

from .formats import UNIT_SEPARATOR, Layout
from .jsonl import json_pieces
from .tasks import ReadTask, count_newlines, open_input, unreadable
from .textlines import RAW_LIMIT, Lines, RawPiece, split_lines, valid_utf8
from .usersample import UserSample, sample_piece

__all__ = ["RawPiece", "iter_raw"]


def _json_render(table: pa.Table) -> Callable[[np.ndarray], list[str]]:
    def render(positions: np.ndarray) -> list[str]:
        rows = table.take(pa.array(positions, pa.int64())).to_pylist()
        return [json.dumps(r, default=str, ensure_ascii=False)[:RAW_LIMIT] for r in rows]

    return render


def _table_piece(table: pa.Table, mapping: tuple, first_row: int) -> RawPiece:
    columns = {key: table.column(raw) for key, raw in mapping}
    rows = np.arange(first_row, first_row + table.num_rows, dtype=np.int64)
    return RawPiece(columns=columns, rows=rows, raw_text=_json_render(table))


def _unique_raw(mapping: tuple) -> list[str]:
    return list(dict.fromkeys(raw for _, raw in mapping))


def _named_read_errors(kind: str) -> Callable:
    """Decorate a binary reader so that a damaged file past its header (a corrupt page or batch, a
    truncated body) fails as a ``SourceError`` naming the source and file, on one line, instead of
    pyarrow's bare multi-line message."""

    def wrap(read: Callable[..., Iterator[RawPiece]]) -> Callable[..., Iterator[RawPiece]]:
        def reader(task: ReadTask, label: str, chunk_rows: int) -> Iterator[RawPiece]:
            try:
                yield from read(task, label, chunk_rows)
            except (OSError, pa.ArrowException) as exc:
                raise unreadable(label, task.path, kind, exc) from exc

        return reader

    return wrap


PRE_BUFFER_MIN_CHUNK_ROWS = 262_144


@_named_read_errors("Parquet")
def _iter_parquet(task: ReadTask, label: str, chunk_rows: int) -> Iterator[RawPiece]:
    columns = _unique_raw(task.mapping)
    # String columns come back dictionary-encoded, as Parquet stores them: decoding millions of
    # repeated action names costs more than the rest of the read (converters handle dictionaries).
    # Pre-buffering reads a row group's column chunks at once (fewer, larger reads), which held ~20 MB
    # more at a time (a 2.7M-row file at 262,144-row batches: 42 vs 21 MB at the pool's peak): done
    # only at the full default chunk size, i.e. where the memory limit leaves a task room for it.
    pre_buffer = chunk_rows >= PRE_BUFFER_MIN_CHUNK_ROWS
    handle = pq.ParquetFile(open_input(task.path, label), read_dictionary=columns, pre_buffer=pre_buffer)
    row = task.first_row or 0
    groups = list(range(task.start, task.stop))
    pending: list[pa.RecordBatch] = []
    for batch in handle.iter_batches(batch_size=chunk_rows, row_groups=groups, columns=columns):
        pending.append(batch)  # dictionary reads stop at row-group ends: regroup to ~chunk_rows
        if sum(b.num_rows for b in pending) >= chunk_rows:
            table = pa.Table.from_batches(pending)
            yield _table_piece(table, task.mapping, row)
            row, pending = row + table.num_rows, []
    if pending:
        yield _table_piece(pa.Table.from_batches(pending), task.mapping, row)


@_named_read_errors("Arrow IPC")
def _iter_arrow(task: ReadTask, label: str, chunk_rows: int) -> Iterator[RawPiece]:
    if storage.is_remote(task.path):
        source = open_input(task.path, label)
    else:
        source = pa.memory_map(storage.filesystem(task.path)[1])
    if task.kind == "arrow_stream":
        batches: Iterator[pa.RecordBatch] = iter(ipc.open_stream(source))
    else:
        reader = ipc.open_file(source)
        batches = (reader.get_batch(i) for i in range(task.start, task.stop))
    names = _unique_raw(task.mapping)
    row = task.first_row or 0
    for batch in batches:
        table = pa.Table.from_batches([batch]).select(names)
        for offset in range(0, table.num_rows, chunk_rows):
            part = table.slice(offset, chunk_rows)
            yield _table_piece(part, task.mapping, row)
            row += part.num_rows


def _text_blocks(task: ReadTask, label: str, chunk_bytes: int) -> Iterator[tuple[Lines, int]]:
    """Blocks of whole lines covering ``[start, stop)``, split into lines, and the row number of each
    block's first line (the next block's follows from the newlines ``split_lines`` found)."""
    handle = open_input(task.path, label)
    row = task.first_row
    if row is None:
        row = count_newlines(handle, 0, task.start) - task.header_lines
    pos, want = task.start, chunk_bytes
    while pos < task.stop:
        block = handle.read_at(min(want, task.stop - pos), pos)
        if not block:
            break
        cut = len(block) if pos + len(block) >= task.stop else block.rfind(b"\n") + 1
        if cut == 0:  # one line longer than the block: read more
            want *= 2
            continue
        block, want = block[:cut], chunk_bytes
        lines = split_lines(block)
        yield lines, row
        row += len(lines.starts) - (not block.endswith(b"\n"))  # one row per newline
        pos += cut


def _csv_options(layout: Layout, task: ReadTask, size: int, handler: Callable) -> dict:
    delimiter = UNIT_SEPARATOR if len(layout.delimiter) > 1 else layout.delimiter
    names = _unique_raw(task.mapping)
    return {
        "read_options": pcsv.ReadOptions(
            column_names=list(task.names), use_threads=False, block_size=max(size + 1, 1 << 16)
        ),
        "parse_options": pcsv.ParseOptions(
            delimiter=delimiter,
            quote_char='"' if layout.quoting else False,
            newlines_in_values=False,
            ignore_empty_lines=True,
            invalid_row_handler=handler,
        ),
        "convert_options": pcsv.ConvertOptions(
            include_columns=names,
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=False,
        ),
    }


def _csv_fast(lines: Lines, layout: Layout, task: ReadTask) -> tuple[pa.Table, np.ndarray] | None:
    """pyarrow parse of the non-blank lines; ``None`` when its row count cannot be mapped to lines."""
    buf = lines.joined(lines.keep)
    if not valid_utf8(buf):  # pyarrow's invalid-row handler cannot take such a line: the line-by-line parse
        return None
    if len(layout.delimiter) > 1:
        buf = buf.replace(layout.delimiter.encode(), UNIT_SEPARATOR.encode())
    invalid: list[int] = []

    def handler(row: pcsv.InvalidRow) -> str:
        invalid.append(-1 if row.number is None else row.number - 1)
        return "skip"

    try:
        table = pcsv.read_csv(io.BytesIO(buf), **_csv_options(layout, task, len(buf), handler))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    bad = np.array(invalid, dtype=np.int64)
    if table.num_rows + len(bad) != len(lines.keep) or (bad < 0).any():
        return None
    return table, bad


def _split_fields(text: str, layout: Layout) -> list[str]:
    if len(layout.delimiter) > 1 or not layout.quoting:
        return text.split(layout.delimiter)
    return next(csv.reader([text], delimiter=layout.delimiter), [])


def _csv_slow(lines: Lines, layout: Layout, task: ReadTask) -> tuple[pa.Table, np.ndarray]:
    """Line-by-line parse, used only when pyarrow rejects the block as a whole (e.g. bad UTF-8)."""
    names = _unique_raw(task.mapping)
    index = [task.names.index(n) for n in names]
    values: list[list[str]] = [[] for _ in names]
    bad = []
    for position, line in enumerate(lines.keep):
        try:
            text = lines.block[lines.starts[line] : lines.ends[line]].decode("utf-8").rstrip("\r")
            fields = _split_fields(text, layout)
        except (UnicodeDecodeError, csv.Error):
            fields = []
        if len(fields) != len(task.names):
            bad.append(position)
            continue
        for column, i in zip(values, index):
            column.append(fields[i])
    table = pa.table({n: pa.array(v, pa.string()) for n, v in zip(names, values)})
    return table, np.array(bad, dtype=np.int64)


def _csv_piece(lines: Lines, row: int, layout: Layout, task: ReadTask) -> RawPiece:
    parsed = _csv_fast(lines, layout, task) or _csv_slow(lines, layout, task)
    table, bad = parsed
    good_lines = np.delete(lines.keep, bad)
    bad_lines = lines.keep[bad]
    columns = {key: table.column(raw) for key, raw in task.mapping}
    return RawPiece(
        columns=columns,
        rows=row + good_lines,
        raw_text=lambda pos: [lines.text(i) for i in good_lines[pos]],
        bad_rows=row + bad_lines,
        bad_raw=[lines.text(i) for i in bad_lines],
    )


def _iter_text(
    task: ReadTask, layout: Layout, label: str, chunk_bytes: int, sample: UserSample | None
) -> Iterator[list[RawPiece]]:
    for lines, row in _text_blocks(task, label, chunk_bytes):
        if layout.kind == "json":
            yield list(json_pieces(lines, row, task.mapping, sample))
        elif len(lines.keep):
            yield [sample_piece(_csv_piece(lines, row, layout, task), sample)]
        else:
            yield []


def iter_raw(
    task: ReadTask, layout: Layout, label: str, chunk_rows: int, chunk_bytes: int, sample: UserSample | None = None
) -> Iterator[list[RawPiece]]:
    """Groups of raw pieces; each group becomes one bounded chunk of canonical events. ``sample``:
    rows of users outside it are left out (``RawPiece.sampled_users``) before other fields are read
    where the format allows (JSON Lines), else right after parsing."""
    if task.kind == "parquet":
        yield from ([sample_piece(p, sample)] for p in _iter_parquet(task, label, chunk_rows))
    elif task.kind in ("arrow", "arrow_stream"):
        yield from ([sample_piece(p, sample)] for p in _iter_arrow(task, label, chunk_rows))
    else:
        yield from _iter_text(task, layout, label, chunk_bytes, sample)
