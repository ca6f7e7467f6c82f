"""The warm driver: one long-lived process that holds a SparkSession and runs the
``available-now`` runs it is sent, so that a scheduled run pays no JVM, Python
worker or JIT start-up (most of a cold run's seconds: docs/benchmarks.md).

    python -m jobs serve [--port 18090]                      # PLATFORM_DRIVER_PORT
    PLATFORM_DRIVER_URL=http://127.0.0.1:18090 python -m jobs run --pipeline P

It listens on loopback only. A run sent here is the same run as a local one: the
client sends the pipeline file's path and hash, the hash of its ``jobs`` code and
of its settings, and the driver refuses any difference (restart it after a
deploy). Each application has one Spark session here (its own SQL settings and
streams), reused by its runs; at most ``MAX_RUNS`` run at once, and one per
application. If the driver dies during a run, nothing of the unfinished batch is
committed and the next run, here or anywhere, replays it. Continuous runs are
long-lived processes of their own and never come here.

Driver and client share a token: ``PLATFORM_DRIVER_TOKEN``, or when it is not set,
one the driver makes at start and writes where only its user can read it
(``<warehouse>/_driver/token-<port>``, mode 600), where a client of that user finds
it. The driver writes it only once it holds the port: a second ``serve`` on a busy
port stops with one line and leaves the live driver's token alone. The token
never crosses the socket: the client first asks for a challenge and checks the
driver's proof (an HMAC of the client's nonce), so another server on the port
learns nothing; the run request then carries an HMAC of the driver's
one-time nonce and the body's hash (``Authorization: Platform-MAC``). The driver
runs only pipeline files under ``PLATFORM_PIPELINES_DIR``: it resolves the path
once, opens what it resolved and checks, hashes and loads that one read.
A client that goes away does not stop its run (it commits exactly once anyway):
the next run of the application waits for the lock or is refused, as locally.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import os
import re
import secrets
import signal
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from jobs import faults
from jobs.errors import ConfigError, LockedError, PlatformError, failure
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import pipeline_from_text
from jobs.private_dir import private_dir
from jobs.settings import ENV_PREFIX, Settings, configured_driver_token

if TYPE_CHECKING:  # a client (run_remote) imports no Spark
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

RUN_PATH = "/v1/run"
HEALTH_PATH = "/v1/health"
CHALLENGE_PATH = "/v1/challenge"
MAC_SCHEME = "Platform-MAC"
NONCE = re.compile(r"[0-9a-f]{32,128}")
NONCE_TTL_S = 60.0
MAX_PIPELINE_BYTES = 1 << 20
TOKEN_ENV = ENV_PREFIX + "DRIVER_TOKEN"
MAX_BODY = 16 * 1024
MAX_FIELD = 4096
MAX_RUNS = 4  # at once: they share the driver's memory and cores
READ_TIMEOUT_S = 30.0
FIELDS = ("pipeline", "pipeline_sha256", "code", "settings")


class NoWarmDriver(PlatformError):
    """Nothing was sent, or the driver refused the run before starting it: no warm
    driver answers, or the one that does cannot take it (other code or settings,
    all its slots busy). A caller that can run the job elsewhere does so."""


class DriverError(PlatformError):
    """A run sent to the warm driver failed there (``exit_code``: the one a local
    run would have had)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


def token_file(settings: Settings, port: int) -> Path:
    """Where the driver writes its token for clients of its user: beside a local
    warehouse (one the user's Airflow shares), or in this user's own folder on this
    machine when the warehouse is a bucket (the driver listens on loopback: its
    clients are on this machine; elsewhere set PLATFORM_DRIVER_TOKEN on both sides)."""
    if settings.warehouse.is_s3:
        return private_dir("driver") / f"token-{port}"
    return settings.warehouse.path / "_driver" / f"token-{port}"


def driver_token(settings: Settings, port: int, given: str | None) -> tuple[str, Path | None]:
    """The token a request must carry, and the file it was written to (None: it was
    given, and is written nowhere)."""
    if given:
        return given, None
    token = secrets.token_urlsafe(32)
    path = token_file(settings, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token)
    temporary.replace(path)
    return token, path


