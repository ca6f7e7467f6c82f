"""What publishing a state version to the output topic costs (no Spark): one
batch's merge of N changed (user, window) rows into ``user_clicks``' state, then
``publish_pending``: the change data feed read, the net change, JSON encoding,
and one Kafka transaction on the embedded broker.

    .venv/bin/python -m benchmarks.output [--sizes 1000,100000,500000]

Writes its section of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import yaml

from benchmarks.report import machine, scratch_broker, write_section
from jobs import kafka_admin, resolution
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import BatchWriter
from jobs.output.changes import commit_infos, net_changes
from jobs.output.encoding import encode
from jobs.output.publisher import OutputPublisher
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import parse_pipeline
from jobs.settings import REPO_ROOT

REPEATS = 3


def pipeline(topic: str) -> Pipeline:
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml").read_text())
    data["output"] = {"topic": topic, "partitions": 3}
    return parse_pipeline(data, "user_clicks.yaml")


def rows(p: Pipeline, n: int, batch_id: int) -> pa.Table:
    start = datetime(2026, 11, 23, tzinfo=UTC)
    starts = [start + timedelta(minutes=i % 60) for i in range(n)]
    return pa.table(
        {
            "user_id": [f"u{i // 60}" for i in range(n)],
            "window_start": starts,
            "window_end": [s + timedelta(minutes=1) for s in starts],
            "clicks": [batch_id + 1] * n,
            "_records": [batch_id + 1] * n,
            "epoch": [0] * n,
            "batch_id": [batch_id] * n,
            "updated_at": [start] * n,
        },
        resolution.of(p).state_schema,
    )


def measure(sizes: list[int]) -> list[dict[str, float]]:
    results = []
    with scratch_broker("output-bench-") as (work, info):
        config = kafka_admin.client_config(info.bootstrap_servers)
        for n in sizes:
            p = pipeline(f"out_{n}")
            layout = AppLayout(work / f"warehouse_{n}", p.application_id)
            tables.ensure_tables(layout, resolution.of(p))
            writer = BatchWriter(p.application_id, 0)
            publisher = OutputPublisher(resolution.of(p), layout, config)
            publisher.open()
            publisher.publish_pending()  # the first: an empty snapshot
            timings: dict[str, list[float]] = {"changes": [], "encode": [], "publish": []}
            for batch_id in range(REPEATS):
                meta = {"platform_operation": "batch", "pipeline_version": "1"}
                version = writer.merge(
                    layout.table("state"), batch_id, rows(p, n, batch_id), p.state_keys, meta
                )
                assert version is not None
                started = time.monotonic()
                info_v = commit_infos(layout.table("state"), version, version)[version]
                changes = net_changes(resolution.of(p), layout.table("state"), version, info_v)
                timings["changes"].append(time.monotonic() - started)
                started = time.monotonic()
                sum(1 for _ in encode(p, changes, 3))
                timings["encode"].append(time.monotonic() - started)
                started = time.monotonic()
                publisher.publish_pending()
                timings["publish"].append(time.monotonic() - started)
            publisher.close()
            medians = {k: statistics.median(v) for k, v in timings.items()}
            results.append({"rows": n, **medians})
            print(
                f"{n:>9,} rows: changes {medians['changes']:.2f} s, encode "
                f"{medians['encode']:.2f} s, publish (all of it) {medians['publish']:.2f} s "
                f"= {n / medians['publish']:,.0f} records/s",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,100000,500000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = measure(sizes)
    lines = [
        "## Output topic",
        "",
        f"`python -m benchmarks.output` on {machine()}. One batch's merge of N changed",
        "(user, window) rows into `user_clicks`' state, then `publish_pending`: the",
        "version's change data feed, its net change, JSON encoding and one Kafka",
        f"transaction on the embedded broker (median of {REPEATS}; the parts are timed",
        "again separately).",
        "",
        "| rows changed | change feed + net change | encoding | publish, all of it | records/s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {int(r['rows']):,} | {r['changes']:.2f} s | {r['encode']:.2f} s | "
            f"{r['publish']:.2f} s | {r['rows'] / r['publish']:,.0f} |"
        )
    write_section("\n".join(lines))


if __name__ == "__main__":
    main()
