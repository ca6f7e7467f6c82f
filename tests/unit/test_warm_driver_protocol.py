"""The warm driver's request checks (``jobs/warm_driver.py``), without Spark: what a
client sends is validated, and a client with other settings is told apart."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from jobs.errors import ConfigError
from jobs.settings import load_settings
from jobs.warehouse import Location
from jobs.warm_driver import FIELDS, RunRequest, settings_digest

GOOD = {name: "x" for name in FIELDS}


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        json.dumps([GOOD]).encode(),
        json.dumps({**GOOD, "extra": "x"}).encode(),
        json.dumps({k: v for k, v in GOOD.items() if k != "code"}).encode(),
        json.dumps({**GOOD, "pipeline": 3}).encode(),
        json.dumps({**GOOD, "pipeline": ""}).encode(),
        json.dumps({**GOOD, "settings": "s" * 5000}).encode(),
    ],
)
def test_bad_requests_are_refused(body: bytes) -> None:
    with pytest.raises(ConfigError):
        RunRequest.parse(body)


def test_a_good_request_parses() -> None:
    assert RunRequest.parse(json.dumps(GOOD).encode()) == RunRequest("x", "x", "x", "x")


def test_settings_that_change_where_data_goes_change_the_digest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = load_settings()
    assert settings_digest(base) == settings_digest(replace(base))
    for other in (
        replace(base, warehouse=tmp_path),
        replace(base, bootstrap_servers="127.0.0.1:1"),
        replace(base, kafka_client={"security.protocol": "SASL_SSL"}),
    ):
        assert settings_digest(other) != settings_digest(base)


@pytest.mark.parametrize("url", ["http://10.0.0.1:18090", "https://127.0.0.1:1", "127.0.0.1:1"])
def test_the_driver_url_must_be_loopback(monkeypatch, url: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PLATFORM_DRIVER_URL", url)
    with pytest.raises(ConfigError, match="loopback"):
        load_settings()


def test_a_driver_started_without_a_token_makes_one_only_its_user_can_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import stat

    from jobs.warm_driver import client_token, driver_token

    settings = replace(load_settings(), warehouse=tmp_path)
    token, path = driver_token(settings, 18090, given=None)
    assert path is not None and len(token) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == token
    # A client of the same user (and warehouse) finds it; an explicit one wins.
    assert client_token(settings, "http://127.0.0.1:18090", given=None) == token
    assert client_token(settings, "http://127.0.0.1:18090", given="mine") == "mine"
    with pytest.raises(ConfigError, match="PLATFORM_DRIVER_TOKEN"):
        client_token(settings, "http://127.0.0.1:18091", given=None)
    # A token given to the driver is used as it is, and written nowhere.
    assert driver_token(settings, 18092, given="secret") == ("secret", None)


def test_a_driver_of_a_warehouse_on_a_bucket_keeps_its_token_in_its_users_folder() -> None:
    import stat

    from jobs.private_dir import private_dir
    from jobs.warm_driver import client_token, driver_token

    settings = replace(load_settings(), warehouse=Location.parse("s3://bucket/prod"))
    token, path = driver_token(settings, 18093, given=None)
    assert path == private_dir("driver") / "token-18093"  # no request to the store
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert client_token(settings, "http://127.0.0.1:18093", given=None) == token
    path.unlink()


def test_the_driver_runs_only_pipelines_of_its_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from jobs.package import package_digest
    from jobs.warm_driver import RunRequest, WarmDriver, file_sha256

    folder = tmp_path / "pipelines"
    folder.mkdir()
    settings = replace(load_settings(), warehouse=tmp_path / "w", pipelines_dir=folder)
    driver = WarmDriver(None, settings)  # type: ignore[arg-type]
    outside = tmp_path / "user_clicks.yaml"
    outside.write_text((load_settings().pipelines_dir / "user_clicks.yaml").read_text())
    for path in (outside, folder / ".." / "user_clicks.yaml"):
        digest = file_sha256(outside)
        request = RunRequest(str(path), digest, package_digest(), driver.settings_digest)
        with pytest.raises(ConfigError, match="only pipelines under"):
            driver.check(request)
    inside = folder / "user_clicks.yaml"
    inside.write_text(outside.read_text())
    request = RunRequest(str(inside), file_sha256(inside), package_digest(), driver.settings_digest)
    assert driver.check(request).application_id == "user_clicks"


def test_a_symlink_is_followed_once_and_only_into_the_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The file checked is the file hashed and loaded: a link out of the folder is
    refused, a link inside it runs its target (the resolved path)."""
    from jobs.package import package_digest
    from jobs.warm_driver import RunRequest, WarmDriver, file_sha256

    folder = tmp_path / "pipelines"
    folder.mkdir()
    settings = replace(load_settings(), warehouse=tmp_path / "w", pipelines_dir=folder)
    driver = WarmDriver(None, settings)  # type: ignore[arg-type]
    text = (load_settings().pipelines_dir / "user_clicks.yaml").read_text()
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(text)
    link = folder / "user_clicks.yaml"
    link.symlink_to(outside)
    request = RunRequest(str(link), file_sha256(link), package_digest(), driver.settings_digest)
    with pytest.raises(ConfigError, match="only pipelines under"):
        driver.check(request)
    link.unlink()
    target = folder / "real.yaml"
    target.write_text(text)
    link.symlink_to(target)
    loaded = driver.check(request)
    assert loaded.source_path == target and loaded.application_id == "user_clicks"


