"""Malformed rows for the synthetic text logs, one kind per reject reason, counted exactly.

Tests and benchmarks check that ``prepare`` quarantines every bad row and keeps every good one, so the
generator must know exactly how many rows of each kind it wrote. Each bad row breaks exactly one rule
(its other fields are copied from a valid event), so the reader's first-failure reason equals the
injected kind.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

__all__ = ["CSV_KINDS", "JSONL_KINDS", "bad_csv_lines", "bad_jsonl_lines", "interleave"]

JSONL_KINDS = ("malformed_row", "missing_id", "negative_id", "bad_timestamp", "bad_type", "unknown_action")
CSV_KINDS = ("malformed_row", "missing_id", "negative_id", "bad_timestamp", "bad_type")


def _jsonl(customer: str, product: str, kind: str, when: str) -> str:
    return f'{{"customer":{customer},"product_id":{product},"kind":{kind},"event_time":{when}}}'


def _jsonl_variant(kind: str, variant: int, user: str, item: int, action: str, ts: int) -> str:
    """One bad JSON line: ``user``/``item``/``action``/``ts`` come from a valid event."""
    cust, prod, act, when = f'"{user}"', str(item), f'"{action}"', str(ts)
    if kind == "malformed_row":
        options = [_jsonl(cust, prod, act, when)[:-12], "not json", "[1, 2, 3]", '{"customer":,}']
        return options[variant % 4]
    if kind == "missing_id":
        options = [
            _jsonl("null", prod, act, when),
            _jsonl('""', prod, act, when),
            f'{{"product_id":{prod},"kind":{act},"event_time":{when}}}',
            _jsonl(cust, "null", act, when),
        ]
        return options[variant % 4]
    if kind == "negative_id":
        return _jsonl(cust, str(-(item + 1)), act, when)
    if kind == "bad_timestamp":
        return _jsonl(cust, prod, act, ['"yesterday"', "null", "5000000000", "-1"][variant % 4])
    if kind == "bad_type":
        return _jsonl(cust, [f"{item}.5", "true", f"[{item}]", f'"{item}.25"'][variant % 4], act, when)
    if kind == "unknown_action":
        return _jsonl(cust, prod, ['"refund"', "null", "17"][variant % 3], when)
    raise ValueError(f"unknown malformed kind {kind!r}")


def _csv_variant(kind: str, variant: int, user: str, item: int, rating: int, ts: int) -> str:
    if kind == "malformed_row":
        return [f"{user},{item},{rating}", f"{user},{item},{rating},{ts},extra", "garbage"][variant % 3]
    if kind == "missing_id":
        return [f",{item},{rating},{ts}", f"{user},,{rating},{ts}", f"  ,{item},{rating},{ts}"][variant % 3]
    if kind == "negative_id":
        return f"{user},{-(item + 1)},{rating},{ts}"
    if kind == "bad_timestamp":
        when = ["soon", "", "9" * 11][variant % 3]  # unparseable, empty, year 5138
        return f"{user},{item},{rating},{when}"
    if kind == "bad_type":
        return [f"{user},{item}.5,{rating},{ts}", f"{user},{item}.25,{rating},{ts}"][variant % 2]
    raise ValueError(f"unknown malformed kind {kind!r}")


def _pick(rng: np.random.Generator, n_valid: int, fraction: float, kinds: tuple[str, ...]):
    n_bad = round(fraction * n_valid) if n_valid else 0
    kind_idx = rng.integers(0, len(kinds), n_bad)
    template = rng.integers(0, max(n_valid, 1), n_bad)
    counts = {k: int((kind_idx == i).sum()) for i, k in enumerate(kinds)}
    return kind_idx, template, counts


def bad_jsonl_lines(rng, n_valid: int, fraction: float, row: Callable[[int], tuple]) -> tuple[list, dict]:
    """``round(fraction * n_valid)`` bad purchase lines and their counts per kind.

    ``row(t)`` gives (customer, product_id, kind, event_time) of valid row ``t``, used as a template.
    """
    kind_idx, template, counts = _pick(rng, n_valid, fraction, JSONL_KINDS)
    pairs = enumerate(zip(kind_idx, template))
    lines = [_jsonl_variant(JSONL_KINDS[k], j, *row(int(t))) for j, (k, t) in pairs]
    return lines, counts


def bad_csv_lines(rng, n_valid: int, fraction: float, row: Callable[[int], tuple]) -> tuple[list, dict]:
    """Bad review lines (that log has no action column, so no ``unknown_action``) and their counts.

    ``row(t)`` gives (reviewer, item, rating, time) of valid row ``t``.
    """
    kind_idx, template, counts = _pick(rng, n_valid, fraction, CSV_KINDS)
    pairs = enumerate(zip(kind_idx, template))
    lines = [_csv_variant(CSV_KINDS[k], j, *row(int(t))) for j, (k, t) in pairs]
    return lines, counts


def interleave(rng: np.random.Generator, valid: pl.Series, bad: list[str]) -> pl.Series:
    """Valid lines in their order with bad lines inserted at random positions."""
    if not bad:
        return valid
    slots = rng.integers(0, len(valid) + 1, len(bad))
    keys = np.concatenate([np.arange(len(valid), dtype=np.float64), slots - 0.5])
    order = np.argsort(keys, kind="stable")
    merged = pl.concat([valid, pl.Series(bad, dtype=pl.String)])
    return merged.gather(order)
