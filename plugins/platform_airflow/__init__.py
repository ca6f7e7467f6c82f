"""Airflow integration of the platform: hooks talk to the platform, operators
compose hooks, sensors wait. Airflow puts ``plugins/`` on ``sys.path``."""

__all__ = [
    "hooks",
    "operators",
    "sensors",
]
