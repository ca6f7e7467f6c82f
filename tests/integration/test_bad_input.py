"""Worse than crashes: poison records, far-future and late event times, a topic
recreated under the application, retention during a read. Real broker, Spark and
Delta; expected values from plain Python over the produced events."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.delta.layout import AppLayout
from jobs.kafka_source.spark_kafka import read_range
from jobs.ledger import current_epoch
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings
from jobs.status import application_status
from jobs.streaming.run import run_pipeline
from tests.conftest import produce
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
PIPELINES = REPO_ROOT / "include" / "pipelines"


def rows(settings: Settings, app: str, name: str) -> list[dict[str, Any]]:
    return DeltaTable(str(settings.warehouse / app / name)).to_pyarrow_table().to_pylist()


def clicks_pipeline(topic: str, **changes: Any) -> Pipeline:
    return dataclasses.replace(load_pipeline("user_clicks", PIPELINES), topics=(topic,), **changes)


def click(user: str, ts: Any) -> bytes:
    return json.dumps({"user_id": user, "timestamp": ts}).encode()


def recreate(kafka_config: dict[str, str], topic: str, partitions: int) -> None:
    admin = AdminClient(kafka_config)
    admin.delete_topics([topic])[topic].result()
    deadline = time.time() + 30
    while topic in admin.list_topics(timeout=5).topics and time.time() < deadline:
        time.sleep(0.2)
    kafka_admin.create_topic(admin, topic, partitions)


def read_recreated_topic_from_its_start(pipeline: Pipeline, settings: Settings, topic: str) -> None:
    """The repair the error names: rewind --to-earliest --topics T --mode skip."""
    from jobs.operations.restart import plan_rewind
    from jobs.operations.runner import run_operation
    from jobs.operations.targets import TargetSpec

    run_operation(
        pipeline,
        settings,
        lambda: plan_rewind(
            pipeline, settings, "topic recreated", TargetSpec("earliest"), "skip", [topic]
        ),
        echo=lambda _line: None,
    )


def test_poison_and_far_future_records_are_dead_letters_not_failures(
    spark, settings, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    pipeline = clicks_pipeline(topic)
    now = int(time.time())
    good = [click(f"u{i % 5}", now - 100 + i % 60) for i in range(300)]
    poison = {
        click("u", 10**16): "is out of range",  # seconds * 10^6 overflows 64 bits
        click("u", -(10**16)): "is out of range",
        click("u", (now + 10 * 86400) * 1000): "ahead of the batch time",  # millis, not s
        click("u", now + 2 * 86400): "ahead of the batch time",
        click("u", -(10**12)): "is before 1000-01-01",
        click("u", 2**63 - 1): "is out of range",
        b'{"user_id": "u", "timestamp": 9223372036854775808}': "is not a bigint",
        b'{"user_id": "u", "timestamp": 1e400}': "is not a bigint",
        b'{"user_id": "\xff\xfe", "timestamp": 1700000000}': "not valid UTF-8",
    }
    produce(kafka_config, topic, [*good[:150], *poison, *good[150:]])
    run_pipeline(spark, pipeline, settings)
    # After the far-future records, later records must still count: the watermark
    # did not jump to the year 55,000.
    later = [click(f"u{i % 5}", now - 30 + i % 20) for i in range(100)]
    produce(kafka_config, topic, later)
    run_pipeline(spark, pipeline, settings)

    expected, _dead, late = clicks_per_window([good, later])
    assert late == 0
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    letters = {r["value"]: r["reason"] for r in rows(settings, "user_clicks", "dead_letter")}
    assert set(letters) == set(poison)
    for value, fragment in poison.items():
        assert fragment in letters[value], (value, letters[value])
    ledger = [r for r in rows(settings, "user_clicks", "_ledger") if r["entry_type"] == "batch"]
    assert sum(r["records_in"] for r in ledger) == len(good) + len(poison) + len(later)
    assert all(r["records_in"] == r["aggregated"] + r["dead_lettered"] for r in ledger)
    # Event times are bounded by the time of the batch that judged them: Spark's, in
    # its offset log (the ledger records it), the same on a replay.
    times = {r["batch_id"]: json.loads(r["details"])["batch_timestamp_ms"] for r in ledger}
    ahead = [r for r in rows(settings, "user_clicks", "dead_letter") if "ahead of" in r["reason"]]
    assert len(ahead) == 2
    for row in ahead:
        assert f"ahead of the batch time {spark_text(times[row['batch_id']])} (" in row["reason"]


def spark_text(ms: int) -> str:
    """A UTC timestamp as Spark casts it to a string (no trailing zeros)."""
    text = f"{datetime.datetime.fromtimestamp(ms // 1000, datetime.UTC):%Y-%m-%d %H:%M:%S}"
    return text + (f".{ms % 1000:03d}".rstrip("0") if ms % 1000 else "")


def test_a_topic_recreated_under_the_application_stops_it_with_the_repair(
    spark, settings, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    pipeline = clicks_pipeline(topic)
    now = int(time.time())
    before = [click(f"u{i}", now - i) for i in range(200)]
    produce(kafka_config, topic, before)
    run_pipeline(spark, pipeline, settings)

    recreate(kafka_config, topic, 1)  # fewer partitions, fewer records
    recreated = [click("v", now) for _ in range(10)]
    produce(kafka_config, topic, recreated)

    # Real Kafka gives the new topic a new id: that is the first check to catch it
    # (the offset checks catch it where a broker reports no ids).
    with pytest.raises(Exception, match=r"deleted and recreated since the application's cut"):
        run_pipeline(spark, pipeline, settings)
    problems = " ".join(application_status(pipeline, settings).problems)
    assert "rewind --to-earliest" in problems and "--mode skip" in problems and topic in problems

    # The repair it names: keep the state, read the new topic from its start. Status
    # then names no problem: the partition the new topic lacks is the old log's
    # (found by the random sequences: status compared the broker with the last
    # batch, of the deleted log, until the next batch).
    read_recreated_topic_from_its_start(pipeline, settings, topic)
    repaired = application_status(pipeline, settings)
    assert repaired.problems == []
    assert [(p.partition, p.committed, p.lag) for p in repaired.partitions] == [(0, 0, 10)]
    assert repaired.oldest_rewind_target is not None
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    assert repaired.oldest_rewind_target["epoch"] == current_epoch(layout)  # the repair
    more = [click("w", now) for _ in range(5)]
    produce(kafka_config, topic, more)
    run_pipeline(spark, pipeline, settings)
    expected, _dead, _late = clicks_per_window([before, recreated + more])
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    assert application_status(pipeline, settings).problems == []


def test_retention_during_a_read_fails_the_read_instead_of_a_short_range(
    spark, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    """Retention deletes records after the platform checked the log start and before
    Spark fetched them: ``failOnDataLoss`` (set on every read) turns that into an
    error, where Spark's default would skip ahead and commit a short range."""
    topic = new_topic(1)
    produce(kafka_config, topic, [b"x" * 100] * 5000)
    admin = AdminClient(kafka_config)
    for future in admin.delete_records([TopicPartition(topic, 0, 4000)]).values():
        future.result()
    records = read_range(
        spark, kafka_config["bootstrap.servers"], {}, {(topic, 0): 100}, {(topic, 0): 5000}
    )
    with pytest.raises(Exception, match=r"(?i)data may have been lost|out of range|fetch offset"):
        records.count()


