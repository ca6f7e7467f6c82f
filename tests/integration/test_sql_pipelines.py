"""Pipelines in Spark SQL, end to end on the real broker, Spark and Delta: nested
fields, a filter, derived expressions, Kafka metadata as key and event time, per
record expression failures, and the HLL distinct count restored across a rebuild.
Expectations are plain Python over the records produced."""

from __future__ import annotations

import json
import struct
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from include.sample_data import order_events
from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline, parse_pipeline
from jobs.settings import REPO_ROOT, Settings
from jobs.streaming.run import run_pipeline
from tests.conftest import run_jobs
from tests.expected import assert_orders_state, order_windows, within_hll_error

pytestmark = pytest.mark.integration
ORDERS = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "orders_revenue.yaml").read_text())


def rows(settings: Settings, app: str, name: str) -> list[dict[str, Any]]:
    return DeltaTable(str(settings.warehouse / app / name)).to_pyarrow_table().to_pylist()


def write(directory: Path, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{data['application_id']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def iso(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def test_orders_revenue_end_to_end(spark, settings, kafka_config, new_topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    start = int(time.time()) // 300 * 300 - 3600
    orders = list(order_events(1200, 12, 150, seed=3, start_s=start, span_s=3000))
    bad: dict[bytes, str] = {}

    def order(**changes: Any) -> dict[str, Any]:
        base = dict(orders[0])
        base.update(order_id="bad", status="paid", created_at=iso(start + 60))
        return {**base, **changes}

    # Every way an expression fails on a record, each a dead letter with its reason.
    bad[json.dumps(order(amount_cents=2**62)).encode()] = "derived 'amount' failed"
    bad[json.dumps(order(items=[{"sku": "x"}])).encode()] = "derived 'units' is null"
    bad[json.dumps(order(merchant={"id": "M-1"})).encode()] = "filter is null"
    bad[json.dumps(order(merchant={"country": "DE"})).encode()] = "derived 'merchant_id' is null"
    bad[json.dumps(order(items=[{"sku": "x", "qty": 2**31 - 1}] * 2)).encode()] = (
        "derived 'units' failed"
    )
    bad[json.dumps(order(amount_cents="lots")).encode()] = "field 'amount_cents' is not a bigint"
    bad[json.dumps(order(merchant="M-1")).encode()] = "field 'merchant' is not a struct"
    bad[b'{"order_id": "x"}'] = "missing or null field 'status'"
    now_ms = int(time.time() * 1000)
    records = [(o.pop("buyer").encode(), json.dumps(o).encode(), now_ms) for o in orders]
    records += [(b"someone", value, now_ms) for value in bad]
    kafka_admin.produce_all(kafka_config, topic, records)  # type: ignore[arg-type]
    path = write(tmp_path, {**ORDERS, "source": {"topics": [topic]}})
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)

    expected, filtered = order_windows(
        [(k.decode(), o) for (k, _, _), o in zip(records, orders, strict=False)]
    )
    assert_orders_state(rows(settings, "orders_revenue", "state"), expected)
    letters = {r["value"]: r["reason"] for r in rows(settings, "orders_revenue", "dead_letter")}
    assert set(letters) == set(bad)
    for value, fragment in bad.items():
        assert fragment in letters[value], (value, letters[value])
    ledger = [r for r in rows(settings, "orders_revenue", "_ledger") if r["entry_type"] == "batch"]
    assert sum(r["filtered"] for r in ledger) == filtered
    assert sum(r["dead_lettered"] for r in ledger) == len(bad)
    assert sum(r["records_valid"] for r in ledger) == len(orders) - filtered
    for r in ledger:
        assert r["records_in"] == r["records_valid"] + r["filtered"] + r["dead_lettered"]


def coupons_or_registers(sketch: bytes) -> tuple[str, Any]:
    """What an Apache DataSketches HLL sketch holds, read from its bytes: the set of
    coupons (list and set modes, where the bytes depend on insertion order) or the
    registers (HLL mode). Equal content means equal estimates after any union."""
    pre_ints, mode = sketch[0], sketch[7] & 3
    if mode in (0, 1):  # LIST, SET: 4-byte coupons after the preamble; 0 is empty
        body = sketch[pre_ints * 4 :]
        found = struct.unpack(f"<{len(body) // 4}I", body[: len(body) // 4 * 4])
        return "coupons", frozenset(c for c in found if c)
    return "registers", bytes(sketch[40 : 40 + (1 << sketch[3])])


BUYERS = {
    "application_id": "buyer_activity",
    "version": 1,
    "source": {"topics": ["set-below"], "starting_offsets": "earliest"},
    "schema": {"sku": "string", "qty": "int", "price": "decimal(10,2)"},
    "derived": [{"name": "buyer", "expr": "kafka.key"}],
    "keys": ["buyer"],
    "event_time": {"field": "kafka.timestamp"},
    "window": {"type": "tumbling", "size": "1 hour"},
    "watermark": "1 day",
    "aggregations": [
        {"name": "orders", "function": "count"},
        {"name": "units", "function": "sum", "field": "qty"},
        # Decimal buffers in Spark's state: a sum keeps a flag beside it, min does not.
        {"name": "spent", "function": "sum", "field": "price"},
        {"name": "cheapest", "function": "min", "field": "price"},
        {"name": "skus", "function": "approx_count_distinct", "field": "sku"},
        {"name": "partitions", "function": "approx_count_distinct", "field": "kafka.partition"},
    ],
}


def test_kafka_key_and_timestamp_and_a_distinct_count_restored_by_rebuild(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    hour = int(time.time()) // 3600 * 3600 - 2 * 3600
    # Two buyers hot enough to push their sketches into HLL mode, the rest small.
    buyers = [f"b{i}" for i in range(6)]

    def batch(salt: int, n: int) -> list[tuple[bytes, bytes, int]]:
        out = []
        for i in range(n):
            buyer = buyers[i % len(buyers)]
            skus = 3000 if buyer in ("b0", "b1") else 40
            sku = f"s{(i * 7919 + salt) % skus}"
            moment_ms = (hour + (i * 13 + salt) % 7200) * 1000
            price = f"{(i * 37 + salt) % 10000 / 100:.2f}"  # JSON text: exact
            record = {"sku": sku, "qty": 1 + i % 4, "price": price}
            out.append((buyer.encode(), json.dumps(record).encode(), moment_ms))
        return out

    first, second = batch(1, 6000), batch(2, 6000)
    kafka_admin.produce_all(kafka_config, topic, first)  # type: ignore[arg-type]
    rebuilt = write(tmp_path / "rebuilt", {**BUYERS, "source": {"topics": [topic]}})
    reference = write(
        tmp_path / "reference",
        {**BUYERS, "application_id": "buyer_reference", "source": {"topics": [topic]}},
    )
    assert run_jobs(rebuilt, settings, "run", spark=spark).returncode == 0
    before = {(r["buyer"], r["window_start"]): r for r in rows(settings, "buyer_activity", "state")}
    done = run_jobs(rebuilt, settings, "rebuild", "--reason", "restore the sketches", spark=spark)
    assert done.returncode == 0, done.stderr
    assert run_jobs(rebuilt, settings, "run", spark=spark).returncode == 0  # the seed batch
    restored = {
        (r["buyer"], r["window_start"]): r for r in rows(settings, "buyer_activity", "state")
    }
    assert {k: coupons_or_registers(r["_sketch_skus"]) for k, r in restored.items()} == {
        k: coupons_or_registers(r["_sketch_skus"]) for k, r in before.items()
    }
    assert any(coupons_or_registers(r["_sketch_skus"])[0] == "registers" for r in before.values())

    kafka_admin.produce_all(kafka_config, topic, second)  # type: ignore[arg-type]
    assert run_jobs(rebuilt, settings, "run", spark=spark).returncode == 0
    assert run_jobs(reference, settings, "run", spark=spark).returncode == 0
    after = {(r["buyer"], r["window_start"]): r for r in rows(settings, "buyer_activity", "state")}
    never = {(r["buyer"], r["window_start"]): r for r in rows(settings, "buyer_reference", "state")}
    # Plain Python: per Kafka key and hour of the Kafka timestamp.
    exact: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"orders": 0, "units": 0, "skus": set(), "spent": Decimal(0), "prices": []}
    )
    for key, value, moment_ms in first + second:
        cell = exact[(key.decode(), moment_ms // 1000 // 3600 * 3600)]
        record = json.loads(value)
        cell["orders"] += 1
        cell["units"] += record["qty"]
        cell["skus"].add(record["sku"])
        cell["spent"] += Decimal(record["price"])
        cell["prices"].append(Decimal(record["price"]))
    assert {(k[0], int(k[1].timestamp())) for k in after} == set(exact)
    for key, row in after.items():
        want = exact[(key[0], int(key[1].timestamp()))]
        assert (row["orders"], row["units"]) == (want["orders"], want["units"])
        assert (row["spent"], row["cheapest"]) == (want["spent"], min(want["prices"]))
        assert within_hll_error(row["skus"], len(want["skus"])), (
            key,
            row["skus"],
            len(want["skus"]),
        )
        # The rebuilt sketch goes on exactly as one never rebuilt.
        assert row["skus"] == never[key]["skus"]
        assert coupons_or_registers(row["_sketch_skus"]) == coupons_or_registers(
            never[key]["_sketch_skus"]
        )
        assert 1 <= row["partitions"] <= 2
    assert Counter(r["orders"] for r in after.values()) == Counter(
        r["orders"] for r in never.values()
    )


def derived(*items: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "expr": expr} for name, expr in items]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"derived": derived(("amount", "amout_cents / 100"))},
            "derived[0] (amount): [UNRESOLVED_COLUMN",
        ),
        (
            {"derived": derived(("a", "b + 1"), ("b", "amount_cents"))},
            "derived[0] (a): [UNRESOLVED_COLUMN",
        ),
        ({"filter": "amount_cents"}, "filter: must be a boolean, is a bigint"),
        ({"derived": derived(("loud", "upper(items)"))}, "derived[0] (loud): [DATATYPE_MISMATCH"),
        ({"derived": derived(("n", "sum(amount_cents)"))}, "derived[0] (n):"),
        ({"derived": derived(("sku", "explode(items)"))}, "one value per record"),
        ({"filter": "status IN (SELECT 'paid')"}, "subquery (SELECT)"),
        ({"filter": "status IN (VALUES ('paid'))"}, "calls values, not a Spark built-in"),
        ({"filter": "status IN (TABLE paid_statuses)"}, "from the record alone (no aggregate"),
        ({"derived": derived(("n", "shout(status)"))}, "calls shout, not a Spark built-in"),
        (
            {"derived": derived(("m", "merchant")), "keys": ["m"]},
            "keys: 'm' is a struct<id:string,country:string>: a key must be a single value",
        ),
        (
            {
                "derived": derived(("s", "upper(status)")),
                "aggregations": [{"name": "t", "function": "sum", "field": "s"}],
            },
            "aggregations[0].field: sum of 's' needs a numeric column, got string",
        ),
        (
            {"derived": derived(("when", "status")), "event_time": {"field": "when"}},
            "event_time.field: 'when' is a string",
        ),
    ],
)
def test_spark_refuses_what_text_cannot_tell(  # type: ignore[no-untyped-def]
    spark, tmp_path, changes: dict[str, Any], message: str
) -> None:
    from jobs.errors import ConfigError
    from jobs.streaming import analyser

    spark.udf.register("shout", lambda s: s.upper())  # a session's UDF: still refused
    spark.createDataFrame([("paid",)], "s string").createOrReplaceTempView("paid_statuses")
    data = {**ORDERS, **changes}
    if "keys" not in changes and "derived" in changes:
        data["keys"] = ["status"]
    if "aggregations" not in changes:
        data["aggregations"] = [{"name": "orders", "function": "count"}]
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as error:
        analyser.resolve(spark, load_pipeline(str(path), tmp_path))
    text = str(error.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert message in text, text


def bare_orders():  # type: ignore[no-untyped-def]
    """``orders_revenue`` without its expressions: a count of orders per status."""
    data = {**ORDERS, "filter": None, "derived": [], "keys": ["status"]}
    return parse_pipeline(
        {**data, "aggregations": [{"name": "orders", "function": "count"}]}, "orders.yaml"
    )


# Each of these passed the text checks once, and Spark evaluates it to the wall
# clock or the OS user (its ``deterministic`` flag is true for all of them). Spark's
# analysed tree refuses them whatever the text looked like: the tests hand the
# expression to Spark without the text checks.
@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("`current_date`", "reads the clock or the session (current_date)"),
        ("date_add(`current_date`, 1)", "reads the clock or the session (current_date)"),
        ("user", "reads the clock or the session (current_user)"),
        ("CAST(concat('to','day') AS DATE)", "reads the string 'today' as a date"),
        ("CAST('no' 'w' AS TIMESTAMP)", "reads the string 'now' as a timestamp"),
        ("DATE 'to\\day'", "reads the string 'today' as a date"),
        ("TIMESTAMP 'n\\u006fw'", "reads the string 'now' as a timestamp"),
        # Functions Spark rewrites into a cast (their ``replacement``) before running.
        ("to_date('to' 'day')", "reads the string 'today' as a date"),
        ("to_date('\\u0074oday')", "reads the string 'today' as a date"),
        ("to_date(concat('to','day'))", "reads the string 'today' as a date"),
        ("to_timestamp('n' 'ow')", "reads the string 'now' as a timestamp"),
        ("try_to_timestamp('n' 'ow')", "reads the string 'now' as a timestamp"),
        ("to_timestamp_ntz('n' 'ow')", "reads the string 'now' as a timestamp_ntz"),
    ],
)
def test_spark_refuses_the_clock_and_the_session_on_its_own_tree(  # type: ignore[no-untyped-def]
    spark, monkeypatch, expr: str, message: str
) -> None:
    import dataclasses

    from jobs import sql_text
    from jobs.errors import ConfigError
    from jobs.pipeline.model import Derived
    from jobs.streaming import analyser

    monkeypatch.setattr(sql_text, "SPECIAL_TIMES", set())  # the text check sees no word
    pipeline = bare_orders()
    bypass = dataclasses.replace(pipeline, derived=(Derived("d", expr),))
    with pytest.raises(ConfigError) as error:
        analyser.resolve(spark, bypass)
    text = str(error.value)
    assert text.startswith("orders_revenue: derived[0] (d): ") and "\n" not in text, text
    assert message in text, text


