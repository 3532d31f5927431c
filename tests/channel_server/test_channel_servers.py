"""Several servers on one warehouse, each channel on one of them: the open records the
server in the catalog and answers its advertised URL, the SDK sends the channel's calls
there (past a load balancer that spreads requests over the servers), and any other
server refuses the channel's calls, naming the one holding it."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest
from deltalake import DeltaTable

from catalog import open_catalog
from channel_server import CompactionTrigger, ServerConfig
from channel_server.config import advertised_url
from ingest_sdk import OpenChannelRequest, StreamingIngestClient
from ingest_sdk.errors import ConfigurationError
from tests.http_calls import call_url
from tests.servers import ThreadServer, free_port


class RoundRobin:
    """A load balancer on a loopback port that sends each request to the next server in
    turn (what a producer meets in front of several servers)."""

    def __init__(self, urls: list[str]) -> None:
        turns = itertools.cycle(urls)
        lock = threading.Lock()

        class Forward(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                with lock:
                    target = next(turns)
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                request = urllib.request.Request(target + self.path, data=body,
                                                 headers=headers, method=self.command)  # fmt: skip
                try:
                    with urllib.request.urlopen(request, timeout=120) as answer:
                        status, raw, kind = answer.status, answer.read(), answer.headers
                except urllib.error.HTTPError as error:
                    status, raw, kind = error.code, error.read(), error.headers
                self.send_response(status)
                self.send_header("Content-Type", kind.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def two_servers(tmp_path):
    """Two servers on one warehouse (one SQLite catalog), each advertising its URL."""
    started = []
    for _ in range(2):
        port = free_port()
        started.append(ThreadServer(ServerConfig(
            port=port, warehouse=tmp_path / "warehouse", advertise_url=f"http://127.0.0.1:{port}",
            compaction=CompactionTrigger(enabled=False), refresh_scheduler=False,
            change_stream_check_seconds=0)))  # fmt: skip
    yield started
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()


def post(url, path, body):
    return call_url(url, "POST", path, body, timeout=60)


def test_a_channel_opened_through_a_balancer_sends_its_calls_to_its_server(two_servers):
    balancer = RoundRobin([s.url for s in two_servers])
    try:
        with StreamingIngestClient("behind-a-balancer", balancer.url) as client:
            client.create_table("DB.S.T", {"ID": "NUMBER"})
            channel = client.open_channel(OpenChannelRequest("feed", "DB", "S", "T"))
            holder = channel.server
            assert holder in {s.url for s in two_servers}
            for batch in range(10):  # through the balancer, half would reach the other
                channel.insert_rows(
                    [{"ID": batch * 10 + i} for i in range(10)], end_offset_token=str(batch)
                )
            assert channel.wait_for_commit("9", timeout=60)
            (status,) = client.get_latest_committed_offset_tokens([channel])
            assert (status.status, status.offset_token) == ("OK", "9")
            shown = [c for c in client.show_channels("DB.S.T") if c["channel"] == "feed"]
            channel.close()
    finally:
        balancer.close()
    uri = two_servers[0].service.catalog.get_table("DB", "S", "T").uri
    ids = DeltaTable(uri).to_pyarrow_table(columns=["ID"]).column("ID").to_pylist()
    assert sorted(int(i) for i in ids) == list(range(100))  # every row once
    assert [c["server"] for c in shown] == [holder]


def test_another_server_refuses_the_channel_naming_the_one_holding_it(two_servers):
    a, b = two_servers
    assert post(a.url, "/v1/tables", {"name": "DB.S.T", "columns": {"ID": "NUMBER"}})[0] == 201
    status, opened = post(a.url, "/v1/channels/open", {"table": "DB.S.T", "channel": "c"})
    assert status == 200 and opened["server"] == a.url
    query = urllib.parse.urlencode({"table": "DB.S.T", "channel": "c",
                                    "generation": opened["generation"], "batch_seq": 1})  # fmt: skip
    status, refused = post(b.url, f"/v1/channels/rows?{query}", {"rows": [{"ID": 1}]})
    refused = refused["error"]
    assert status == 409 and refused["code"] == "CHANNEL_INVALIDATED", refused
    assert a.url in refused["message"] and "send its calls there" in refused["message"]
    # The newest open wins: opened on B, the channel is B's, and A refuses it once its
    # handle is fenced.
    status, reopened = post(b.url, "/v1/channels/open", {"table": "DB.S.T", "channel": "c"})
    assert status == 200 and reopened["server"] == b.url
    catalog = open_catalog(a.config.warehouse / "catalog.sqlite")
    try:
        info = catalog.get_table("DB", "S", "T")
        assert catalog.get_channel(info.id, "c").server == b.url
    finally:
        catalog.close()


def test_without_an_advertised_url_the_client_keeps_its_own(tmp_path):
    server = ThreadServer(ServerConfig(port=0, warehouse=tmp_path / "w",
                                       compaction=CompactionTrigger(enabled=False)))  # fmt: skip
    try:
        assert (
            post(server.url, "/v1/tables", {"name": "DB.S.T", "columns": {"ID": "NUMBER"}})[0]
            == 201
        )
        status, opened = post(server.url, "/v1/channels/open", {"table": "DB.S.T", "channel": "c"})
        assert status == 200 and opened["server"] is None
        catalog = server.service.catalog
        info = catalog.get_table("DB", "S", "T")
        assert catalog.get_channel(info.id, "c").server == server.service.id
    finally:
        server.stop()


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://h:1", "http://", "http://h:port",
                                 "http://h:1/?q=1", "http://h:1/#f", ""])  # fmt: skip
def test_an_advertised_url_clients_cannot_use_is_refused(url):
    with pytest.raises(ConfigurationError, match="advertise URL"):
        advertised_url(url)


def test_an_advertised_url_is_kept_as_written_without_its_trailing_slash():
    assert advertised_url(" https://ingest-2.example:8443/ ") == "https://ingest-2.example:8443"
    assert ServerConfig(advertise_url="http://h:1/").advertise_url == "http://h:1"
