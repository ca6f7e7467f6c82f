"""Credentials reach both Kafka clients: a broker that requires SASL/PLAIN logins,
and one set of PLATFORM_KAFKA_* settings in librdkafka's names. The platform's
tools (librdkafka) and Spark's Kafka source (Java, given the equivalent JAAS
login) both authenticate; a wrong password is one error line."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from jobs import broker as embedded
from jobs import kafka_admin
from jobs.broker import BrokerInfo
from jobs.settings import load_settings
from tests.conftest import pipeline_file, produce, recent_clicks, run_jobs
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
# A password with characters a JAAS option must quote.
USERS = {"broker": "broker-secret", "alice": 'p@ss "word" \\ 1'}


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    data_dir = tmp_path_factory.mktemp("sasl-broker")
    info = embedded.start(data_dir, embedded.find_free_port(), sasl_users=USERS)
    yield info
    embedded.stop(data_dir)


def client_env(password: str) -> dict[str, str]:
    return {
        "PLATFORM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "PLATFORM_KAFKA_SASL_MECHANISM": "PLAIN",
        "PLATFORM_KAFKA_SASL_USERNAME": "alice",
        "PLATFORM_KAFKA_SASL_PASSWORD": password,
    }


def test_one_set_of_credentials_serves_the_tools_and_sparks_source(
    sasl_broker: BrokerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in client_env(USERS["alice"]).items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    config = kafka_admin.client_config(sasl_broker.bootstrap_servers, settings.kafka_client)
    topic = "clicks_sasl"
    kafka_admin.create_topic(kafka_admin.admin(config), topic, 2)
    values = recent_clicks(600, 3) + [b"not json"]
    produce(config, topic, values)
    pipeline = pipeline_file(tmp_path, "user_clicks", topic)
    run_settings = dataclasses.replace(
        settings, bootstrap_servers=sasl_broker.bootstrap_servers, warehouse=tmp_path / "wh"
    )

    done = run_jobs(pipeline, run_settings, "run", "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    expected, dead, late = clicks_per_window([values])
    assert late == 0 and dead == 1
    state = DeltaTable(str(tmp_path / "wh" / "user_clicks" / "state")).to_pyarrow_table()
    assert state_as_counter(state.to_pylist(), "clicks") == expected

    monkeypatch.setenv("PLATFORM_KAFKA_SASL_PASSWORD", "wrong")
    refused = run_jobs(pipeline, run_settings, "run", "--quiet")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0
    assert len(errors) == 1, refused.stderr[-3000:]
    assert "the broker refused the Kafka login" in errors[0], errors[0]
    assert "Authentication failed" in errors[0] and "SASL_PASSWORD" in errors[0], errors[0]
