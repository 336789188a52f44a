"""A local, rate-limited "cloud store": nginx serving a directory on 127.0.0.1.

Used by the data-cache tests and `thinwire bench cache`. Each server has its own temporary
prefix (configuration, pid file, logs, temp paths), listens on loopback only and is stopped by
`stop()` / the context manager. A few locations answer with errors for fault tests:
`/fail503/...` always returns 503 and `/fail404/...` 404.

Rate limiting takes two directives, because nginx's `limit_rate` alone does not slow small
objects down: it lets each response send `rate x 1 s` bytes at once before pacing starts (the
write filter allows `rate * (now - start + 1)` bytes), so a 100 KB record at 100 Mbit/s goes out
at loopback speed. The server therefore also paces requests with `limit_req` at
`rate / request_bytes` requests per second (queued, not refused) when the object size is known:
together they emulate the node's `rate` link to the store, for small objects (limit_req,
shared by all connections) and large ones (limit_rate, per connection).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from thinwire.ports import free_port

_CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
{user}
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    {zone}
    default_type application/octet-stream;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    sendfile on;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        autoindex on;
        {rate}
        {pace}
        location /fail503/ {{ return 503; }}
        location /fail404/ {{ return 404; }}
    }}
}}
"""


def find_nginx() -> str | None:
    """The nginx binary, or None (Debian installs it in /usr/sbin, often not on PATH)."""
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_byte_rate(rate: str | int | None) -> int | None:
    """Bytes per second from '100mbit', '12.5MB', '800kbit' or an integer (bytes/s)."""
    if rate is None or isinstance(rate, int):
        if isinstance(rate, int) and rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        return rate
    text = rate.strip().lower()
    units = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8, "bit": 1 / 8,
             "gb": 1e9, "mb": 1e6, "kb": 1e3, "b": 1}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            try:
                value = float(text[: -len(suffix)]) * scale
            except ValueError:
                break
            if value <= 0:
                break
            return int(value)
    raise ValueError(f"rate must look like 100mbit, 12.5mb, 800kbit or bytes/s, got {rate!r}")


class NginxServer:
    """nginx serving `root` on 127.0.0.1, each connection limited to `rate` (bytes/s or '100mbit')."""

    def __init__(self, root: str | os.PathLike, rate: str | int | None = None,
                 request_bytes: int | None = None) -> None:
        self.binary = find_nginx()
        if self.binary is None:
            raise FileNotFoundError("nginx not found (install it: `make system-tools` as root, "
                                    "or apt-get install nginx-light)")
        self.root = Path(root).resolve()
        self.rate = parse_byte_rate(rate)
        if request_bytes is not None and (not isinstance(request_bytes, int) or request_bytes < 1):
            raise ValueError(f"request_bytes must be a positive integer, got {request_bytes!r}")
        self.request_bytes = request_bytes
        self.port = 0
        self._prefix: str | None = None
        self._process: subprocess.Popen | None = None

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def start(self, timeout_s: float = 15.0) -> "NginxServer":
        self._prefix = tempfile.mkdtemp(prefix="thinwire-nginx-")
        # As root nginx would hand its workers to `nobody`, who cannot read a private temp dir.
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
        for _ in range(5):                 # a free port can be taken before nginx binds it
            self.port = free_port()
            conf = Path(self._prefix) / "nginx.conf"
            zone = pace = ""
            if self.rate and self.request_bytes:
                per_minute = max(1, round(self.rate * 60 / self.request_bytes))
                zone = f"limit_req_zone $server_port zone=link:1m rate={per_minute}r/m;"
                pace = "limit_req zone=link burst=1000000;"
            conf.write_text(_CONFIG.format(
                user=user, prefix=self._prefix, port=self.port, root=self.root, zone=zone,
                pace=pace, rate=f"limit_rate {self.rate};" if self.rate else ""))
            self._process = subprocess.Popen(
                [self.binary, "-p", self._prefix, "-c", str(conf), "-e",
                 f"{self._prefix}/error.log"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if self._wait_ready(timeout_s):
                return self
            self._process.kill()
            self._process.wait()
        log_text = Path(self._prefix, "error.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"nginx did not start; its error log ends with:\n{log_text}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()          # SIGTERM: fast shutdown of master and workers
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process is not None and self._process.stderr:
            self._process.stderr.close()
        self._process = None
        if self._prefix:
            shutil.rmtree(self._prefix, ignore_errors=True)
            self._prefix = None

    def __enter__(self) -> "NginxServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
