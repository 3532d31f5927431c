"""Kafka -> channels with exactly-once delivery: one channel per topic partition.

The Kafka offset is the channel's offset token. The recovery rule is the whole
trick: on every assignment the bridge opens the partition's channel (which
invalidates any other owner and discards what it had not committed), reads the
latest committed token and seeks to token + 1. Only when the channel has no
token yet does it fall back to the consumer group's committed offset or the
reset policy. So a crash, a rebalance or a server restart re-reads exactly the
records whose rows were not committed, and nothing else.

Consumer group offsets are committed periodically *to the channels' committed
tokens*, only so that Kafka lag tools show the true lag; they are never the
source of truth.

Before consuming anything the bridge checks its mapping against the tables
(``table_check``) and waits for a broker to answer (``--broker-timeout``): both
mistakes used to look like a running bridge. It joins the group as a static
member (``group.instance.id``) with a short session timeout, because a member
that dies without leaving keeps its partitions until its session times out, and
a restarted bridge would otherwise wait that long (librdkafka's default is 45 s,
and a rebalance can wait for two of them).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential,
    wait_none,
)

from examples.kafka_bridge.errors import BridgeError, KafkaUnavailableError
from examples.kafka_bridge.kafka_health import (
    CLIENT_SETTINGS,
    REMINDER_INTERVAL,
    KafkaHealth,
    RepeatFilter,
)
from examples.kafka_bridge.reporting import Metrics, describe_resume, record_error, record_name
from examples.kafka_bridge.table_check import check_tables
from ingest_sdk import (
    ChannelInvalidatedError,
    IngestError,
    OnErrorOption,
    OpenChannelRequest,
    StreamingIngestClient,
    TransportError,
)
from ingest_sdk.schema import split_table_name
from ingest_sdk.wire import loads_exact

__all__ = ["BridgeConfig", "KafkaBridge", "Metrics", "TopicMapping"]

log = logging.getLogger("kafka_bridge")
#: librdkafka's own log lines land here (through a :class:`RepeatFilter`), not on raw stderr.
kafka_log = logging.getLogger("kafka_bridge.librdkafka")

#: Kafka metadata a mapping may store in columns: name -> how to read it from a message.
METADATA = {
    "topic": lambda m: m.topic(),
    "partition": lambda m: m.partition(),
    "offset": lambda m: m.offset(),
    "timestamp": lambda m: m.timestamp()[1] if m.timestamp()[0] else None,
    "key": lambda m: m.key().decode("utf-8", "replace") if m.key() is not None else None,
    "headers": lambda m: {k: (v or b"").decode("utf-8", "replace") for k, v in (m.headers() or [])},
}

#: Seconds without partitions before the bridge says why it waits (a fresh group takes
#: about 3 s: the coordinator's initial rebalance delay).
ASSIGNMENT_NOTICE = 5.0
#: Seconds one metadata request may wait while the bridge waits for its first broker.
BROKER_PROBE = 1.0


@dataclass(frozen=True)
class TopicMapping:
    """A topic's records go to a table; JSON object values map to columns by name.

    Attributes:
        metadata_columns: Kafka metadata to store, e.g. ``{"offset": "KAFKA_OFFSET"}``
            (keys: topic, partition, offset, timestamp, key, headers).
    """

    topic: str
    table: str
    metadata_columns: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BridgeConfig:
    """Settings of one bridge process.

    Attributes:
        instance_id: ``group.instance.id`` (static membership): a restarted bridge with the
            same id takes its partitions back at once on brokers that support it. Must be
            unique in the group and stable across restarts; ``None`` joins as a dynamic
            member. The command line defaults it to ``<group id>-<host name>``.
        session_timeout: seconds the group waits for a silent member before it hands its
            partitions to others: the longest a restart waits for them.
        broker_timeout: seconds to wait for a first answer from a broker before giving up.
    """

    bootstrap_servers: str
    group_id: str
    server_url: str
    mappings: tuple[TopicMapping, ...]
    token: str | None = None
    dlq_topic: str | None = None
    max_client_lag: float = 1.0
    batch_size: int = 1000
    commit_interval: float = 5.0
    auto_offset_reset: str = "earliest"
    channel_name: str = "{topic}:P{partition}"
    instance_id: str | None = None
    session_timeout: float = 10.0
    broker_timeout: float = 300.0
    consumer_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Partition:
    mapping: TopicMapping
    channel: Any  # ingest_sdk.Channel
    name: str


def close_together(channels: dict[str, Any], timeout: float) -> dict[str, str | None]:
    """Close channels at once (one flush can commit them all), each waiting at most
    ``timeout`` seconds for what it sent; returns each name's error, or ``None``."""

    def close(channel: Any) -> str | None:
        try:
            channel.close(timeout=timeout)
        except IngestError as exc:
            return str(exc)
        return None

    if not channels:
        return {}
    with ThreadPoolExecutor(max_workers=len(channels), thread_name_prefix="close") as pool:
        return dict(zip(channels, pool.map(close, channels.values()), strict=True))


