"""A proxy in front of the real S3 server, on loopback: it counts the requests by
kind (``kinds``: LIST, GET, HEAD, PUT, DELETE, ...), records every write with the
store's answer (``writes``: one proxy per machine tells whose they are) and, as a
faulty store,
answers every ``every``-th one with ``503 SlowDown`` (what AWS S3 sends a client
that goes too fast) and delays the others by ``delay_s``. Requests are passed on
with their own ``Host`` header, so their signatures stay valid.

Two faults of a single write, chosen by a regular expression searched in the
request's path (percent-decoded, with its query):

* ``drop_reply``: the first write (PUT or POST) it matches that the store applies
  (answers 2xx: a conditional write it refuses is answered) has its answer recorded
  in ``writes`` and ``dropped``, and then the client's connection is closed with no
  reply at all: an answer lost on the network. Once per pattern: the attribute is
  None again after it fired; setting it re-arms.
* ``hold``: every write it matches waits, before it is passed on, until ``release``
  is set; ``holding`` is set when one starts to wait (and stays set)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
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
        # Answered with what was dropped (GET), or re-armed (POST ``?pattern=``).
        self.drop_path: str | None = None
        # Every write passed on, with the store's answer: (time, method, path, status).
        self.writes: list[tuple[float, str, str, int]] = []
        # The writes applied whose answer was never sent, as in ``writes``.
        self.dropped: list[tuple[float, str, str, int]] = []
        self._drop_reply: re.Pattern[str] | None = None
        self.hold: re.Pattern[str] | None = None
        self.release = threading.Event()
        self.holding = threading.Event()
        self._closing = False
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
        self._closing = True  # a write still held is dropped, never passed on
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def drop_reply(self) -> re.Pattern[str] | None:
        """The pattern of the next write whose answer is lost; None once it fired."""
        return self._drop_reply

    @drop_reply.setter
    def drop_reply(self, pattern: re.Pattern[str] | None) -> None:
        with self._lock:
            self._drop_reply = pattern

    def _drops(self, method: str, path: str) -> bool:
        """This applied write's answer is the one to lose (claimed: no other's is)."""
        if method not in ("PUT", "POST"):
            return False
        with self._lock:
            pattern = self._drop_reply
            if pattern is None or not pattern.search(urllib.parse.unquote(path)):
                return False
            self._drop_reply = None
            return True

    def _holds(self, method: str, path: str) -> bool:
        pattern = self.hold
        return (
            method in ("PUT", "POST")
            and pattern is not None
            and bool(pattern.search(urllib.parse.unquote(path)))
        )

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

            def _answer(self, found: object) -> None:
                data = json.dumps(found).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _control_drop(self) -> None:
                if self.command == "POST":
                    query = urllib.parse.parse_qs(self.path.partition("?")[2])
                    pattern = query.get("pattern", [""])[0]
                    store.drop_reply = re.compile(pattern) if pattern else None
                with store._lock:
                    armed = store._drop_reply
                    dropped = list(store.dropped)
                    writes = list(store.writes)
                self._answer(
                    {"armed": armed and armed.pattern, "dropped": dropped, "writes": writes}
                )

            def _pass_on(self) -> None:
                body = self._body()
                if store.drop_path is not None and self.path.partition("?")[0] == store.drop_path:
                    self._control_drop()
                    return
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
                if store._holds(self.command, self.path):
                    store.holding.set()
                    store.release.wait()
                    if store._closing:
                        self.close_connection = True
                        return
                time.sleep(store.delay_s)
                backend = http.client.HTTPConnection("127.0.0.1", store.backend_port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                backend.request(self.command, self.path, body=body, headers=headers)
                answer = backend.getresponse()
                data = answer.read()
                # Only a write the store applied has its answer lost (a refused one,
                # 412, is answered): the first such the pattern matches.
                drop = 200 <= answer.status < 300 and store._drops(self.command, self.path)
                if self.command in ("PUT", "POST", "DELETE"):
                    write = (time.time(), self.command, self.path, answer.status)
                    with store._lock:
                        store.writes.append(write)
                        if drop:
                            store.dropped.append(write)
                if drop:  # applied; the answer is lost: the connection closes unanswered
                    backend.close()
                    self.close_connection = True
                    return
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
DROP_PATH = "/__proxy_drop"
# The pattern ``main`` starts with as its ``drop_reply``.
DROP_ENV = "PROXY_DROP_REPLY"


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
    ``GET /__proxy_counts`` with the counts so far as JSON. Its ``drop_reply`` is
    ``PROXY_DROP_REPLY`` (a regular expression) when set, and ``POST
    /__proxy_drop?pattern=<regex, URL-encoded>`` arms it again (an empty pattern
    disarms it); either answers ``{"armed": pattern or null, "dropped": [[time,
    method, path, status], ...], "writes": [...]}``, as ``GET /__proxy_drop`` does
    (``drop``)."""
    import sys

    store = StoreProxy(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    store.counts_path = COUNTS_PATH
    store.drop_path = DROP_PATH
    if os.environ.get(DROP_ENV):
        store.drop_reply = re.compile(os.environ[DROP_ENV])
    print(store.endpoint, flush=True)
    store.server.serve_forever()


def drop(endpoint: str, pattern: str | None = None) -> dict[str, Any]:
    """What the proxy at ``endpoint`` (run by ``main``) armed and dropped so far;
    with ``pattern``, armed with it first (``""`` disarms)."""
    import urllib.request

    url = endpoint + DROP_PATH
    if pattern is None:
        request = urllib.request.Request(url)
    else:
        query = urllib.parse.urlencode({"pattern": pattern})
        request = urllib.request.Request(f"{url}?{query}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        found: dict[str, Any] = json.loads(answer.read())
    return found


if __name__ == "__main__":
    main()
