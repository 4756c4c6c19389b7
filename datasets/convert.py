"""Vectorised conversion of raw columns (any Arrow type) into canonical integer columns plus reject codes.

Readers hand over whatever the file held: strings from CSV, typed columns from Parquet, inferred types
from JSON. Every field is converted with whole-column casts (polars ``strict=False`` casts turn
unparseable values into nulls instead of failing the chunk), and each row gets one reject reason: the
first failing check in field order user, item, timestamp, action. Keeping the rules in one place makes
a value mean the same thing whether it came from a Parquet int64, a CSV string or a JSON number.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from .ids import stable_id

__all__ = [
    "BAD_TIMESTAMP",
    "BAD_TYPE",
    "DUPLICATE_USER",
    "MALFORMED",
    "MISSING_ID",
    "NEGATIVE_ID",
    "REASONS",
    "UNKNOWN_ACTION",
    "convert_action",
    "convert_feature",
    "convert_id",
    "convert_ts",
    "first_failure",
]

REASONS = (
    "",
    "malformed_row",
    "missing_id",
    "bad_type",
    "negative_id",
    "bad_timestamp",
    "unknown_action",
    "duplicate_user",  # a users-table row of a user an earlier row lists
)
OK, MALFORMED, MISSING_ID, BAD_TYPE, NEGATIVE_ID, BAD_TIMESTAMP, UNKNOWN_ACTION, DUPLICATE_USER = range(8)
TS_MIN = 0  # 1970-01-01
TS_MAX = 4_102_444_800  # 2100-01-01, exclusive
INT32_MAX = 2**31 - 1
_INT64_LIMIT = 9.2e18  # floats beyond this do not round-trip to int64
UNIT_DIVISOR = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_INT_RE = r"^[+-]?[0-9]+$"
_FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_NUMBER_START = pa.array(list("+-.0123456789"))  # the characters either regex accepts first
ISO_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f%z",
    "%Y-%m-%d %H:%M:%S%.f%z",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M%z",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d",
)


@dataclass
class Parsed:
    """A column read as numbers: which values are blank, integral (after scaling) or numeric at all."""

    empty: np.ndarray  # null, empty or whitespace-only
    is_int: np.ndarray  # an exact int64 (integral floats included)
    is_number: np.ndarray  # any finite number, integral or not
    ints: np.ndarray  # int64, valid where is_int
    floats: np.ndarray  # float64 value (unscaled), NaN where not a number
    strings: pa.Array | None  # trimmed strings for string columns (for hashing), else None


def normalize(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array with dictionaries decoded and string variants cast to plain strings."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = pc.cast(arr, pa.string())
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        with contextlib.suppress(pa.ArrowInvalid):  # invalid UTF-8 stays binary: bad_type
            arr = pc.cast(arr, pa.string())
    if pa.types.is_decimal(arr.type):
        arr = pc.cast(arr, pa.float64())
    return arr


def _null_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.zeros(len(arr), dtype=bool)
    return np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False), dtype=bool)


def _float_to_int(values: np.ndarray, finite: np.ndarray, scale: int) -> tuple[np.ndarray, np.ndarray]:
    scaled = np.where(finite, values, 0.0) * scale
    integral = finite & (np.floor(scaled) == scaled) & (np.abs(scaled) < _INT64_LIMIT)
    return np.where(integral, scaled, 0).astype(np.int64), integral


def _mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _scatter(n: int, where: np.ndarray, values: pa.Array, dtype, fill) -> np.ndarray:
    out = np.full(n, fill, dtype=dtype)
    if where.any():
        out[where] = values.to_numpy(zero_copy_only=False)
    return out


def _string_ints(text: pa.Array, syntax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integers from strings matching ``[+-]?digits``: cast in bulk up to 19 characters (18 always fit
    in int64; 19 are cast together unless one overflows), longer ones one by one (rare)."""
    n = len(text)
    length = np.asarray(pc.utf8_length(text).fill_null(0).to_numpy(zero_copy_only=False))
    values, ok = np.zeros(n, np.int64), np.zeros(n, bool)
    rest = syntax & (length > 19)
    for bulk in (syntax & (length <= 18), syntax & (length == 19)):
        if not bulk.any():
            continue
        digits = text.filter(pa.array(bulk))
        if pc.any(pc.starts_with(digits, "+")).as_py():  # pyarrow's cast takes "-5" but not "+5"
            digits = pc.replace_substring_regex(digits, r"^\+", "")
        try:
            values[bulk] = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
            ok |= bulk
        except pa.ArrowInvalid:  # a 19-digit value beyond int64: check them one by one
            rest |= bulk
    for i in np.flatnonzero(rest):
        value = int(text[i].as_py())
        if -(2**63) <= value < 2**63:
            values[i], ok[i] = value, True
    return values, ok


