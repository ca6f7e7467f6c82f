# Airflow 3 for the production-like stack: the official image plus Java (the Spark
# driver runs in the worker in client mode), the platform's pinned packages and its
# pinned JVM jars (include/jvm/pom.xml, resolved with Maven at build time into
# PLATFORM_JARS_DIR: Spark's Kafka source, handed to every spark-submit), plus the
# platform's own classes (include/jvm/sources, compiled against pyspark: a JDK).
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven \
    && rm -rf /var/lib/apt/lists/*
COPY include/jvm /tmp/platform-jvm
RUN mvn -q -B -f /tmp/platform-jvm/pom.xml -Djars.dir=/opt/platform-jars package \
    && chmod -R a+rX /opt/platform-jars && rm -rf /root/.m2
ENV PLATFORM_JARS_DIR=/opt/platform-jars
USER airflow
COPY requirements.txt constraints.txt /tmp/platform/
RUN pip install --no-cache-dir -r /tmp/platform/requirements.txt -c /tmp/platform/constraints.txt
RUN /tmp/platform-jvm/build_sources.sh python /tmp/platform-sources.jar
USER root
RUN mv /tmp/platform-sources.jar /opt/platform-jars/spark/platform-sources.jar \
    && chmod a+r /opt/platform-jars/spark/platform-sources.jar && rm -rf /tmp/platform-jvm
USER airflow
