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
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

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

from ingest_sdk import (
    ChannelInvalidatedError,
    IngestError,
    OnErrorOption,
    OpenChannelRequest,
    StreamingIngestClient,
    TransportError,
)
from ingest_sdk.schema import split_table_name

__all__ = ["BridgeConfig", "KafkaBridge", "TopicMapping"]

log = logging.getLogger("kafka_bridge")

#: Kafka metadata a mapping may store in columns: name -> how to read it from a message.
METADATA = {
    "topic": lambda m: m.topic(),
    "partition": lambda m: m.partition(),
    "offset": lambda m: m.offset(),
    "timestamp": lambda m: m.timestamp()[1] if m.timestamp()[0] else None,
    "key": lambda m: m.key().decode("utf-8", "replace") if m.key() is not None else None,
    "headers": lambda m: {k: (v or b"").decode("utf-8", "replace") for k, v in (m.headers() or [])},
}


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
    consumer_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Partition:
    mapping: TopicMapping
    channel: Any  # ingest_sdk.Channel
    name: str


@dataclass
class Metrics:
    records: int = 0
    rows: int = 0
    bad_records: int = 0
    dlq_records: int = 0
    reopens: int = 0
    started: float = field(default_factory=time.monotonic)
    lag: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        seconds = max(time.monotonic() - self.started, 1e-9)
        return {
            "records": self.records,
            "records_per_s": round(self.records / seconds, 1),
            "rows": self.rows,
            "bad_records": self.bad_records,
            "dlq_records": self.dlq_records,
            "reopens": self.reopens,
            "lag": dict(self.lag),
        }


class KafkaBridge:
    """Runs until ``stop`` is set; see the module docstring for the recovery rule."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self.mappings = {m.topic: m for m in config.mappings}
        self.metrics = Metrics()
        self.client = StreamingIngestClient(
            f"kafka-bridge-{config.group_id}",
            url=config.server_url,
            token=config.token,
            max_client_lag=config.max_client_lag,
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": config.bootstrap_servers,
                "group.id": config.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": config.auto_offset_reset,
                **config.consumer_config,
            }
        )
        self.dlq = (
            Producer({"bootstrap.servers": config.bootstrap_servers}) if config.dlq_topic else None
        )
        self.partitions: dict[tuple[str, int], _Partition] = {}

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
        for tp in assigned:
            _, resume = self._open(tp.topic, tp.partition)
            if resume is not None:
                tp.offset = resume
                source = "channel token"
            else:
                (committed,) = consumer.committed([TopicPartition(tp.topic, tp.partition)], 10)
                tp.offset = committed.offset if committed.offset >= 0 else OFFSET_INVALID
                source = "group offset" if committed.offset >= 0 else "reset policy"
            log.info(
                "assigned %s[%d]: resume at %s (%s)", tp.topic, tp.partition, tp.offset, source
            )
        consumer.assign(assigned)

    def _on_revoke(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            state = self.partitions.pop((tp.topic, tp.partition), None)
            if state is None:
                continue
            try:
                state.channel.close(timeout=30)  # what was sent commits; the next owner resumes
            except IngestError as exc:
                log.info("revoked %s[%d]: %s", tp.topic, tp.partition, exc)
            log.info("revoked %s[%d]", tp.topic, tp.partition)

    def _recover(self, topic: str, partition: int, reason: Exception) -> None:
        """Reopen after invalidation or a server restart and rewind to the committed token."""
        self.metrics.reopens += 1
        log.warning("recovering %s[%d] after %s", topic, partition, reason)
        for attempt in range(60):
            try:
                _, resume = self._open(topic, partition)
                break
            except (TransportError, IngestError) as exc:
                log.warning("reopen of %s[%d] failed (%s), retrying", topic, partition, exc)
                time.sleep(min(0.1 * 2**attempt, 2.0))
        else:
            raise RuntimeError(f"cannot reopen the channel of {topic}[{partition}]")
        if resume is None:
            (committed,) = self.consumer.committed([TopicPartition(topic, partition)], 10)
            resume = committed.offset if committed.offset >= 0 else 0
        self.consumer.seek(TopicPartition(topic, partition, resume))

    # -- records ------------------------------------------------------------------------------

    def _row(self, message: Message, mapping: TopicMapping) -> dict[str, Any]:
        try:
            value = orjson.loads(message.value() or b"")
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"the record value is not valid JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise ValueError("the record value is not a JSON object")
        for source, column in mapping.metadata_columns.items():
            value[column] = METADATA[source](message)
        return value

    def _dead_letter(self, message: Message, error: str) -> None:
        self.metrics.bad_records += 1
        log.warning("bad record %s[%d]@%d: %s", message.topic(), message.partition(),
                    message.offset(), error)  # fmt: skip
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

    def run(self, stop: threading.Event) -> None:
        topics = list(self.mappings)
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)  # fmt: skip
        log.info("consuming %s from %s", topics, self.config.bootstrap_servers)
        next_commit = time.monotonic() + self.config.commit_interval
        try:
            while not stop.is_set():
                messages = self.consumer.consume(self.config.batch_size, timeout=0.2)
                by_partition: dict[tuple[str, int], list[Message]] = {}
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", error)
                        continue
                    key = (str(message.topic()), int(message.partition() or 0))
                    by_partition.setdefault(key, []).append(message)
                for (topic, partition), batch in by_partition.items():
                    self._deliver(topic, partition, batch)
                if self.dlq is not None:
                    self.dlq.poll(0)
                if time.monotonic() >= next_commit:
                    next_commit = time.monotonic() + self.config.commit_interval
                    try:
                        self._commit_group_offsets()
                    except IngestError as exc:
                        log.warning("group offset commit skipped: %s", exc)
                    log.info("metrics %s", orjson.dumps(self.metrics.snapshot()).decode())
        finally:
            self.close()

    def close(self) -> None:
        """Close the channels (what was sent commits), then leave the group offsets at the
        final tokens."""
        for state in self.partitions.values():
            with contextlib.suppress(IngestError):
                state.channel.close(timeout=30)
        with contextlib.suppress(IngestError, KafkaException):
            self._commit_group_offsets(asynchronous=False)
        self.partitions.clear()
        if self.dlq is not None:
            self.dlq.flush(10)
        self.consumer.close()
        with contextlib.suppress(IngestError):
            self.client.close()
