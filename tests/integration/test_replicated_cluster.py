"""A replicated cluster, as users run Kafka: three KRaft nodes, every topic with three
replicas and two in sync to take a write (``python -m jobs broker start --nodes 3``).

A continuous stream reads a 4-partition topic under a live producer and publishes
to an output topic. In a seeded random order, the leader of a partition is
SIGKILLed mid-batch, and so is the node that coordinates the output topic's
transactions; each node comes back a while later. (A run killed mid-batch is
``test_crash_restart``'s.) Then every node stops under the stream and the cluster
restarts from its kept data: a stream that gives up in the outage is restarted,
as a scheduler retries it. The Spark checkpoint is lost while the stream is down
(``rebuild`` restores it from Delta). Last, a scheduled run catches up while
another leader is killed under it. No other operation is run. The state must be
exact against plain Python, every dead letter there once, the ledger's ranges must
tile every partition, and the output topic read ``read_committed`` must carry
every state change once.

The warehouse is on the project's S3 server, as in a deployment where the machines
share nothing but Kafka and the bucket: the killed stream's lease holds the
application until it expires, and the rebuild takes it over then.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from jobs import broker as embedded
from jobs import kafka_admin
from jobs.monitoring_group import group_id
from jobs.output.publisher import transactional_id
from jobs.settings import REPO_ROOT
from tests.conftest import jobs_args, pipeline_file, run_in_process, wait_out_a_killed_lease
from tests.live import (
    LiveProducer,
    assert_exact_clicks,
    assert_ledger_tiles,
    kill,
    ledger_batches,
    start_stream,
    wait_for_batches,
)
from tests.output_topic import (
    assert_published_like_the_changelog,
    last_values,
    read_output,
    state_table,
    with_output,
)

pytestmark = pytest.mark.integration
PARTITIONS = 4


def broker_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", "broker", *args, "--data-dir", str(data_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[embedded.ClusterInfo]:
    """Three nodes from the command line (``broker start --nodes 3``), shared by the
    file's tests (each leaves every node running); ``stop`` ends every node,
    including those the tests restarted."""
    data_dir = tmp_path_factory.mktemp("replicated") / "cluster"
    started = broker_cli(data_dir, "start", "--nodes", "3")
    try:
        assert started.returncode == 0, started.stderr
        assert sum(line.startswith("node ") for line in started.stdout.splitlines()) == 3
        status = broker_cli(data_dir, "status")
        assert status.returncode == 0 and status.stdout.count(" running: 127.0.0.1:") == 3
        nodes = embedded.cluster_status(data_dir)
        assert sorted(nodes) == [1, 2, 3] and all(nodes.values())
        yield embedded.ClusterInfo(data_dir, {n: i for n, i in nodes.items() if i})
    finally:
        stopped = broker_cli(data_dir, "stop")
        assert stopped.returncode == 0 and "3 of 3 nodes stopped" in stopped.stdout
        assert not any(embedded.cluster_status(data_dir).values())
        assert_stopped_cleanly(data_dir)


def assert_stopped_cleanly(data_dir: Path) -> None:
    """Every node wrote Kafka's clean-shutdown marker: none was left to SIGKILL."""
    unclean = [
        node.name
        for node in sorted(data_dir.glob("node-*"))
        if not (node / "kafka-logs" / ".kafka_cleanshutdown").exists()
    ]
    assert not unclean, f"{unclean} did not shut down cleanly"


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (how Kafka places a transactional id)."""
    value = 0
    for char in text:
        value = (31 * value + ord(char)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def leader(config: dict[str, str], topic: str, partition: int) -> int:
    meta = kafka_admin.admin(config).list_topics(topic=topic, timeout=30).topics[topic]
    return int(meta.partitions[partition].leader)


def coordinator(config: dict[str, str], application_id: str) -> int:
    """The node coordinating the output publisher's transactions."""
    return coordinator_of(config, "__transaction_state", transactional_id(application_id))


def coordinator_of(config: dict[str, str], log: str, key: str) -> int:
    """The node coordinating ``key`` (a transactional id or a group): Kafka places it
    by ``Utils.abs(key.hashCode()) % partitions`` of its internal ``log``."""
    count = len(kafka_admin.admin(config).list_topics(topic=log, timeout=30).topics[log].partitions)
    code = java_hash(key)
    return leader(config, log, (0 if code == -(1 << 31) else abs(code)) % count)


def without_plans(log: str) -> str:
    """A stream's stderr without Spark's plan trees (they push the Python traceback
    out of a failure's message)."""
    return "\n".join(line for line in log.splitlines() if not PLAN_LINE.match(line))


PLAN_LINE = re.compile(r"^[\s:|+~-]*([+:]- |\+- )")


