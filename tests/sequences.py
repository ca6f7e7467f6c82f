"""Random sequences of operations on the real broker and Spark, checked against a
plain-Python model after every step (issue 28).

The application is ``inventory`` (quantity and movements per SKU, no window) on a
topic whose partitions the driver writes explicitly, so the model knows every
record's offset. A sequence draws from: produce (with bad records), run, a run
killed between two commits and recovered, add a partition, rewind skip and
reprocess to offsets, rebuild from Delta and from the source, backfill from the
earliest offsets with a new version (odd versions subtract returns, even ones add
them back), verify. The model keeps which offsets the state judged and with which
version, which a skip left out, and the lineage's points; the expected state is a
sum over the judged records. ``python -m benchmarks.sequences`` runs long ones.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable

from jobs.settings import REPO_ROOT, Settings

TP = tuple[str, int]
SIGNS = {1: {"receipt": 1, "sale": -1, "return": -1}, 0: {"receipt": 1, "sale": -1, "return": 1}}
KINDS = ["receipt", "receipt", "sale", "return"]
FAULTS = ["after_dead_letter", "after_changelog", "after_state", "after_ledger"]


def signed_qty(version: int) -> str:
    cases = " ".join(
        f"WHEN '{kind}' THEN {'' if sign > 0 else '-'}qty"
        for kind, sign in SIGNS[version % 2].items()
    )
    return f"CASE kind {cases} END"


@dataclass
class Point:
    """A lineage point of the model: offsets judged (with the version that judged
    each), offsets skipped, where the stream reads next."""

    judged: dict[TP, dict[int, int]]
    skipped: dict[TP, set[int]]
    pos: dict[TP, int]

    def copy(self) -> Point:
        return Point(
            {tp: dict(d) for tp, d in self.judged.items()},
            {tp: set(s) for tp, s in self.skipped.items()},
            dict(self.pos),
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
    version: int = 1
    model: Point = field(default_factory=lambda: Point({}, {}, {}))
    points: list[Point] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.records = {(self.topic, 0): [], (self.topic, 1): []}
        self.model.pos = {tp: 0 for tp in self.records}
        self.path = self.pipeline_file(self.version)

    # -- the application -------------------------------------------------------
    def pipeline_file(self, version: int) -> Path:
        data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
        data["source"]["topics"] = [self.topic]
        data["version"] = version
        data["derived"][0]["expr"] = signed_qty(version)
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

    def state(self) -> dict[str, tuple[int, int]]:
        table = DeltaTable(str(self.settings.warehouse / "inventory" / "state"))
        return {
            r["sku"]: (r["quantity"], r["movements"]) for r in table.to_pyarrow_table().to_pylist()
        }

    def expected(self, version_now: int | None = None) -> dict[str, tuple[int, int]]:
        """The state: each judged valid record with the version that judged it (or
        ``version_now``'s logic: what verify recomputes)."""
        totals: dict[str, tuple[int, int]] = {}
        for tp, judged in self.model.judged.items():
            for offset, judged_by in judged.items():
                version = judged_by if version_now is None else version_now
                event = self.records[tp][offset]
                if event is None:
                    continue  # a dead letter
                qty, count = totals.get(event["sku"], (0, 0))
                sign = SIGNS[version % 2][event["kind"]]
                totals[event["sku"]] = (qty + sign * event["qty"], count + 1)
        return totals

    def check(self) -> None:
        state, expected = self.state(), self.expected()
        assert state == expected, f"after {self.done}: {state} != {expected}"

    # -- operations ----------------------------------------------------------------
    def produce(self) -> None:
        n = self.rng.randint(5, 60)
        producer = Producer({**self.kafka_config, "enable.idempotence": True})
        now_ms = int(time.time() * 1000)
        for i in range(n):
            tp = self.rng.choice(sorted(self.records))
            bad = self.rng.random() < 0.05
            event = (
                None
                if bad
                else {
                    "sku": f"S{self.rng.randint(0, 6)}",
                    "qty": self.rng.randint(1, 9),
                    "kind": self.rng.choice(KINDS),
                    "timestamp": 1700000000 + i,
                }
            )
            value = b"not json" if event is None else json.dumps(event).encode()
            producer.produce(tp[0], value=value, partition=tp[1], timestamp=now_ms)
            self.records[tp].append(event)
        assert producer.flush(30) == 0
        self.done.append(f"produce({n})")

    def _ran(self) -> None:
        """The model after a run: every produced record judged, one new point."""
        new = False
        for tp, events in self.records.items():
            start = self.model.pos.get(tp, 0)
            judged = self.model.judged.setdefault(tp, {})
            for offset in range(start, len(events)):
                judged[offset] = self.version
                new = True
            self.model.pos[tp] = len(events)
        if new:
            self.points.append(self.model.copy())

    def run(self) -> None:
        self.run_with_fault(
            self.path,
            self.settings.bootstrap_servers,
            self.settings.warehouse,
            None,
            spark=self.spark,
        )
        self._ran()
        self.done.append("run")

    def crash_and_run(self) -> None:
        fault = self.rng.choice(FAULTS)
        code = self.run_with_fault(
            self.path, self.settings.bootstrap_servers, self.settings.warehouse, fault
        )
        self.run()
        self.done[-1] = f"run killed {fault} ({code}), run"

    def add_partition(self) -> None:
        if len(self.records) >= 4:
            return
        admin = AdminClient(self.kafka_config)
        count = len(self.records) + 1
        for future in admin.create_partitions([NewPartitions(self.topic, count)]).values():
            future.result()
        time.sleep(1)
        self.records[(self.topic, count - 1)] = []
        self.done.append(f"partitions -> {count}")

    def has_batches(self) -> bool:
        return bool(self.points)

    def _target(self, low: Callable[[TP], int]) -> dict[TP, int]:
        return {tp: self.rng.randint(low(tp), len(events)) for tp, events in self.records.items()}

    def _offsets(self, target: dict[TP, int]) -> str:
        spec: dict[str, dict[str, int]] = {}
        for (topic, part), off in target.items():
            spec.setdefault(topic, {})[str(part)] = off
        return json.dumps(spec)

    def skip(self) -> None:
        target = self._target(lambda tp: self.model.pos.get(tp, 0))
        self.jobs(
            "rewind", "--mode", "skip", "--to-offset", self._offsets(target), "--reason", "skip"
        )
        for tp, off in target.items():
            start = self.model.pos.get(tp, 0)
            self.model.skipped.setdefault(tp, set()).update(range(start, off))
            self.model.pos[tp] = off
        self.points.append(self.model.copy())
        self.done.append(f"skip to {sorted(target.values())}")

    def reprocess(self) -> None:
        earliest = self.rng.random() < 0.25
        target = {tp: 0 for tp in self.records} if earliest else self._target(lambda tp: 0)
        where = ["--to-earliest"] if earliest else ["--to-offset", self._offsets(target)]
        self.jobs("rewind", *where, "--reason", "reprocess")
        self._restored(target)
        self.done.append(f"reprocess to {sorted(target.values())}")

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
        self.points = self.points[: self.points.index(point) + 1] + [self.model.copy()]

    def saved_plan(self) -> None:
        """A reviewed rewind applied after something else happened: refused (nothing
        changes) when a batch committed since the dry run, applied exactly otherwise."""
        target = self._target(lambda tp: 0)
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
        """Replayed from the first offsets: gaps and all (the plan says so)."""
        self.model = Point({}, {}, {tp: 0 for tp in self.records})
        self.points = [self.model.copy()]

    def rebuild(self) -> None:
        self.jobs("rebuild", "--reason", "checkpoint lost")
        self.points.append(self.model.copy())
        self.done.append("rebuild")

    def rebuild_from_source(self) -> None:
        self.jobs("rebuild", "--from-source", "--reason", "recompute")
        self._emptied()
        self.done.append("rebuild --from-source")

    def backfill(self) -> None:
        """A new version republishes the state: from the earliest offsets, or from the
        boundary at or before a target (the state there stays as it was judged)."""
        self.version += 1
        self.path = self.pipeline_file(self.version)
        base: Point | None = None
        if self.rng.random() < 0.4:
            target = self._target(lambda tp: 0)
            start = ["--from-offset", self._offsets(target)]
            base = self._chosen(target)
        else:
            start = ["--from-earliest"]
        self.jobs("backfill", *start, "--reason", f"v{self.version}")
        for tp, judged in self.model.judged.items():
            kept = {} if base is None else base.judged.get(tp, {})
            for offset in judged:
                judged[offset] = kept.get(offset, self.version)
        kept_points = [] if base is None else self.points[: self.points.index(base) + 1]
        self.points = [*kept_points, self.model.copy()]
        self.done.append(f"backfill v{self.version} {start[0]}")

    def maintain(self) -> None:
        """Compaction and vacuum: no row changes, every boundary stays restorable."""
        self.jobs("maintain", "--reason", "housekeeping")
        self.done.append("maintain")

    def verify(self) -> None:
        """The state recomputed with the current version: equal, unless some of it
        was judged by an older one (a backfill from a boundary keeps what it found
        there), which verify must then report."""
        done = self.run_jobs(self.path, self.settings, "verify", spark=self.spark)
        if self.expected(self.version) == self.expected():
            assert done.returncode == 0 and ", 0 differ" in done.stdout, (
                f"after {self.done}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
        else:
            assert done.returncode != 0 and "differ" in done.stderr, done.stderr[-1500:]
        self.done.append("verify")

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
        if self.has_batches():
            choices += [
                (self.skip, 2),
                (self.reprocess, 2),
                (self.saved_plan, 1),
                (self.rebuild, 1),
                (self.backfill, 1),
            ]
        operations, weights = zip(*choices, strict=True)
        self.rng.choices(operations, weights)[0]()
        self.check()


def run_sequence(seed: int, steps: int, **context: Any) -> list[str]:
    """``steps`` random operations with ``seed``, checked after each; then a run of
    what is left and a verify. Returns the operations done."""
    sequence = Sequence(rng=random.Random(seed), **context)
    sequence.produce()
    sequence.run()
    for _ in range(steps):
        sequence.step()
    sequence.produce()
    sequence.run()
    sequence.check()
    sequence.verify()
    # status names no problem that is not there (nothing is lagging or damaged).
    status = json.loads(sequence.jobs("status", "--json"))
    assert status["problems"] == [] and status["repair"] is None, (sequence.done, status)
    return sequence.done
