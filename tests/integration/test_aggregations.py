"""avg, min, max and a hopping window, across two runs with late records, checked
against plain Python over the produced events."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.pipeline.parser import load_pipeline
from jobs.streaming.run import run_pipeline
from tests.conftest import produce

pytestmark = pytest.mark.integration
SIZE, SLIDE, DELAY = 120, 60, 300


def payments_pipeline(directory: Path, topic: str) -> Path:
    definition = {
        "application_id": "payments",
        "source": {"topics": [topic]},
        "schema": {"user": "string", "amount": "double", "items": "long", "ts": "long"},
        "keys": ["user"],
        "event_time": {"field": "ts", "unit": "seconds"},
        "window": {"type": "hopping", "size": "2 minutes", "slide": "1 minute"},
        "watermark": "5 minutes",
        "aggregations": [
            {"name": "payments", "function": "count"},
            {"name": "total", "function": "sum", "field": "amount"},
            {"name": "mean", "function": "avg", "field": "amount"},
            {"name": "smallest", "function": "min", "field": "amount"},
            {"name": "largest", "function": "max", "field": "items"},
        ],
    }
    path = directory / "payments.yaml"
    path.write_text(yaml.safe_dump(definition))
    return path


def expected(batches: list[list[dict[str, Any]]]) -> tuple[dict[Any, dict[str, Any]], int]:
    """Per (user, window start): the aggregates; and how many records were late.

    A batch's watermark is the newest event time of earlier batches minus the delay;
    a record is late when its earliest window ended at or before it."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    newest: int | None = None
    late = 0
    for batch in batches:
        watermark = None if newest is None else newest - DELAY
        for e in batch:
            first_end = e["ts"] - e["ts"] % SLIDE + SLIDE
            if watermark is not None and first_end <= watermark:
                late += 1
                continue
            last_start = e["ts"] - e["ts"] % SLIDE
            for start in range(last_start - SIZE + SLIDE, last_start + 1, SLIDE):
                groups[(e["user"], start)].append(e)
        newest = max([newest or 0, *(e["ts"] for e in batch)])
    result = {
        key: {
            "payments": len(es),
            "total": sum(e["amount"] for e in es),
            "mean": sum(e["amount"] for e in es) / len(es),
            "smallest": min(e["amount"] for e in es),
            "largest": max(e["items"] for e in es),
        }
        for key, es in groups.items()
    }
    return result, late


def events(n: int, start: int, span: int, seed: int) -> list[dict[str, Any]]:
    return [
        {
            "user": f"p{(i * 7 + seed) % 9}",
            "amount": round(((i * 37 + seed) % 1000) / 8 - 40, 3),
            "items": (i * 13 + seed) % 50 - 10,
            "ts": start + (i * span) // n,
        }
        for i in range(n)
    ]


def test_hopping_window_with_avg_min_max(
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    pipeline = load_pipeline(str(payments_pipeline(tmp_path, topic)), tmp_path)
    now = int(time.time()) // 60 * 60
    first = events(1500, now - 1200, 900, 1)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in first])
    run_pipeline(spark, pipeline, settings)
    second = events(300, now - 200, 180, 2) + events(20, now - 3000, 60, 3)  # the last late
    produce(kafka_config, topic, [json.dumps(e).encode() for e in second])
    run_pipeline(spark, pipeline, settings)

    want, late = expected([first, second])
    assert late == 20
    state = DeltaTable(str(settings.warehouse / "payments" / "state")).to_pyarrow_table()
    got = {(r["user"], int(r["window_start"].timestamp())): r for r in state.to_pylist()}
    assert set(got) == set(want)
    for key, values in want.items():
        row = got[key]
        assert row["window_end"].timestamp() - row["window_start"].timestamp() == SIZE
        assert row["payments"] == values["payments"]
        assert row["largest"] == values["largest"]
        assert row["smallest"] == values["smallest"]
        assert row["total"] == pytest.approx(values["total"], abs=1e-6)
        assert row["mean"] == pytest.approx(values["mean"], abs=1e-9)
    ledger = [
        r
        for r in DeltaTable(str(settings.warehouse / "payments" / "_ledger"))
        .to_pyarrow_table()
        .to_pylist()
        if r["entry_type"] == "batch"
    ]
    assert sum(r["dead_lettered"] for r in ledger) == late
    assert all(r["aggregated"] == 2 * (r["records_in"] - r["dead_lettered"]) for r in ledger)