def wait_until_replicated(config: dict[str, str]) -> None:
    """Until every partition of every topic has its three replicas in sync again (a
    restarted node catches up before the next one dies)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        topics = kafka_admin.admin(config).list_topics(timeout=30).topics.values()
        if all(len(p.isrs) == 3 for t in topics for p in t.partitions.values()):
            return
        time.sleep(0.5)
    raise AssertionError("the cluster did not get every replica back in sync in 120 s")


def wait_for_leader(config: dict[str, str], topic: str, partitions: int, gone: int) -> None:
    """Until every partition has a leader other than the dead node ``gone``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        leaders = {leader(config, topic, p) for p in range(partitions)}
        if gone not in leaders and min(leaders) >= 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"node {gone} still leads a partition of {topic}")


def test_leader_and_coordinator_failover_keep_every_record_exactly_once(  # type: ignore[no-untyped-def]
    spark, cluster, tmp_path, s3_warehouse, monkeypatch
) -> None:
    data_dir, servers = cluster.data_dir, cluster.bootstrap_servers
    config = kafka_admin.client_config(servers)
    topic, output = "clicks", "clicks_out"
    kafka_admin.create_topic(kafka_admin.admin(config), topic, PARTITIONS, {"retention.ms": "-1"})
    described = kafka_admin.admin(config).list_topics(topic=topic, timeout=30).topics[topic]
    assert all(len(p.replicas) == 3 for p in described.partitions.values())
    path = with_output(
        pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=1500), output, 2
    )
    data = yaml.safe_load(path.read_text())
    data["trigger"] = {"mode": "continuous", "interval": "1 second"}
    path.write_text(yaml.safe_dump(data))
    warehouse = s3_warehouse
    # Renewed every 1.5 s; a stream that misses renewals for 4.5 s stops (and is
    # restarted like one that gave up in an outage).
    monkeypatch.setenv("PLATFORM_LEASE_SECONDS", "6")
    rng = random.Random(20261126)
    started = time.monotonic()
    timeline: list[str] = []  # what happened when: printed, and in a failure's message

    def step(what: str) -> None:
        timeline.append(f"{time.monotonic() - started:.0f}s {what}")

    def node_dies(node: int, what: str) -> None:
        time.sleep(rng.uniform(0.2, 1.2))  # into the next batch
        embedded.kill_node(data_dir, node)
        step(f"{what}: node {node}")

    def batches_after(stream: subprocess.Popen[str], more_than: int) -> None:
        """Until the ledger has more than ``more_than`` batches; else the stream's log."""
        try:
            wait_for_batches(warehouse, more_than, timeout=180)
        except AssertionError:
            if stream.poll() is None:
                os.killpg(stream.pid, signal.SIGKILL)
            _out, err = stream.communicate(timeout=60)
            raise AssertionError(f"after {timeline}: {without_plans(err)[-6000:]}") from None

    def restarted_if_it_gave_up(
        stream: subprocess.Popen[str], more_than: int
    ) -> subprocess.Popen[str]:
        """The stream, or a new one if it exits before the ledger has more than
        ``more_than`` batches: a stream may give up in an outage (a scheduler's retry
        restarts it), and exactness must hold either way. Its error goes on the
        timeline."""
        deadline = time.monotonic() + 180
        while stream.poll() is None and time.monotonic() < deadline:
            if len(ledger_batches(warehouse)) > more_than:
                return stream
            time.sleep(0.5)
        if stream.poll() is None:
            return stream  # batches_after reports it
        _out, err = stream.communicate(timeout=60)
        step(f"stream exited {stream.returncode} in the outage: {without_plans(err)[-3000:]}")
        return start_stream(path, servers, warehouse)

    producer = LiveProducer(config, topic)
    producer.start()
    stream = start_stream(path, servers, warehouse)
    try:
        batches_after(stream, 0)
        step("the stream's first batch")
        events = ["leader", "coordinator"]
        rng.shuffle(events)
        for event in events:
            done = len(ledger_batches(warehouse))
            node = (
                coordinator(config, "user_clicks")
                if event == "coordinator"
                else leader(config, topic, rng.randrange(PARTITIONS))
            )
            node_dies(node, event)
            degraded = broker_cli(data_dir, "status")  # names the dead node, exits 1
            assert degraded.returncode == 1 and f"node {node}: not running" in degraded.stdout
            wait_for_leader(config, topic, PARTITIONS, node)
            step("a new leader for every partition")
            batches_after(stream, done + 2)  # on two nodes
            step("two batches on two nodes")
            embedded.start_node(data_dir, node)
            wait_until_replicated(config)
            step(f"node {node} back in sync")

        # Every node stops under the stream and the cluster comes back from its kept
        # data (same ports, same cluster id). A stream that gave up is restarted.
        done = len(ledger_batches(warehouse))
        producer.pause()
        stopped = broker_cli(data_dir, "stop")
        assert stopped.returncode == 0 and "3 of 3 nodes stopped" in stopped.stdout
        assert_stopped_cleanly(data_dir)
        time.sleep(2)
        restarted = broker_cli(data_dir, "start", "--nodes", "3")
        assert restarted.returncode == 0, restarted.stderr
        producer.resume()
        step("every node")
        stream = restarted_if_it_gave_up(stream, done + 1)
        batches_after(stream, done + 1)
        step("a batch after the outage")

        # The Spark checkpoint is lost while the stream is down: rebuild from Delta.
        kill(stream)
        (warehouse / "user_clicks" / "_checkpoints").delete_tree()
        step("the checkpoint")
        wait_out_a_killed_lease(warehouse)
        rebuild = jobs_args(path, servers, warehouse, "rebuild", "--reason", "checkpoint lost")
        rebuilt = run_in_process(spark, rebuild)
        assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
        step("rebuilt")
    finally:
        producer.stopped.set()
        producer.join(60)
        if stream.poll() is None:
            kill(stream)
    assert producer.error is None, producer.error

    # A scheduled run catches up the backlog while another leader dies under it.
    backlog = [b'{"user_id": "u%d", "timestamp": %d}' % (i % 40, time.time()) for i in range(3000)]
    kafka_admin.produce_all(config, topic, ((None, v, None) for v in backlog))
    command = jobs_args(path, servers, warehouse, "run", "--trigger", "available-now", "--quiet")
    outcome: dict[str, Any] = {}

    def scheduled_run() -> None:
        try:
            outcome["done"] = run_in_process(spark, command)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    runner = threading.Thread(target=scheduled_run)
    done = len(ledger_batches(warehouse))
    runner.start()
    wait_for_batches(warehouse, done, timeout=180)
    node = leader(config, topic, rng.randrange(PARTITIONS))
    node_dies(node, "leader under the scheduled run")
    runner.join(300)
    assert not runner.is_alive(), "the scheduled run did not end in 300 s"
    assert "error" not in outcome, outcome.get("error")
    embedded.start_node(data_dir, node)
    caught_up = outcome["done"]
    if caught_up.returncode != 0:  # a scheduler's retry: no operation
        step(f"scheduled run retried after: {caught_up.stderr.strip()[-300:]}")
        caught_up = run_in_process(spark, command)
    assert caught_up.returncode == 0, caught_up.stderr[-3000:]
    step("caught up")
    print("\n".join(timeline))

    values = producer.values + backlog
    marks = kafka_admin.watermarks(config, [(topic, p) for p in range(PARTITIONS)])
    assert sum(high for _low, high in marks.values()) == len(values)  # acks=all: none lost
    assert_exact_clicks(warehouse, values)
    batches = ledger_batches(warehouse)
    assert len({b["epoch"] for b in batches}) >= 2  # the rebuild started a new epoch
    assert_ledger_tiles(batches, topic, {p: marks[(topic, p)][1] for p in range(PARTITIONS)})
    records = read_output(config, output)
    assert_published_like_the_changelog(records, warehouse)
    assert last_values(records) == state_table(warehouse)


