"""A proxy in front of the real S3 server, on loopback: it counts the requests by
kind (``kinds``: LIST, GET, HEAD, PUT, DELETE, ...), records every write with the
store's answer (``writes``: one proxy per machine tells whose they are) and, as a
faulty store,
answers every ``every``-th one with ``503 SlowDown`` (what AWS S3 sends a client
that goes too fast) and delays the others by ``delay_s``. Requests are passed on
with their own ``Host`` header, so their signatures stay valid."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


class StoreProxy:
    def __init__(self, backend_port: int, every: int = 0, delay_s: float = 0.0) -> None:
        """``every``: 0 refuses none."""
        self.backend_port, self.every, self.delay_s = backend_port, every, delay_s
        self.requests = 0
        self.refused = 0
        self.kinds: Counter[str] = Counter()
        # By kind and the object's shape (its last three names, digits folded):
        # where a run's requests go.
        self.shapes: Counter[str] = Counter()
        self.counts_path: str | None = None  # answered with the counts, not passed on
        # Every write passed on, with the store's answer: (time, method, path, status).
        self.writes: list[tuple[float, str, str, int]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StoreProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _refuse(self, kind: str, path: str) -> bool:
        with self._lock:
            self.requests += 1
            self.kinds[kind] += 1
            self.shapes[f"{kind} {shape(path)}"] += 1
            refuse = bool(self.every) and self.requests % self.every == 0
            self.refused += refuse
            return refuse

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                return None

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _pass_on(self) -> None:
                body = self._body()
                if store.counts_path is not None and self.path in (
                    store.counts_path,
                    store.counts_path + "/shapes",
                ):
                    counted = store.kinds if self.path == store.counts_path else store.shapes
                    counts = json.dumps(dict(counted)).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(counts)))
                    self.end_headers()
                    self.wfile.write(counts)
                    return
                listing = self.command == "GET" and "list-type=" in self.path.partition("?")[2]
                if store._refuse("LIST" if listing else self.command, self.path):
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":  # a HEAD answer has no body
                        self.wfile.write(SLOW_DOWN)
                    return
                time.sleep(store.delay_s)
                backend = http.client.HTTPConnection("127.0.0.1", store.backend_port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                backend.request(self.command, self.path, body=body, headers=headers)
                answer = backend.getresponse()
                data = answer.read()
                if self.command in ("PUT", "POST", "DELETE"):
                    with store._lock:
                        store.writes.append((time.time(), self.command, self.path, answer.status))
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                backend.close()
                if self.command != "HEAD":
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        # A reader that had enough of a range hangs up: its business.
                        self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _pass_on

        return Handler


COUNTS_PATH = "/__proxy_counts"


def shape(path: str) -> str:
    """``/b/p/apps/x/state/_delta_log/00000000000000000012.json`` → ``state/_delta_log/#.json``;
    a listing by its prefix."""
    where, _, query = path.partition("?")
    prefix = re.search(r"prefix=([^&]*)", query)
    if prefix:
        where = urllib.parse.unquote(prefix.group(1))
    names = [name for name in where.split("/") if name][-3:]
    return re.sub(r"\d+", "#", "/".join(names))


def main() -> None:
    """``python -m tests.s3_proxy BACKEND_PORT [EVERY]``: the proxy in a process of its
    own (a client that holds the GIL while it waits, as delta-rs does, would
    otherwise wait on a proxy in its own process); prints its endpoint, answers
    ``GET /__proxy_counts`` with the counts so far as JSON."""
    import sys

    store = StoreProxy(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    store.counts_path = COUNTS_PATH
    print(store.endpoint, flush=True)
    store.server.serve_forever()


if __name__ == "__main__":
    main()
