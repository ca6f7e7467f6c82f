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
PINNED = re.compile(r"^[\w./-]+:v?\d+(\.\d+)+[\w.-]*$")


def test_the_stack_has_every_component() -> None:
    assert {
        "kafka",
        "spark-master",
        "spark-worker",
        "postgres",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    } <= set(SERVICES)
    assert "KRaft" in (REPO_ROOT / "docker-compose.yml").read_text()
    assert SERVICES["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


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
    assert airflow["PLATFORM_WAREHOUSE"] == "/data/warehouse"
    assert airflow["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/platform/dags"
    # The DAGs and jobs expect the project layout under /opt/platform.
    mounts = {v.split(":")[1] for v in SERVICES["airflow-scheduler"]["volumes"]}
    assert {"/opt/platform/jobs", "/opt/platform/dags", "/opt/platform/plugins"} <= mounts
    assert "/data/warehouse" in mounts
    assert "%3A%2F%2F" in airflow["AIRFLOW_CONN_SPARK_DEFAULT"]  # encoded, or it falls to YARN


def test_no_secrets_in_the_file() -> None:
    text = (REPO_ROOT / "docker-compose.yml").read_text()
    assert "${POSTGRES_PASSWORD:?" in text and "${AIRFLOW_JWT_SECRET:?" in text
    for service in SERVICES.values():
        for key, value in service.get("environment", {}).items():
            if any(word in key for word in ("PASSWORD", "SECRET")):
                assert str(value).startswith("${"), key


def test_host_ports_do_not_clash() -> None:
    ports: list[str] = []
    for service in SERVICES.values():
        for mapping in service.get("ports", []):
            ports.append(str(mapping).split(":")[0])
    assert len(ports) == len(set(ports)), ports


def test_compose_file_is_where_readme_says() -> None:
    assert Path(REPO_ROOT / "docker-compose.yml").is_file()
    assert "docker-compose.yml" in (REPO_ROOT / "README.md").read_text()


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
