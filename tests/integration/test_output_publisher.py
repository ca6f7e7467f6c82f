"""The output publisher against the real broker and real Delta tables, without
Spark: zombie fencing, bookmarks that cannot be trusted, and maintenance."""

from __future__ import annotations

import dataclasses
import shutil
import time

import pytest
from confluent_kafka.admin import NewPartitions
from deltalake import DeltaTable

from jobs import kafka_admin, resolution
from jobs.errors import FencedError, OutputError
from jobs.operations.maintain import plan_maintenance, run_maintain
from jobs.operations.publish import run_publish
from jobs.output import publisher as publisher_module
from jobs.output.publisher import OutputPublisher, read_bookmark
from jobs.settings import Settings
from tests.output_tables import StateWriter, clicks_pipeline
from tests.output_topic import read_output

pytestmark = pytest.mark.integration


def topic_table(config: dict[str, str], topic: str) -> dict[str, int]:
    last: dict[str, int] = {}
    for record in read_output(config, topic):
        if record["value"] is None:
            last.pop(record["key"]["user_id"], None)
        else:
            last[record["key"]["user_id"]] = record["value"]["aggregates"]["clicks"]
    return last


def state_table(writer: StateWriter) -> dict[str, int]:
    rows = DeltaTable(str(writer.path)).to_pyarrow_table().to_pylist()
    return {r["user_id"]: r["clicks"] for r in rows}


def publisher(writer: StateWriter, config: dict[str, str]) -> OutputPublisher:
    output = OutputPublisher(resolution.of(writer.pipeline), writer.layout, config)
    output.open()
    return output


def test_a_newer_publisher_fences_the_older_one(settings, kafka_config, new_topic) -> None:  # type: ignore[no-untyped-def]
    out = f"out_{new_topic(1)}"
    writer = StateWriter(settings.warehouse, clicks_pipeline(out))
    writer.batch({"a": 1, "b": 2})
    zombie = publisher(writer, kafka_config)
    zombie.publish_pending()  # the first publish: a snapshot
    writer.batch({"a": 5})
    newer = publisher(writer, kafka_config)
    with pytest.raises(FencedError, match="took over output topic"):
        zombie.publish_pending()
    zombie.close()
    assert [p.records for p in newer.publish_pending()] == [1]
    newer.close()
    records = read_output(kafka_config, out)
    assert [r["headers"]["platform.kind"] for r in records].count("snapshot") == 2
    assert len(records) == 3  # the snapshot's two, the batch's one: nothing twice
    assert topic_table(kafka_config, out) == state_table(writer) == {"a": 5, "b": 2}


def test_untrusted_bookmarks_stop_publishing_until_a_snapshot(  # type: ignore[no-untyped-def]
    settings: Settings, kafka_config, new_topic, tmp_path
) -> None:
    out = f"out_{new_topic(1)}"
    writer = StateWriter(settings.warehouse, clicks_pipeline(out))
    writer.batch({"a": 1})
    # Someone else wrote to the topic: what is in it is unknown.
    kafka_admin.create_topic(kafka_admin.admin(kafka_config), out, 3)
    kafka_admin.produce_all(kafka_config, out, [(b"x", b"foreign", None)])
    with pytest.raises(OutputError, match=r"records of another writer.*--snapshot"):
        publisher(writer, kafka_config)
    run_publish(writer.pipeline, settings, "topic reused", snapshot=True, dry_run=False)
    assert read_bookmark(kafka_config, writer.pipeline) is not None
    writer.batch({"b": 4})
    with publisher(writer, kafka_config) as output:
        assert [p.records for p in output.publish_pending()] == [1]
    # The state table replaced by another one, even one with more versions.
    shutil.rmtree(writer.path)
    replaced = StateWriter(settings.warehouse, writer.pipeline)
    for i in range(6):
        replaced.batch({"c": i})
    with pytest.raises(OutputError, match=r"versions of another state table.*--snapshot"):
        publisher(replaced, kafka_config)
    # More partitions: a key's new records would land away from its old ones.
    run_publish(writer.pipeline, settings, "table replaced", snapshot=True, dry_run=False)
    admin = kafka_admin.admin(kafka_config)
    for future in admin.create_partitions([NewPartitions(out, 5)]).values():
        future.result()
    with pytest.raises(
        OutputError, match="has 5 partitions, but user_clicks spread its keys over 3"
    ):
        publisher(replaced, kafka_config)


