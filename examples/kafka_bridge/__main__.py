"""``python -m examples.kafka_bridge``: run the bridge until SIGTERM or Ctrl-C.

One topic:   --bootstrap-servers H:P --topic T --table DB.S.T --server-url URL --group-id G
Many topics: --config bridge.json  with
    {"bootstrap_servers": "...", "group_id": "...", "server_url": "...", "dlq_topic": "...",
     "mappings": [{"topic": "orders", "table": "SHOP.PUBLIC.ORDERS",
                   "metadata_columns": {"offset": "KAFKA_OFFSET"}}]}
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

import orjson

from examples.kafka_bridge.bridge import METADATA, BridgeConfig, KafkaBridge, TopicMapping


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
    args = parser.parse_args(argv)
    settings: dict = orjson.loads(args.config.read_bytes()) if args.config else {}
    metadata = dict(item.split("=", 1) for item in args.metadata_column)
    unknown = set(metadata) - set(METADATA)
    if unknown:
        parser.error(f"unknown metadata field(s) {sorted(unknown)}; use {', '.join(METADATA)}")
    mappings = [TopicMapping(**m) for m in settings.get("mappings", [])]
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
    return BridgeConfig(
        bootstrap_servers=str(required["bootstrap_servers"]),
        group_id=str(required["group_id"]),
        server_url=str(required["server_url"]),
        mappings=tuple(mappings),
        token=args.token or settings.get("token"),
        dlq_topic=args.dlq_topic or settings.get("dlq_topic"),
        max_client_lag=args.max_client_lag,
        commit_interval=args.commit_interval,
        auto_offset_reset=args.auto_offset_reset,
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    config = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    KafkaBridge(config).run(stop)


if __name__ == "__main__":
    main()