def client_token(settings: Settings, url: str, given: str | None) -> str:
    if given:
        return given
    port = urllib.parse.urlsplit(url).port
    path = token_file(settings, port or 0)
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"the warm driver at {url} requires its token: set {TOKEN_ENV}, or run as the "
            f"user that started it (it writes {path})"
        ) from exc


def mac(token: str, *parts: str) -> str:
    """The proof that who computed it holds ``token``, bound to ``parts``."""
    message = "|".join(parts).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


class Challenges:
    """The driver's one-time nonces. A nonce carries its time and its own MAC under
    the token, so handing them out keeps no state (anyone may ask for one; no
    number of askers can push a client's nonce out); one that a request used is
    remembered until it expires, so a recorded request cannot be sent again."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._used: dict[str, float] = {}
        self._guard = threading.Lock()

    def issue(self) -> str:
        stamp, salt = f"{int(time.time() * 1000):012x}", secrets.token_hex(16)
        return stamp + salt + mac(self._token, "nonce", stamp, salt)[:32]

    def redeem(self, nonce: str) -> bool:
        """Whether ``nonce`` is one of ours, fresh and not used before (it is now)."""
        if len(nonce) != 76 or not NONCE.fullmatch(nonce):
            return False
        stamp, salt, tag = nonce[:12], nonce[12:44], nonce[44:]
        if not hmac.compare_digest(tag, mac(self._token, "nonce", stamp, salt)[:32]):
            return False
        now = time.time()
        if not 0 <= now - int(stamp, 16) / 1000 < NONCE_TTL_S:
            return False
        with self._guard:
            self._used = {n: t for n, t in self._used.items() if now - t < NONCE_TTL_S}
            if nonce in self._used:
                return False
            self._used[nonce] = now
        return True


def settings_digest(settings: Settings) -> str:
    """Where a run reads and writes, and how it talks to Kafka (credentials
    included, hashed): a warm driver runs only for clients that agree."""
    text = json.dumps(
        [settings.bootstrap_servers, str(settings.warehouse), sorted(settings.kafka_client.items())]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_sha256(path: Any) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@dataclass(frozen=True)
class RunRequest:
    pipeline: str  # the pipeline file's absolute path
    pipeline_sha256: str
    code: str  # package_digest() of the client's jobs/
    settings: str  # settings_digest() of the client's settings

    @classmethod
    def parse(cls, body: bytes) -> RunRequest:
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"the request is not JSON: {exc}") from exc
        if not isinstance(data, dict) or sorted(data) != sorted(FIELDS):
            raise ConfigError(f"the request must be a JSON object with exactly {list(FIELDS)}")
        for name in FIELDS:
            value = data[name]
            if not isinstance(value, str) or not 0 < len(value) <= MAX_FIELD:
                raise ConfigError(f"{name} must be a non-empty string of at most {MAX_FIELD}")
        return cls(**{name: data[name] for name in FIELDS})


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
    from jobs.streaming.summary import BatchResult, RunSummary

    batches = [BatchResult(b["batch_id"], b["skipped"], b["ledger"]) for b in data["batches"]]
    return RunSummary(data["application_id"], data["epoch"], batches, data["seconds"])


class WarmDriver:
    """Runs requests in this process's SparkContext, one session per application."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        from jobs.package import package_digest

        self.spark = spark
        self.settings = settings
        # What this process runs: the code imported now (and shipped at start).
        self.code = package_digest()
        self.settings_digest = settings_digest(settings)
        self.slots = threading.BoundedSemaphore(MAX_RUNS)
        self._guard = threading.Lock()
        self._sessions: dict[str, SparkSession] = {}
        self._running: dict[str, threading.Lock] = {}

    def check(self, request: RunRequest) -> Pipeline:
        if request.code != self.code:
            raise ConfigError(
                f"the warm driver runs other code (jobs {self.code}, the client's "
                f"{request.code}): restart it (python -m jobs serve) after a deploy"
            )
        if request.settings != self.settings_digest:
            raise ConfigError(
                "the warm driver has other settings (warehouse, bootstrap servers or Kafka "
                f"client; it serves {self.settings.warehouse} from "
                f"{self.settings.bootstrap_servers}): start it with the client's "
                "PLATFORM_* environment"
            )
        path, data = self._read_pipeline(request.pipeline)
        if hashlib.sha256(data).hexdigest() != request.pipeline_sha256:
            raise ConfigError(f"{request.pipeline} changed while the run was sent: send it again")
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None
        return pipeline_from_text(path, text)

    def _read_pipeline(self, given: str) -> tuple[Path, bytes]:
        """The file at ``given``, resolved once and read once, if it is under the
        pipelines folder: the file opened is checked (by its descriptor), so a
        symlink swapped in after the check is not followed."""
        folder = self.settings.pipelines_dir.resolve()
        refusal = ConfigError(
            f"the warm driver runs only pipelines under {folder} "
            f"({ENV_PREFIX}PIPELINES_DIR), not {given}"
        )
        path = Path(given).resolve()
        if not path.is_relative_to(folder):
            raise refusal
        try:
            # Non-blocking: a FIFO put there must not hold a run slot forever.
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise ConfigError(f"cannot read pipeline file {path}: {exc.strerror}") from None
        with os.fdopen(descriptor, "rb") as handle:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise ConfigError(f"{path} is not a regular file")
            # Linux names the file a descriptor holds; elsewhere the resolved path stands.
            proc = Path(f"/proc/self/fd/{descriptor}")
            opened = Path(os.readlink(proc)) if proc.is_symlink() else path
            if not opened.is_relative_to(folder):
                raise refusal
            try:
                data = handle.read(MAX_PIPELINE_BYTES + 1)
            except OSError as exc:
                raise ConfigError(f"cannot read pipeline file {path}: {exc.strerror}") from None
        if len(data) > MAX_PIPELINE_BYTES:
            raise ConfigError(f"{path} is larger than {MAX_PIPELINE_BYTES} bytes")
        return path, data

    def _session(self, application_id: str) -> tuple[SparkSession, threading.Lock]:
        with self._guard:
            if application_id not in self._sessions:
                # One session per application, reused: a session per run would leave
                # a streaming listener behind each time.
                session = self.spark.newSession()
                self._sessions[application_id] = session
                self._running[application_id] = threading.Lock()
            return self._sessions[application_id], self._running[application_id]

    def run(self, pipeline: Pipeline) -> dict[str, Any]:
        """Run ``pipeline`` (as ``check`` returned it) in its application's session."""
        from jobs.streaming.run import preflight, run_pipeline

        # As a local run does before Spark: a pipeline that does not fit the current
        # epoch is refused before the run records anything (its client checks nothing).
        preflight(pipeline, self.settings)
        session, running = self._session(pipeline.application_id)
        # The file lock decides between processes; this one between this driver's
        # threads (a lock file is per process on some file systems).
        if not running.acquire(blocking=False):
            raise LockedError(
                f"application {pipeline.application_id} is busy: a run on this warm driver"
            )
        try:
            return summary_json(run_pipeline(session, pipeline, self.settings, "available-now"))
        finally:
            running.release()

    def stop_runs(self) -> None:
        """Stop every run's query (between batches: what is committed stays)."""
        with self._guard:
            sessions = list(self._sessions.values())
        for session in sessions:
            for query in session.streams.active:
                query.stop()


