"""Kafka for Spark 4 as a Python Data Source (no Spark Kafka connector jar exists here)."""

from jobs.kafka_source.datasource import KafkaDataSource

__all__ = ["KafkaDataSource"]