class _Recorder:
    """Whatever reaches a server on the driver's port: request lines, headers, bodies."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []


def _serve(handler: type) -> tuple[object, int]:  # (server, port)
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_another_server_on_the_port_never_gets_the_token(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from http.server import BaseHTTPRequestHandler

    from jobs.pipeline.parser import load_pipeline
    from jobs.warm_driver import NoWarmDriver, run_remote

    recorder = _Recorder()

    class Impostor(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            recorder.seen.append(self.requestline.encode() + bytes(self.headers) + body)
            data = json.dumps({"ok": True, "nonce": "ab" * 32, "proof": "00" * 32}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    server, port = _serve(Impostor)
    try:
        secret = "the-drivers-secret-token-0123456789"
        monkeypatch.setenv("PLATFORM_DRIVER_TOKEN", secret)
        settings = replace(load_settings(), driver_url=f"http://127.0.0.1:{port}")
        pipeline = load_pipeline("user_clicks", settings.pipelines_dir)
        with pytest.raises(NoWarmDriver, match="did not prove it holds the warm driver's token"):
            run_remote(settings, pipeline)
    finally:
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
    assert recorder.seen, "the client asked the server for a challenge"
    assert all(secret.encode() not in seen for seen in recorder.seen)
    assert all(not seen.startswith(b"POST") for seen in recorder.seen)  # no run request


def test_a_run_request_is_good_once_and_only_with_the_token() -> None:
    import hashlib
    import threading
    import urllib.error
    import urllib.request

    from jobs.warm_driver import CHALLENGE_PATH, MAC_SCHEME, RUN_PATH, _handler, mac

    class Driver:  # what the handler asks of a driver, without Spark
        code = "c0de"
        slots = threading.BoundedSemaphore(1)

        def check(self, request: RunRequest) -> str:
            return request.pipeline

        def run(self, pipeline: str) -> dict[str, str]:
            return {"ran": pipeline}

    token = "t" * 40
    server, port = _serve(_handler(Driver(), token))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only

    def challenge() -> str:
        client = "ab" * 16
        with opener.open(f"{url}{CHALLENGE_PATH}?client={client}") as response:
            answer = json.loads(response.read())
        assert answer["proof"] == mac(token, "driver", client, answer["nonce"])
        return str(answer["nonce"])

    def post(nonce: str, signed_with: str) -> int:
        body = json.dumps(GOOD).encode()
        signature = mac(signed_with, "client", nonce, hashlib.sha256(body).hexdigest())
        request = urllib.request.Request(
            url + RUN_PATH,
            data=body,
            headers={
                "Content-Type": "application/json",
                "Authorization": f"{MAC_SCHEME} {nonce} {signature}",
            },
        )
        try:
            with opener.open(request) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    try:
        assert post(challenge(), "wrong token") == 401
        nonce = challenge()
        assert post(nonce, token) == 200
        assert post(nonce, token) == 401  # a recorded request cannot be sent again
        assert post("cd" * 38, token) == 401  # a nonce the driver never issued
    finally:
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]


def test_no_number_of_askers_pushes_a_client_s_nonce_out() -> None:
    """Challenges keep no state per asker: a flood of them leaves a client's nonce
    good (once), and a nonce made without the token is refused."""
    from jobs.warm_driver import Challenges

    challenges = Challenges("t" * 40)
    mine = challenges.issue()
    for _ in range(5000):
        challenges.issue()
    assert challenges.redeem(mine)
    assert not challenges.redeem(mine)
    forged = Challenges("another token").issue()
    assert not challenges.redeem(forged)
    assert not challenges.redeem(mine[:-1] + ("0" if mine[-1] != "0" else "1"))


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999", "http://127.0.0.1:0", "http://localhost:65536"]
)
def test_a_driver_url_port_out_of_range_is_refused(monkeypatch, url: str) -> None:  # type: ignore[no-untyped-def]
    """It was accepted, and the client then failed with a ValueError traceback."""
    monkeypatch.setenv("PLATFORM_DRIVER_URL", url)
    with pytest.raises(ConfigError, match=r"PLATFORM_DRIVER_URL must be .*1-65535"):
        load_settings()


def test_a_driver_url_port_in_range_is_taken(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for url in ("http://127.0.0.1:1", "http://localhost:65535"):
        monkeypatch.setenv("PLATFORM_DRIVER_URL", url)
        assert load_settings().driver_url == url


class _NoSpark:
    """``get_spark`` of a test: records a start, starts nothing."""

    def __init__(self) -> None:
        self.started = 0
        self.stopped = 0

    def __call__(self, *args: object) -> _NoSpark:
        self.started += 1
        return self

    def stop(self) -> None:
        self.stopped += 1

    @property
    def streams(self) -> object:
        return type("Streams", (), {"active": []})()


def test_a_second_driver_on_a_busy_port_leaves_the_live_one_alone(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, capsys
) -> None:
    """It replaced the live driver's token, then died with a traceback: every client
    then failed the proof and went to spark-submit."""
    import socket

    from jobs import cli
    from jobs.warm_driver import token_file

    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(tmp_path))
    monkeypatch.delenv("PLATFORM_DRIVER_TOKEN", raising=False)
    no_spark = _NoSpark()
    monkeypatch.setattr("jobs.streaming.spark.get_spark", no_spark)
    with socket.socket() as live:  # the live driver's port
        live.bind(("127.0.0.1", 0))
        live.listen()
        port = live.getsockname()[1]
        token = token_file(load_settings(), port)
        token.parent.mkdir(mode=0o700)
        token.write_text("the live driver's token")
        code = cli.main(["serve", "--port", str(port)])
    err = capsys.readouterr().err
    assert token.read_text() == "the live driver's token"
    assert no_spark.started == 0  # refused before a JVM started
    assert code == 2, err
    assert err.splitlines() == [err.strip()] and err.startswith("error: ")
    assert f"port {port}" in err and "Traceback" not in err


def test_a_driver_listens_before_it_writes_its_token_and_removes_it_at_the_end(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch
) -> None:
    import os
    import signal
    import threading
    import urllib.request

    from jobs.warm_driver import HEALTH_PATH, serve, token_file

    monkeypatch.delenv("PLATFORM_DRIVER_TOKEN", raising=False)
    settings = replace(load_settings(), warehouse=tmp_path)
    no_spark = _NoSpark()
    monkeypatch.setattr("jobs.streaming.spark.get_spark", no_spark)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    port = _free_port()
    path = token_file(settings, port)
    answers: list[bytes] = []

    def ask_then_stop() -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(100):
            if path.exists():
                break
            threading.Event().wait(0.05)
        with opener.open(f"http://127.0.0.1:{port}{HEALTH_PATH}", timeout=10) as response:
            answers.append(response.read())
        os.kill(os.getpid(), signal.SIGTERM)  # to the process: its main thread handles it

    asker = threading.Thread(target=ask_then_stop)
    try:
        asker.start()
        assert serve(settings, port) == 0
    finally:
        asker.join(10)
        for sig, handler in handlers.items():  # serve's own are this process's now
            signal.signal(sig, handler)
    assert answers and json.loads(answers[0])["ok"] is True
    assert not path.exists()  # removed at the end
    assert no_spark.started == 1 and no_spark.stopped == 1


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
