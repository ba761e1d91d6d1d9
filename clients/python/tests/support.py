"""Shared test support: the daemon under test, a client factory, waiting."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import uuid
from typing import Callable

_SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.environ.get("COORDD_TEST_INSTALLED"):
    # The package in this source tree; with COORDD_TEST_INSTALLED set, the
    # one installed (a wheel in a virtual environment, as make test does).
    sys.path.insert(0, _SOURCE)

import coordd  # noqa: E402

if os.environ.get("COORDD_TEST_INSTALLED") and os.path.abspath(coordd.__file__).startswith(_SOURCE + os.sep):
    raise ImportError(f"COORDD_TEST_INSTALLED is set but coordd was imported from the source tree ({coordd.__file__}): run the tests from outside it")

import daemon  # noqa: E402

_mu = threading.Lock()
_daemon: daemon.Daemon | None = None


def endpoint() -> str:
    """The gRPC endpoint of the daemon under test: COORDD_ENDPOINT's, or one
    started on first use and stopped when the test process exits."""
    global _daemon
    with _mu:
        if _daemon is None:
            _daemon = daemon.start()
            atexit.register(_daemon.stop)
        return _daemon.endpoint


_other: daemon.Daemon | None = None


def other_endpoint() -> str | None:
    """The gRPC endpoint of a second daemon, of a cluster of its own:
    COORDD_OTHER_ENDPOINT's, one started on first use when the tests own
    their daemons, else None."""
    global _other
    ep = os.environ.get("COORDD_OTHER_ENDPOINT")
    if ep or not owns_daemon():
        return ep or None
    with _mu:
        if _other is None:
            _other = daemon.start()
            atexit.register(_other.stop)
        return _other.endpoint


def owns_daemon() -> bool:
    """Whether the tests started the daemon (so may start others too)."""
    return not os.environ.get("COORDD_ENDPOINT")


def client(**kw) -> coordd.Client:
    """A client of the daemon under test (close it)."""
    return coordd.Client([endpoint()], **kw)


def unique(prefix: str) -> str:
    """A name no other test (or earlier run against the same daemon) uses."""
    return f"pytest/{prefix}/{uuid.uuid4().hex[:12]}"


def wait_for(cond: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> object:
    """Polls cond until it returns something truthy (returned), failing
    with AssertionError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)  # polling interval, not synchronisation
