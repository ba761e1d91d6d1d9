"""The old holder always knows first: when the next holder's call returns,
the old one's ``done`` is already set, in every path. Each path runs
COORDD_HANDOVERS hand-overs (1,000 by default)."""

from __future__ import annotations

import os
import threading
import time
import unittest
from typing import Any, Callable

import support
from support import unique

from coordd.v1 import election_pb2, lock_pb2, session_pb2

ROUNDS = int(os.environ.get("COORDD_HANDOVERS", "1000"))


def until(what: str, cond: Callable[[], bool]) -> None:
    """Asks cond again at once until it holds (each ask is a round trip)."""
    deadline = time.monotonic() + 30
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")


class Next:
    """A waiting call on a thread of its own, which checks the old holder's
    ``done`` the instant the call returns."""

    def __init__(self, old: Any, call: Callable[[], Any]) -> None:
        self.got: Any = None
        self.err: BaseException | None = None
        self.stale = False

        def run() -> None:
            try:
                self.got = call()
                self.stale = not old.done.is_set()
            except BaseException as e:  # noqa: BLE001 - reported by result()
                self.err = e

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def result(self) -> Any:
        self._t.join(60)
        if self.err is not None:
            raise self.err
        return self.got


class ToldFirstTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = support.client()
        self.addCleanup(self.client.close)
        self.a = self.client.session(ttl=60, owner="told-a")
        self.b = self.client.session(ttl=60, owner="told-b")
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)
        _, self.raw = self.client._pick()  # raw stubs: acting from outside, as an operator would

    def other(self, s: Any) -> Any:
        return self.b if s is self.a else self.a

    def queued(self, name: str) -> None:
        until("a waiter", lambda: len(self.client.describe_lock(name).waiters) >= 1)

    def candidates(self, name: str) -> None:
        until("a candidate", lambda: len(self.client.candidates(name)) >= 1)

    def release_rounds(self, name: str, acquire: Callable[[Any, int], Any]) -> int:
        holder = acquire(self.a, -1)
        waiter = self.b
        overlaps = 0
        for i in range(ROUNDS):
            w = Next(holder, lambda s=waiter, i=i: acquire(s, i))
            self.queued(name)
            self.raw.locks.Release(lock_pb2.ReleaseRequest(name=name, token=holder.token), timeout=120)
            nxt = w.result()
            overlaps += w.stale
            holder, waiter = nxt, self.other(waiter)
        holder.release()
        return overlaps

    def test_outside_release(self) -> None:
        name = unique("told-release")
        overlaps = self.release_rounds(name, lambda s, i: s.lock(name))
        self.assertEqual(overlaps, 0, f"in {overlaps} of {ROUNDS} outside releases the old holder still held")

    def test_semaphore_outside_release(self) -> None:
        name = unique("told-sem")
        third = self.client.session(ttl=60)
        self.addCleanup(third.close)
        keep = third.semaphore(name, 2)
        overlaps = self.release_rounds(name, lambda s, i: s.semaphore(name, 2))
        keep.release()
        self.assertEqual(overlaps, 0, f"in {overlaps} of {ROUNDS} outside releases of a permit the old holder still held")

    def test_read_write_outside_release(self) -> None:
        name = unique("told-rw")
        overlaps = self.release_rounds(name, lambda s, i: s.rlock(name) if i % 2 == 0 else s.lock(name))
        self.assertEqual(overlaps, 0, f"in {overlaps} of {ROUNDS} outside releases of a read/write grant the old holder still held")

    def election_rounds(self, name: str, hand_over: Callable[[Any, Any], None]) -> int:
        leader = self.a.campaign(name, "a")
        other = self.b
        overlaps = 0
        for _ in range(ROUNDS):
            w = Next(leader, lambda s=other: s.campaign(name, "next"))
            self.candidates(name)
            hand_over(leader, other)
            nxt = w.result()
            overlaps += w.stale
            leader, other = nxt, self.other(other)
        leader.resign()
        return overlaps

    def test_outside_resign(self) -> None:
        name = unique("told-resign")
        overlaps = self.election_rounds(
            name, lambda ld, _: self.raw.elections.Resign(election_pb2.ResignRequest(name=name, term=ld.term), timeout=120))
        self.assertEqual(overlaps, 0, f"in {overlaps} of {ROUNDS} outside resignations the old leader still led")

    def test_transfer(self) -> None:
        name = unique("told-transfer")
        overlaps = self.election_rounds(name, lambda ld, nxt: ld.transfer(nxt.id))
        self.assertEqual(overlaps, 0, f"in {overlaps} of {ROUNDS} transfers the old leader still led")

    def test_session_closed_from_outside(self) -> None:
        name = unique("told-close")
        holder_session = self.client.session(ttl=60)
        holder = holder_session.lock(name)
        overlaps = 0
        for _ in range(ROUNDS):
            waiter = self.client.session(ttl=60)
            w = Next(holder, lambda s=waiter: s.lock(name))
            self.queued(name)
            self.raw.sessions.CloseSession(session_pb2.CloseSessionRequest(session_id=holder_session.id), timeout=120)
            nxt = w.result()
            overlaps += w.stale
            holder_session.close()  # gone on the server already: frees its thread
            holder, holder_session = nxt, waiter
        holder_session.close()
        self.assertEqual(overlaps, 0, f"in {overlaps} of {ROUNDS} session closes the old holder still held")


if __name__ == "__main__":
    unittest.main()