def test_an_expired_bookmark_is_recovered_from_the_records(  # type: ignore[no-untyped-def]
    settings: Settings, kafka_config, new_topic
) -> None:
    out = f"out_{new_topic(1)}"
    writer = StateWriter(settings.warehouse, clicks_pipeline(out))
    writer.batch({"a": 1, "b": 1})
    with publisher(writer, kafka_config) as output:
        output.publish_pending()
    writer.batch({"a": 2})
    with publisher(writer, kafka_config) as output:
        output.publish_pending()
    # Kafka drops an idle group's offsets after offsets.retention.minutes.
    admin = kafka_admin.admin(kafka_config)
    for future in admin.delete_consumer_groups(["platform-output.user_clicks"]).values():
        future.result()
    writer.batch({"b": 7})
    writer.batch({})  # a version without changes
    with publisher(writer, kafka_config) as output:
        assert output.bookmark is not None and output.bookmark.recovered
        assert [p.records for p in output.publish_pending()] == [1]
    records = read_output(kafka_config, out)
    assert len(records) == 4  # snapshot a, b; a=2; b=7: nothing twice
    assert topic_table(kafka_config, out) == state_table(writer) == {"a": 2, "b": 7}


def test_a_recreated_topic_gets_the_whole_state_again(  # type: ignore[no-untyped-def]
    settings: Settings, kafka_config, new_topic
) -> None:
    out = f"out_{new_topic(1)}"
    writer = StateWriter(settings.warehouse, clicks_pipeline(out))
    writer.batch({"a": 1, "b": 1})
    with publisher(writer, kafka_config) as output:
        output.publish_pending()
    admin = kafka_admin.admin(kafka_config)
    for future in admin.delete_topics([out]).values():
        future.result()
    kafka_admin.create_topic(admin, out, 3)
    writer.batch({"c": 1})
    try:
        with publisher(writer, kafka_config) as output:
            output.publish_pending()  # the bookmark went with the topic: a snapshot
    except OutputError as exc:  # the bookmark outlived the topic: refused, named
        assert "is empty, but 2 record(s) were published" in str(exc)
        run_publish(writer.pipeline, settings, "recreated", snapshot=True, dry_run=False)
    assert topic_table(kafka_config, out) == state_table(writer) == {"a": 1, "b": 1, "c": 1}


def test_a_failure_while_sending_leaves_no_transaction_open(  # type: ignore[no-untyped-def]
    settings: Settings, kafka_config, new_topic, monkeypatch
) -> None:
    out = f"out_{new_topic(1)}"
    writer = StateWriter(settings.warehouse, clicks_pipeline(out))
    writer.batch({"a": 1})
    with publisher(writer, kafka_config) as output:
        output.publish_pending()
    writer.batch({"a": 2, "b": 2, "c": 2})
    real_encode = publisher_module.encode

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        for i, record in enumerate(real_encode(*args, **kwargs)):
            if i == 2:
                raise ValueError("encoding broke")
            yield record

    monkeypatch.setattr(publisher_module, "encode", failing)
    with publisher(writer, kafka_config) as output, pytest.raises(ValueError):
        output.publish_pending()
    monkeypatch.undo()
    started = time.monotonic()
    # Aborted at once: a read_committed reader is not held back by it.
    assert topic_table(kafka_config, out) == {"a": 1}
    assert time.monotonic() - started < 10
    with publisher(writer, kafka_config) as output:
        assert [p.records for p in output.publish_pending()] == [3]
    assert topic_table(kafka_config, out) == state_table(writer)


def test_maintain_keeps_the_versions_not_yet_published(  # type: ignore[no-untyped-def]
    settings: Settings, kafka_config, new_topic
) -> None:
    out = f"out_{new_topic(1)}"
    pipeline = clicks_pipeline(out)
    writer = StateWriter(settings.warehouse, pipeline)
    writer.batch({"a": 1})
    with publisher(writer, kafka_config) as output:
        output.publish_pending()
    published = DeltaTable(str(writer.path)).version()
    for i in range(12):  # versions the topic does not have yet
        writer.batch({f"u{i}": i, "a": i + 2})
    immediate = dataclasses.replace(pipeline, reader_grace_hours=0)
    plan = plan_maintenance(immediate, settings, "test")
    assert plan.output_from == published
    run_maintain(immediate, settings, "test", dry_run=False, echo=lambda _line: None)
    with publisher(writer, kafka_config) as output:
        assert len(output.publish_pending()) == 12
    assert topic_table(kafka_config, out) == state_table(writer)
