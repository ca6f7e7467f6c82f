"""One set of PLATFORM_KAFKA_* settings, translated for each Kafka client."""

from __future__ import annotations

import pytest

from jobs.errors import ConfigError
from jobs.kafka_settings import for_java, for_librdkafka

SASL = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "alice",
    "sasl.password": 'a"b\\c',
    "ssl.ca.location": "/etc/ca.pem",
}


def test_librdkafka_gets_its_own_names_and_no_java_ones() -> None:
    java_only = {
        "sasl.jaas.config": "x required;",
        "ssl.truststore.location": "/t.jks",
        "ssl.truststore.certificates": "-----BEGIN",
        "ssl.keystore.type": "JKS",
        "sasl.login.connect.timeout.ms": "1000",
        "ssl.enabled.protocols": "TLSv1.3",
    }
    assert for_librdkafka({**SASL, **java_only}) == SASL


def test_no_host_check_has_each_clients_spelling() -> None:
    given = {"ssl.endpoint.identification.algorithm": "none"}
    assert for_librdkafka(given) == given
    assert for_java(given) == {"ssl.endpoint.identification.algorithm": ""}


def test_java_gets_a_jaas_login_and_a_pem_trust_store() -> None:
    assert for_java(SASL) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="a\\"b\\\\c";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/ca.pem",
    }


def test_java_settings_given_explicitly_win() -> None:
    given = {**SASL, "sasl.jaas.config": "mine required;", "ssl.truststore.location": "/t.jks"}
    java = for_java(given)
    assert java["sasl.jaas.config"] == "mine required;"
    assert java["ssl.truststore.location"] == "/t.jks" and "ssl.truststore.type" not in java


def test_librdkafkas_mechanisms_alias_reaches_java_as_mechanism() -> None:
    java = for_java({"sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p"})
    assert java["sasl.mechanism"] == "PLAIN" and "sasl.mechanisms" not in java
    assert java["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.")


@pytest.mark.parametrize(
    "given, message",
    [
        ({"sasl.username": "u"}, "must be set together"),
        ({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"}, "JAAS_CONFIG"),
        ({"ssl.certificate.location": "/c.pem"}, "KEYSTORE_LOCATION"),
        ({"ssl.ca.pem": "-----BEGIN CERTIFICATE-----"}, "SSL_CA_PEM"),
    ],
)
def test_what_cannot_be_translated_is_refused(given: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        for_java(given)


def test_sparks_source_gets_short_admin_timeouts_unless_the_user_sets_one() -> None:
    from jobs.kafka_source.spark_kafka import source_options

    plain = source_options("b:9092", {})
    assert plain["kafka.default.api.timeout.ms"] == "15000"
    assert plain["kafka.request.timeout.ms"] == "10000"
    assert plain["kafka.isolation.level"] == "read_committed"
    own = source_options("b:9092", {"request.timeout.ms": "40000"})
    assert own["kafka.request.timeout.ms"] == "40000"
    assert "kafka.default.api.timeout.ms" not in own  # Kafka's own default (60 s) >= 40 s


def test_sparks_source_polls_many_records_at_once_unless_the_user_sets_it() -> None:
    from jobs.kafka_source.spark_kafka import source_options

    plain = source_options("b:9092", {})
    assert plain["kafka.max.poll.records"] == "10000"
    assert plain["kafka.max.partition.fetch.bytes"] == str(4 * 1024 * 1024)
    own = source_options("b:9092", {"max.poll.records": "500"})
    assert own["kafka.max.poll.records"] == "500"
    assert own["kafka.max.partition.fetch.bytes"] == str(4 * 1024 * 1024)


def test_the_sources_admin_timeout_reaches_java_only() -> None:
    """librdkafka has no ``default.api.timeout.ms`` and refuses a client given one:
    every command failed before it ran."""
    from confluent_kafka.admin import AdminClient

    from jobs.kafka_admin import client_config
    from jobs.kafka_source.spark_kafka import source_options

    given = {"default.api.timeout.ms": "3000", "request.timeout.ms": "2000"}
    AdminClient(client_config("127.0.0.1:1", given))  # refused before the fix
    options = source_options("b:9092", given)
    assert options["kafka.default.api.timeout.ms"] == "3000"
    assert options["kafka.request.timeout.ms"] == "2000"
