"""Exactly-once publishing of an application's state changes to a Kafka topic."""
