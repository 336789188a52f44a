"""Helpers for the data-cache tests: synthetic records and a faulty HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np


def write_records(directory: Path, count: int, size: int, seed: int = 0) -> list[bytes]:
    """`count` random records of `size` bytes as directory/rec-00000.bin ...; returns them."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    payloads = []
    for i in range(count):
        data = rng.bytes(size)
        (directory / f"rec-{i:05d}.bin").write_bytes(data)
        payloads.append(data)
    return payloads


class FaultServer:
    """A threaded http.server on 127.0.0.1 whose paths choose the fault:

    /flaky/N/<name>    500 for the first N requests of that path, then the body
    /slow/<name>       sleeps `slow_s` before answering (a timeout)
    /truncated/<name>  announces more bytes than it sends, then closes
    /ok/<name>         the body
    The body of every path is `body(name)`; `requests` counts requests per path.
    """

    def __init__(self, slow_s: float = 2.0) -> None:
        self.slow_s = slow_s
        self.requests: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):      # keep test output quiet
                pass

            def do_GET(self):
                server.requests[self.path] += 1
                parts = self.path.strip("/").split("/")
                body = server.body(parts[-1])
                if parts[0] == "flaky" and server.requests[self.path] <= int(parts[1]):
                    return self._send(500, b"try again")
                if parts[0] == "slow":
                    time.sleep(server.slow_s)
                if parts[0] == "truncated":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(200, body)

            def _send(self, status, body):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # A client that timed out leaves a broken pipe behind: expected here, not worth a trace.
        self.httpd.handle_error = lambda request, client_address: None
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def body(name: str) -> bytes:
        return (name.encode() + b"|") * 500

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def __enter__(self) -> "FaultServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
