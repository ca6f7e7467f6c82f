"""Kafka for Spark 4 as a Python Data Source (no Spark Kafka connector jar exists here).

``datasource`` is the Spark side; ``offsets`` is pure planning, importable without
Spark (status, planners and the Airflow hook use it).
"""
