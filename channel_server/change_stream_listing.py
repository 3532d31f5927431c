"""``GET /v1/change-streams`` and ``GET /v1/change-streams/{name}``: the change streams a
warehouse holds, as ``SHOW CHANGE STREAMS`` lists them, for clients that speak HTTP but
not SQL (a consumer finding the stream to read, a dashboard).

Each stream is one JSON object: its full name and parts, what it watches (``"ALL"`` or
the full names of its tables; a dropped table drops out), the column lists of the
tables that have one (``"columns"``: full name -> columns), its options as ``OPTIONS``
writes them (``value_capture_type``, ``retention_period``, the four ``exclude_*``
booleans), its creation time (epoch
seconds, as ``GET /v1/tables`` gives ``created_at``) and its partitions open now (the
tokens a reader resumes from are in ``SHOW CHANGE STREAM PARTITIONS``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from catalog import Catalog, ChangeStreamRecord
from channel_server.change_stream_api import change_stream_name, stream_named
from channel_server.http_common import SERVICE, Routes
from ingest_sdk.errors import InvalidRequestError
from pipelines.change_streams.definition import exclusion_flags, retention_text, watched_names

__all__ = [
    "change_stream_json", "describe_change_stream", "list_change_streams", "no_change_stream_named",
    "setup",
]  # fmt: skip


routes = Routes()


def setup(app: web.Application) -> None:
    app.add_routes(routes)


def change_stream_json(catalog: Catalog, stream: ChangeStreamRecord,
                       tables: dict[int, str]) -> dict[str, Any]:  # fmt: skip
    """One stream's JSON form; ``tables``: table id -> full name, of the tables that exist."""
    watched = watched_names(stream, tables)
    open_partitions = sum(p.end_us is None for p in catalog.list_partitions(stream.uid))
    return {
        "name": stream.full_name,
        "database": stream.database,
        "schema": stream.schema_name,
        "change_stream": stream.name,
        "for": watched,
        "columns": {tables[t]: list(c) for t, c in stream.column_lists if t in tables},
        "value_capture_type": stream.value_capture_type,
        "retention_period": retention_text(stream.retention_s),
        **exclusion_flags(stream),
        "created_at": stream.created_at,
        "open_partitions": open_partitions,
    }


def _tables(catalog: Catalog) -> dict[int, str]:
    return {t.id: t.full_name for t in catalog.list_tables()}


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


@routes.get("/v1/change-streams")
async def list_change_streams(request: web.Request) -> web.Response:
    """Every change stream, ordered by database, schema and name."""
    return _json(await asyncio.to_thread(_listing, request.app[SERVICE].catalog))


@routes.get("/v1/change-streams/")
async def no_change_stream_named(request: web.Request) -> web.Response:
    """A trailing slash and no name (what an empty name makes of the path)."""
    raise InvalidRequestError("a change stream name is missing after /v1/change-streams/: "
                              "GET /v1/change-streams lists them, GET /v1/change-streams/"
                              "{name} answers one")  # fmt: skip


@routes.get("/v1/change-streams/{name:[^/]+}")
async def describe_change_stream(request: web.Request) -> web.Response:
    """One change stream, named as the read route names it (``NAME``, ``SCHEMA.NAME`` or
    ``DATABASE.SCHEMA.NAME``; unquoted parts upper-cased)."""
    names = change_stream_name(request.match_info["name"])
    return _json(await asyncio.to_thread(_described, request.app[SERVICE].catalog, names))


def _listing(catalog: Catalog) -> dict[str, Any]:
    """Every stream's JSON form (blocking: catalog reads, run in a worker thread)."""
    tables = _tables(catalog)
    return {"change_streams": [change_stream_json(catalog, stream, tables)
                               for stream in catalog.list_change_streams()]}  # fmt: skip


def _described(catalog: Catalog, names: tuple[str, str, str]) -> dict[str, Any]:
    """One stream's JSON form (blocking: catalog reads, run in a worker thread)."""
    return change_stream_json(catalog, stream_named(catalog, names), _tables(catalog))