class _Handler(BaseHTTPRequestHandler):
    """The warm driver's HTTP answers; ``_handler`` gives it its driver and token."""

    driver: WarmDriver
    token: str
    challenges: Challenges

    timeout = READ_TIMEOUT_S  # a client that sends too slowly holds no thread for long

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError as exc:  # the client went away; the run's outcome stands
            log.warning("could not answer the client (%s): %s", exc, body.get("error", "ok"))

    def _refuse(self, status: int, message: str, code: int = 2) -> None:
        """An answer for a run that was not started (the client may run it elsewhere)."""
        self._reply(status, {"ok": False, "code": code, "error": message, "started": False})

    def _authorized(self, body: bytes) -> bool:
        scheme, _, rest = self.headers.get("Authorization", "").partition(" ")
        nonce, _, given = rest.partition(" ")
        if scheme != MAC_SCHEME or not self.challenges.redeem(nonce):
            return False
        wanted = mac(self.token, "client", nonce, hashlib.sha256(body).hexdigest())
        return hmac.compare_digest(given.encode(), wanted.encode())

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == HEALTH_PATH:
            self._reply(200, {"ok": True, "code": self.driver.code})
            return
        if url.path != CHALLENGE_PATH:
            self._refuse(404, f"no such path {url.path}")
            return
        client = urllib.parse.parse_qs(url.query).get("client", [""])[0]
        if not NONCE.fullmatch(client):
            self._refuse(400, "client must be a hex nonce of 32 to 128 digits")
            return
        nonce = self.challenges.issue()
        proof = mac(self.token, "driver", client, nonce)
        self._reply(200, {"ok": True, "nonce": nonce, "proof": proof})

    def _authorized_body(self) -> bytes | None:
        """The run request's body, or None once refused (path, type, size, token)."""
        if self.path != RUN_PATH:
            self._refuse(404, f"no such path {self.path}")
            return None
        if self.headers.get("Content-Type") != "application/json":
            self._refuse(415, "the request must be application/json")
            return None
        length = self.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY:
            self._refuse(413, "body missing or too large")
            return None
        self.connection.settimeout(READ_TIMEOUT_S)
        body = self.rfile.read(int(length))
        self.connection.settimeout(None)
        if not self._authorized(body):
            self._refuse(401, "missing or wrong token")
            return None
        return body

    def do_POST(self) -> None:
        body = self._authorized_body()
        if body is None:
            return
        if not self.driver.slots.acquire(blocking=False):
            self._refuse(503, f"the warm driver is busy with {MAX_RUNS} runs: try again")
            return
        try:
            request = RunRequest.parse(body)
            log.info("run of %s requested", request.pipeline)
            pipeline = self.driver.check(request)
        except Exception as exc:
            self.driver.slots.release()
            code, message = failure(exc)
            self._refuse(422 if code == 2 else 500, message, code)
            return
        try:
            answer = {"ok": True, "summary": self.driver.run(pipeline)}
        except Exception as exc:
            code, message = failure(exc)
            if code != 2:
                log.exception("run failed")
            answer = {"ok": False, "code": code, "error": message}
        finally:
            self.driver.slots.release()
        self._reply(200 if answer["ok"] else 422 if answer["code"] == 2 else 500, answer)


