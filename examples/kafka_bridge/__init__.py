"""Kafka -> streaming ingest channels, exactly once. See README.md beside this file."""

from examples.kafka_bridge.bridge import BridgeConfig, KafkaBridge, TopicMapping

__all__ = ["BridgeConfig", "KafkaBridge", "TopicMapping"]
