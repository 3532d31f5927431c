"""A Kafka-protocol broker for tests: librdkafka's mock cluster, kept alive in this process.

Prints one JSON line {"bootstrap_servers": "..."} and serves until killed.
"""

import logging
import re
import sys
import time

import orjson
from confluent_kafka import Producer

found: dict[str, str] = {}


class _Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        match = re.search(r"replaced with (\S+)", record.getMessage())
        if match and "Mock cluster enabled" in record.getMessage():
            found["bootstrap_servers"] = match.group(1)


logger = logging.getLogger("mock")
logger.addHandler(_Capture())
logger.setLevel(logging.DEBUG)
holder = Producer({"test.mock.num.brokers": 3, "bootstrap.servers": "unused", "debug": "broker",
                   "logger": logger})  # fmt: skip
deadline = time.monotonic() + 30
while "bootstrap_servers" not in found and time.monotonic() < deadline:
    holder.poll(0.1)
if "bootstrap_servers" not in found:
    sys.exit("the mock cluster did not report its address")
print(orjson.dumps(found).decode(), flush=True)
while True:
    holder.poll(1.0)
