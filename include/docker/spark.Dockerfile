# Spark master/worker for the production-like stack: the official Spark image plus
# the Python packages the Kafka source needs on executors (confluent-kafka, pyarrow).
FROM apache/spark:4.2.0-scala2.13-java21-python3-ubuntu
USER root
COPY requirements.txt constraints.txt /tmp/platform/
RUN pip install --no-cache-dir -c /tmp/platform/constraints.txt \
        confluent-kafka pyarrow pandas numpy PyYAML deltalake \
    && rm -rf /tmp/platform
USER spark
