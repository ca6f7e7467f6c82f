"""Airflow DAGs ``dimension_<name>`` for every dimension in include/dimensions: the
batch jobs that keep the tables streams enrich from. The factory lives in
include/dag_factory.py."""

from include.dag_factory import dimension_dags

globals().update(dimension_dags())
