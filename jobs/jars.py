"""The JVM jars the platform adds to pyspark's own, resolved and built once by ``make setup``.

``include/jvm/pom.xml`` pins them; ``mvn`` copies them into ``.jvm/`` (or
``$PLATFORM_JARS_DIR``): ``spark/`` is what every Spark session of the platform
loads (Spark's Kafka source, Delta, and ``platform-sources.jar``: the platform's
own classes in ``include/jvm/sources``, compiled against pyspark's jars),
``kafka/`` the embedded Apache Kafka broker's classpath. Nothing is resolved at
run time: a missing folder is one error naming the command that fills it.
"""

from __future__ import annotations

from pathlib import Path

from jobs.errors import ConfigError
from jobs.settings import jars_dir

ENV = "PLATFORM_JARS_DIR"
SETUP_HINT = "run make setup (it resolves include/jvm/pom.xml with mvn into .jvm/)"
# The platform's own classes (include/jvm/sources), compiled by make setup.
SOURCES_JAR = "platform-sources.jar"


def _jars(group: str) -> list[Path]:
    folder = jars_dir() / group
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not found:
        raise ConfigError(f"no jars in {folder}: {SETUP_HINT}")
    return found


def spark_jars() -> list[Path]:
    """Every jar a Spark session of the platform adds (``spark.jars``, ``--jars``)."""
    found = _jars("spark")
    if not any(jar.name == SOURCES_JAR for jar in found):
        raise ConfigError(
            f"no {SOURCES_JAR} in {jars_dir() / 'spark'}: run make setup (it compiles "
            "include/jvm/sources with include/jvm/build_sources.sh)"
        )
    return found


def broker_classpath() -> list[Path]:
    """The embedded broker's classpath (its own JVM, apart from Spark's)."""
    return _jars("kafka")


def tools_classpath() -> list[Path]:
    """Kafka's own command-line tools (``kafka-consumer-groups``, ...)."""
    return _jars("kafka-tools")