def test_dates_written_out_and_the_records_own_times_are_fine(spark) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from jobs.pipeline.model import Derived
    from jobs.streaming import analyser

    exprs = [
        "DATE '2026-01-31'",
        "TIMESTAMP '2026-01-31 10:00:00+02:00'",
        "CAST('2026-01-31' AS DATE) < CAST(created_at AS DATE)",
        "CAST(status AS TIMESTAMP)",  # per record: not a constant
        "date_add(CAST(created_at AS DATE), 1)",
    ]
    pipeline = bare_orders()
    derived = tuple(Derived(f"d{i}", e) for i, e in enumerate(exprs))
    resolved = analyser.resolve(spark, dataclasses.replace(pipeline, derived=derived))
    assert resolved.headers_read is False


def test_whether_headers_are_read_is_spark_s_answer(spark) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from jobs.errors import ConfigError
    from jobs.pipeline.model import Derived
    from jobs.streaming import analyser

    pipeline = bare_orders()
    for expr, reads in [
        ("kafka['head' 'ers']", True),
        ("to_json(kafka)", True),  # the whole struct
        ("kafka.key", False),
        ("merchant.id", False),
    ]:
        found = dataclasses.replace(pipeline, derived=(Derived("d", expr),))
        assert analyser.resolve(spark, found).headers_read is reads, expr
    archived = dataclasses.replace(
        pipeline, derived=(Derived("d", "kafka['head' 'ers']"),), archive=True
    )
    with pytest.raises(ConfigError, match="does not keep Kafka headers"):
        analyser.resolve(spark, archived)


