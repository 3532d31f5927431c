"""The channel service (aiohttp): catalog, channel lifecycle, buffering and backpressure.

It never writes Parquet or Delta itself; :mod:`flush` does.
"""

from catalog import Catalog, ChannelRecord, SqliteCatalog, TableInfo
from channel_server.app import create_app
from channel_server.config import CompactionTrigger, FlushPolicy, Limits, ServerConfig, SqlLimits
from channel_server.service import IngestService

__all__ = [
    "Catalog",
    "ChannelRecord",
    "CompactionTrigger",
    "FlushPolicy",
    "IngestService",
    "Limits",
    "ServerConfig",
    "SqlLimits",
    "SqliteCatalog",
    "TableInfo",
    "create_app",
]
