"""Sample events for the reference pipelines, deterministic from a seed.

    python -m include.sample_data clicks --count 10000 [--bad 20] [--topic clicks]
    python -m include.sample_data inventory --count 1000
    python -m include.sample_data orders --count 5000 [--bad 20]
    python -m include.sample_data merchants [--category M-007=garden ...] [--out FILE]

``merchants`` writes the file the merchants dimension loads (JSON lines, one row
per merchant of the orders, ``<warehouse>/incoming/merchants.jsonl``);
``--category`` changes a merchant's category (a fix of the dimension).

Bad records (not JSON, missing fields, wrong types, null keys) are mixed in on
purpose: they must land in ``dead_letter``, never vanish.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from jobs import kafka_admin
from jobs.errors import PlatformError
from jobs.settings import load_settings

BAD_CLICKS = [
    b"not json at all",
    b'{"user_id": "mallory"}',
    b'{"user_id": "mallory", "timestamp": "yesterday"}',
    b'{"user_id": null, "timestamp": 1678886400}',
    b"[1, 2, 3]",
]


def click_events(
    count: int, users: int, seed: int, start_s: int, span_s: int
) -> Iterator[dict[str, object]]:
    rng = random.Random(seed)
    for i in range(count):
        yield {
            "user_id": f"user_{rng.randrange(users):05d}",
            "timestamp": start_s + (i * span_s) // max(count, 1),
        }


def inventory_events(count: int, skus: int, seed: int, start_s: int) -> Iterator[dict[str, object]]:
    rng = random.Random(seed)
    kinds = ["receipt"] * 5 + ["sale"] * 4 + ["return"]
    for i in range(count):
        yield {
            "sku": f"SKU-{rng.randrange(skus):04d}",
            "qty": rng.randint(1, 20),
            "kind": rng.choice(kinds),
            "timestamp": start_s + i,
        }


BAD_ORDERS = [
    b'{"order_id": "o-bad-1", "status": "paid"}',  # missing fields
    b'{"order_id": "o-bad-2", "status": "paid", "amount_cents": "lots", "merchant": {"id": "M-1",'
    b' "country": "DE"}, "items": [], "buyer": "b", "created_at": "2026-01-01T00:00:00Z"}',
    # an item without qty: the units expression has nothing to add up
    b'{"order_id": "o-bad-3", "status": "paid", "amount_cents": 100, "merchant": {"id": "M-1",'
    b' "country": "DE"}, "items": [{"sku": "x"}], "buyer": "b", "created_at":'
    b' "2026-01-01T00:00:00Z"}',
]
ORDER_STATUSES = ["paid"] * 7 + ["pending"] * 2 + ["refunded"]
ORDER_MERCHANTS = 40
CATEGORIES = ["books", "games", "garden", "food", "fashion"]
REGIONS = {"DE": "central", "FR": "west", "NL": "north", "XX": "test"}
MERCHANT_ID = re.compile(r"^M-\d{3}$")
CATEGORY = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


def merchant_rows(count: int, seed: int, categories: dict[str, str]) -> list[dict[str, str]]:
    """The merchants of the orders (their ids and countries), each with a category
    (``categories`` overrides some) and the region of its country."""
    rng = random.Random(seed)
    countries = list(REGIONS)
    rows = []
    for m in range(count):
        merchant_id = f"M-{m:03d}"
        category = rng.choice(CATEGORIES)
        rows.append(
            {
                "id": merchant_id,
                "name": f"Merchant {m:03d}",
                "category": categories.get(merchant_id, category),
                "region": REGIONS[countries[m % 4]],
            }
        )
    return rows


def parse_categories(pairs: list[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        merchant, _, category = pair.partition("=")
        if not MERCHANT_ID.fullmatch(merchant) or not CATEGORY.fullmatch(category):
            raise ValueError(f"--category wants M-NNN=category (lower case), got {pair!r}")
        if int(merchant[2:]) >= ORDER_MERCHANTS:
            raise ValueError(f"--category {merchant}: the orders have M-000..M-039")
        found[merchant] = category
    return found


def write_merchants(out: Path, categories: dict[str, str], seed: int) -> int:
    """The file, replaced whole (written aside, then renamed: a reader never sees half)."""
    rows = merchant_rows(ORDER_MERCHANTS, seed, categories)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial.replace(out)
    return len(rows)


def order_events(
    count: int, merchants: int, buyers: int, seed: int, start_s: int, span_s: int
) -> Iterator[dict[str, object]]:
    """Orders as a web shop's event stream: nested merchant and items, ISO times;
    merchant country "XX" marks test shops, which the pipeline filters out."""
    rng = random.Random(seed)
    countries = ["DE", "FR", "NL", "XX"]
    for i in range(count):
        merchant = rng.randrange(merchants)
        moment = start_s + (i * span_s) // max(count, 1)
        yield {
            "order_id": f"o-{seed}-{i}",
            "status": rng.choice(ORDER_STATUSES),
            "amount_cents": rng.randint(100, 50_000),
            "merchant": {"id": f"M-{merchant:03d}", "country": countries[merchant % 4]},
            "items": [
                {"sku": f"SKU-{rng.randrange(100):03d}", "qty": rng.randint(1, 3)}
                for _ in range(rng.randint(1, 3))
            ],
            "buyer": f"buyer-{rng.randrange(buyers):05d}",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment)),
        }


def encoded(
    events: Iterator[dict[str, object]], bad: list[bytes], bad_count: int, key_field: str
) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    now_ms = int(time.time() * 1000)
    for i, event in enumerate(events):
        yield str(event[key_field]).encode(), json.dumps(event).encode(), now_ms
        if i < bad_count:
            yield None, bad[i % len(bad)], now_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m include.sample_data", description=__doc__)
    parser.add_argument("kind", choices=["clicks", "inventory", "orders", "merchants"])
    parser.add_argument("--count", type=int, default=10000, help="valid events (default 10000)")
    parser.add_argument("--bad", type=int, default=0, help="bad records mixed in (default 0)")
    parser.add_argument("--topic", help="default: clicks / inventory_movements / orders")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--bootstrap-servers")
    parser.add_argument(
        "--category",
        action="append",
        default=[],
        metavar="M-NNN=CATEGORY",
        help="merchants: set a merchant's category (repeatable)",
    )
    parser.add_argument("--out", type=Path, help="merchants: the file to write")
    args = parser.parse_args(argv)
    if args.count < 0 or args.bad < 0 or args.partitions < 1:
        parser.error("--count and --bad must be >= 0 and --partitions >= 1")
    try:
        settings = load_settings()
    except PlatformError as exc:  # a bad PLATFORM_* value
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.kind == "merchants":
        try:
            categories = parse_categories(args.category)
        except ValueError as exc:
            parser.error(str(exc))
        out = args.out or (settings.warehouse / "incoming" / "merchants.jsonl").path
        written = write_merchants(out, categories, args.seed)
        print(f"wrote {written} merchants to {out}")
        return 0
    config = kafka_admin.client_config(
        args.bootstrap_servers or settings.bootstrap_servers, settings.kafka_client
    )
    now_s = int(time.time())
    if args.kind == "clicks":
        topic = args.topic or "clicks"
        events = click_events(args.count, 500, args.seed, now_s - 3600, 3600)
        records = encoded(events, BAD_CLICKS, args.bad, "user_id")
    elif args.kind == "orders":
        topic = args.topic or "orders"
        events = order_events(args.count, ORDER_MERCHANTS, 2000, args.seed, now_s - 3600, 3600)
        records = encoded(events, BAD_ORDERS, args.bad, "buyer")  # keyed by buyer
    else:
        topic = args.topic or "inventory_movements"
        events = inventory_events(args.count, 50, args.seed, now_s - args.count)
        records = encoded(
            events, [b'{"sku": "A-1", "qty": 1, "kind": "theft", "timestamp": 1}'], args.bad, "sku"
        )
    try:
        kafka_admin.create_topic(kafka_admin.admin(config), topic, args.partitions)
        produced = kafka_admin.produce_all(config, topic, records)
    except PlatformError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bad = min(args.bad, args.count)
    print(f"produced {produced} records to {topic} ({args.count} valid, {bad} bad)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
