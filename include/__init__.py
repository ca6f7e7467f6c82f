"""Pipeline definitions, DAG factories, sample data and the local servers' tools."""

__all__ = [
    "dag_factory",
    "dashboard_preview",
    "local_airflow",
    "local_spark",
    "maintenance_dags",
    "sample_data",
]