def _number_syntax(text: pa.Array, empty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which strings are integers (``_INT_RE``) and which are numbers (``_FLOAT_RE``).

    The regexes dominate a CSV read, so they run only where they can matter: plain digit strings are
    both at once (``ascii_is_decimal``, no regex), and a string whose first character cannot start a
    number (ids such as ``u001190``) is neither.
    """
    digits = _mask(pc.ascii_is_decimal(text))
    int_syntax, float_syntax = digits.copy(), digits.copy()
    first = pc.utf8_slice_codeunits(text, 0, 1)
    maybe = ~digits & ~empty & _mask(pc.is_in(first, value_set=_NUMBER_START))
    if maybe.any():
        candidates = text.filter(pa.array(maybe))
        int_syntax[maybe] = _mask(pc.match_substring_regex(candidates, _INT_RE))
        float_syntax[maybe] = _mask(pc.match_substring_regex(candidates, _FLOAT_RE))
    return int_syntax, float_syntax


def _all_digits(arr: pa.Array) -> bool:
    """Every non-null value is ASCII digits only (CSV id and epoch columns, quoted JSON numbers)."""
    return bool(pc.all(pc.ascii_is_decimal(arr)).as_py())


def _parse_strings(arr: pa.Array, scale: int) -> Parsed:
    """Strings as numbers with syntax checks and exact casts on the matching subset only.

    pyarrow's string casts fail the whole array on one bad value, so values are first classified by
    syntax (integer, float) and only well-formed ones are cast; everything else is "not a number".
    A column of plain digit strings is one cast (a fifth of the checks' time).
    """
    if _all_digits(arr):
        with contextlib.suppress(pa.ArrowInvalid):  # beyond int64: the checks below, value by value
            return _parse_integers(pc.cast(arr, pa.int64()), scale, strings=arr)
    n = len(arr)
    text = pc.utf8_trim_whitespace(arr)
    empty = _null_mask(text) | _mask(pc.equal(pc.utf8_length(text), 0))
    int_syntax, float_syntax = _number_syntax(text, empty)
    raw_ints, int_ok = _string_ints(text, int_syntax)
    floats = _scatter(n, float_syntax, pc.cast(text.filter(pa.array(float_syntax)), pa.float64()), np.float64, np.nan)
    finite = np.isfinite(floats)
    ints, integral = _float_to_int(floats, finite, scale)
    exact = int_ok & (np.abs(raw_ints) <= (2**63 - 1) // scale)
    ints = np.where(exact, raw_ints * np.int64(scale), ints)
    floats = np.where(int_ok & ~finite, raw_ints.astype(np.float64), floats)
    return Parsed(empty, exact | integral, finite | int_ok, ints, floats, text)


def _parse_integers(arr: pa.Array, scale: int, strings: pa.Array | None = None) -> Parsed:
    """An integer column times ``scale``; values that would overflow int64 are not integers."""
    nulls = _null_mask(arr)
    raw = arr.fill_null(0).to_numpy(zero_copy_only=False)
    limit = (2**63 - 1) // scale
    fits = (raw <= limit) if pa.types.is_unsigned_integer(arr.type) else (np.abs(raw.astype(np.int64)) <= limit)
    ints = np.where(fits, raw, 0).astype(np.int64) * np.int64(scale)
    return Parsed(nulls, ~nulls & fits, ~nulls, ints, raw.astype(np.float64), strings)


def parse_numbers(arr: pa.Array, scale: int = 1) -> Parsed:
    """Read a column of any type as numbers times ``scale``; unsupported types are never numbers."""
    arr = normalize(arr)
    n = len(arr)
    nulls = _null_mask(arr)
    t = arr.type
    if pa.types.is_string(t):
        return _parse_strings(arr, scale)
    if pa.types.is_integer(t):
        return _parse_integers(arr, scale)
    if pa.types.is_floating(t):
        values = arr.fill_null(np.nan).to_numpy(zero_copy_only=False).astype(np.float64)
        finite = np.isfinite(values)
        ints, integral = _float_to_int(values, finite, scale)
        return Parsed(nulls, integral, finite, ints, values, None)
    empty = nulls | pa.types.is_null(t)
    none = np.zeros(n, dtype=bool)
    return Parsed(empty, none, none, np.zeros(n, dtype=np.int64), np.full(n, np.nan), None)


def _clean_signed_ints(arr: pa.Array) -> np.ndarray | None:
    """A signed-integer column without nulls as int64 (no copy for int64), else ``None``.

    Typed id and epoch columns (Parquet, Arrow, JSON numbers) are nearly always this: every value is
    an exact integer, so ``parse_numbers``' masks and float copy (a dozen passes over the column, a
    tenth of a Parquet scan) decide nothing. ``tests/datasets/test_fastpaths.py`` checks the results
    against the general path.
    """
    if arr.null_count or not pa.types.is_signed_integer(arr.type):
        return None
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def convert_id(arr: pa.Array, id_type: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """User/item ids as int64 plus codes (missing_id, bad_type, negative_id).

    ``auto``: integers (typed or digit strings) stay integers, non-numeric strings are hashed with
    ``stable_id`` and non-integral numbers are ``bad_type``. ``int``: only integers. ``string``:
    every non-empty value is hashed, digits included (Amazon ASINs such as ``"0000013714"``).

    A string column that repeats its values (users, popular items) is converted once per distinct
    value and spread over the rows.
    """
    arr = normalize(arr)
    ints = _clean_signed_ints(arr) if id_type != "string" else None
    if ints is not None:
        return ints, (ints < 0).astype(np.uint8) * np.uint8(NEGATIVE_ID)
    if pa.types.is_string(arr.type) and len(arr) > 1 and not _all_digits(arr):
        encoded = pc.dictionary_encode(arr)
        if 0 < 2 * len(encoded.dictionary) <= len(arr):
            values, codes = _convert_id_values(encoded.dictionary, id_type)
            return _spread(values, codes, encoded.indices)
    return _convert_id_values(arr, id_type)


def _spread(values: np.ndarray, codes: np.ndarray, indices: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per-distinct-value results to rows; null rows are ``missing_id``."""
    nulls = _null_mask(indices)
    position = indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.intp)
    values, codes = values[position], codes[position]
    values[nulls], codes[nulls] = 0, MISSING_ID
    return values, codes


