"""Exceptions the platform raises on purpose.

Every ``PlatformError`` carries a message meant for the user: the CLI prints it
as one line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class PlatformError(Exception):
    """An expected failure with a message for the user."""


class ConfigError(PlatformError):
    """A bad argument, environment variable or pipeline definition."""


class SourceError(PlatformError):
    """The Kafka source cannot deliver the exact range it was asked for."""


class BrokerError(PlatformError):
    """The embedded broker cannot be started, stopped or reached."""


class FencedError(PlatformError):
    """A writer of an older epoch tried to commit after the epoch was bumped."""


class ConsistencyError(PlatformError):
    """A batch's bookkeeping does not add up; nothing of it was published."""


class OutputError(PlatformError):
    """The output topic cannot be brought up to date exactly; nothing half-published."""
