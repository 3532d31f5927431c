"""Row conversion throughput: convert_rows against pyarrow.Table.from_pylist on the same rows.

Target (issue 2): at least 200,000 rows/s on one core for 8-column rows of plain
ints, strings, floats and timestamps, and within 2x of ``from_pylist``.

``run_json`` (``python -m bench.conversion json``) measures the JSON rows path of
the server: ``loads_exact`` against ``orjson.loads`` on the same 10,000-row bodies
(issue 9), alone and followed by ``convert_rows``.

``scale`` (``python -m bench conversion --scale S``) multiplies the rows of a batch and
of a body (10,000; at least 100).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa

from bench.pipelines import _rows
from ingest_sdk import OnErrorOption, TableSchema, convert_rows
from ingest_sdk.wire import loads_exact

_COLUMNS = {
    "ID": "INT NOT NULL",
    "ACCOUNT_ID": "NUMBER(18,0)",
    "NAME": "VARCHAR(64)",
    "CITY": "VARCHAR(32)",
    "PRICE": "FLOAT",
    "SCORE": "FLOAT",
    "CREATED_AT": "TIMESTAMP_NTZ",
    "UPDATED_AT": "TIMESTAMP_LTZ",
}
SCHEMA = TableSchema.parse(_COLUMNS)
JSON_SCHEMA = TableSchema.parse({**_COLUMNS, "TRACE": "VARCHAR(36)", "AMOUNT": "NUMBER(38,2)"})
CITIES = ["Lisbon", "Oslo", "Lagos", "Lima", "Hanoi", "Perth", "Quito", "Seoul"]


def make_rows(count: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    start = datetime(2026, 1, 1)
    return [
        {
            "ID": i,
            "ACCOUNT_ID": rng.randrange(1_000_000),
            "NAME": f"customer-{rng.randrange(10**9)}",
            "CITY": rng.choice(CITIES),
            "PRICE": rng.random() * 1000,
            "SCORE": rng.random(),
            "CREATED_AT": start + timedelta(seconds=i),
            "UPDATED_AT": (start + timedelta(seconds=i, microseconds=rng.randrange(10**6))).replace(
                tzinfo=UTC
            ),
        }
        for i in range(count)
    ]


def _rate(func: Any, rows: list[dict[str, Any]], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        func(rows)
        times.append(time.perf_counter() - started)
    best = min(times)
    return {
        "rows_per_s_best": round(len(rows) / best),
        "rows_per_s_median": round(len(rows) / statistics.median(times)),
    }


def run(scale: float | None = None, batches: int = 5, repeats: int = 5) -> dict[str, Any]:
    scale = 1.0 if scale is None else scale
    batch_rows = _rows(scale, 10_000)
    rows = make_rows(batch_rows * batches)
    chunks = [rows[i : i + batch_rows] for i in range(0, len(rows), batch_rows)]
    arrow_schema = SCHEMA.to_arrow()

    def ours(all_rows: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            batch, response = convert_rows(SCHEMA, chunk, OnErrorOption.CONTINUE)
            assert batch is not None and not response.has_errors()

    def from_pylist(all_rows: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            pa.Table.from_pylist(chunk, schema=arrow_schema)

    text_chunks = [
        [
            dict(
                row,
                CREATED_AT=row["CREATED_AT"].isoformat(),
                UPDATED_AT=row["UPDATED_AT"].isoformat(),
            )
            for row in chunk
        ]
        for chunk in chunks
    ]

    def ours_text_timestamps(all_rows: list[dict[str, Any]]) -> None:
        for chunk in text_chunks:
            convert_rows(SCHEMA, chunk, OnErrorOption.CONTINUE)

    ours_rate = _rate(ours, rows, repeats)
    text_rate = _rate(ours_text_timestamps, rows, max(1, repeats // 2))
    base_rate = _rate(from_pylist, rows, repeats)
    ratio = base_rate["rows_per_s_best"] / ours_rate["rows_per_s_best"]
    return {
        "benchmark": "row_conversion",
        "scale": scale,
        "rows": len(rows),
        "batch_rows": batch_rows,
        "columns": len(SCHEMA),
        "convert_rows": ours_rate,
        "baseline_pyarrow_from_pylist": base_rate,
        # Informational: timestamps as ISO text (as JSON clients send them) take the per-value path.
        "convert_rows_iso_text_timestamps": text_rate,
        "slowdown_vs_from_pylist": round(ratio, 2),
        "targets": {
            "rows_per_s_min": 200_000,
            "slowdown_max": 2.0,
            "met": ours_rate["rows_per_s_best"] >= 200_000 and ratio <= 2.0,
        },
    }


def json_bodies(rows: int = 10_000, seed: int = 11) -> dict[str, bytes]:
    """JSON row bodies as plain HTTP clients send them (ISO timestamps, a UUID per row).

    typical: prices in cents and short scores, no number of 16+ digits;
    full_doubles: the same with 17-digit doubles (exact, but long enough to be checked);
    long_numbers: typical plus a 30-digit NUMBER(38,2) amount in every row;
    one_long_number: typical with a single long number in the last row.
    """
    rng = random.Random(seed)
    base = [
        {
            **row,
            "CREATED_AT": row["CREATED_AT"].isoformat(),
            "UPDATED_AT": row["UPDATED_AT"].isoformat(),
            "TRACE": str(uuid.UUID(int=rng.getrandbits(128))),
        }
        for row in make_rows(rows, seed)
    ]
    typical = [
        {**row, "PRICE": round(row["PRICE"], 2), "SCORE": round(row["SCORE"], 4)} for row in base
    ]
    amounts = [f"{rng.randrange(10**29, 10**30)}.{rng.randrange(100):02d}" for _ in range(rows)]

    def dumps(body_rows: list[dict[str, Any]]) -> bytes:
        return orjson.dumps({"rows": body_rows, "end_offset_token": "42"})

    with_long = [
        {**row, "AMOUNT": orjson.Fragment(amount)}
        for row, amount in zip(typical, amounts, strict=True)
    ]
    one_long = [*typical[:-1], with_long[-1]]
    return {
        "typical": dumps(typical),
        "full_doubles": dumps(base),
        "long_numbers": dumps(with_long),
        "one_long_number": dumps(one_long),
    }


def _best_ms(func: Callable[[], Any], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return {
        "best_ms": round(min(times) * 1000, 2),
        "median_ms": round(statistics.median(times) * 1000, 2),
    }


def run_json(scale: float | None = None, repeats: int = 15) -> dict[str, Any]:
    """orjson.loads (the baseline, which rounds long numbers) against loads_exact, per body."""
    scale = 1.0 if scale is None else scale
    rows = _rows(scale, 10_000)
    results: dict[str, Any] = {}
    for name, body in json_bodies(rows).items():
        last = loads_exact(body)["rows"][-1]

        def parse_and_convert(parse: Callable[[bytes], Any], body: bytes = body) -> None:
            batch, response = convert_rows(JSON_SCHEMA, parse(body)["rows"], OnErrorOption.CONTINUE)
            assert batch is not None and not response.has_errors()

        base = _best_ms(lambda body=body: orjson.loads(body), repeats)
        ours = _best_ms(lambda body=body: loads_exact(body), repeats)
        base_all = _best_ms(lambda: parse_and_convert(orjson.loads), max(3, repeats // 5))
        ours_all = _best_ms(lambda: parse_and_convert(loads_exact), max(3, repeats // 5))
        results[name] = {
            "bytes": len(body),
            # False for orjson.loads: the 30-digit amount became a float.
            "digits_kept": isinstance(last.get("AMOUNT"), Decimal) if "AMOUNT" in last else None,
            "baseline_orjson_loads": base,
            "loads_exact": ours,
            "slowdown": round(ours["best_ms"] / base["best_ms"], 2),
            "with_convert_rows": {
                "baseline_orjson_loads": base_all,
                "loads_exact": ours_all,
                "slowdown": round(ours_all["best_ms"] / base_all["best_ms"], 2),
            },
        }
    return {"benchmark": "json_rows_parse", "scale": scale, "rows": rows,
            "python": sys.version.split()[0], "bodies": results}  # fmt: skip


if __name__ == "__main__":
    print(orjson.dumps(run_json() if sys.argv[1:] == ["json"] else run()).decode())
