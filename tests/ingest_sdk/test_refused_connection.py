"""A refused connection: at once before the service ever answered (a wrong port, a service
not started), retried up to the deadline after it answered once (a restart).

The refused port is real: a socket bound by the OS, closed, its port used. Connect
attempts are counted at the socket (``socket.socket.connect``, what the event loop calls
for each attempt), only those to the test's port.
"""

from __future__ import annotations

import socket

import pytest

from ingest_sdk import (
    RetryPolicy,
    ServiceUnreachableError,
    StreamingIngestClient,
    TransportError,
)

#: A retry loop would go on for an hour at 10 ms a turn: its attempts show in the count.
PATIENT = RetryPolicy(initial=0.01, maximum=0.01, deadline=3600)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Attempts(dict[int, int]):
    """Connect attempts per port. Ports in ``at_most_once`` fail the test on a second
    attempt within one call: a retry loop shows as that error, not as a long wait."""

    def __init__(self) -> None:
        super().__init__()
        self.at_most_once: set[int] = set()


@pytest.fixture
def connects(monkeypatch):
    attempts = Attempts()
    real = socket.socket.connect

    def counting(sock, address):
        if isinstance(address, tuple) and address[0] in ("127.0.0.1", "::1"):
            port = address[1]
            attempts[port] = attempts.get(port, 0) + 1
            if port in attempts.at_most_once and attempts[port] > 1:
                raise AssertionError(f"connect to port {port} retried")
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", counting)
    return attempts


def test_a_refused_connection_before_any_answer_fails_at_once_naming_the_url(connects):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    connects.at_most_once.add(port)
    with StreamingIngestClient("refused", url=url, retry=PATIENT) as client:
        with pytest.raises(ServiceUnreachableError) as refused:
            client.list_tables()
        assert connects[port] == 1
        message = str(refused.value)
        assert url in message
        assert "connection refused" in message
        assert "check that the service is running" in message and "port" in message
        assert refused.value.__cause__ is None  # one clear error, not aiohttp's chain
        assert isinstance(refused.value, TransportError) and not refused.value.retriable

        # The streamed read (a change stream) fails the same way.
        connects[port] = 0
        with pytest.raises(ServiceUnreachableError, match="connection refused"):
            next(iter(client.read_change_stream("CS", "2026-01-31T12:00:00Z")))
        assert connects[port] == 1


def test_a_refused_connection_after_an_answer_is_retried_until_the_deadline(
    server_factory, connects
):
    server = server_factory()
    port = int(server.url.rsplit(":", 1)[1])
    retry = RetryPolicy(initial=0.01, maximum=0.05, deadline=1.0)
    with StreamingIngestClient("restarted", url=server.url, retry=retry) as client:
        assert client.list_tables() == []
        server.stop()  # the port now refuses: a service that went away, maybe to restart
        with pytest.raises(TransportError) as broken:
            client.list_tables()
    assert not isinstance(broken.value, ServiceUnreachableError)
    assert connects[port] > 2  # the first answer's connection, then the retries
