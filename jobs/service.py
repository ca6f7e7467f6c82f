"""The warm driver: one long-lived process that holds a SparkSession and runs the
``available-now`` runs it is sent, so that a scheduled run pays no JVM, Python
worker or JIT start-up (most of a cold run's seconds: docs/benchmarks.md).

    python -m jobs serve [--port 18090]                      # PLATFORM_DRIVER_PORT
    PLATFORM_DRIVER_URL=http://127.0.0.1:18090 python -m jobs run --pipeline P

It listens on loopback only. A run sent here is the same run as a local one: the
same code, commits and errors, in a Spark session of its own (``newSession``: its
own SQL settings and streams) on a thread of its own; the application lock still
allows one run per application. If the driver dies during a run, nothing of the
unfinished batch is committed and the next run, here or anywhere, replays it.
Continuous runs are long-lived processes of their own and never come here. With
``PLATFORM_DRIVER_TOKEN`` set, a request must carry it (``Authorization: Bearer``).
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import os
import signal
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from pyspark.sql import SparkSession

from jobs import faults
from jobs.errors import ConfigError, PlatformError
from jobs.pipeline import load_pipeline
from jobs.settings import ENV_PREFIX, Settings

log = logging.getLogger(__name__)

RUN_PATH = "/v1/run"
HEALTH_PATH = "/v1/health"
TOKEN_ENV = ENV_PREFIX + "DRIVER_TOKEN"
MAX_BODY = 16 * 1024
MAX_FIELD = 4096


class DriverError(PlatformError):
    """A run sent to the warm driver failed there (``exit_code``: the one a local
    run would have had)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


@dataclass(frozen=True)
class RunRequest:
    pipeline: str  # a name in the driver's pipelines folder, or a path
    warehouse: str
    bootstrap_servers: str

    @classmethod
    def parse(cls, body: bytes) -> RunRequest:
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"the request is not JSON: {exc}") from exc
        fields = ("pipeline", "warehouse", "bootstrap_servers")
        if not isinstance(data, dict) or sorted(data) != sorted(fields):
            raise ConfigError(f"the request must be a JSON object with exactly {list(fields)}")
        for name in fields:
            value = data[name]
            if not isinstance(value, str) or not 0 < len(value) <= MAX_FIELD:
                raise ConfigError(f"{name} must be a non-empty string of at most {MAX_FIELD}")
        return cls(data["pipeline"], data["warehouse"], data["bootstrap_servers"])


def summary_json(summary: Any) -> dict[str, Any]:
    return {
        "application_id": summary.application_id,
        "epoch": summary.epoch,
        "seconds": summary.seconds,
        "batches": [
            {"batch_id": b.batch_id, "skipped": b.skipped, "ledger": b.ledger}
            for b in summary.batches
        ],
    }


def summary_from_json(data: dict[str, Any]) -> Any:
    from jobs.streaming.batch import BatchResult
    from jobs.streaming.run import RunSummary

    batches = [BatchResult(b["batch_id"], b["skipped"], b["ledger"]) for b in data["batches"]]
    return RunSummary(data["application_id"], data["epoch"], batches, data["seconds"])


