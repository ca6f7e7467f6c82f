"""The Kafka cluster stops answering under a continuous run (the embedded broker
stopped, then started again on its data): the run waits for it and starts again
from its checkpoint, and every record is counted once; with no wait allowed it
stops with one error line and nothing half-written. Expectations are plain Python."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from jobs import broker as embedded
from jobs import kafka_admin
from tests.conftest import continuous_pipeline, produce, recent_clicks, run_jobs, start_stream
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
RECORDS = 2_000
# Spark's offset lookups give up after 3 s (four tries) instead of 15 s: a 25 s
# outage outlasts them, and the idle query fails the same way every time.
SHORT_TIMEOUTS = {
    "PLATFORM_KAFKA_DEFAULT_API_TIMEOUT_MS": "3000",
    "PLATFORM_KAFKA_REQUEST_TIMEOUT_MS": "2000",
}


def committed_records(warehouse: Path) -> int:
    ledger = warehouse / "user_clicks" / "_ledger"
    if not (ledger / "_delta_log").is_dir():
        return 0
    rows = DeltaTable(str(ledger)).to_pyarrow_table().to_pylist()
    return sum(r["records_in"] or 0 for r in rows if r["entry_type"] == "batch")


def wait_until(what: str, done, stream: subprocess.Popen[str], seconds: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not done():
        if stream.poll() is not None:
            raise AssertionError(
                f"the stream exited {stream.returncode} before {what}: "
                f"{stream.communicate()[1][-3000:]}"
            )
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.5)


@contextlib.contextmanager
def port_held(port: int) -> Iterator[None]:
    """Hold a stopped broker's port until its restart: another test worker's server
    could take a free port, and the run's clients would meet a stranger (a
    controller answering "The node does not support METADATA"). Every connection is
    closed at once, as by a port whose broker is gone."""
    server = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: past TIME_WAIT
    server.settimeout(0.2)
    done = threading.Event()

    def refuse() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                server.accept()[0].close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        server.close()


def test_a_continuous_run_waits_out_a_kafka_outage_and_counts_every_record_once(  # type: ignore[no-untyped-def]
    spark, settings, tmp_path
) -> None:
    data_dir = tmp_path / "broker"
    port = embedded.find_free_port()
    info = embedded.start(data_dir, port)
    try:
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        before, after = recent_clicks(RECORDS, 5), recent_clicks(RECORDS, 6)
        produce(config, "clicks", list(before))
        pipeline = continuous_pipeline(
            tmp_path, "user_clicks", "clicks", max_offsets_per_trigger=400
        )
        local = dataclasses.replace(settings, bootstrap_servers=info.bootstrap_servers)
        warehouse = local.warehouse

        stream = start_stream(
            pipeline, local, env={**SHORT_TIMEOUTS, "PLATFORM_OUTAGE_WAIT_SECONDS": "180"}
        )
        wait_until("the records", lambda: committed_records(warehouse) == RECORDS, stream, 120)
        # The stream is idle, asking Kafka for new offsets every second: past the
        # clients' time-outs the query fails, and the run waits for the broker.
        embedded.stop(data_dir)
        with port_held(port):
            time.sleep(25)
            assert stream.poll() is None, stream.communicate()[1][-3000:]
        info = embedded.start(data_dir, port)
        produce(config, "clicks", list(after))
        wait_until(
            "the new records", lambda: committed_records(warehouse) == 2 * RECORDS, stream, 180
        )
        stream.send_signal(signal.SIGTERM)
        _out, err = stream.communicate(timeout=120)
        assert stream.returncode == 0, err[-3000:]
        assert "Waiting up to" in err and "Kafka answers again" in err, err[-3000:]

        values: list[bytes | None] = [*before, *after]
        expected, dead, late = clicks_per_window([values])
        assert dead == late == 0
        rows = DeltaTable(str(warehouse / "user_clicks" / "state")).to_pyarrow_table().to_pylist()
        assert state_as_counter(rows, "clicks") == expected

        # No wait allowed: the run stops with one error line, nothing half-written.
        produce(config, "clicks", list(recent_clicks(800, 7)))
        stream = start_stream(
            pipeline, local, env={**SHORT_TIMEOUTS, "PLATFORM_OUTAGE_WAIT_SECONDS": "0"}
        )
        total = 2 * RECORDS + 800
        wait_until("more records", lambda: committed_records(warehouse) == total, stream, 120)
        embedded.stop(data_dir)
        with port_held(port):
            _out, err = stream.communicate(timeout=120)
        assert stream.returncode == 2, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: Kafka did not answer"), errors
        info = embedded.start(data_dir, port)
        ledger = DeltaTable(str(warehouse / "user_clicks" / "_ledger")).to_pyarrow_table()
        batches = [
            (r["epoch"], r["batch_id"]) for r in ledger.to_pylist() if r["entry_type"] == "batch"
        ]
        assert len(batches) == len(set(batches))
        checked = run_jobs(pipeline, local, "verify", spark=spark)
        assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]
    finally:
        embedded.stop(data_dir)
