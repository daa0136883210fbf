"""A local HTTP receiver that records what it is sent and answers from a script: stands in
for an Alertmanager webhook receiver, a Slack incoming webhook or PagerDuty's Events API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: str = "ok"
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float


class Receiver:
    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply()
        self.script: list[Reply] = []
        self.received: list[Received] = []
        self.arrived = threading.Condition()
        self.url = ""

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        with self.arrived:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"expected {count} requests, got {len(self.received)}"
                self.arrived.wait(left)
            return list(self.received)


@contextmanager
def serve(receiver: Receiver) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            reply = receiver.script.pop(0) if receiver.script else receiver.default
            if reply.delay_s:
                time.sleep(reply.delay_s)
            with receiver.arrived:
                receiver.received.append(
                    Received(self.path, dict(self.headers), json.loads(raw), time.monotonic())
                )
                receiver.arrived.notify_all()
            body = reply.body.encode()
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # Polled every 50 ms: shutdown() waits for the next poll (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