class WarmDriver:
    """Runs requests in the one SparkSession of this process."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings

    def run(self, request: RunRequest) -> dict[str, Any]:
        from jobs.streaming.run import run_pipeline
        from jobs.streaming.spark import register_sources

        # The driver's own settings decide where data goes; a client that believes
        # otherwise is refused rather than silently redirected.
        if Path(request.warehouse).resolve() != self.settings.warehouse:
            raise ConfigError(
                f"this warm driver serves the warehouse {self.settings.warehouse}, not "
                f"{request.warehouse}"
            )
        if request.bootstrap_servers != self.settings.bootstrap_servers:
            raise ConfigError(
                f"this warm driver reads {self.settings.bootstrap_servers}, not "
                f"{request.bootstrap_servers}"
            )
        pipeline = load_pipeline(request.pipeline, self.settings.pipelines_dir)
        session = self.spark.newSession()
        register_sources(session)
        summary = run_pipeline(session, pipeline, self.settings, "available-now")
        return summary_json(summary)


def _handler(driver: WarmDriver, token: str | None) -> type[BaseHTTPRequestHandler]:
    from jobs.cli import failure

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), format % args)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if token is None:
                return True
            given = self.headers.get("Authorization", "")
            return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

        def do_GET(self) -> None:
            if self.path != HEALTH_PATH:
                self._reply(404, {"ok": False, "error": f"no such path {self.path}"})
                return
            self._reply(200, {"ok": True, "warehouse": str(driver.settings.warehouse)})

        def do_POST(self) -> None:
            if self.path != RUN_PATH:
                self._reply(404, {"ok": False, "error": f"no such path {self.path}"})
                return
            if not self._authorized():
                self._reply(401, {"ok": False, "code": 2, "error": "missing or wrong token"})
                return
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > MAX_BODY:
                self._reply(413, {"ok": False, "code": 2, "error": "body missing or too large"})
                return
            try:
                request = RunRequest.parse(self.rfile.read(int(length)))
                log.info("run of %s requested", request.pipeline)
                self._reply(200, {"ok": True, "summary": driver.run(request)})
            except Exception as exc:
                code, message = failure(exc)
                if code != 2:
                    log.exception("run failed")
                self._reply(
                    422 if code == 2 else 500, {"ok": False, "code": code, "error": message}
                )

    return Handler


def serve(settings: Settings, port: int) -> int:
    """Start Spark, listen on loopback, run requests until SIGTERM/SIGINT; runs in
    progress finish before the session stops."""
    from jobs.streaming.spark import get_spark

    faults.arm()
    spark = get_spark(
        settings.spark_master,
        "platform-warm-driver",
        settings.spark_driver_memory,
        settings.spark_python,
    )
    token = os.environ.get(TOKEN_ENV) or None
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(WarmDriver(spark, settings), token))
    server.daemon_threads = False  # close() waits for runs in progress
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    thread = threading.Thread(target=server.serve_forever, name="warm-driver", daemon=True)
    thread.start()
    print(f"warm driver listening on http://127.0.0.1:{port}", flush=True)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        try:
            spark.stop()
        except Exception:  # the JVM got the signal too (a process-group stop): gone
            log.info("Spark had stopped already")
    return 0


def run_remote(settings: Settings, pipeline: str) -> Any:
    """Send an available-now run to the warm driver; its summary, or its error."""
    assert settings.driver_url is not None
    url = settings.driver_url + RUN_PATH
    target = Path(pipeline)
    body = {
        # A path is the same file for the driver on this machine; a name is looked
        # up in the driver's pipelines folder.
        "pipeline": str(target.resolve()) if target.exists() else pipeline,
        "warehouse": str(settings.warehouse),
        "bootstrap_servers": settings.bootstrap_servers,
    }
    headers = {"Content-Type": "application/json"}
    token = os.environ.get(TOKEN_ENV)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request) as response:  # a run takes as long as it takes
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        answer = json.load(exc)
    except (urllib.error.URLError, ConnectionRefusedError) as exc:
        raise PlatformError(
            f"no warm driver answers at {settings.driver_url} ({exc}); start one with "
            "python -m jobs serve, or unset PLATFORM_DRIVER_URL to run in this process"
        ) from exc
    except (http.client.HTTPException, ConnectionError) as exc:
        raise PlatformError(
            f"the warm driver at {settings.driver_url} ended during the run ({exc!r}); "
            "nothing of an unfinished batch was committed: run again (it replays the batch)"
        ) from exc
    if not answer.get("ok"):
        raise DriverError(str(answer.get("error")), int(answer.get("code", 2)))
    return summary_from_json(answer["summary"])
