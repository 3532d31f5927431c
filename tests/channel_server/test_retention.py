"""Channels idle past the retention period are removed with their tokens."""

import time

from ingest_sdk import OpenChannelRequest


def test_idle_channels_are_removed_open_ones_kept(server_factory, client_factory):
    server = server_factory(channel_retention_seconds=0.5)
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    idle = client.open_channel(OpenChannelRequest("idle", "DB", "S", "T"))
    idle.insert_rows([{"ID": 1}], end_offset_token="1")
    idle.wait_for_commit(timeout=30)
    idle.close()
    busy = client.open_channel(OpenChannelRequest("busy", "DB", "S", "T"))
    time.sleep(0.7)
    busy.insert_rows([{"ID": 2}], end_offset_token="2")  # activity keeps it
    busy.wait_for_commit(timeout=30)
    assert server.call(server.service.channels.remove_inactive) == 1
    names = [row["channel"] for row in client.show_channels("db.s.t")]
    assert names == ["busy"]
    (status,) = client.get_latest_committed_offset_tokens([("db.s.t", "idle")])
    assert status.status == "CHANNEL_NOT_FOUND"
