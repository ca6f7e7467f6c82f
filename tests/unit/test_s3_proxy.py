"""The store proxy's faults of a single write (``tests/s3_proxy.py``), in front of a
stand-in store on loopback that applies every PUT (and refuses, 412, a path with
``refused`` in it): a reply dropped after the write was applied, and a write held
until released."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from jobs.settings import REPO_ROOT
from tests.s3_proxy import DROP_ENV, DROP_PATH, StoreProxy, drop


class Backend:
    """Records the writes it applied, by path."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                return None

            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = 412 if "refused" in self.path else 200
                if status == 200:
                    backend.applied.append(self.path)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


@pytest.fixture
def backend() -> Iterator[Backend]:
    found = Backend()
    yield found
    found.server.shutdown()
    found.server.server_close()


@pytest.fixture
def proxy(backend: Backend) -> Iterator[StoreProxy]:
    with StoreProxy(backend.port) as store:
        yield store


def put(proxy: StoreProxy, path: str) -> int:
    """The status of a PUT through the proxy; -1 when the connection closed unanswered."""
    port = int(proxy.server.server_address[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("PUT", path, body=b"x")
        return connection.getresponse().status
    except http.client.RemoteDisconnected:
        return -1
    finally:
        connection.close()


def test_the_first_applied_write_matched_loses_its_reply_once_per_arming(
    backend: Backend, proxy: StoreProxy
) -> None:
    proxy.drop_reply = re.compile(r"/b/(app|refused)/_lease$")
    assert put(proxy, "/b/other") == 200  # not matched
    assert put(proxy, "/b/refused/_lease") == 412  # refused: answered, not dropped
    assert put(proxy, "/b/app/_lease") == -1  # applied, then no answer
    assert backend.applied == ["/b/other", "/b/app/_lease"]
    assert [(m, p, s) for _t, m, p, s in proxy.dropped] == [("PUT", "/b/app/_lease", 200)]
    assert proxy.writes[-1][1:] == ("PUT", "/b/app/_lease", 200)
    assert proxy.drop_reply is None
    assert put(proxy, "/b/app/_lease") == 200  # once only
    proxy.drop_reply = re.compile(r"epoch=1\.json$")  # re-armed; matched percent-decoded
    assert put(proxy, "/b/epoch%3D1.json") == -1
    assert len(proxy.dropped) == 2 and backend.applied[-1] == "/b/epoch%3D1.json"


def test_a_held_write_waits_until_released(backend: Backend, proxy: StoreProxy) -> None:
    proxy.hold = re.compile(r"/offsets/\d+$")
    answers: list[int] = []
    held = threading.Thread(target=lambda: answers.append(put(proxy, "/b/offsets/3")))
    held.start()
    assert proxy.holding.wait(10)
    assert put(proxy, "/b/commits/3") == 200  # others pass meanwhile
    assert backend.applied == ["/b/commits/3"] and not answers
    proxy.release.set()
    held.join(10)
    assert answers == [200] and backend.applied == ["/b/commits/3", "/b/offsets/3"]


def test_the_proxy_process_takes_its_drop_from_the_environment_and_is_rearmed(
    backend: Backend,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.s3_proxy", str(backend.port)],
        cwd=REPO_ROOT,
        env={**os.environ, DROP_ENV: r"/app/_lease$"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        assert drop(endpoint)["armed"] == r"/app/_lease$"
        port = int(endpoint.rsplit(":", 1)[1])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("PUT", "/b/app/_lease", body=b"x")
        with pytest.raises(http.client.RemoteDisconnected):
            connection.getresponse()
        connection.close()
        found = drop(endpoint)
        assert found["armed"] is None
        assert [d[1:] for d in found["dropped"]] == [["PUT", "/b/app/_lease", 200]]
        assert drop(endpoint, r"epoch=\d+\.json$")["armed"] == r"epoch=\d+\.json$"
        assert drop(endpoint, "")["armed"] is None
        assert DROP_PATH not in "".join(backend.applied)  # control requests stay here
    finally:
        proc.kill()
        proc.wait()
