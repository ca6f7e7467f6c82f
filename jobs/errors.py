"""Exceptions the platform raises on purpose, and the one line and exit code a
failed command reports for any exception (``failure``: the CLI's and the warm
driver's).

Every ``PlatformError`` carries a message meant for the user: the CLI prints it
as one line and exits non-zero, without a traceback.
"""

from __future__ import annotations

import re
import sys

EXIT_ERROR = 2  # an expected failure: its message is the whole story
EXIT_CRASH = 1  # anything else
# An error raised inside a Spark task or the source comes back wrapped in Java and
# Python tracebacks; this finds the platform's own one-line message in it (the
# JVM sources' user errors are ``platform.streaming.PlatformError``).
# How delta-rs (object_store) reports a store it could not use.
STORE_ERROR = re.compile(r"^Generic S3 error\b")
WRAPPED_ERROR = re.compile(
    r"(?:jobs\.errors\.\w+Error|platform\.streaming\.PlatformError): (.+?)(?:\n|$| SQLSTATE)"
)
# Spark's own errors start with their class: "[ARITHMETIC_OVERFLOW] long overflow. ..."
SPARK_ERROR = re.compile(r"\[([A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)*)\] ([^\n]{0,300})")
# A stream's batch function that raised: Spark wraps the Python traceback in its
# own message ([FOREACH_BATCH_USER_FUNCTION_ERROR]); the cause is the traceback's
# exception line, and for a Java call that failed, the line after it.
TRACEBACK = "Traceback (most recent call last):\n"
JAVA_CALL_FAILED = "Py4JJavaError"
SQLSTATE = re.compile(r"\s*SQLSTATE: \S+.*$")


class PlatformError(Exception):
    """An expected failure with a message for the user."""


class LockedError(PlatformError):
    """Another run or operation holds the application."""


class ConfigError(PlatformError):
    """A bad argument, environment variable or pipeline definition."""


def refused(what: str, form: str, raw: str) -> ConfigError:
    """The one line a bad value gets: what (a variable, a flag), the form it takes,
    the value given."""
    return ConfigError(f"{what} must be {form}, got {raw!r}")


class SourceError(PlatformError):
    """The Kafka source cannot deliver the exact range it was asked for."""


class KafkaUnavailableError(SourceError):
    """Kafka did not answer in time (brokers down, no leader). ``while_running``: it
    stopped a query that had reached Kafka, so a continuous run may wait for the
    brokers and restart (``jobs/streaming/outage.py``); at a run's start it is
    more likely a wrong address, and the run stops at once."""

    def __init__(self, message: str, while_running: bool = False, detail: str = "") -> None:
        super().__init__(message)
        self.while_running = while_running
        self.detail = detail or message  # what did not answer, for the wait's log line


class BrokerError(PlatformError):
    """The embedded broker cannot be started, stopped or reached."""


class FencedError(PlatformError):
    """A writer of an older epoch tried to commit after the epoch was bumped."""


class LeaseError(PlatformError):
    """The application's lease is held by another, or this holder lost it."""


class LeaseLostError(LeaseError):
    """This holder may not commit any more: its lease expired or was taken over."""


class ConsistencyError(PlatformError):
    """A batch's bookkeeping does not add up; nothing of it was published."""


class OutputError(PlatformError):
    """The output topic cannot be brought up to date exactly; nothing half-published."""


def failure(exc: BaseException) -> tuple[int, str]:
    """(exit code, one line) of a failed command: the platform's own errors, also
    when Spark wraps them, are expected (2); anything else is a crash (1)."""
    admin = sys.modules.get("jobs.kafka_admin")  # loaded if a Kafka client ran
    kafka_error = isinstance(exc, (SourceError, OutputError))
    refused = admin.login_refused() if admin is not None and kafka_error else None
    if isinstance(exc, PlatformError):
        return int(getattr(exc, "exit_code", EXIT_ERROR)), str(exc) + (refused or "")
    found = WRAPPED_ERROR.search(str(exc)) or WRAPPED_ERROR.search(jvm_trace(exc))
    if found:
        return EXIT_ERROR, found.group(1).strip()
    if isinstance(exc, OSError) and STORE_ERROR.match(str(exc)):
        # delta-rs' own reads and commits, which do not go through jobs/warehouse.py.
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return EXIT_ERROR, (
            f"the object store did not answer or refused a request ({first}): check "
            "AWS_ENDPOINT_URL, that the store is up and the keys "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); nothing of an unfinished batch or "
            "operation was committed (a run replays it)"
        )
    return EXIT_CRASH, crash_summary(exc)


def jvm_trace(exc: BaseException) -> str:
    """The Java exception and its causes behind a pyspark error (kept as text when
    pyspark converted it): where a JVM source's error is when Spark's message has
    only the innermost message, not its class."""
    trace = getattr(exc, "_stackTrace", None)
    return trace if isinstance(trace, str) else ""


def crash_summary(exc: BaseException) -> str:
    """One line for an unexpected failure: what failed and what happens next."""
    cause = python_cause(str(exc))
    text = cause or str(exc)
    spark = SPARK_ERROR.search(text)
    what = (
        f"Spark failed with [{spark.group(1)}] {spark.group(2).strip()}"
        if spark
        else cause[:300] or f"{type(exc).__name__}: {(text.strip().splitlines() or [''])[0][:300]}"
    )
    return (
        f"{what}; nothing of the unfinished batch or operation was committed (a run replays "
        "it; the traceback above has the details)"
    )


def python_cause(text: str) -> str:
    """The exception line of the last Python traceback inside ``text`` (its class
    without the module), or "" when there is none."""
    start = text.rfind(TRACEBACK)
    if start < 0:
        return ""
    lines = text[start + len(TRACEBACK) :].splitlines()
    at = next((i for i, line in enumerate(lines) if line and not line[0].isspace()), None)
    if at is None:
        return ""
    cause = lines[at]
    following = lines[at + 1] if at + 1 < len(lines) else ""
    if JAVA_CALL_FAILED in cause and following.startswith(": "):
        cause = following[2:]
    name, colon, message = cause.partition(": ")
    if " " not in name:  # a class name: keep its last part
        cause = name.rsplit(".", 1)[-1] + colon + message
    return SQLSTATE.sub("", cause).strip()
