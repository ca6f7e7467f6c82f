"""Retention deleting records the stream has already committed is normal life for
a long-running application: the next run resumes from its checkpoint and must not
trip over the epoch's (long gone) starting offsets."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.streaming.run import run_pipeline
from tests.conftest import pipeline_file, produce
from tests.conftest import recent_clicks as clicks
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration


def test_a_run_after_retention_deleted_committed_records(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic)
    first, second = clicks(500, 0), clicks(300, 4)
    produce(kafka_config, topic, first)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    # Retention removes everything the stream has read (the epoch started at 0).
    marks = kafka_admin.watermarks(kafka_config, [(topic, 0), (topic, 1)])
    admin = kafka_admin.admin(kafka_config)
    ends = [TopicPartition(topic, p, high) for (_t, p), (_low, high) in marks.items()]
    for future in admin.delete_records(ends).values():
        future.result()
    produce(kafka_config, topic, second)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    expected, _dead, _late = clicks_per_window([first + second])
    state = DeltaTable(str(settings.warehouse / "user_clicks" / "state")).to_pyarrow_table()
    assert state_as_counter(state.to_pylist(), "clicks") == expected


def test_records_deleted_ahead_of_the_stream_stop_it_with_the_repair(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    """Retention deleting records the stream has *not* read is a loss: the run stops
    with the platform's error naming the repair, and commits nothing past it."""
    topic = new_topic(1)
    path = pipeline_file(tmp_path, "user_clicks", topic)
    pipeline = load_pipeline(str(path), tmp_path)
    produce(kafka_config, topic, clicks(200, 0))
    run_pipeline(spark, pipeline, settings)
    produce(kafka_config, topic, clicks(300, 1))
    admin = kafka_admin.admin(kafka_config)
    for future in admin.delete_records([TopicPartition(topic, 0, 350)]).values():
        future.result()
    with pytest.raises(Exception, match=r"Kafka no longer has records the run needs") as raised:
        run_pipeline(spark, pipeline, settings)
    assert "rewind --mode skip" in str(raised.value)
    ledger = DeltaTable(str(settings.warehouse / "user_clicks" / "_ledger")).to_pyarrow_table()
    ends = [row for row in ledger.to_pylist() if row["entry_type"] == "batch"]
    # (the first run's no-data batch, which moves the watermark on, ends there too)
    assert ends and {r["end_offsets"] for r in ends} == {f'{{"{topic}": {{"0": 200}}}}'}
