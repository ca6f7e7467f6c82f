"""The Spark-side package: pipelines, the Kafka source, Delta writes, operations."""
