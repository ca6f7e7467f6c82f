"""Random sequences of operations on the real broker and Spark, checked against a
plain-Python model after every step (issue 28).

The application is ``inventory`` (quantity and movements per SKU; windowed or
not) on a topic whose partitions the driver writes explicitly, with Kafka
timestamps an hour apart per produce, so the model knows every record's offset
and time. Windowed, the records' event times are out of order and some arrive
after the watermark closed their window (late: dead letters), which the model
decides with the platform's rule: a batch's watermark is the cut's floor or the
newest event time of the epoch's aggregated records minus the delay. A sequence
draws from: produce (with bad records), run, a run killed between two commits and
recovered, add a partition, the topic deleted and recreated (the run refuses, the
named repair applies), rewind skip and reprocess to offsets, times, durations and
earliest, an operation killed after its fence and run again, rebuild from Delta
and from the source, backfill with a new version (odd versions subtract returns,
even ones add them back) from the earliest offsets, an offset or a time, from
Kafka or the raw archive, saved plans applied after another operation, maintain,
verify. The model keeps which offsets the state judged and with which version,
which a skip left out, and the lineage's points; the expected state is a sum over
the judged records. ``python -m benchmarks.sequences`` runs long ones.

Enriched (issue 42), the quantity is multiplied by a factor per SKU from one of
two Delta dimension tables (a SKU the version lacks: a dead letter), and the
sequence also draws: a new version of a table loaded, a table deleted and loaded
again (another table: what batches joined of it can no longer be read, and each
recomputation or replay that needs it is refused with one line until
``backfill --dimensions newest``), a new pipeline version that re-points
``enrich`` to the other table, removes it or adds it back (each also changes the
sign of returns: a derived column), and ``backfill --dimensions newest``. The
model knows the table (name, generation, version) each judgment joined, the one
the lineage holds for each offset (what a replay joins: a judgment without the
enrichment joins the table now at the version loaded before its batch, or its
oldest), and what ``verify`` joins.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable, write_deltalake

from jobs import kafka_admin
from jobs.settings import REPO_ROOT, Settings
from tests.conftest import wait_out_a_killed_lease

TP = tuple[str, int]
Pin = tuple[str, int, int]  # a dimension table as joined: (name, generation, version)
TABLES = ["sa", "sb"]
SIGNS = {1: {"receipt": 1, "sale": -1, "return": -1}, 0: {"receipt": 1, "sale": -1, "return": 1}}
KINDS = ["receipt", "receipt", "sale", "return"]
FAULTS = ["after_dead_letter", "after_changelog", "after_state", "after_ledger"]
HOUR_MS = 3_600_000


def signed_qty(version: int) -> str:
    cases = " ".join(
        f"WHEN '{kind}' THEN {'' if sign > 0 else '-'}qty"
        for kind, sign in SIGNS[version % 2].items()
    )
    return f"CASE kind {cases} END"


@dataclass(frozen=True)
class Judgment:
    """How a record was judged: by which version, late or not, under which watermark."""

    version: int
    late: bool = False
    watermark_ms: int = 0
    # Enriched: the table the ledger's coverage records for it (None: judged by a
    # version without enrich:), the one the state was computed with, and the
    # logical time of its batch (what a later join without a record goes by).
    dim: Pin | None = None
    used: Pin | None = None
    clock: int = 0


@dataclass
class Point:
    """A lineage point of the model: offsets judged, offsets skipped, where the
    stream reads next, and the watermark its batch was judged with (an
    operation's cut: the one it carries on)."""

    judged: dict[TP, dict[int, Judgment]]
    skipped: dict[TP, set[int]]
    pos: dict[TP, int]
    watermark_ms: int = 0

    def copy(self) -> Point:
        return Point(
            {tp: dict(d) for tp, d in self.judged.items()},
            {tp: set(s) for tp, s in self.skipped.items()},
            dict(self.pos),
            self.watermark_ms,
        )

    def fits(self, target: dict[TP, int]) -> bool:
        return all(
            all(o in self.skipped.get(tp, set()) for o in range(target[tp], pos))
            for tp, pos in self.pos.items()
            if tp in target
        )


@dataclass
class Sequence:
    """One application driven through ``steps`` operations."""

    spark: Any
    settings: Settings
    kafka_config: dict[str, str]
    topic: str
    directory: Path
    rng: random.Random
    run_jobs: Callable[..., Any]
    run_with_fault: Callable[..., int]
    records: dict[TP, list[dict[str, Any] | None]] = field(default_factory=dict)
    stamps: dict[TP, list[int]] = field(default_factory=dict)  # Kafka timestamps (ms)
    version: int = 1
    rounds: int = 0  # produce calls: round r's records are stamped base + r hours
    logs: int = 0  # topic recreations: the deleted logs' records keep their own keys
    model: Point = field(default_factory=lambda: Point({}, {}, {}))
    points: list[Point] = field(default_factory=list)
    # After a topic recreation, the point the repair kept: the deleted log's
    # judgments, which a recomputation "from the first offsets" starts from.
    floor: Point | None = None
    maintenance: dict[str, Any] | None = None  # the pipeline's maintenance section
    # Windowed: 1-minute tumbling windows, a 1-minute watermark delay, event times
    # out of order (up to 200 s behind a clock that moves 20-120 s per produce), so
    # some records arrive late. The epoch's watermark: at least the cut's floor, and
    # Spark's, the newest event time of the epoch's aggregated records (a seed's:
    # its newest window start) minus the delay.
    windowed: bool = False
    floor_ms: int = 0
    newest_ms: int | None = None
    done: list[str] = field(default_factory=list)
    # Enriched: each table's generations (a delete and reload starts one), each a
    # list of versions (rows: SKU -> factor, and the logical time it was loaded);
    # the table enrich points at (None: a version without it); generations deleted.
    enriched: bool = False
    tables: dict[str, list[list[tuple[dict[str, int], int]]]] = field(default_factory=dict)
    pointing: str | None = None
    gone: set[tuple[str, int]] = field(default_factory=set)
    clock: int = 0
    # The judgment the lineage last held for each offset ever judged (what a
    # replay joins), beyond the points' too (a rewind discarded them).
    recorded: dict[TP, dict[int, Judgment]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.records = {(self.topic, 0): [], (self.topic, 1): []}
        self.stamps = {tp: [] for tp in self.records}
        self.model.pos = {tp: 0 for tp in self.records}
        self.base_ms = (int(time.time()) // 3600 - 48) * HOUR_MS
        self.clock_s = int(time.time()) - 86400
        self.archive = self.rng.random() < 0.5
        if self.enriched:
            for name in TABLES:
                self._load(name)
            self.pointing = "sa"
        self.path = self.pipeline_file(self.version)

    def live(self) -> list[TP]:
        """The partitions of the topic's current log."""
        return sorted(tp for tp in self.records if tp[0] == self.topic)

    # -- the application -------------------------------------------------------
    def pipeline_file(self, version: int) -> Path:
        data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
        data["source"]["topics"] = [self.topic]
        data["version"] = version
        data["source"]["archive"] = self.archive
        if self.maintenance is not None:
            data["maintenance"] = self.maintenance
        data["derived"][0]["expr"] = signed_qty(version)
        if self.pointing is not None:
            data["enrich"] = [
                {
                    "name": "s",
                    "table": "${warehouse}/dims/" + self.pointing,
                    "on": "sku = s.sku",
                    "missing": "dead_letter",
                }
            ]
            data["derived"][0]["expr"] = f"({signed_qty(version)}) * s.factor"
        if self.windowed:
            data["window"] = {"type": "tumbling", "size": "1 minute"}
            data["watermark"] = "1 minute"
        path = self.directory / f"v{version}" / "inventory.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path

    def jobs(self, *args: str) -> str:
        done = self.run_jobs(self.path, self.settings, *args, spark=self.spark)
        assert done.returncode == 0, f"{self.done}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
        return str(done.stdout)

    def last_batch(self) -> tuple[int, int] | None:
        from jobs.delta.layout import AppLayout
        from jobs.ledger import last_batch

        row = last_batch(AppLayout(self.settings.warehouse, "inventory"))
        return None if row is None else (int(row["epoch"]), int(row["batch_id"]))

    def state(self) -> dict[Any, tuple[int, int]]:
        table = DeltaTable(str(self.settings.warehouse / "inventory" / "state"))
        return {
            self._key(r["sku"], r.get("window_start")): (r["quantity"], r["movements"])
            for r in table.to_pyarrow_table().to_pylist()
        }

    def _key(self, sku: str, window_start: Any) -> Any:
        if not self.windowed:
            return sku
        if isinstance(window_start, datetime):
            aware = window_start if window_start.tzinfo else window_start.replace(tzinfo=UTC)
            return (sku, int(aware.timestamp()))
        return (sku, int(window_start))

    def expected(self, version_now: int | None = None) -> dict[Any, tuple[int, int]]:
        """The state: each judged valid record that was not late, with the version
        that judged it (or ``version_now``'s logic: what verify recomputes)."""
        totals: dict[Any, tuple[int, int]] = {}
        kept = {} if self.floor is None else self.floor.judged  # no broker replays them
        for tp, judged in self.model.judged.items():
            for offset, judgment in judged.items():
                recorded = version_now is None or offset in kept.get(tp, {})
                version = judgment.version if recorded else version_now
                pin = judgment.used if recorded else self._verify_pin(judgment)
                event = self.records[tp][offset]
                factor = 1 if pin is None or event is None else self._factor(pin, event["sku"])
                if event is None or judgment.late or factor is None:
                    continue  # a dead letter
                key = self._key(event["sku"], event["timestamp"] // 60 * 60)
                qty, count = totals.get(key, (0, 0))
                sign = SIGNS[version % 2][event["kind"]]
                totals[key] = (qty + sign * event["qty"] * factor, count + 1)
        return totals

    def _dead_letter(self, event: dict[str, Any] | None, judgment: Judgment) -> bool:
        """Bad, late, or its SKU not in the table version it joined."""
        if event is None or judgment.late:
            return True
        return judgment.used is not None and self._factor(judgment.used, event["sku"]) is None

    # -- the dimension tables (enriched) ---------------------------------------------
    def _load(self, name: str, again: bool = False) -> None:
        """A new version of table ``name`` (``again``: deleted and loaded again)."""
        rows = {f"S{i}": self.rng.randint(1, 5) for i in range(7) if self.rng.random() > 0.15}
        path = self.settings.warehouse / "dims" / name
        if again:
            self.gone.add((name, len(self.tables[name]) - 1))
            path.delete_tree()
        table = pa.table(
            {
                "sku": pa.array(list(rows), pa.string()),
                "factor": pa.array(list(rows.values()), pa.int64()),
            }
        )
        write_deltalake(str(path), table, mode="overwrite")
        self.clock += 1
        if again or name not in self.tables:
            self.tables.setdefault(name, []).append([])
        self.tables[name][-1].append((rows, self.clock))

    def _pin(self) -> Pin | None:
        """What a new batch joins: the newest version of the table enrich points at."""
        if self.pointing is None:
            return None
        versions = self.tables[self.pointing]
        return (self.pointing, len(versions) - 1, len(versions[-1]) - 1)

    def _filled(self, clock: int) -> Pin | None:
        """What a judgment without a recorded table joins now: the table enrich points
        at, at the version loaded before its batch, or its oldest."""
        if self.pointing is None:
            return None
        generation = len(self.tables[self.pointing]) - 1
        before = [v for v, (_r, at) in enumerate(self.tables[self.pointing][-1]) if at < clock]
        return (self.pointing, generation, max(before, default=0))

    def _verify_pin(self, judgment: Judgment) -> Pin | None:
        """What a recomputation with the recorded tables joins for ``judgment``."""
        if self.pointing is None:
            return None
        return judgment.dim or self._filled(judgment.clock)

    def _factor(self, pin: Pin, sku: str) -> int | None:
        name, generation, version = pin
        return self.tables[name][generation][version][0].get(sku)

    def _needs_gone(self, judgments: list[Judgment]) -> bool:
        """Whether joining ``judgments`` as recorded needs a deleted table."""
        if self.pointing is None:
            return False
        return any(j.dim is not None and j.dim[:2] in self.gone for j in judgments)

    def _beyond(self, pos: dict[TP, int]) -> list[Judgment]:
        """The lineage's judgments of the offsets of the current log at or after ``pos``:
        what a replay from there joins again."""
        return [
            j
            for tp, held in self.recorded.items()
            if tp[0] == self.topic
            for o, j in held.items()
            if o >= pos.get(tp, 0)
        ]

    def _refused_for_a_deleted_table(self, done: Any) -> None:
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode != 0 and len(lines) == 1, f"{self.done}: {done.stderr[-1500:]}"
        assert "deleted and loaded again" in lines[0], lines[0]

    def load_dimension(self) -> None:
        name = self.rng.choice(TABLES)
        self._load(name)
        self.done.append(f"load {name}")

    def reload_dimension(self) -> None:
        name = self.rng.choice(TABLES)
        self._load(name, again=True)
        self.done.append(f"{name} deleted and loaded again")

    def new_definition(self) -> None:
        """A new pipeline version: enrich re-pointed, removed or added back; the sign
        of returns (a derived column) changes with every version."""
        self.pointing = self.rng.choice([*TABLES, None])
        self.version += 1
        self.path = self.pipeline_file(self.version)
        self.done.append(f"v{self.version} enrich -> {self.pointing}")

    # -- the watermark (windowed) ------------------------------------------------------
    def _batch_watermark(self) -> int:
        spark = None if self.newest_ms is None else self.newest_ms - 60_000
        return max(self.floor_ms, spark or 0)

    def _newest_window(self, point: Point) -> int | None:
        """The newest window start of the state at ``point`` (ms): what its seed
        gives Spark as its newest event time."""
        starts = [
            event["timestamp"] // 60 * 60_000
            for tp, judged in point.judged.items()
            for offset, judgment in judged.items()
            for event in [self.records[tp][offset]]
            if event is not None and not judgment.late
        ]
        return max(starts) if starts else None

    def _cut_from(self, point: Point | None, floor_ms: int | None = None) -> None:
        """A new epoch seeded with the state at ``point`` (None: emptied state): its
        watermark floor is the one ``point``'s batch was judged with (``floor_ms``:
        a backfill's, the highest its coverage holds)."""
        if point is None:
            self.floor_ms, self.newest_ms = 0, None
        else:
            self.floor_ms = point.watermark_ms if floor_ms is None else floor_ms
            self.newest_ms = self._newest_window(point)
        self.model.watermark_ms = self.floor_ms

    def check(self) -> None:
        state, expected = self.state(), self.expected()
        assert state == expected, f"after {self.done}: {state} != {expected}"
        if self.logs == 0:  # (a deleted log's offsets repeat the new log's)
            self.check_dead_letters()

    def check_dead_letters(self) -> None:
        """Every judged record that could not be aggregated (bad, or late) is in
        ``dead_letter`` exactly once, whatever the repairs judged again."""
        path = self.settings.warehouse / "inventory" / "dead_letter"
        found: list[tuple[str, int, int]] = []
        if DeltaTable.is_deltatable(str(path)):
            table = DeltaTable(str(path)).to_pyarrow_table()
            columns = [table.column(c).to_pylist() for c in ("topic", "partition", "offset")]
            found = sorted(zip(*columns, strict=True))
        wanted = sorted(
            (tp[0], tp[1], offset)
            for tp, judged in self.model.judged.items()
            for offset, judgment in judged.items()
            if self._dead_letter(self.records[tp][offset], judgment)
        )
        assert found == wanted, f"after {self.done}: dead letters {found} != {wanted}"

    # -- operations ----------------------------------------------------------------
    def produce(self) -> None:
        n = self.rng.randint(5, 60)
        producer = Producer({**self.kafka_config, "enable.idempotence": True})
        stamp = self.base_ms + self.rounds * HOUR_MS
        self.rounds += 1
        self.clock_s += self.rng.randint(20, 120)
        for i in range(n):
            tp = self.rng.choice(self.live())
            bad = self.rng.random() < 0.05
            event = (
                None
                if bad
                else {
                    "sku": f"S{self.rng.randint(0, 6)}",
                    "qty": self.rng.randint(1, 9),
                    "kind": self.rng.choice(KINDS),
                    "timestamp": self.clock_s - self.rng.randint(0, 200)
                    if self.windowed
                    else 1700000000 + i,
                }
            )
            value = b"not json" if event is None else json.dumps(event).encode()
            producer.produce(tp[0], value=value, partition=tp[1], timestamp=stamp + i)
            self.records[tp].append(event)
            self.stamps[tp].append(stamp + i)
        assert producer.flush(30) == 0
        self.done.append(f"produce({n})")

    def _ran(self) -> int:
        """The model after a run: every produced record judged, one new point.
        Returns how many were late."""
        new = False
        lates = 0
        watermark = self._batch_watermark() if self.windowed else 0
        for tp in self.live():
            events = self.records[tp]
            start = self.model.pos.get(tp, 0)
            judged = self.model.judged.setdefault(tp, {})
            for offset in range(start, len(events)):
                event = events[offset]
                late = (
                    self.windowed
                    and event is not None
                    and (event["timestamp"] // 60 * 60 + 60) * 1000 <= watermark
                )
                held = self.recorded.get(tp, {}).get(offset)
                if self.pointing is None:
                    dim = None
                elif held is not None:  # judged before: a replay joins what it held
                    dim = held.dim or self._filled(held.clock)
                else:
                    dim = self._pin()
                judged[offset] = Judgment(self.version, late, watermark, dim, dim, self.clock)
                self.recorded.setdefault(tp, {})[offset] = judged[offset]
                lates += late
                if self.windowed and event is not None and not late:
                    newest = event["timestamp"] * 1000
                    self.newest_ms = max(self.newest_ms or newest, newest)
                new = True
            self.model.pos[tp] = len(events)
        if new:
            self.model.watermark_ms = watermark
            self.points.append(self.model.copy())
        return lates

    def run(self) -> None:
        self.clock += 1  # its batches are planned after every load so far
        if self._needs_gone(self._beyond(self.model.pos)):
            refused = self.run_jobs(self.path, self.settings, "run", "--quiet", spark=self.spark)
            self._refused_for_a_deleted_table(refused)
            self.done.append("run refused: a replay needs a deleted table")
            return
        self.run_with_fault(
            self.path,
            self.settings.bootstrap_servers,
            self.settings.warehouse,
            None,
            spark=self.spark,
        )
        lates = self._ran()
        self.done.append(f"run ({lates} late)" if lates else "run")

    def crash_and_run(self) -> None:
        fault = self.rng.choice(FAULTS)
        if self._needs_gone(self._beyond(self.model.pos)):
            self.run()  # refused before any batch: nothing to kill
            return
        if all(self.model.pos.get(tp, 0) == len(self.records[tp]) for tp in self.live()):
            self.produce()  # something to read: a batch to kill
        code = self.run_with_fault(
            self.path, self.settings.bootstrap_servers, self.settings.warehouse, fault
        )
        self.run()  # (its batches' tables: those the killed ones recorded, the same)
        self.done[-1] = f"run killed {fault} ({code}), run"

    def add_partition(self) -> None:
        if len(self.live()) >= 4:
            return
        admin = AdminClient(self.kafka_config)
        count = len(self.live()) + 1
        for future in admin.create_partitions([NewPartitions(self.topic, count)]).values():
            future.result()
        time.sleep(1)
        self.records[(self.topic, count - 1)] = []
        self.stamps[(self.topic, count - 1)] = []
        self.done.append(f"partitions -> {count}")

    def recreate_topic(self) -> None:
        """The topic deleted and recreated with 1-3 partitions: the run refuses and
        names the repair (keep the state, read the new log from its start); the old
        log's judgments stay in the state, under keys of their own in the model."""
        admin = kafka_admin.admin(self.kafka_config)
        admin.delete_topics([self.topic])[self.topic].result()
        deadline = time.time() + 30
        while self.topic in admin.list_topics(timeout=5).topics and time.time() < deadline:
            time.sleep(0.2)
        count = self.rng.randint(1, 3)
        kafka_admin.create_topic(admin, self.topic, count)
        self.logs += 1
        self._cut_from(self.points[-1])  # the repair keeps the state (before the renames)
        old = f"{self.topic} (log {self.logs})"
        for tp in self.live():
            self.records[(old, tp[1])] = self.records.pop(tp)
            self.stamps.pop(tp)
            self.model.pos.pop(tp, None)
            if tp in self.model.judged:
                self.model.judged[(old, tp[1])] = self.model.judged.pop(tp)
            if tp in self.model.skipped:
                self.model.skipped[(old, tp[1])] = self.model.skipped.pop(tp)
            if tp in self.recorded:
                self.recorded[(old, tp[1])] = self.recorded.pop(tp)
        for part in range(count):
            self.records[(self.topic, part)] = []
            self.stamps[(self.topic, part)] = []
            self.model.pos[(self.topic, part)] = 0
        self.produce()
        refused = self.run_jobs(self.path, self.settings, "run", "--quiet", spark=self.spark)
        assert refused.returncode != 0, f"{self.done}: a run read a recreated topic"
        assert "deleted and recreated" in refused.stderr, refused.stderr[-1500:]
        repair = ["--to-earliest", "--topics", self.topic, "--mode", "skip"]
        self.jobs("rewind", *repair, "--reason", "topic recreated")
        # Offsets of the deleted log compare with nothing: the new log's lineage
        # starts here, with everything judged so far in the state.
        self.floor = self.model.copy()
        self.points = [self.model.copy()]
        self.done[-1] = f"topic recreated ({count} partitions), {self.done[-1]}, repaired"

    def crash_operation(self) -> None:
        """An operation killed after its fence (its cut written, the state not yet
        acted on): the run refuses, naming it; the same operation again completes."""
        operation = self.rng.choice(["reprocess", "rebuild", "skip"])
        if operation == "reprocess":
            where, target = self._rewind_target()
            args = ["rewind", *where, "--reason", "reprocess"]
            if self._needs_gone(self._replayed_from(target)):
                operation, args = "rebuild", ["rebuild", "--reason", "checkpoint lost"]
        elif operation == "skip":
            target = self._target(lambda tp: self.model.pos.get(tp, 0))
            args = ["rewind", "--mode", "skip", "--to-offset", self._offsets(target)]
            args += ["--reason", "skip"]
        else:
            args = ["rebuild", "--reason", "checkpoint lost"]
        killed = self.run_jobs(
            self.path, self.settings, *args, env={"PLATFORM_FAULT": "after_fence"}
        )
        assert killed.returncode == -9, f"{self.done}: {killed.stderr[-1500:]}"
        wait_out_a_killed_lease(self.settings.warehouse)
        refused = self.run_jobs(self.path, self.settings, "run", "--quiet", spark=self.spark)
        assert refused.returncode != 0 and "did not finish" in refused.stderr, (
            f"{self.done}: {refused.stderr[-1500:]}"
        )
        self.jobs(*args)
        if operation == "reprocess":
            self._restored(target)
        elif operation == "skip":
            self._skipped(target)
        else:
            self._cut_from(self.points[-1])
            self.points.append(self.model.copy())
        self.done.append(f"{' '.join(args[:2])} killed after its fence, run refused, again")

    def has_batches(self) -> bool:
        return bool(self.points)

    def _target(self, low: Callable[[TP], int]) -> dict[TP, int]:
        return {tp: self.rng.randint(low(tp), len(self.records[tp])) for tp in self.live()}

    def _time_target(self) -> tuple[list[str], dict[TP, int]]:
        """A time between two produce rounds, as ``--to-datetime`` or (for a rewind)
        ``--by-duration``, and the offsets Kafka finds for it: per partition the
        first record stamped at or after it, else the log end."""
        moment = self.base_ms + self.rng.randint(0, self.rounds) * HOUR_MS - HOUR_MS // 2
        target = {
            tp: next((o for o, ts in enumerate(stamps) if ts >= moment), len(stamps))
            for tp, stamps in self.stamps.items()
        }
        if self.rng.random() < 0.5:
            minutes = round((time.time() * 1000 - moment) / 60_000)
            return ["--by-duration", f"PT{minutes}M"], target
        when = datetime.fromtimestamp(moment / 1000, UTC).isoformat()
        return ["--to-datetime", when], target

    def _offsets(self, target: dict[TP, int]) -> str:
        spec: dict[str, dict[str, int]] = {}
        for (topic, part), off in target.items():
            spec.setdefault(topic, {})[str(part)] = off
        return json.dumps(spec)

    def skip(self) -> None:
        """Forward to offsets, or to a time: one that lies behind the stream in some
        partition is refused (a skip never counts a record twice) and changes nothing."""
        if self.rng.random() < 0.3:
            where, target = self._time_target()
        else:
            target = self._target(lambda tp: self.model.pos.get(tp, 0))
            where = ["--to-offset", self._offsets(target)]
        args = ["rewind", "--mode", "skip", *where, "--reason", "skip"]
        if any(off < self.model.pos.get(tp, 0) for tp, off in target.items()):
            refused = self.run_jobs(self.path, self.settings, *args, spark=self.spark)
            assert refused.returncode == 2, f"{self.done}: {refused.stderr[-1500:]}"
            assert "only moves forward" in refused.stderr, refused.stderr[-1500:]
            self.done.append(f"skip {where[0]} {sorted(target.values())} refused: behind")
            return
        self.jobs(*args)
        self._skipped(target)
        self.done.append(f"skip {where[0]} {sorted(target.values())}")

    def _skipped(self, target: dict[TP, int]) -> None:
        self._cut_from(self.points[-1])  # the state kept: seeded from the last point
        for tp, off in target.items():
            start = self.model.pos.get(tp, 0)
            self.model.skipped.setdefault(tp, set()).update(range(start, off))
            self.model.pos[tp] = off
        self.points.append(self.model.copy())

    def _rewind_target(self) -> tuple[list[str], dict[TP, int]]:
        """A reprocess target: earliest, offsets, a datetime or a duration."""
        draw = self.rng.random()
        if draw < 0.2:
            return ["--to-earliest"], {tp: 0 for tp in self.live()}
        if draw < 0.5:
            return self._time_target()
        target = self._target(lambda tp: 0)
        return ["--to-offset", self._offsets(target)], target

    def reprocess(self) -> None:
        where, target = self._rewind_target()
        if self._needs_gone(self._replayed_from(target)):
            refused = self.run_jobs(
                self.path,
                self.settings,
                "rewind",
                *where,
                "--reason",
                "reprocess",
                spark=self.spark,
            )
            self._refused_for_a_deleted_table(refused)
            self.done.append(f"reprocess {where[0]} refused: needs a deleted table")
            return
        self.jobs("rewind", *where, "--reason", "reprocess")
        self._restored(target)
        self.done.append(f"reprocess {where[0]} {sorted(target.values())}")

    def _replayed_from(self, target: dict[TP, int]) -> list[Judgment]:
        """The lineage's judgments a rewind to ``target`` replays (from its boundary,
        or from the first offsets)."""
        point = self._chosen(target)
        return self._beyond({} if point is None else point.pos)

    def _chosen(self, target: dict[TP, int]) -> Point | None:
        """The model's boundary for a target: the last point that judged nothing at
        or after it (what lies between it and the point's offsets was skipped)."""
        fits = [p for p in self.points if p.fits(target)]
        return fits[-1] if fits else None

    def _restored(self, target: dict[TP, int]) -> None:
        point = self._chosen(target)
        if point is None:
            self._emptied()
            return
        self.model = point.copy()
        self._cut_from(point)
        self.points = self.points[: self.points.index(point) + 1] + [self.model.copy()]

    def saved_plan(self) -> None:
        """A reviewed rewind applied after something else happened: refused (nothing
        changes) when a batch committed since the dry run, applied exactly otherwise."""
        target = self._target(lambda tp: 0)
        if self._needs_gone(self._replayed_from(target)):
            self.reprocess()  # (refused, or another target)
            return
        out = self.jobs(
            "rewind", "--to-offset", self._offsets(target), "--reason", "review", "--dry-run"
        )
        plan_id = out.rsplit("plan: ", 1)[1].split()[0]
        moved = False
        if self.rng.random() < 0.5:
            self.produce()
            if self.rng.random() < 0.5:
                before = self.last_batch()
                self.run()
                moved = self.last_batch() != before  # a batch committed since the review
        done = self.run_jobs(
            self.path,
            self.settings,
            "rewind",
            "--plan",
            plan_id,
            "--reason",
            "review",
            spark=self.spark,
        )
        if moved:
            assert done.returncode == 2 and "no longer fits" in done.stderr, done.stderr[-1500:]
        else:
            assert done.returncode == 0, f"{self.done}: {done.stderr[-1500:]}"
            self._restored(target)
        self.done.append(
            f"saved rewind to {sorted(target.values())}, {'refused' if moved else 'applied'}"
        )

    def _emptied(self) -> None:
        """Replayed from the first offsets, gaps and all (the plan says so): of the
        topic's current log, onto what the floor holds of its deleted ones."""
        self.model = Point({}, {}, {}) if self.floor is None else self.floor.copy()
        self.model.pos = {tp: 0 for tp in self.live()}
        self._cut_from(self.floor)
        self.points = [self.model.copy()]

    def rebuild(self) -> None:
        self.jobs("rebuild", "--reason", "checkpoint lost")
        self._cut_from(self.points[-1])
        self.points.append(self.model.copy())
        self.done.append("rebuild")

    def rebuild_from_source(self) -> None:
        if self._needs_gone(self._beyond({})):
            args = ("rebuild", "--from-source", "--reason", "recompute")
            self._refused_for_a_deleted_table(
                self.run_jobs(self.path, self.settings, *args, spark=self.spark)
            )
            self.done.append("rebuild --from-source refused: needs a deleted table")
            return
        self.jobs("rebuild", "--from-source", "--reason", "recompute")
        self._emptied()
        self.done.append("rebuild --from-source")

    def backfill(self, repair: bool = False) -> None:
        """A new version republishes the state: from the earliest offsets, or from the
        boundary at or before a target (the state there stays as it was judged).
        ``repair``: from the earliest offsets with each table's newest version (what
        a refusal for a deleted table names)."""
        self.version += 1
        self.path = self.pipeline_file(self.version)
        base: Point | None = None
        draw = 1.0 if repair else self.rng.random()
        if draw < 0.25:
            target = self._target(lambda tp: 0)
            start = ["--from-offset", self._offsets(target)]
            base = self._chosen(target)
        elif draw < 0.45:
            start, target = self._time_target()
            start = ["--from-datetime", start[1]] if start[0] == "--to-datetime" else start
            if start[0] == "--by-duration":  # a backfill starts from a datetime only
                start, target = ["--from-earliest"], {}
            base = self._chosen(target) if target else None
        else:
            start = ["--from-earliest"]
        if start[0] == "--from-earliest":
            base = self.floor
        label = start[0]
        if self.archive and not repair and self.rng.random() < 0.5:
            start += ["--source", "archive"]
            label += " --source archive"
        reads = [
            j
            for tp, judged in self.model.judged.items()
            for o, j in judged.items()
            if base is None or o not in base.judged.get(tp, {})
        ]
        newest = self.pointing is not None and (repair or self.rng.random() < 0.4)
        if not newest and self._needs_gone(reads):
            args = ("backfill", *start, "--reason", f"v{self.version}")
            self._refused_for_a_deleted_table(
                self.run_jobs(self.path, self.settings, *args, spark=self.spark)
            )
            label += " refused (a deleted table), then the repair:"
            newest = True
        if newest:
            start += ["--dimensions", "newest"]
            label += " --dimensions newest"
        self.jobs("backfill", *start, "--reason", f"v{self.version}")
        pin = self._pin() if newest else None
        for tp, judged in self.model.judged.items():
            kept = {} if base is None else base.judged.get(tp, {})
            for offset, judgment in judged.items():  # each decision as it was made
                redone = dataclasses.replace(
                    judgment,
                    version=self.version,
                    dim=pin or judgment.dim,
                    used=pin or self._verify_pin(judgment),
                )
                judged[offset] = kept.get(offset, redone)
                self.recorded.setdefault(tp, {})[offset] = judged[offset]
        if pin is not None:  # what a rewind discarded after its boundary stands with it too
            for tp, held in self.recorded.items():
                kept = {} if base is None else base.judged.get(tp, {})
                for offset, judgment in held.items():
                    if offset not in kept:
                        held[offset] = dataclasses.replace(judgment, dim=pin)
        # The new epoch: seeded with the published state, its floor the highest
        # watermark the judgments hold.
        highest = max(
            (j.watermark_ms for judged in self.model.judged.values() for j in judged.values()),
            default=0,
        )
        self._cut_from(self.model, highest)
        if base is None:
            kept_points = []
        elif base is self.floor:  # the lineage's first point since the recreation
            kept_points = self.points[:1]
        else:
            kept_points = self.points[: self.points.index(base) + 1]
        self.points = [*kept_points, self.model.copy()]
        self.done.append(f"backfill v{self.version} {label}")

    def maintain(self) -> None:
        """Compaction and vacuum: no row changes, every boundary stays restorable."""
        self.jobs("maintain", "--reason", "housekeeping")
        self.done.append("maintain")

    def verify(self) -> None:
        """The state recomputed with the current version: equal, unless some of it
        was judged by an older one (a backfill from a boundary keeps what it found
        there), which verify must then report."""
        done = self.run_jobs(self.path, self.settings, "verify", spark=self.spark)
        kept = {} if self.floor is None else self.floor.judged  # not recomputed
        recomputed = [
            j
            for tp, judged in self.model.judged.items()
            for o, j in judged.items()
            if o not in kept.get(tp, {})
        ]
        if self._needs_gone(recomputed):
            self._refused_for_a_deleted_table(done)
        elif self.expected(self.version) == self.expected():
            assert done.returncode == 0 and ", 0 differ" in done.stdout, (
                f"after {self.done}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
        else:
            assert done.returncode != 0 and "differ" in done.stderr, done.stderr[-1500:]
        self.done.append("verify")

    def check_status(self) -> None:
        """``status`` names no problem that is not there (nothing is damaged), and the
        one that is: a replay the next run refuses, and its repair."""
        status = json.loads(self.jobs("status", "--json"))
        if self._needs_gone(self._beyond(self.model.pos)):  # the next run is refused
            assert status["repair"] == "backfill --from-earliest --dimensions newest", status
            (problem,) = status["problems"]
            assert "deleted and loaded again" in problem, (self.done, status)
            return
        assert status["problems"] == [] and status["repair"] is None, (self.done, status)

    def step(self) -> None:
        """One operation drawn at random (those that need a batch only after one)."""
        choices: list[tuple[Callable[[], None], int]] = [
            (self.produce, 5),
            (self.run, 5),
            (self.crash_and_run, 1),
            (self.add_partition, 1),
            (self.rebuild_from_source, 1),
            (self.verify, 1),
            (self.maintain, 1),
        ]
        if self.enriched:
            choices += [(self.load_dimension, 3), (self.reload_dimension, 2)]
            choices += [(self.new_definition, 2)]
        if self.has_batches():
            choices += [
                (self.skip, 2),
                (self.reprocess, 2),
                (self.saved_plan, 1),
                (self.rebuild, 1),
                (self.backfill, 1),
                (self.crash_operation, 1),
                (self.recreate_topic, 1),
            ]
        operations, weights = zip(*choices, strict=True)
        self.rng.choices(operations, weights)[0]()
        self.check()


def run_sequence(
    seed: int, steps: int, check_every_step: bool = False, **context: Any
) -> list[str]:
    """``steps`` random operations with ``seed``, the state checked after each (and
    ``check_every_step``: verify and status too); then a run of what is left, a
    verify and status. Returns the operations done."""
    sequence = Sequence(rng=random.Random(seed), **context)
    sequence.produce()
    sequence.run()
    for _ in range(steps):
        sequence.step()
        if check_every_step:
            sequence.verify()
            sequence.done.pop()  # (not an operation of the sequence)
            sequence.check_status()
    sequence.produce()
    sequence.run()
    sequence.check()
    sequence.verify()
    sequence.check_status()
    if sequence.enriched and sequence._needs_gone(sequence._beyond(sequence.model.pos)):
        sequence.backfill(repair=True)  # the repair the refusals name
        sequence.run()
        sequence.check()
        sequence.verify()
        sequence.check_status()
    return sequence.done
