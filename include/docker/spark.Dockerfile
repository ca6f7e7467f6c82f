# Spark master/worker for the production-like stack. Executors run the job's Python
# code, so this image has the driver's Python (3.11, as the Airflow image) and the
# same pinned pyspark (Spark 4.2.0 itself: its bin/spark-class starts the daemons),
# pyarrow and deltalake; Kafka is read by Spark's JVM source (its jars come with
# each job), so no Kafka client. PLATFORM_SPARK_PYTHON names this python3.
FROM python:3.11.14-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl procps \
    && rm -rf /var/lib/apt/lists/*
COPY requirements.txt constraints.txt /tmp/platform/
RUN pip install --no-cache-dir -c /tmp/platform/constraints.txt \
        pyspark pyarrow pandas numpy PyYAML deltalake protobuf obstore \
    && ln -s "$(python3 -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')" /opt/spark \
    && rm -rf /tmp/platform
ENV SPARK_HOME=/opt/spark PYSPARK_PYTHON=python3
# The Airflow image's user (uid 50000, group 0), as the driver's.
RUN useradd --create-home --uid 50000 --gid 0 spark
USER 50000:0
