"""One set of Kafka client settings (``PLATFORM_KAFKA_*``), two clients: librdkafka
(the driver's tools: admin, producers, dead letters, the output topic) and Java's
(Spark's Kafka source). Most settings have one name in both. Credentials and TLS
files do not: users give librdkafka's names, and Spark's client gets the Java
equivalent. A setting only one client knows never reaches the other (librdkafka
refuses an unknown setting; Java ignores it and connects without credentials).
"""

from __future__ import annotations

from collections.abc import Mapping

from jobs.errors import ConfigError

# librdkafka's names with no Java equivalent of the same name (translated below).
LIBRDKAFKA_ONLY = frozenset(
    {
        "sasl.username",
        "sasl.password",
        "sasl.mechanisms",  # librdkafka's alias of sasl.mechanism
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "enable.ssl.certificate.verification",
        "ssl.ca.pem",
        "ssl.certificate.pem",
        "ssl.key.pem",
    }
)
# Java's names librdkafka does not know (or reads otherwise: its keystore is
# PKCS#12 only, so keystores are Spark's; the tools take ssl.certificate/key).
JAVA_ONLY = frozenset(
    {
        "sasl.jaas.config",
        "sasl.client.callback.handler.class",
        "ssl.protocol",
        "ssl.enabled.protocols",
        "ssl.provider",
        "ssl.keymanager.algorithm",
        "ssl.trustmanager.algorithm",
        "ssl.secure.random.implementation",
        "security.providers",
        "default.api.timeout.ms",  # the Java client's API calls (Spark's offset lookups)
    }
)
JAVA_ONLY_PREFIXES = ("ssl.truststore.", "ssl.keystore.", "sasl.login.", "sasl.kerberos.min.")
JAAS_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def for_librdkafka(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings librdkafka is given."""
    return {key: value for key, value in settings.items() if not _java_only(key)}


def _java_only(key: str) -> bool:
    return key in JAVA_ONLY or key.startswith(JAVA_ONLY_PREFIXES)


def for_java(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings Java's client is given (Spark's source: as ``kafka.<setting>``)."""
    java = {key: value for key, value in settings.items() if key not in LIBRDKAFKA_ONLY}
    mechanism = settings.get("sasl.mechanism") or settings.get("sasl.mechanisms")
    if mechanism:
        java["sasl.mechanism"] = mechanism
    user, password = settings.get("sasl.username"), settings.get("sasl.password")
    if (user is None) != (password is None):
        raise ConfigError(
            "PLATFORM_KAFKA_SASL_USERNAME and PLATFORM_KAFKA_SASL_PASSWORD must be set together"
        )
    if user is not None and password is not None and "sasl.jaas.config" not in settings:
        module = JAAS_LOGIN_MODULES.get((mechanism or "").upper())
        if module is None:
            raise ConfigError(
                "PLATFORM_KAFKA_SASL_USERNAME/_PASSWORD need PLATFORM_KAFKA_SASL_MECHANISM "
                f"PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (got {mechanism!r}); for another "
                "mechanism give Spark's client PLATFORM_KAFKA_SASL_JAAS_CONFIG as well"
            )
        java["sasl.jaas.config"] = (
            f'{module} required username="{jaas_quoted(user)}" password="{jaas_quoted(password)}";'
        )
    if java.get("ssl.endpoint.identification.algorithm") == "none":
        java["ssl.endpoint.identification.algorithm"] = ""  # Java's "no host check"
    ca = settings.get("ssl.ca.location")
    if ca and "ssl.truststore.location" not in settings:
        java["ssl.truststore.type"] = "PEM"  # Java reads a PEM file as a trust store
        java["ssl.truststore.location"] = ca
    for pem in ("ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem"):
        if pem in settings:
            raise ConfigError(
                f"PLATFORM_KAFKA_{pem.upper().replace('.', '_')} (inline PEM) reaches only "
                "the platform's tools: give a file instead (PLATFORM_KAFKA_SSL_CA_LOCATION), "
                "or Spark's client its own PLATFORM_KAFKA_SSL_TRUSTSTORE_*/_KEYSTORE_* as well"
            )
    if settings.get("ssl.certificate.location") and "ssl.keystore.location" not in settings:
        raise ConfigError(
            "PLATFORM_KAFKA_SSL_CERTIFICATE_LOCATION (a client certificate) reaches only the "
            "platform's tools: give Spark's client PLATFORM_KAFKA_SSL_KEYSTORE_LOCATION "
            "(and _TYPE, _PASSWORD) as well"
        )
    return java


def jaas_quoted(value: str) -> str:
    """A value inside a JAAS option's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
