"""Starting and stopping a real coordd daemon for the tests.

If the environment variable COORDD_ENDPOINT is set (host:port of a running
daemon's gRPC listener), the tests use that daemon and start none.
Otherwise :func:`start` runs the binary named by COORDD_BIN (default
/tmp/coordd-bin/coordd) in a temporary data directory on free loopback
ports, and waits for its /readyz endpoint to answer 200.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

DEFAULT_BIN = "/tmp/coordd-bin/coordd"
READY_TIMEOUT = 30.0


def _free_ports(n: int) -> list[int]:
    """Returns n distinct ports free on 127.0.0.1 right now (the daemon binds
    them a moment later: a small race, retried by :func:`start`)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Daemon:
    """A daemon the tests started (process is None for COORDD_ENDPOINT)."""

    endpoint: str
    process: subprocess.Popen | None = None
    data_dir: str | None = None
    log_path: str | None = None
    extra: dict = field(default_factory=dict)

    def stop(self) -> None:
        """Stops the daemon (SIGTERM, then SIGKILL after 10 s) and removes its
        data directory. Does nothing for an external daemon."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def log(self) -> str:
        """The daemon's output so far (empty for an external daemon)."""
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()


def start(extra_args: list[str] | None = None) -> Daemon:
    """Returns the daemon to test against: COORDD_ENDPOINT's, or a new one."""
    ep = os.environ.get("COORDD_ENDPOINT")
    if ep:
        return Daemon(endpoint=ep)
    binary = os.environ.get("COORDD_BIN", DEFAULT_BIN)
    last = ""
    for _attempt in range(3):  # a port taken between _free_ports and bind
        grpc_port, http_port, peer_port = _free_ports(3)
        data_dir = tempfile.mkdtemp(prefix="coordd-pytest-")
        log_path = os.path.join(data_dir, "coordd.log")
        args = [
            binary,
            "--data-dir", os.path.join(data_dir, "data"),
            "--grpc-addr", f"127.0.0.1:{grpc_port}",
            "--http-addr", f"127.0.0.1:{http_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--no-console",
            *(extra_args or []),
        ]
        logf = open(log_path, "wb")
        proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        logf.close()
        d = Daemon(endpoint=f"127.0.0.1:{grpc_port}", process=proc, data_dir=data_dir, log_path=log_path)
        if _wait_ready(proc, f"http://127.0.0.1:{http_port}/readyz"):
            return d
        last = d.log()
        d.stop()
    raise RuntimeError(f"coordd did not become ready; its log:\n{last}")


def _wait_ready(proc: subprocess.Popen, url: str) -> bool:
    """Polls url until it answers 200 (True), or the process exits or
    READY_TIMEOUT passes (False)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)  # polling interval, not synchronisation
    return False
