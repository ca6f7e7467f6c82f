"""Independent expected results: plain Python over the produced events.

Nothing here imports the platform's aggregation code; it re-derives the rules
(validation, tumbling windows, watermark lateness) from the pipeline's meaning.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def parse_click(value: bytes | None) -> tuple[str, int] | None:
    """A valid click is a JSON object with a string user_id and an integer timestamp."""
    if value is None:
        return None
    try:
        event = json.loads(value)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    user, ts = event.get("user_id"), event.get("timestamp")
    if not isinstance(user, str) or isinstance(ts, bool) or not isinstance(ts, int):
        return None
    return user, ts


def clicks_per_window(
    batches: list[list[bytes | None]], window_s: int = 60, watermark_s: int = 600
) -> tuple[Counter[tuple[str, int]], int, int]:
    """(count per (user, window start), dead, late) for events arriving in these batches.

    Spark's rule: a batch's watermark is the max event time of earlier batches minus
    the delay; a record whose window ended at or before it is dropped as late.
    """
    counts: Counter[tuple[str, int]] = Counter()
    max_event: int | None = None
    dead = late = 0
    for batch in batches:
        watermark = None if max_event is None else max_event - watermark_s
        for value in batch:
            click = parse_click(value)
            if click is None:
                dead += 1
                continue
            user, ts = click
            start = ts - ts % window_s
            if watermark is not None and start + window_s <= watermark:
                late += 1
                continue
            counts[(user, start)] += 1
        times = [c[1] for c in map(parse_click, batch) if c is not None]
        if times:
            max_event = max([*times, max_event] if max_event is not None else times)
    return counts, dead, late


def state_as_counter(rows: list[dict[str, Any]], value: str) -> Counter[tuple[str, int]]:
    return Counter({(r["user_id"], int(r["window_start"].timestamp())): r[value] for r in rows})


def order_windows(
    orders: list[tuple[str, dict[str, Any]]],
) -> tuple[dict[tuple[str, int], dict[str, Any]], int]:
    """``orders_revenue`` in plain Python over (buyer, order) pairs of valid orders:
    paid orders of real shops (country not XX) per merchant in both 10-minute
    windows (every 5 minutes) they fall in; and how many the filter leaves out."""
    import calendar
    import time
    from collections import defaultdict
    from decimal import Decimal

    windows: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"revenue": Decimal(0), "orders": 0, "units": 0, "buyers": set()}
    )
    filtered = 0
    for buyer, order in orders:
        if order["status"] != "paid" or order["merchant"]["country"] == "XX":
            filtered += 1
            continue
        moment = calendar.timegm(time.strptime(order["created_at"], "%Y-%m-%dT%H:%M:%SZ"))
        first = moment - moment % 300
        for window_start in (first - 300, first):
            cell = windows[(order["merchant"]["id"], window_start)]
            cell["revenue"] += Decimal(order["amount_cents"]) / 100
            cell["orders"] += 1
            cell["units"] += sum(item["qty"] for item in order["items"])
            cell["buyers"].add(buyer)
    return dict(windows), filtered


def assert_orders_state(state: list[dict[str, Any]], expected: dict[Any, dict[str, Any]]) -> None:
    """The ``orders_revenue`` state rows hold exactly the expected windows: revenue,
    orders and units exact, the distinct buyers within the sketch's error."""
    got = {(r["merchant_id"], int(r["window_start"].timestamp())): r for r in state}
    assert set(got) == set(expected)
    for cell, want in expected.items():
        row = got[cell]
        exact = (want["revenue"], want["orders"], want["units"])
        assert (row["revenue"], row["orders"], row["units"]) == exact, cell
        assert within_hll_error(row["buyers"], len(want["buyers"])), (cell, row["buyers"])
        assert row["window_end"].timestamp() - row["window_start"].timestamp() == 600


def within_hll_error(estimate: int, exact: int) -> bool:
    """Within the documented error of a 2^12-bucket HLL sketch (1.6% relative standard
    error; three of them here), or off by one where the count is small."""
    return abs(estimate - exact) <= max(1, 0.05 * exact)
