"""``python -m examples.kafka_bridge``: run the bridge until SIGTERM or Ctrl-C.

One topic:   --bootstrap-servers H:P --topic T --table DB.S.T --server-url URL --group-id G
Many topics: --config bridge.json  with
    {"bootstrap_servers": "...", "group_id": "...", "server_url": "...", "dlq_topic": "...",
     "mappings": [{"topic": "orders", "table": "SHOP.PUBLIC.ORDER_EVENTS",
                   "metadata_columns": {"offset": "KAFKA_OFFSET"}}]}

Exit status: 0 after SIGTERM/Ctrl-C, 2 for a configuration the tables do not fit (or a bad
flag), 1 when Kafka or the channel service stays unreachable.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

import orjson

from examples.kafka_bridge.bridge import METADATA, BridgeConfig, KafkaBridge, TopicMapping
from examples.kafka_bridge.errors import BridgeError
from ingest_sdk.process_exit import run_entry_point

log = logging.getLogger("kafka_bridge")


def default_instance_id(group_id: str) -> str:
    """``<group id>-<host name>``: stable across restarts of a bridge on one host (or one
    StatefulSet pod), which is what static membership needs."""
    return f"{group_id}-{socket.gethostname()}"


def _mapping(parser: argparse.ArgumentParser, item: object) -> TopicMapping:
    """A ``mappings`` entry of the config file, refused as a flag would be."""
    if not isinstance(item, dict):
        parser.error(f"each entry of mappings must be an object, got {item!r}")
    try:
        mapping = TopicMapping(**item)
    except TypeError as exc:
        parser.error(f"mapping {item!r}: {exc}; use topic, table, metadata_columns")
    unknown = set(mapping.metadata_columns) - set(METADATA)
    if unknown:
        parser.error(f"mapping of topic {mapping.topic}: unknown metadata field(s) "
                     f"{sorted(unknown)}; use {', '.join(METADATA)}")  # fmt: skip
    return mapping


def parse_args(argv: list[str] | None = None) -> BridgeConfig:
    parser = argparse.ArgumentParser(
        prog="python -m examples.kafka_bridge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, help="JSON file with the settings below and mappings"
    )
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--topic")
    parser.add_argument("--table")
    parser.add_argument("--server-url")
    parser.add_argument("--group-id")
    parser.add_argument("--token", help="bearer token of the channel service")
    parser.add_argument("--dlq-topic", help="bad records go here (with the error in headers)")
    parser.add_argument(
        "--metadata-column",
        action="append",
        default=[],
        metavar="FIELD=COLUMN",
        help=f"store Kafka metadata: {', '.join(METADATA)}",
    )
    parser.add_argument("--max-client-lag", type=float, default=1.0)
    parser.add_argument("--commit-interval", type=float, default=5.0)
    parser.add_argument("--auto-offset-reset", default="earliest", choices=["earliest", "latest"])
    parser.add_argument(
        "--instance-id",
        help="static group membership id (group.instance.id), unique in the group and stable "
        "across restarts; default <group id>-<host name>; '' joins as a dynamic member",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=10.0,
        help="seconds before the group gives a silent member's partitions to others (default 10)",
    )
    parser.add_argument(
        "--broker-timeout",
        type=float,
        default=300.0,
        help="give up (exit 1) if no Kafka broker answers within this many seconds of start-up "
        "(default 300)",
    )
    args = parser.parse_args(argv)
    settings: dict = orjson.loads(args.config.read_bytes()) if args.config else {}
    metadata = dict(item.split("=", 1) for item in args.metadata_column)
    unknown = set(metadata) - set(METADATA)
    if unknown:
        parser.error(f"unknown metadata field(s) {sorted(unknown)}; use {', '.join(METADATA)}")
    mappings = [_mapping(parser, m) for m in settings.get("mappings", [])]
    if args.topic:
        if not args.table:
            parser.error("--topic needs --table")
        mappings.append(TopicMapping(args.topic, args.table, metadata))
    required = {
        "bootstrap_servers": args.bootstrap_servers or settings.get("bootstrap_servers"),
        "group_id": args.group_id or settings.get("group_id"),
        "server_url": args.server_url or settings.get("server_url"),
    }
    missing = [f"--{k.replace('_', '-')}" for k, v in required.items() if not v]
    if missing or not mappings:
        parser.error(f"missing: {', '.join(missing) or '--topic/--table or mappings in --config'}")
    if args.session_timeout <= 0 or args.broker_timeout <= 0:
        parser.error("--session-timeout and --broker-timeout must be positive")
    group_id = str(required["group_id"])
    instance_id = args.instance_id
    if instance_id is None:
        instance_id = settings.get("instance_id", default_instance_id(group_id))
    return BridgeConfig(
        bootstrap_servers=str(required["bootstrap_servers"]),
        group_id=group_id,
        server_url=str(required["server_url"]),
        mappings=tuple(mappings),
        token=args.token or settings.get("token"),
        dlq_topic=args.dlq_topic or settings.get("dlq_topic"),
        max_client_lag=args.max_client_lag,
        commit_interval=args.commit_interval,
        auto_offset_reset=args.auto_offset_reset,
        instance_id=instance_id or None,
        session_timeout=args.session_timeout,
        broker_timeout=args.broker_timeout,
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    config = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        KafkaBridge(config).run(stop)
    except BridgeError as exc:
        log.error("%s", exc)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    run_entry_point(main)
