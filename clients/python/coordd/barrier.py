"""Barriers and double barriers (BarrierService), as the Go SDK's
Session.EnterBarrier and Barrier.Leave use them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordd._util import server_wait
from coordd.v1 import barrier_pb2

if TYPE_CHECKING:
    from coordd.session import Session


class Barrier:
    """A session's participant in an open barrier (Session.enter_barrier).
    ``participants`` is how many were in when it was seen open,
    ``revision`` the etcd revision at which it was. Usable as ``with
    session.enter_barrier(name, count) as b:``, which leaves at the end of
    the block (a double barrier's exit)."""

    def __init__(self, session: "Session", name: str, participant: str, participants: int, revision: int) -> None:
        self.session = session
        self.name = name
        self.participant = participant
        self.participants = participants
        self.revision = revision

    def __repr__(self) -> str:
        return f"<coordd.Barrier {self.name!r} participant={self.participant!r} participants={self.participants}>"

    def leave(self, timeout: float | None = None) -> None:
        """Takes the participant out of the barrier and waits until every
        participant has left, up to timeout seconds (None: as long as the
        session lives); the participant is out even when the wait ends
        first (then DeadlineExceeded). The last one out closes the barrier
        for the next round. Retried while coordd is unavailable."""
        req = barrier_pb2.LeaveBarrierRequest(name=self.name, session_id=self.session.id, participant=self.participant)
        rpc_timeout = server_wait(req, timeout)
        self.session._client._unary("barriers", "LeaveBarrier", req, timeout=rpc_timeout, retry=True)

    def __enter__(self) -> "Barrier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()