def _log_reopen_retry(state: RetryCallState) -> None:
    topic, partition = state.args
    error = state.outcome.exception() if state.outcome else None
    log.warning("reopen of %s[%d] failed (%s), retrying", topic, partition, error)


class KafkaBridge:
    """Runs until ``stop`` is set; see the module docstring for the recovery rule."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self.mappings = {m.topic: m for m in config.mappings}
        self.metrics = Metrics()
        self.health = KafkaHealth(config.bootstrap_servers, log)
        self._log_filter = RepeatFilter()
        kafka_log.addFilter(self._log_filter)
        self.client = StreamingIngestClient(
            f"kafka-bridge-{config.group_id}",
            url=config.server_url,
            token=config.token,
            max_client_lag=config.max_client_lag,
        )
        self._kafka_settings: dict[str, Any] = {
            "bootstrap.servers": config.bootstrap_servers,
            "error_cb": self.health.on_error,
            "logger": kafka_log,
            **CLIENT_SETTINGS,
        }
        session_ms = int(config.session_timeout * 1000)
        membership = {"group.instance.id": config.instance_id} if config.instance_id else {}
        self._consumer_settings: dict[str, Any] = {
            **self._kafka_settings,
            "group.id": config.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": config.auto_offset_reset,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, min(3000, session_ms // 3)),
            **membership,
            **config.consumer_config,
        }
        self._consumer: Consumer | None = None
        self.dlq: Producer | None = None  # made by run() with the consumer
        self.partitions: dict[tuple[str, int], _Partition] = {}
        self._unassigned_since: float | None = None
        self._next_waiting_notice = 0.0

    @property
    def consumer(self) -> Consumer:
        """The group's consumer, made on first use: :meth:`run` checks the mapping first, so
        a mapping that does not fit dials no broker (and says nothing about one)."""
        if self._consumer is None:
            self._consumer = Consumer(self._consumer_settings)
        return self._consumer

    # -- start-up ------------------------------------------------------------------------------

    def _serve_kafka_callbacks(self) -> None:
        """librdkafka hands over errors and log lines only while the application polls."""
        self.consumer.poll(0)  # not subscribed yet: serves callbacks, returns no record
        if self.dlq is not None:
            self.dlq.poll(0)

    def _wait_for_broker(self, stop: threading.Event) -> bool:
        """Block until a broker answers; False if stopped first.

        A phase of its own because giving up is right only before the first answer: once
        connected, librdkafka reconnects by itself and the bridge keeps running.

        Raises:
            KafkaUnavailableError: no broker answered within ``broker_timeout``.
        """

        def probe() -> None:
            try:
                self.consumer.list_topics(timeout=BROKER_PROBE)
            finally:
                self._serve_kafka_callbacks()

        retrying = Retrying(
            retry=retry_if_exception_type(KafkaException),
            stop=stop_after_delay(self.config.broker_timeout) | stop_when_event_set(stop),
            wait=wait_none(),  # each probe waits BROKER_PROBE s for an answer by itself
        )
        try:
            retrying(probe)
        except RetryError as exc:
            if stop.is_set():
                return False
            raise KafkaUnavailableError(
                f"gave up: no Kafka broker at {self.config.bootstrap_servers} answered within "
                f"{self.config.broker_timeout:g} s (--broker-timeout). Fix: start the broker or "
                "correct --bootstrap-servers"
            ) from exc
        self.health.connected = True
        return True

    # -- assignment and recovery -------------------------------------------------------------

    def _open(self, topic: str, partition: int) -> tuple[_Partition, int | None]:
        """Open (or reopen) the partition's channel; returns it and the offset to resume at."""
        mapping = self.mappings[topic]
        database, schema, table = split_table_name(mapping.table)
        name = self.config.channel_name.format(topic=topic, partition=partition)
        channel = self.client.open_channel(
            OpenChannelRequest(name, database, schema, table, on_error=OnErrorOption.CONTINUE)
        )
        token = channel.get_latest_committed_offset_token()
        state = _Partition(mapping, channel, name)
        self.partitions[(topic, partition)] = state
        return state, int(token) + 1 if token is not None else None

    def _on_assign(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        if self._unassigned_since is not None:
            waited = time.monotonic() - self._unassigned_since
            if waited >= ASSIGNMENT_NOTICE:
                log.info("the group coordinator assigned partitions after %.0f s", waited)
            self._unassigned_since = None
        if not assigned:
            log.info("no partitions assigned to this instance: the group has more members "
                     "than the topics have partitions; it idles until a rebalance")  # fmt: skip
        source: Literal["token", "group", "reset"]
        for tp in assigned:
            _, resume = self._open(tp.topic, tp.partition)
            if resume is not None:
                tp.offset, source = resume, "token"
            else:
                (committed,) = consumer.committed([TopicPartition(tp.topic, tp.partition)], 10)
                if committed.offset >= 0:
                    tp.offset, source = committed.offset, "group"
                else:
                    tp.offset, source = OFFSET_INVALID, "reset"
            log.info("assigned %s[%d]: resume %s", tp.topic, tp.partition,
                     describe_resume(tp.offset, source, self.config.auto_offset_reset))  # fmt: skip
        consumer.assign(assigned)

    def _on_revoke(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        """Close the revoked partitions' channels together, for at most half a session.

        The group waits for every member to rejoin for about one session timeout
        (librdkafka's mock broker: the timeout less 1 s), and a member still closing
        then holds every member of the group without partitions for another round.
        Waiting longer buys nothing for exactly-once: what has not committed by then
        is fenced by the next owner's open, which resumes from the committed token.
        """
        states = [(tp, self.partitions.pop((tp.topic, tp.partition), None)) for tp in revoked]
        closing = {f"{tp.topic}[{tp.partition}]": state.channel
                   for tp, state in states if state is not None}  # fmt: skip
        started = time.monotonic()
        outcomes = close_together(closing, timeout=self.config.session_timeout / 2)
        for name, error in outcomes.items():
            log.info("revoked %s after %.2f s%s", name, time.monotonic() - started,
                     f": {error}" if error else "")  # fmt: skip
        if not self.partitions and self._unassigned_since is None:
            self._unassigned_since = time.monotonic()
            self._next_waiting_notice = 0.0

    def _note_waiting(self, now: float) -> None:
        """Say why no records flow while the group has not assigned partitions: a metrics
        line with ``"lag": {}`` for a minute and nothing else looks like a hang."""
        if self._unassigned_since is None or now < self._next_waiting_notice:
            return
        waited = now - self._unassigned_since
        if waited < ASSIGNMENT_NOTICE:
            return
        self._next_waiting_notice = now + REMINDER_INTERVAL
        membership = (
            f"instance {self.config.instance_id}" if self.config.instance_id else "dynamic member"
        )
        log.info(
            "waiting for partition assignment from the group coordinator (group %s, %s) for "
            "%.0f s: a rebalance waits until every member has rejoined, and a member that "
            "stopped without leaving the group (killed, or any stopped static member) keeps its "
            "partitions until its session times out (session.timeout.ms %.0f s here)",
            self.config.group_id, membership, waited, self.config.session_timeout,
        )  # fmt: skip

    def _recover(self, topic: str, partition: int, reason: Exception) -> None:
        """Reopen after invalidation or a server restart and rewind to the committed token."""
        self.metrics.reopens += 1
        log.warning("recovering %s[%d] after %s", topic, partition, reason)
        retrying = Retrying(
            retry=retry_if_exception_type((TransportError, IngestError)),
            stop=stop_after_attempt(60),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            before_sleep=_log_reopen_retry,
        )
        try:
            _, resume = retrying(self._open, topic, partition)
        except RetryError as exc:
            raise BridgeError(
                f"cannot reopen the channel of {topic}[{partition}] at the channel service "
                f"{self.config.server_url}: {exc.last_attempt.exception()}"
            ) from exc
        if resume is None:
            (committed,) = self.consumer.committed([TopicPartition(topic, partition)], 10)
            resume = committed.offset if committed.offset >= 0 else 0
        log.info("recovered %s[%d]: resume at offset %d", topic, partition, resume)
        self.consumer.seek(TopicPartition(topic, partition, resume))

    # -- records ------------------------------------------------------------------------------

    def _row(self, message: Message, mapping: TopicMapping) -> dict[str, Any]:
        try:
            value = loads_exact(message.value() or b"")  # big numbers keep every digit
        except ValueError as exc:
            raise ValueError(f"the record value is not valid JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise ValueError("the record value is not a JSON object")
        for source, column in mapping.metadata_columns.items():
            value[column] = METADATA[source](message)
        return value

    def _dead_letter(self, message: Message, error: str) -> None:
        self.metrics.bad_records += 1
        error = record_error(error)
        log.warning("bad record %s: %s", record_name(message), error)
        if self.dlq is None or self.config.dlq_topic is None:
            return
        headers: list[tuple[str, str | bytes | None]] = [
            ("ingest.error", error.encode()),
            (
                "ingest.source",
                f"{message.topic()}:{message.partition()}:{message.offset()}".encode(),
            ),
        ]
        self.dlq.produce(self.config.dlq_topic, value=message.value(), key=message.key(),
                         headers=headers)  # fmt: skip
        self.metrics.dlq_records += 1

    def _deliver(self, topic: str, partition: int, messages: list[Message]) -> None:
        state = self.partitions.get((topic, partition))
        if state is None:
            return  # revoked meanwhile: the new owner reads these again
        rows, sources = [], []
        for message in messages:
            try:
                rows.append(self._row(message, state.mapping))
                sources.append(message)
            except ValueError as exc:
                self._dead_letter(message, str(exc))
        token = str(messages[-1].offset())  # bad records are consumed too: the token covers them
        try:
            response = state.channel.insert_rows(rows, end_offset_token=token)
        except (ChannelInvalidatedError, TransportError) as exc:
            self._recover(topic, partition, exc)
            return
        for error in response.insert_errors:
            self._dead_letter(sources[error.row_index], error.message)
        self.metrics.records += len(messages)
        self.metrics.rows += response.inserted_row_count

    def _commit_group_offsets(self, asynchronous: bool = True) -> None:
        """Move the group's offsets to the channels' committed tokens (for lag tools)."""
        self.metrics.partitions = len(self.partitions)
        self.metrics.lag = {}  # revoked partitions drop out
        if not self.partitions:
            return
        keys = list(self.partitions)
        statuses = self.client.get_latest_committed_offset_tokens(
            [(self.partitions[key].mapping.table, self.partitions[key].name) for key in keys]
        )
        offsets = [
            TopicPartition(topic, partition, int(status.offset_token) + 1)
            for (topic, partition), status in zip(keys, statuses, strict=True)
            if status.ok and status.offset_token is not None
        ]
        if offsets and asynchronous:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        elif offsets:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        for topic, partition in keys:
            _, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), cached=True
            ) or (0, 0)
            (position,) = self.consumer.position([TopicPartition(topic, partition)])
            if position.offset >= 0:
                self.metrics.lag[f"{topic}[{partition}]"] = max(0, high - position.offset)

    def _raise_if_fatal(self) -> None:
        error = self.health.fatal
        if error is None:
            return
        if error.code() == KafkaError.FENCED_INSTANCE_ID:
            raise KafkaUnavailableError(
                f"another consumer joined group {self.config.group_id} with this bridge's "
                f"--instance-id {self.config.instance_id}, and the coordinator fenced this one. "
                "Fix: give each bridge instance its own --instance-id"
            )
        raise KafkaUnavailableError(f"fatal Kafka client error {error.name()}: {error.str()}")

    def run(self, stop: threading.Event) -> None:
        """Check the mapping, wait for a broker, then consume until ``stop`` is set.

        Raises:
            ConfigurationError: the mapping does not fit the tables (nothing was consumed).
            KafkaUnavailableError: no broker answered in time, or a fatal client error.
        """
        try:
            check_tables(self.client, self.config.mappings)
            if self.config.dlq_topic:
                self.dlq = Producer(self._kafka_settings)
            if not self._wait_for_broker(stop):
                return
            self._consume(stop)
        finally:
            self.close()

    def _consume(self, stop: threading.Event) -> None:
        topics = list(self.mappings)
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)  # fmt: skip
        membership = (
            f"static member {self.config.instance_id}" if self.config.instance_id else
            "dynamic member"
        )  # fmt: skip
        log.info("consuming %s from %s as %s of group %s", topics, self.config.bootstrap_servers,
                 membership, self.config.group_id)  # fmt: skip
        self._unassigned_since = time.monotonic()
        next_commit = time.monotonic() + self.config.commit_interval
        while not stop.is_set():
            messages = self.consumer.consume(self.config.batch_size, timeout=0.2)
            self._raise_if_fatal()
            by_partition: dict[tuple[str, int], list[Message]] = {}
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        self.health.on_error(error)  # said once, not once per poll
                    continue
                key = (str(message.topic()), int(message.partition() or 0))
                by_partition.setdefault(key, []).append(message)
            for (topic, partition), batch in by_partition.items():
                self._deliver(topic, partition, batch)
            if self.dlq is not None:
                self.dlq.poll(0)
            self._note_waiting(time.monotonic())
            if time.monotonic() >= next_commit:
                next_commit = time.monotonic() + self.config.commit_interval
                try:
                    self._commit_group_offsets()
                except IngestError as exc:
                    log.warning("group offset commit skipped: %s", exc)
                log.info("metrics %s", orjson.dumps(self.metrics.snapshot()).decode())

    def close(self) -> None:
        """Close the channels (what was sent commits), then leave the group offsets at the
        final tokens."""
        close_together({state.name: state.channel for state in self.partitions.values()},
                       timeout=30)  # fmt: skip
        with contextlib.suppress(IngestError, KafkaException):
            self._commit_group_offsets(asynchronous=False)
        self.partitions.clear()
        if self.dlq is not None:
            self.dlq.flush(10)
        if self._consumer is not None:
            self._consumer.close()
        with contextlib.suppress(IngestError):
            self.client.close()
        kafka_log.removeFilter(self._log_filter)
