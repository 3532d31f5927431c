"""Fixtures of the service tests: a plain HTTP client on a real server."""

import aiohttp
import pytest


@pytest.fixture
async def http(server):
    """An aiohttp session whose paths are relative to the ``server`` fixture's URL."""
    async with aiohttp.ClientSession(base_url=server.url) as session:
        yield session
