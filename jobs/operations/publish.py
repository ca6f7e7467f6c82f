"""``publish``: bring an application's output topic up to date now, or republish
its whole state as a snapshot (the repair when the topic's bookmark cannot be
trusted: a recreated topic, a replaced state table, versions no longer readable).

A stream publishes by itself after every batch, and an operation after it
applies; this command holds the application lock, so it refuses next to a
running stream instead of fencing the stream's publisher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltalake import DeltaTable

from jobs import kafka_admin, resolution
from jobs.audit import append_audit, audit_row
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, KafkaUnavailableError, OutputError
from jobs.ledger import current_epoch
from jobs.lock import application_lock
from jobs.output.publisher import OutputPublisher, read_bookmark
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings

PUBLISH = "publish"


def run_publish(
    pipeline: Pipeline,
    settings: Settings,
    reason: str,
    snapshot: bool,
    dry_run: bool,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    if pipeline.output is None:
        raise ConfigError(
            f"pipeline {pipeline.application_id} has no output topic (add output: {{topic: ...}})"
        )
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    tables.ensure_tables(layout, resolution.load_stored(layout, pipeline))
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    topic = pipeline.output.topic
    current = DeltaTable(str(layout.table("state"))).version()
    try:
        mark = read_bookmark(config, pipeline)
    except (OutputError, KafkaUnavailableError):
        if not snapshot:
            raise
        mark = None  # untrusted or unread: the snapshot is the repair, it needs none
    if snapshot:
        echo(f"plan: publish the whole state at version {current} to {topic} as a snapshot")
    elif mark is None:
        echo(f"plan: {topic} has no bookmark: a snapshot of state version {current} first")
    elif mark.next_version > current:
        echo(f"plan: {topic} holds every state version (up to {current}): nothing to publish")
    else:
        echo(f"plan: publish state versions {mark.next_version}..{current} to {topic}")
    details: dict[str, Any] = {"reason": reason, "snapshot": snapshot, "state_version": current}
    epoch = current_epoch(layout)
    if dry_run:
        append_audit(layout, audit_row(pipeline, PUBLISH, epoch, {**details, "dry_run": True}))
        echo("dry run: nothing was published (the plan is recorded in the ledger)")
        return {}
    with application_lock(layout, f"{PUBLISH} --reason {reason!r}"):
        output = OutputPublisher(resolution.load_stored(layout, pipeline), layout, config)
        output.open(republish=snapshot)
        try:
            done = [output.publish_snapshot()] if snapshot else output.publish_pending()
        finally:
            output.close()
    result = {
        "versions": [p.version for p in done],
        "records": sum(p.records for p in done),
    }
    append_audit(layout, audit_row(pipeline, PUBLISH, epoch, {**details, "result": result}))
    echo(f"published: {result['records']} record(s) of {len(done)} state version(s) to {topic}")
    return result
