"""Airflow DAGs maintenance_rewind, maintenance_rebuild, maintenance_backfill,
maintenance_tables and recovery. The factory lives in include/maintenance_dags.py."""

from include.maintenance_dags import maintenance_dags

globals().update(maintenance_dags())