def test_run_names_a_bad_expression_in_one_line(spark, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, {**ORDERS, "filter": "amount_cents > 'x' AND nope"})
    done = run_jobs(path, settings, "run", spark=spark)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {path}: filter: [UNRESOLVED_COLUMN")
    assert done.stderr.count("\n") == 1
    assert not (settings.warehouse / "orders_revenue").exists()  # nothing ran, nothing written


def test_a_failing_part_two_expressions_share_fails_only_its_record(spark) -> None:  # type: ignore[no-untyped-def]
    """Spark computes a subexpression two expressions share once; it must stay
    inside the per-record guard (else one bad record fails the whole batch)."""
    import dataclasses

    from jobs.kafka_source import spark_kafka
    from jobs.streaming import analyser, judging

    data = {
        **BUYERS,
        "schema": {"s": "string"},
        "derived": derived(
            ("buyer", "kafka.key"),
            ("plus", "CAST(s AS INT) + 1"),  # both use CAST(s AS INT)
            ("twice", "CAST(s AS INT) * 2 -- a trailing comment"),
        ),
        "aggregations": [{"name": "n", "function": "sum", "field": "twice"}],
    }
    pipeline = analyser.resolve(
        spark, dataclasses.replace(parse_pipeline(data, "shared.yaml"), topics=("t",))
    )
    moment = datetime.fromtimestamp(time.time() - 60, UTC)
    raw = spark.createDataFrame(
        [
            (b"k", json.dumps({"s": s}).encode(), "t", 0, i, moment, 0)
            for i, s in enumerate(["12", "x", "2147483647", "7"])
        ],
        spark_kafka.COLUMNS,
    )
    judged = judging.classify(raw, pipeline).select("_offset", "_reason", "twice").collect()
    reasons = {r["_offset"]: r["_reason"] for r in judged}
    assert reasons[0] is None and reasons[3] is None
    assert reasons[1].startswith("derived 'plus' failed")  # 'x' is no INT
    assert reasons[2].startswith("derived 'plus' failed")  # INT overflow
    assert {r["_offset"]: r["twice"] for r in judged if r["_reason"] is None} == {0: 24, 3: 14}


def test_a_pipeline_keyed_by_a_header_recomputes_the_same_state(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    """Spark's Kafka source reads headers only when asked: the stream, ``verify``
    and a backfill must all ask (a recomputation without them keys every record by
    NULL)."""
    from confluent_kafka import Producer

    topic = new_topic(2)
    producer = Producer(kafka_config)
    regions = ["eu", "us", "apac"]
    moment_ms = (int(time.time()) - 600) * 1000
    for i in range(300):
        value = json.dumps({"sku": f"s{i % 7}", "qty": 1 + i % 3, "price": "1.00"}).encode()
        region = regions[i % len(regions)].encode()
        producer.produce(topic, value=value, headers=[("region", region)], timestamp=moment_ms)
    producer.flush(10)
    region = "decode(element_at(filter(kafka.headers, h -> h.key = 'region'), 1).value, 'UTF-8')"
    data = {
        **BUYERS,
        "application_id": "header_regions",
        "source": {"topics": [topic], "starting_offsets": "earliest"},
        "derived": [{"name": "region", "expr": region}],
        "keys": ["region"],
        "aggregations": [{"name": "units", "function": "sum", "field": "qty"}],
    }
    path = write(tmp_path, data)
    assert run_jobs(path, settings, "run", spark=spark).returncode == 0
    expected = Counter()
    for i in range(300):
        expected[regions[i % len(regions)]] += 1 + i % 3

    def state() -> Counter[str]:
        return Counter({r["region"]: r["units"] for r in rows(settings, "header_regions", "state")})

    assert state() == expected
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]
    fixed = write(tmp_path / "v2", {**data, "version": 2})
    done = run_jobs(fixed, settings, "backfill", "--from-earliest", "--reason", "v2", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state() == expected
