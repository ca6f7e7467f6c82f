"""Records of random shapes through the real inventory and orders pipelines: the run never
fails, every record ends in exactly one place, and every bad record is a dead letter
exactly once. The corpus is generated from a seed; each record is built to be
clearly valid or clearly invalid, and the expectation is plain Python."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming.run import run_pipeline
from tests.conftest import produce

pytestmark = pytest.mark.integration
SIGN = {"receipt": 1, "sale": -1, "return": -1}
EDGE_INTS = [0, 1, -1, 2**53, -(2**53), 999, -1000]
NOW = int(time.time())


def good_record(rng: random.Random) -> dict[str, Any]:
    sku = rng.choice(["S1", "S2", "", "ünïcødé", 'quo"te', "nul\u0000byte", "x" * 5000, "🙂", "S3"])
    qty = rng.choice(EDGE_INTS) if rng.random() < 0.05 else rng.randint(-1000, 1000)
    record = {
        "sku": sku,
        "qty": qty,
        "kind": rng.choice(list(SIGN)),
        "timestamp": rng.randint(NOW - 365 * 86400, NOW),
    }
    if rng.random() < 0.2:
        record["extra"] = rng.choice([None, 1.5, "x", {"a": [1, 2]}, True])
    items = list(record.items())
    rng.shuffle(items)
    return dict(items)


def bad_value(rng: random.Random) -> bytes | None:
    base = {"sku": "S1", "qty": 1, "kind": "sale", "timestamp": NOW - 10}
    field = rng.choice(["qty", "kind", "timestamp", "sku"])
    # Spark reads any JSON value into a string field as text: only qty, kind and
    # timestamp can hold a wrong type that is unambiguously invalid.
    typed_field = field if field != "sku" else "qty"
    broken: dict[str, Any] = dict(base)
    choice = rng.randrange(12)
    if choice == 0:
        return None  # a tombstone
    if choice == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) + b"\xff"
    if choice == 2:
        return json.dumps(base).encode()[: rng.randrange(1, 20)]  # truncated
    if choice == 3:
        return rng.choice([b"[]", b"null", b"42", b'"text"', b"[1, 2, 3]", b""])
    if choice == 4:
        del broken[field]
    elif choice == 5:
        broken[field] = None
    elif choice == 6:
        wrong = {
            "qty": ["12", 1.5, 1e308, -0.0, True, {"a": 1}, [1], "NaN", "x" * 100_000],
            "timestamp": [1.5e9, -0.0, "now", 2**63, -(2**63) - 1, 1e400, False],
            "kind": ["theft", "", "RECEIPT", "x" * 100_000, {"k": "sale"}],
        }
        broken[typed_field] = rng.choice(wrong[typed_field])
    elif choice == 7:
        broken["qty"] = rng.choice([2**63 - 1, -(2**63), 2**53 + 1, -(2**53) - 1, 2**64])
    elif choice == 8:
        broken["timestamp"] = rng.choice(
            [(NOW + 3 * 86400), NOW * 1000, -(10**12), 2**63 - 1, -(2**62)]
        )
    elif choice == 9:  # deep nesting, written out (Python's json stops at ~1000 levels)
        depth = rng.choice([10, 200, 5000])
        text = json.dumps({**base, "qty": 0}).encode()
        return text.replace(b'"qty": 0', b'"qty": ' + b"[" * depth + b"1" + b"]" * depth)
    elif choice == 10:
        text = json.dumps(base).encode()
        return text.replace(b'"S1"', b'"S\xc3\x28"')  # invalid UTF-8 inside a string
    else:  # an integer beyond 64 bits, written out
        digits = b"9" * rng.randrange(20, 40)
        return json.dumps(base).encode().replace(b'"qty": 1', b'"qty": ' + digits)
    return json.dumps(broken).encode()


def test_fuzzed_records_never_fail_a_batch_and_are_accounted_for_exactly(
    spark, settings, kafka_config, new_topic
) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(20261122)
    values: list[bytes | None] = []
    good: list[dict[str, Any]] = []
    bad_offsets: set[int] = set()
    for offset in range(12_000):
        if rng.random() < 0.5:
            record = good_record(rng)
            good.append(record)
            values.append(json.dumps(record).encode())
        else:
            value = bad_value(rng)
            values.append(value)
            bad_offsets.add(offset)
    topic = new_topic(1)  # one partition: offset == position in the corpus
    produce(kafka_config, topic, values)
    pipeline = dataclasses.replace(
        load_pipeline("inventory", REPO_ROOT / "include" / "pipelines"),
        topics=(topic,),
        max_offsets_per_trigger=2500,
    )
    run_pipeline(spark, pipeline, settings)

    quantity: Counter[str] = Counter()
    movements: Counter[str] = Counter()
    for record in good:
        quantity[record["sku"]] += SIGN[record["kind"]] * record["qty"]
        movements[record["sku"]] += 1
    root = Path(settings.warehouse) / "inventory"
    state = DeltaTable(str(root / "state")).to_pyarrow_table().to_pylist()
    assert {r["sku"]: r["quantity"] for r in state} == dict(quantity)
    assert {r["sku"]: r["movements"] for r in state} == dict(movements)

    letters = DeltaTable(str(root / "dead_letter")).to_pyarrow_table().to_pylist()
    offsets = [r["offset"] for r in letters]
    assert len(offsets) == len(set(offsets)), "a record is a dead letter twice"
    assert set(offsets) == bad_offsets
    assert all(r["value"] == values[r["offset"]] for r in letters)
    ledger = [
        r
        for r in DeltaTable(str(root / "_ledger")).to_pyarrow_table().to_pylist()
        if r["entry_type"] == "batch"
    ]
    assert sum(r["records_in"] for r in ledger) == len(values)
    for r in ledger:
        assert r["records_in"] == r["aggregated"] + r["dead_lettered"], r


def good_order(rng: random.Random) -> dict[str, Any]:
    """A valid order: aggregated when paid at a real shop, else filtered."""
    merchant = {"id": rng.choice(["M-1", "M-2", "ünï", "", 'q"t']), "country": "DE"}
    if rng.random() < 0.15:
        merchant["country"] = "XX"
    amount = rng.choice([0, 1, -1, 10**15, -(10**15), 999_999]) if rng.random() < 0.1 else 0
    return {
        "order_id": f"o{rng.randrange(10**6)}",
        "status": rng.choice(["paid"] * 6 + ["pending", "PAID", ""]),
        "amount_cents": amount or rng.randint(-(10**6), 10**6),
        "merchant": merchant,
        "items": [
            {"sku": "s", "qty": rng.choice([0, 1, 10**8]) if rng.random() < 0.05 else 2}
            for _ in range(rng.choice([0, 1, 1, 3]))
        ],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - rng.randrange(3600))),
        **({"note": rng.choice([None, [1], {"x": 1}])} if rng.random() < 0.2 else {}),
    }


def bad_order(rng: random.Random, base: dict[str, Any]) -> bytes:
    """An order that must be a dead letter: a paid order of a real shop whose
    content breaks the schema or makes an expression fail or yield null."""
    broken = {**base, "status": "paid", "merchant": {"id": "M-1", "country": "DE"}}
    choice = rng.randrange(9)
    if choice == 0:
        broken["amount_cents"] = rng.choice([10**16, -(10**17), 2**63 - 1])  # no DECIMAL(18,2)
    elif choice == 1:
        broken["items"] = [{"sku": "s"}]  # no qty: units is null
    elif choice == 2:
        broken["items"] = [{"sku": "s", "qty": 2**31 - 1}, {"sku": "t", "qty": 1}]  # int overflow
    elif choice == 3:
        broken["merchant"] = rng.choice([None, "M-1", [1], {"country": "DE"}])
    elif choice == 4:
        broken["merchant"] = {"id": "M-1"}  # no country: the filter is null
    elif choice == 5:
        broken["created_at"] = rng.choice(["yesterday", "", "2026-13-45T00:00:00Z", [1]])
    elif choice == 6:
        broken["items"] = rng.choice([{"sku": "s"}, "many", 3])
    elif choice == 7:
        broken["amount_cents"] = rng.choice(["12", 1.5, True, None])
    else:
        del broken[rng.choice(["status", "items", "amount_cents", "order_id"])]
    return json.dumps(broken).encode()


def test_fuzzed_orders_through_filter_and_expressions_are_accounted_for_exactly(
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from tests.expected import assert_orders_state, order_windows

    rng = random.Random(20261124)
    records: list[tuple[bytes, bytes, int]] = []
    good: list[tuple[str, dict[str, Any]]] = []
    bad_offsets: set[int] = set()
    for offset in range(4000):
        order = good_order(rng)
        buyer = f"b{rng.randrange(50)}"
        if rng.random() < 0.3:
            records.append((buyer.encode(), bad_order(rng, order), NOW * 1000))
            bad_offsets.add(offset)
        else:
            records.append((buyer.encode(), json.dumps(order).encode(), NOW * 1000))
            good.append((buyer, order))
    topic = new_topic(1)
    kafka_admin.produce_all(kafka_config, topic, records)  # type: ignore[arg-type]
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "orders_revenue.yaml").read_text())
    data["source"] = {"topics": [topic]}
    path = tmp_path / "orders_revenue.yaml"
    path.write_text(yaml.safe_dump(data))
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)

    expected, filtered = order_windows(good)
    root = Path(settings.warehouse) / "orders_revenue"
    assert_orders_state(DeltaTable(str(root / "state")).to_pyarrow_table().to_pylist(), expected)
    letters = DeltaTable(str(root / "dead_letter")).to_pyarrow_table().to_pylist()
    assert sorted(r["offset"] for r in letters) == sorted(bad_offsets)
    ledger = [
        r
        for r in DeltaTable(str(root / "_ledger")).to_pyarrow_table().to_pylist()
        if r["entry_type"] == "batch"
    ]
    assert sum(r["filtered"] for r in ledger) == filtered
    assert sum(r["records_in"] for r in ledger) == len(records)
    for r in ledger:
        assert r["records_in"] == r["records_valid"] + r["filtered"] + r["dead_lettered"], r
