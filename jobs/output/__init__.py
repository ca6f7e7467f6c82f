"""Exactly-once publishing of an application's state changes to a Kafka topic."""

__all__ = [
    "bookmark",
    "changes",
    "encoding",
    "publisher",
]
