"""The grant history of locks and elections (HistoryService), as the Go
SDK's Admin.LockHistory and Admin.ElectionHistory read it: each grant and
each end of one, with its token, session, owner and reason, kept for the
daemon's ``--history-retention``."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from google.protobuf import timestamp_pb2

from coordd._util import seconds, timestamp
from coordd.v1 import history_pb2

if TYPE_CHECKING:
    from coordd.client import Client


@dataclass(frozen=True)
class HistoryEvent:
    """One entry of the history. ``type`` is GRANTED, RELEASED, EXPIRED or
    SESSION_CLOSED for locks, ELECTED, RESIGNED or REMOVED for elections,
    GAP where events from ``from_revision`` to ``revision`` could not be
    recorded."""

    type: str
    name: str
    token: int
    session_id: str
    owner: str
    principal: str
    hostname: str
    request_id: str
    read: bool
    reason: str
    revision: int
    from_revision: int
    time: datetime.datetime | None
    #: The token this grant was handed over from (a transfer), or 0.
    handed_from: int
    #: How long the grant waited in the queue, and (on an end) was held; seconds.
    waited: float
    held: float


def _event(e: history_pb2.HistoryEvent) -> HistoryEvent:
    kind = history_pb2.HistoryEventType.Name(e.type).removeprefix("HISTORY_EVENT_TYPE_")
    return HistoryEvent(kind, e.name, e.token, e.session_id, e.owner, e.principal, e.hostname, e.request_id, e.read,
                        e.reason, e.revision, e.from_revision, timestamp(e.time) if e.HasField("time") else None,
                        e.handed_from, seconds(e.waited), seconds(e.held))


def _stamp(t: datetime.datetime | None) -> timestamp_pb2.Timestamp | None:
    if t is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(t.astimezone(datetime.timezone.utc))
    return ts


def events(client: "Client", method: str, request_type: type, name: str, owner: str, since: datetime.datetime | None,
           until: datetime.datetime | None, page_size: int, newest_first: bool, min_revision: int) -> Iterator[HistoryEvent]:
    """Pages through ListLockHistory or ListElectionHistory (method), a page
    per call, yielding each event; a failed page raises its error."""
    token = ""
    while True:
        req = request_type(name=name, owner=owner, since=_stamp(since), until=_stamp(until), page_size=page_size,
                           page_token=token, newest_first=newest_first, min_revision=min_revision)
        resp = client._unary("history", method, req)
        yield from (_event(e) for e in resp.events)
        token = resp.next_page_token
        if not token:
            return
