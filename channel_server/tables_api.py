"""``/v1/tables``: create, list, describe and drop tables; their migrations, clustering
and compaction. Catalog calls run in worker threads: the event loop never waits for the
catalog (its lock may be held by another process for up to 30 s)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from catalog import TableInfo
from channel_server.http_common import REQUEST_TABLE, SERVICE, Routes, json_answer
from channel_server.requests import field, json_body

__all__ = ["setup"]

routes = Routes()
#: A table in a path: any name but "/" (aiohttp's default pattern also refuses "{" and
#: "}", which a table name may hold, so such a table could not be described or dropped).
_TABLE_PATH = "/v1/tables/{name:[^/]+}"


def setup(app: web.Application) -> None:
    app.add_routes(routes)


def _table_json(info: TableInfo) -> dict[str, Any]:
    return {
        "name": info.full_name,
        "database": info.database,
        "schema": info.schema_name,
        "table": info.name,
        "location": info.uri,
        "columns": info.schema.declarations(),
        "clustering": list(info.clustering),
        "created_at": info.created_at,
    }


@routes.post("/v1/tables")
async def create_table(request: web.Request) -> web.Response:
    body = await json_body(request)
    request[REQUEST_TABLE] = body["name"] if isinstance(body.get("name"), str) else ""
    name = field(body, "name", str)
    columns = field(body, "columns", dict)
    if_not_exists = bool(field(body, "if_not_exists", bool, required=False))
    info, created = await asyncio.to_thread(
        request.app[SERVICE].tables.create, name, columns, if_not_exists
    )
    return json_answer({**_table_json(info), "created": created}, 201 if created else 200)


@routes.get("/v1/tables")
async def list_tables(request: web.Request) -> web.Response:
    tables = await asyncio.to_thread(request.app[SERVICE].tables.all)
    return json_answer({"tables": [_table_json(info) for info in tables]})


@routes.get(_TABLE_PATH)
async def describe_table(request: web.Request) -> web.Response:
    tables = request.app[SERVICE].tables
    info = await asyncio.to_thread(tables.describe, request.match_info["name"])
    return json_answer(_table_json(info))


@routes.delete(_TABLE_PATH)
async def drop_table(request: web.Request) -> web.Response:
    info = await request.app[SERVICE].drop_table(request.match_info["name"])
    return json_answer({"dropped": info.full_name})


@routes.get(_TABLE_PATH + "/migrations")
async def migrations(request: web.Request) -> web.Response:
    tables = request.app[SERVICE].tables
    runs = await asyncio.to_thread(tables.migrations, request.match_info["name"])
    return json_answer({"migrations": runs})


@routes.put(_TABLE_PATH + "/clustering")
async def set_clustering(request: web.Request) -> web.Response:
    body = await json_body(request)
    columns = field(body, "columns", list)
    tables = request.app[SERVICE].tables
    info = await asyncio.to_thread(tables.set_clustering, request.match_info["name"], columns)
    return json_answer({**_table_json(info)})


@routes.post(_TABLE_PATH + "/compact")
async def compact(request: web.Request) -> web.Response:
    """Start a background compaction now (202); its run appears in the migration history."""
    info, started = await request.app[SERVICE].compact_now(request.match_info["name"])
    return json_answer({"table": info.full_name, "started": started}, 202)