def test_late_records_after_a_restart_are_dead_letters(
    spark, settings, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    pipeline = clicks_pipeline(topic, max_offsets_per_trigger=100)
    now = int(time.time()) // 60 * 60
    first = [click(f"u{i % 3}", now - 60 + i % 50) for i in range(250)]
    produce(kafka_config, topic, first)
    run_pipeline(spark, pipeline, settings)
    late = [click("late", now - 3600 + i) for i in range(7)]
    on_time = [click("u0", now - 5) for _ in range(5)]
    produce(kafka_config, topic, late + on_time)
    run_pipeline(spark, pipeline, settings)

    expected, _dead, late_count = clicks_per_window([first, late + on_time])
    assert late_count == len(late)
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    reasons = Counter(
        r["reason"].startswith("late: window ending ") and " closed at watermark " in r["reason"]
        for r in rows(settings, "user_clicks", "dead_letter")
    )
    assert reasons == Counter({True: len(late)})


def test_inventory_poison_values(spark, settings, kafka_config, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    pipeline = dataclasses.replace(load_pipeline("inventory", PIPELINES), topics=(topic,))
    base = {"sku": "S1", "kind": "receipt", "timestamp": 1700000000}
    good = [{**base, "qty": q} for q in (1, 2, 3)]
    bad = {
        json.dumps({**base, "qty": 2**62}).encode(): "beyond +-2^53",
        json.dumps({**base, "qty": -(2**63)}).encode(): "beyond +-2^53",
        # -qty overflows 64 bits: the expression fails on this record
        json.dumps(
            {**base, "kind": "sale", "qty": -(2**63)}
        ).encode(): "derived 'signed_qty' failed",
        json.dumps({**base, "qty": 1.5}).encode(): "is not a bigint",
        json.dumps({**base, "qty": "NaN"}).encode(): "is not a bigint",
        json.dumps({**base, "qty": [1]}).encode(): "is not a bigint",
        json.dumps({**base, "qty": 1, "kind": {"a": 1}}).encode(): "derived 'signed_qty' is null",
    }
    produce(kafka_config, topic, [json.dumps(g).encode() for g in good] + list(bad))
    run_pipeline(spark, pipeline, settings)
    state = rows(settings, "inventory", "state")
    assert [(r["sku"], r["quantity"], r["movements"]) for r in state] == [("S1", 6, 3)]
    letters = {r["value"]: r["reason"] for r in rows(settings, "inventory", "dead_letter")}
    assert set(letters) == set(bad)
    for value, fragment in bad.items():
        assert fragment in letters[value], (value, letters[value])


def test_a_backfill_keeps_the_streams_late_decisions(
    spark, settings, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    """Records the stream dead-lettered as late stay out of a backfill's state (the
    ledger tells each record's watermark): otherwise a record would be in two places,
    the dead letters and the state."""
    from jobs.operations.backfill import run_backfill
    from jobs.operations.targets import TargetSpec

    topic = new_topic(1)
    # Event time at most 1 s ahead of the batch's time: a record 60 s ahead is a dead
    # letter for the stream (whose batch starts well within 59 s, even on a loaded
    # machine: 20 s was not always enough), and would not be for a backfill run 60 s
    # later that judged it by its own clock.
    pipeline = clicks_pipeline(topic, max_offsets_per_trigger=100, max_ahead_seconds=1)
    now = int(time.time()) // 60 * 60
    first = [click(f"u{i % 3}", now - 60 + i % 50) for i in range(250)]
    ahead_at = int(time.time()) + 60
    ahead = [click("ahead", ahead_at)]
    produce(kafka_config, topic, first + ahead)
    run_pipeline(spark, pipeline, settings)
    late = [click("late", now - 3600 + i) for i in range(7)]
    on_time = [click("u0", now - 5) for _ in range(5)]
    produce(kafka_config, topic, late + on_time)
    run_pipeline(spark, pipeline, settings)
    unprocessed = [click("u1", now - 3) for _ in range(4)]
    produce(kafka_config, topic, unprocessed)
    time.sleep(max(0.0, ahead_at + 1 - time.time()))

    run_backfill(
        spark, pipeline, settings, "same code", TargetSpec("earliest"), echo=lambda _: None
    )
    run_pipeline(spark, pipeline, settings)
    expected, _dead, late_count = clicks_per_window([first, late + on_time + unprocessed])
    assert late_count == len(late)
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    letters = sorted(r["value"] for r in rows(settings, "user_clicks", "dead_letter"))
    assert letters == sorted(late + ahead)


def test_a_recreated_topic_that_outgrew_the_committed_offset_is_caught_by_its_id(
    spark, settings, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    """The new log already reaches past the committed offset, so the offsets look
    continuous; the topic id the cut recorded tells the two topics apart."""
    topic = new_topic(1)
    assert kafka_admin.topic_ids(kafka_admin.admin(kafka_config), [topic])
    pipeline = clicks_pipeline(topic)
    now = int(time.time())
    before = [click(f"u{i % 4}", now - i) for i in range(50)]
    produce(kafka_config, topic, before)
    run_pipeline(spark, pipeline, settings)

    recreate(kafka_config, topic, 1)
    recreated = [click(f"v{i % 3}", now - i % 30) for i in range(80)]
    produce(kafka_config, topic, recreated)

    with pytest.raises(Exception, match=r"deleted and recreated since the application's cut"):
        run_pipeline(spark, pipeline, settings)
    problems = " ".join(application_status(pipeline, settings).problems)
    assert "topic id" in problems and "--mode skip" in problems

    read_recreated_topic_from_its_start(pipeline, settings, topic)
    run_pipeline(spark, pipeline, settings)
    expected, _dead, _late = clicks_per_window([before, recreated])
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    assert application_status(pipeline, settings).problems == []