def _handler(driver: WarmDriver, token: str) -> type[BaseHTTPRequestHandler]:
    attributes = {"driver": driver, "token": token, "challenges": Challenges(token)}
    return type("Handler", (_Handler,), attributes)


def listen(port: int) -> ThreadingHTTPServer:
    """The driver's socket on loopback, bound and listening before anything else is
    done: a port that is taken (another warm driver's, perhaps) is refused with one
    line, and that driver's token file stays as it is. Requests wait in the
    socket's backlog until the driver serves them."""
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on port {port} of 127.0.0.1 ({exc.strerror}): another warm "
            f"driver may run there; choose another port (--port, {ENV_PREFIX}DRIVER_PORT)"
        ) from None
    server.daemon_threads = False  # close() waits for the runs to return
    return server


def serve(settings: Settings, port: int, train_events: int = 0) -> int:
    """Listen on loopback, start Spark, train it on ``train_events`` events
    (``driver_training.py``), run requests until SIGTERM/SIGINT, which stops the runs
    in progress between batches and then the session."""
    from jobs.driver_training import train
    from jobs.streaming import run  # noqa: F401 (imported now: the code the digest names)
    from jobs.streaming.spark import get_spark

    server = listen(port)  # first: the token file is written only by the port's holder
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # From here a stop is never lost: the training ends on it, and so does serving.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    # Then the token, before Spark's start: a client meanwhile waits in the backlog
    # with this driver's token, not the one of a driver that ran here before.
    written: Path | None = None
    try:
        token, written = driver_token(settings, port, configured_driver_token())
        faults.arm()
        spark = get_spark(
            settings.spark_master,
            "platform-warm-driver",
            settings.spark_driver_memory,
            settings.spark_python,
        )
    except BaseException:
        server.server_close()
        if written is not None:
            written.unlink(missing_ok=True)
        raise
    # Before serving: a client meanwhile waits (the stream DAGs' tasks, after 30 s,
    # run with spark-submit instead).
    train(spark, settings, train_events, stop)
    driver = WarmDriver(spark, settings)
    server.RequestHandlerClass = _handler(driver, token)
    thread = threading.Thread(target=server.serve_forever, name="warm-driver", daemon=True)
    if not stop.is_set():  # else stopped while it started or trained: it never serves
        thread.start()
        print(f"warm driver listening on http://127.0.0.1:{port} (jobs {driver.code})", flush=True)
        if written is not None:
            print(f"its token is in {written} (readable by this user only)", flush=True)
    try:
        stop.wait()
    finally:
        if written is not None:
            written.unlink(missing_ok=True)
        if thread.is_alive():
            server.shutdown()
        driver.stop_runs()
        server.server_close()
        try:
            spark.stop()
        except Exception:  # the JVM got the signal too (a process-group stop): gone
            log.info("Spark had stopped already")
    return 0