# Commits offsets to the monitoring group every 0.1 s until the file ``stop`` exists.
COMMITTER = """
import sys, time
from pathlib import Path
from jobs import kafka_admin
from jobs.monitoring_group import MonitoringGroup
group = MonitoringGroup(kafka_admin.client_config(sys.argv[1]), "monitored")
offset = 0
while not Path(sys.argv[2]).exists():
    offset += 1
    group.commit({"clicks": {"0": offset}})
    time.sleep(0.1)
group.close(60)
print(offset)
"""


def test_monitoring_commits_survive_their_coordinator_dying(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The group's coordinator is SIGKILLed while commits are in flight. (With the
    admin API's offset commit, librdkafka aborted the committing process here.)"""
    config = kafka_admin.client_config(cluster.bootstrap_servers)
    kafka_admin.create_topic(kafka_admin.admin(config), "clicks", PARTITIONS)  # kept if there
    stop = tmp_path / "stop"
    committer = subprocess.Popen(
        [sys.executable, "-c", COMMITTER, cluster.bootstrap_servers, str(stop)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # the first commits create the group's log
        node = coordinator_of(config, "__consumer_offsets", group_id("monitored"))
        embedded.kill_node(cluster.data_dir, node)
        time.sleep(15)  # commits go on to the dead coordinator and past it
        embedded.start_node(cluster.data_dir, node)
        wait_until_replicated(config)
        stop.touch()
        out, err = committer.communicate(timeout=120)
    finally:
        if committer.poll() is None:
            committer.kill()
    assert committer.returncode == 0, err[-3000:]
    last = int(out.strip())
    reader = Consumer({**config, "group.id": group_id("monitored")})
    try:
        [committed] = reader.committed([TopicPartition("clicks", 0)], timeout=30)
    finally:
        reader.close()
    assert committed.offset == last  # the newest commit reached the group
