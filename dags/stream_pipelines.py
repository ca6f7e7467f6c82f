"""Airflow DAGs ``stream_<application_id>`` (and ``health_<application_id>``) for every
pipeline in include/pipelines. The factory lives in include/dag_factory.py."""

from include.dag_factory import stream_dags

globals().update(stream_dags())