def _verified_nonce(opener: urllib.request.OpenerDirector, url: str, token: str) -> str:
    """The driver's one-time nonce, once it has proved it holds the token."""
    client = secrets.token_hex(32)
    try:
        with opener.open(f"{url}{CHALLENGE_PATH}?client={client}", timeout=30) as response:
            answer = json.loads(response.read(MAX_BODY))
        nonce, proof = str(answer["nonce"]), str(answer["proof"])
    except urllib.error.HTTPError as exc:
        raise NoWarmDriver(f"{url} did not answer as a warm driver (HTTP {exc.code})") from exc
    except urllib.error.URLError as exc:
        raise NoWarmDriver(
            f"no warm driver answers at {url} ({exc.reason}); start one with python -m jobs "
            "serve, or unset PLATFORM_DRIVER_URL to run in this process"
        ) from exc
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
        raise NoWarmDriver(f"{url} did not answer as a warm driver ({exc!r})") from exc
    if not NONCE.fullmatch(nonce) or not hmac.compare_digest(
        proof.encode(), mac(token, "driver", client, nonce).encode()
    ):
        raise NoWarmDriver(
            f"the server at {url} did not prove it holds the warm driver's token (a wrong "
            f"{TOKEN_ENV}, or another server on the port): nothing was sent to it"
        )
    return nonce


def run_remote(settings: Settings, pipeline: Pipeline, url: str | None = None) -> Any:
    """Send an available-now run of ``pipeline`` to the warm driver at ``url``
    (default ``PLATFORM_DRIVER_URL``); its summary. ``NoWarmDriver``: nothing ran."""
    from jobs.package import package_digest

    url = url or settings.driver_url
    assert url is not None and pipeline.source_path is not None
    if os.environ.get(faults.ENV):
        raise NoWarmDriver(
            f"{faults.ENV} applies to the process that runs the batch: set it on the warm "
            "driver, or unset PLATFORM_DRIVER_URL"
        )
    try:
        token = client_token(settings, url, configured_driver_token())
    except ConfigError as exc:
        raise NoWarmDriver(str(exc)) from None
    path = pipeline.source_path.resolve()
    body = {
        "pipeline": str(path),
        "pipeline_sha256": file_sha256(path),
        "code": package_digest(),
        "settings": settings_digest(settings),
    }
    # Never through a proxy: the request stays on loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    nonce = _verified_nonce(opener, url, token)
    data = json.dumps(body).encode()
    signature = mac(token, "client", nonce, hashlib.sha256(data).hexdigest())
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"{MAC_SCHEME} {nonce} {signature}",
    }
    request = urllib.request.Request(url + RUN_PATH, data=data, headers=headers)
    try:
        with opener.open(request) as response:  # a run takes as long as it takes
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
    except urllib.error.URLError as exc:
        # Answered the challenge a moment ago: whether the run started is unknown.
        raise PlatformError(
            f"the warm driver at {url} went away ({exc.reason}); nothing of an unfinished "
            "batch was committed: run again (it replays the batch)"
        ) from exc
    except (http.client.HTTPException, ConnectionError) as exc:
        raise PlatformError(
            f"the warm driver at {url} ended during the run ({exc!r}); "
            "nothing of an unfinished batch was committed: run again (it replays the batch)"
        ) from exc
    try:
        answer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlatformError(f"{url} did not answer as a warm driver: {raw[:200]!r}") from exc
    if not answer.get("ok"):
        code = int(answer.get("code", 2))
        if answer.get("started") is False:
            raise NoWarmDriver(f"the warm driver at {url} refused the run: {answer.get('error')}")
        where = " (the traceback is in the warm driver's log)" if code != 2 else ""
        raise DriverError(f"{answer.get('error')}{where}", code)
    return summary_from_json(answer["summary"])
