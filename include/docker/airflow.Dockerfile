# Airflow 3 for the production-like stack: the official image plus Java (the Spark
# driver runs in the worker in client mode) and the platform's pinned packages.
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
USER airflow
COPY requirements.txt constraints.txt /tmp/platform/
RUN pip install --no-cache-dir -r /tmp/platform/requirements.txt -c /tmp/platform/constraints.txt
