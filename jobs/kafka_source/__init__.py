"""Kafka for Spark: ``spark_kafka`` holds the options of every read with Spark's own
Kafka source; ``offsets`` is pure planning, importable without Spark (status,
planners and the Airflow hook use it).
"""

__all__ = [
    "offsets",
    "spark_kafka",
]