def _convert_id_values(arr: pa.Array, id_type: str) -> tuple[np.ndarray, np.ndarray]:
    parsed = parse_numbers(arr)
    values = parsed.ints.copy()
    codes = np.zeros(len(arr), dtype=np.uint8)
    present = ~parsed.empty
    if id_type == "string":
        hashed = present
        strings = parsed.strings if parsed.strings is not None else _as_strings(arr)
    else:
        hashed = np.zeros(len(arr), dtype=bool)
        if id_type == "auto" and parsed.strings is not None:
            hashed = present & ~parsed.is_number
        strings = parsed.strings
        codes[present & ~parsed.is_int & ~hashed] = BAD_TYPE
    if hashed.any() and strings is not None:
        values[hashed] = stable_id(strings.filter(pa.array(hashed)))
    elif hashed.any():
        codes[hashed] = BAD_TYPE
    codes[(codes == OK) & present & (values < 0)] = NEGATIVE_ID
    codes[parsed.empty] = MISSING_ID
    return values, codes


def _as_strings(arr: pa.Array) -> pa.Array | None:
    try:
        return pc.utf8_trim_whitespace(pc.cast(arr, pa.string()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _iso_seconds(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """ISO 8601 strings to epoch seconds (UTC when no offset); a trailing ``Z`` means UTC."""
    series = pl.from_arrow(pc.utf8_trim_whitespace(arr)).str.replace(r"[zZ]$", "+00:00")
    frame = pl.DataFrame({"s": series})
    exprs = [pl.col("s").str.to_datetime(format=f, strict=False, time_zone="UTC", time_unit="us") for f in ISO_FORMATS]
    secs = frame.select(pl.coalesce(exprs).dt.epoch("s")).to_series()
    ok = secs.is_not_null().to_numpy()
    return secs.fill_null(0).to_numpy().astype(np.int64), ok


def _temporal_seconds(arr: pa.Array) -> np.ndarray:
    t = arr.type
    raw = pc.cast(arr, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_date32(t):
        return raw * 86_400
    if pa.types.is_date64(t):
        return raw // 1_000
    return raw // UNIT_DIVISOR[t.unit]


def _temporal_strings(arr: pa.Array) -> pa.Array:
    """ISO text of a temporal column, so an inferred type cannot change what a value means."""
    if pa.types.is_timestamp(arr.type):
        return pc.strftime(arr, format="%Y-%m-%dT%H:%M:%S")
    return pc.cast(arr, pa.string())


def _numeric_seconds(arr: pa.Array, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """Epoch numbers (ints, floats or numeric strings, ``normalize``d) in ``unit`` floored to seconds."""
    divisor = UNIT_DIVISOR[unit]
    ints = _clean_signed_ints(arr)
    if ints is not None:
        return (np.floor_divide(ints, divisor) if divisor > 1 else ints), np.ones(len(ints), dtype=bool)
    parsed = parse_numbers(arr)
    secs = np.floor_divide(parsed.ints, divisor)
    fractional = parsed.is_number & ~parsed.is_int
    if fractional.any():
        with np.errstate(invalid="ignore", over="ignore"):
            approx = np.floor(parsed.floats / divisor)
        in_range = np.isfinite(approx) & (np.abs(approx) < _INT64_LIMIT)
        secs = np.where(fractional & in_range, approx, secs).astype(np.int64)
        return secs, parsed.is_int | (fractional & in_range)
    return secs, parsed.is_int


def convert_ts(arr: pa.Array, unit: str, typed_ok: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps to int64 epoch seconds plus ``bad_timestamp`` codes (null, unparseable, outside 1970-2100).

    Typed temporal columns carry their own unit (Parquet/Arrow, ``typed_ok``); JSON readers may infer
    timestamps from strings, so there they are turned back into strings and follow ``unit``.
    """
    arr = normalize(arr)
    nulls = _null_mask(arr)
    if (pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type)) and not typed_ok:
        arr = _temporal_strings(arr)
    t = arr.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        secs, ok = _temporal_seconds(arr), ~nulls
    elif unit == "iso8601":
        if pa.types.is_string(t):
            secs, ok = _iso_seconds(arr)
        else:
            secs, ok = np.zeros(len(arr), dtype=np.int64), np.zeros(len(arr), dtype=bool)
    else:
        secs, ok = _numeric_seconds(arr, unit)
    ok &= ~nulls & (secs >= TS_MIN) & (secs < TS_MAX)
    codes = np.where(ok, OK, BAD_TIMESTAMP).astype(np.uint8)
    return np.where(ok, secs, 0).astype(np.int64), codes


def _action_keys(arr: pa.Array) -> pa.Array:
    """Raw action values as the strings ``action_map`` is keyed by (``5.0`` reads as ``"5"``)."""
    if pa.types.is_string(arr.type):
        return pc.utf8_trim_whitespace(arr)
    try:
        return pc.cast(arr, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(len(arr), pa.string())


def _action_index(arr: pa.Array | pa.ChunkedArray, keys: pa.Array) -> pa.Array:
    """Position of each raw action in ``keys`` (null: not found); a dictionary column is looked up
    once per distinct value, then spread over the rows by its indices."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    if pa.types.is_dictionary(arr.type):
        return pc.take(pc.index_in(_action_keys(normalize(arr.dictionary)), value_set=keys), arr.indices)
    return pc.index_in(_action_keys(normalize(arr)), value_set=keys)


def convert_action(
    arr: pa.Array | None,
    n: int,
    mode: str,
    action_map: dict[str, int],
    default: int,
    scale: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Action ids (int32 range, >= 0) plus codes.

    ``map``: raw values looked up in ``action_map`` (a miss or a null is ``unknown_action``).
    ``number``: integer or rating values times ``scale`` (non-integral is ``bad_type``; null, negative
    or beyond int32 is ``unknown_action``). ``default``: no column, every row gets ``default``.
    """
    if arr is None or mode == "default":
        return np.full(n, default, dtype=np.int64), np.zeros(n, dtype=np.uint8)
    codes = np.zeros(n, dtype=np.uint8)
    if mode == "map":
        index = _action_index(arr, pa.array(list(action_map), pa.string()))
        found = ~_null_mask(index)
        lookup = np.array(list(action_map.values()) or [0], dtype=np.int64)
        values = lookup[index.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)]
        codes[~found] = UNKNOWN_ACTION
        return np.where(found, values, 0), codes
    parsed = parse_numbers(normalize(arr), scale)
    codes[~parsed.empty & ~parsed.is_int] = BAD_TYPE
    out_of_range = parsed.is_int & ((parsed.ints < 0) | (parsed.ints > INT32_MAX))
    codes[out_of_range | parsed.empty] = UNKNOWN_ACTION
    return np.where(codes == OK, parsed.ints, 0), codes


def convert_feature(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """An integer user feature; null, empty or non-integer values are ``bad_type``."""
    parsed = parse_numbers(arr)
    codes = np.where(parsed.is_int, OK, BAD_TYPE).astype(np.uint8)
    return np.where(parsed.is_int, parsed.ints, 0), codes


def first_failure(codes: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first non-OK code over fields in order, and that field's position (1-based)."""
    reason = np.zeros(n, dtype=np.uint8)
    field = np.zeros(n, dtype=np.uint8)
    for position, code in enumerate(codes, start=1):
        take = (reason == OK) & (code != OK)
        reason[take] = code[take]
        field[take] = position
    return reason, field
