"""Small conversions shared by the client's modules."""

from __future__ import annotations

import datetime
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2


def duration(seconds: float) -> duration_pb2.Duration:
    """A google.protobuf.Duration of seconds (rounded to the nanosecond)."""
    nanos_total = int(round(seconds * 1e9))
    d = duration_pb2.Duration()
    d.seconds, d.nanos = divmod(nanos_total, 1_000_000_000)
    return d


def seconds(d: duration_pb2.Duration) -> float:
    """The seconds of a google.protobuf.Duration."""
    return d.seconds + d.nanos / 1e9


def timestamp(ts: timestamp_pb2.Timestamp | None) -> datetime.datetime | None:
    """A timezone-aware UTC datetime, or None when the field is unset."""
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return datetime.datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=datetime.timezone.utc)


def remaining(deadline: float | None, now: float) -> float | None:
    """Seconds left until a monotonic deadline (None: no deadline), at least 0."""
    if deadline is None:
        return None
    return max(deadline - now, 0.0)




def server_wait(req: Any, timeout: float | None) -> float | None:
    """Sets req's ``wait`` to timeout seconds (the server's own bound on a
    waiting call, which ends it cleanly with nothing left queued) and
    returns the call's deadline, which only backs the server's wait up:
    timeout + 2 s, or None when timeout is None (as long as the session
    lives)."""
    if timeout is None:
        return None
    req.wait.CopyFrom(duration(timeout))
    return timeout + 2.0
