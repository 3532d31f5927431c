"""The wire format shared by the SDK and the server.

Control calls are JSON (orjson). Row batches are Arrow IPC streams with the
channel coordinates in headers, so the body is the data and nothing else; JSON
rows are accepted too, for clients without Arrow. Every data call carries
``(generation, batch_seq)``, which makes a repeated send harmless.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

from ingest_sdk.exact_json import loads_exact

__all__ = [
    "ARROW_CONTENT_TYPE",
    "HEADER_BATCH_SEQ",
    "HEADER_END_OFFSET_TOKEN",
    "HEADER_GENERATION",
    "JSON_CONTENT_TYPE",
    "MAX_BATCH_SEQ",
    "MAX_GENERATION",
    "MAX_OFFSET_TOKEN_LENGTH",
    "decode_arrow",
    "encode_arrow",
    "loads_exact",
    "pack_txn_version",
    "unpack_txn_version",
]

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSON_CONTENT_TYPE = "application/json"
HEADER_GENERATION = "X-Ingest-Generation"
HEADER_BATCH_SEQ = "X-Ingest-Batch-Seq"
HEADER_END_OFFSET_TOKEN = "X-Ingest-End-Offset-Token"
#: Offset tokens are free text chosen by the producer, at most this long.
MAX_OFFSET_TOKEN_LENGTH = 2048

_SEQ_BITS = 40
#: Largest batch_seq and generation a channel position can hold (see pack_txn_version).
MAX_BATCH_SEQ = (1 << _SEQ_BITS) - 1
MAX_GENERATION = (1 << 23) - 1


def encode_arrow(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """One Arrow IPC stream holding ``batches`` (possibly none)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_arrow(body: bytes) -> pa.Table:
    """The table of an Arrow IPC stream; raises ``pa.ArrowInvalid`` on a malformed body."""
    with pa.ipc.open_stream(pa.py_buffer(body)) as reader:
        return reader.read_all()


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def loads(body: bytes | str) -> Any:
    return orjson.loads(body)


def pack_txn_version(generation: int, batch_seq: int) -> int:
    """The Delta app-transaction version of a channel position: generation and seq in one int.

    Ordered like ``(generation, batch_seq)``; 40 bits of sequence allow a trillion
    batches per open, 23 bits of generation eight million opens.
    """
    if not 0 <= batch_seq <= MAX_BATCH_SEQ or not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"channel position out of range: generation {generation}, seq {batch_seq}")
    return (generation << _SEQ_BITS) | batch_seq


def unpack_txn_version(version: int) -> tuple[int, int]:
    return version >> _SEQ_BITS, version & ((1 << _SEQ_BITS) - 1)
