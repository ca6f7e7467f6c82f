"""The Spark SQL settings that can change a result, pinned by the platform.

A replay, a rebuild or a backfill must compute what the batch computed. Spark takes
these settings from wherever its host put them (``spark-defaults.conf``, ``--conf``,
a notebook's session), so two drivers could judge the same record differently:
ANSI mode turns an overflow into an error (a dead letter) or a wrapped number, the
time parser policy and the session time zone change every parsed time. The
platform sets each one on its sessions (``jobs/streaming/spark.py``), refuses a
session that computes otherwise, and records them with the resolved pipeline
(``jobs/resolution.py``), where a later run, operation or warm driver checks them.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobs.errors import ConfigError

# Each at Spark 4.2's own default, except the time zone.
PINNED: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "true",
    "spark.sql.storeAssignmentPolicy": "ANSI",
    "spark.sql.legacy.timeParserPolicy": "CORRECTED",
    "spark.sql.timestampType": "TIMESTAMP_LTZ",
    "spark.sql.decimalOperations.allowPrecisionLoss": "true",
    "spark.sql.legacy.allowNegativeScaleOfDecimal": "false",
    "spark.sql.parser.escapedStringLiterals": "false",
    "spark.sql.ansi.doubleQuotedIdentifiers": "false",
    "spark.sql.caseSensitive": "false",
    "spark.sql.mapKeyDedupPolicy": "EXCEPTION",
    "spark.sql.json.enablePartialResults": "true",
    "spark.sql.variant.allowDuplicateKeys": "false",
    "spark.sql.legacy.sizeOfNull": "true",
    "spark.sql.legacy.castComplexTypesToString.enabled": "false",
    "spark.sql.legacy.typeCoercion.datetimeToString.enabled": "false",
    "spark.sql.legacy.followThreeValuedLogicInArrayExists": "true",
    "spark.sql.legacy.negativeIndexInArrayInsert": "false",
    "spark.sql.legacy.lpadRpadAlwaysReturnString": "false",
    "spark.sql.legacy.allowZeroIndexInFormatString": "false",
    "spark.sql.legacy.codingErrorAction": "false",
    "spark.sql.legacy.javaCharsets": "false",
}
# Spark's switches back to an older behaviour: one the platform does not pin may
# not be set to anything but its default.
LEGACY = "spark.sql.legacy."


def check_session(values: Mapping[str, str | None], legacy: Mapping[str, str]) -> None:
    """Refuse a session that would compute otherwise. ``values``: the session's
    value of each pinned setting; ``legacy``: the other ``spark.sql.legacy.*``
    settings it sets away from Spark's default."""
    for key, wanted in PINNED.items():
        if values.get(key) != wanted:
            raise ConfigError(
                f"this Spark session has {key}={values.get(key)}: the platform computes with "
                f"{key}={wanted}, or a replay would judge records otherwise (remove it from "
                "spark-defaults.conf, --conf or the session)"
            )
    for key, value in sorted(legacy.items()):
        raise ConfigError(
            f"this Spark session sets {key}={value}: a legacy behaviour the platform does "
            "not pin would change results between a batch and its replay (remove it from "
            "spark-defaults.conf, --conf or the session)"
        )


def check_recorded(origin: str, recorded: Mapping[str, str]) -> None:
    """Refuse to compute a definition whose stored copy was computed with other
    settings (an older platform that pinned others): a replay would differ."""
    for key, value in sorted(recorded.items()):
        if PINNED.get(key) != value:
            raise ConfigError(
                f"{origin}: its batches were computed with {key}={value} and this platform "
                f"computes with {key}={PINNED.get(key)}: a replay would judge records "
                "otherwise; run it with the platform version that recorded it, or start a new "
                "pipeline version (version: N+1)"
            )
