"""Locks against a real daemon: exclusion, tokens, fencing, expiry."""

from __future__ import annotations

import datetime
import threading
import time
import unittest

import support
from proxy import Proxy
from support import coordd, unique, wait_for


class LockTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = support.client()
        self.addCleanup(self.client.close)
        self.s1 = self.client.session(ttl=5, owner="test-s1")
        self.s2 = self.client.session(ttl=5, owner="test-s2")

    def test_exclusive_and_tokens_increase(self) -> None:
        name = unique("lock")
        with self.s1.lock(name, timeout=5) as held:
            self.assertEqual(held.name, name)
            self.assertIsInstance(held.token, int)
            self.assertFalse(held.lost.is_set())
            held.check()
            with self.assertRaises(coordd.LockHeld) as cm:
                self.s2.try_lock(name)
            self.assertEqual(cm.exception.reason, "LOCK_HELD")
            state = self.client.describe_lock(name)
            self.assertEqual([h.session_id for h in state.holders], [self.s1.id])
            self.assertEqual(state.waiters, ())  # the refused try-lock left nothing queued
        self.assertTrue(held.released)
        second = self.s2.try_lock(name)
        try:
            self.assertGreater(second.token, held.token)
        finally:
            second.release()
        third = self.s1.acquire(name, timeout=5)
        self.assertGreater(third.token, second.token)
        third.release()
        third.release()  # a second release does nothing

    def test_run_locked_releases_after_fn_also_when_it_raises(self) -> None:
        name = unique("lock")

        def holding(held: coordd.Lock) -> int:
            with self.assertRaises(coordd.LockHeld):
                self.s2.try_lock(name)
            return held.token

        token = self.s1.run_locked(name, holding, timeout=5)
        self.assertIsInstance(token, int)
        again = self.s2.try_lock(name)  # released after fn returned
        again.release()

        def failing(held: coordd.Lock) -> None:
            raise ValueError("fn failed")

        with self.assertRaises(ValueError):
            self.s1.run_locked(name, failing, timeout=5)
        self.s2.try_lock(name).release()  # released after fn raised
        readers = self.s1.run_read_locked(name, lambda held: self.s2.rlock(name, timeout=5), timeout=5)
        readers.release()  # two read grants were held together

    def test_lock_all_holds_every_lock_or_none(self) -> None:
        a, b = unique("set-a"), unique("set-b")
        with self.s1.lock_all([b, a], timeout=5) as locks:
            self.assertEqual([held.name for held in locks], [a, b])  # sorted by name
            self.assertIsInstance(locks[a].token, int)
            locks.check()
            for name in (a, b):
                with self.assertRaises(coordd.LockHeld):
                    self.s2.try_lock(name)
            # A set that overlaps a held one waits, holding nothing meanwhile.
            c = unique("set-c")
            with self.assertRaises(coordd.DeadlineExceeded):
                self.s2.lock_all([a, c], timeout=0.2)
            self.s1.try_lock(c).release()  # nothing of the failed set stayed held
        self.assertTrue(all(held.released for held in locks))
        again = self.s2.lock_all([a, b], timeout=5)
        self.assertGreater(again[a].token, locks[a].token)
        again.release()

    def test_lock_history_records_the_grant_and_its_release(self) -> None:
        name = unique("history")
        held = self.s1.lock(name, timeout=5)
        held.release()
        granted = list(self.client.lock_history(name, min_revision=held.revision))
        self.assertEqual([(e.type, e.token, e.session_id) for e in granted][:1], [("GRANTED", held.token, self.s1.id)])

        def both() -> list[coordd.HistoryEvent]:
            evs = list(self.client.lock_history(name, page_size=1))  # a page per event: paging is followed
            return evs if len(evs) == 2 else []

        evs = wait_for(both, what="the release in the history")
        self.assertEqual([(e.type, e.token) for e in evs], [("GRANTED", held.token), ("RELEASED", held.token)])
        self.assertEqual([e.type for e in self.client.lock_history(name, newest_first=True)], ["RELEASED", "GRANTED"])
        self.assertEqual(list(self.client.election_history(name)), [])

    def test_waiter_is_granted_after_release_in_order(self) -> None:
        name = unique("handoff")
        first = self.s1.lock(name, timeout=5)
        result: dict = {}

        def wait() -> None:
            try:
                result["lock"] = self.s2.lock(name, timeout=10)
            except Exception as e:  # noqa: BLE001 - reported below
                result["error"] = e

        t = threading.Thread(target=wait)
        t.start()
        self.addCleanup(t.join, 10)
        wait_for(lambda: len(self.client.describe_lock(name).waiters) == 1, what="the waiter to queue")
        self.assertNotIn("lock", result)
        first.release()
        t.join(10)
        self.assertNotIn("error", result)
        self.assertGreater(result["lock"].token, first.token)
        result["lock"].release()

    def test_stale_token_refused_by_fenced_kv(self) -> None:
        name, key = unique("fence"), unique("fence-key")
        held = self.s1.lock(name, timeout=5)
        rev = held.put(key, b"first")
        self.assertGreater(rev, 0)
        self.assertEqual(self.client.kv.get(key).value, b"first")
        held.validate()
        held.release()
        newer = self.s2.lock(name, timeout=5)
        self.addCleanup(newer.release)
        with self.assertRaises(coordd.StaleToken) as cm:
            self.client.fenced_put(key, b"late", held.token, lock=name)
        self.assertEqual(cm.exception.reason, "STALE_TOKEN")
        with self.assertRaises(coordd.StaleToken):
            self.client.validate_fence(held.token, lock=name)
        self.assertEqual(self.client.kv.get(key).value, b"first")  # nothing written
        newer.put(key, "second")
        self.assertEqual(self.client.kv.get(key).value, b"second")
        newer.delete(key)
        with self.assertRaises(coordd.KeyNotFound):
            self.client.kv.get(key)

    def test_acquire_timeout_leaves_nothing_queued(self) -> None:
        name = unique("timeout")
        held = self.s1.lock(name, timeout=5)
        self.addCleanup(held.release)
        t0 = time.monotonic()
        with self.assertRaises(coordd.DeadlineExceeded):
            self.s2.lock(name, timeout=0.3)
        self.assertLess(time.monotonic() - t0, 3)
        self.assertEqual(self.client.describe_lock(name).waiters, ())

    def test_wait_ends_when_session_closes(self) -> None:
        name = unique("waitclose")
        held = self.s1.lock(name, timeout=5)
        self.addCleanup(held.release)
        result: dict = {}

        def wait() -> None:
            try:
                self.s2.lock(name)  # no timeout: waits as long as the session lives
            except Exception as e:  # noqa: BLE001
                result["error"] = e

        t = threading.Thread(target=wait)
        t.start()
        wait_for(lambda: len(self.client.describe_lock(name).waiters) == 1, what="the waiter to queue")
        self.s2.close()
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(result.get("error"), coordd.SessionClosed)
        self.assertEqual(self.client.describe_lock(name).waiters, ())

    def test_semaphore(self) -> None:
        name = unique("sem")
        s3 = self.client.session(ttl=5)
        a = self.s1.semaphore(name, 2, timeout=5)
        b = self.s2.semaphore(name, 2, timeout=5)
        self.assertNotEqual(a.token, b.token)
        with self.assertRaises(coordd.LockHeld):
            s3.try_lock(name, limit=2)
        with self.assertRaises(coordd.LimitMismatch):
            s3.try_lock(name, limit=3)
        a.release()
        c = s3.try_lock(name, limit=2)
        self.assertEqual(len(self.client.describe_lock(name).holders), 2)
        b.release()
        c.release()
        s3.close()

    def test_read_write_lock(self) -> None:
        name = unique("rw")
        r1 = self.s1.rlock(name, timeout=5)
        r2 = self.s2.rlock(name, timeout=5)
        self.assertTrue(r1.read and r2.read)
        s3 = self.client.session(ttl=5)
        self.addCleanup(s3.close)
        with self.assertRaises(coordd.LockHeld):
            s3.try_lock(name)  # a write grant waits for the readers
        with self.assertRaises(coordd.NotHolder):
            r1.put(unique("rw-key"), "x")  # fenced writes need a write grant
        r1.release()
        r2.release()
        w = s3.try_lock(name)
        self.assertFalse(w.read)
        self.assertGreater(w.token, max(r1.token, r2.token))
        w.release()

    def test_with_block_raises_lock_lost_when_lost(self) -> None:
        name = unique("withlost")
        with self.assertRaises(coordd.LockLost):
            with self.s1.lock(name, timeout=5) as held:
                self.s1.close()  # the session ends: the lock goes with it
                self.assertTrue(held.lost.is_set())
                with self.assertRaises(coordd.LockLost):
                    held.check()
        # Released on the server with the session.
        self.s2.try_lock(name).release()

    def test_session_expiry_tells_holder_before_anyone_else_is_granted(self) -> None:
        """The local deadline: with renewals stopped, the holder's ``lost``
        is set before the server expires the session and grants the lock
        (and the leadership) to the other session."""
        name, election = unique("expiry"), unique("expiry-election")
        victim = self.client.session(ttl=2, owner="victim")
        self.assertAlmostEqual(victim.ttl, 2.0)
        held = victim.lock(name, timeout=5)
        lead = victim.campaign(election, "victim", timeout=5)
        lost_at: dict[str, float] = {}
        victim.on_lost(lambda err: lost_at.update(mono=time.monotonic(), wall=time.time(), held=held.lost.is_set(), lead=lead.lost.is_set(), err=err))

        victim._pause_keepalive()  # the process stalls: no renewals, no close
        paused_at = time.monotonic()
        other = self.s2.lock(name, timeout=15)  # granted once the server expires the victim
        granted_mono = time.monotonic()
        self.addCleanup(other.release)

        self.assertIn("mono", lost_at, "the victim was granted away before its session was lost locally")
        self.assertTrue(lost_at["held"] and lost_at["lead"], "held lock and leadership are lost with the session")
        self.assertIsInstance(lost_at["err"], coordd.SessionExpired)
        self.assertIsInstance(victim.error, coordd.SessionExpired)
        self.assertTrue(victim.lost.is_set())
        with self.assertRaises(coordd.LockLost):
            held.check()
        self.assertLess(lost_at["mono"], granted_mono)
        # The server records a grant that waited a moment after it (until
        # then DescribeLock shows the enqueue time, a lower bound): wait for
        # a grant time after the local loss, which a real violation never
        # shows.
        lost_wall = datetime.datetime.fromtimestamp(lost_at["wall"], tz=datetime.timezone.utc)
        granted_wall = wait_for(lambda: (g := self.client.describe_lock(name).holders[0].grant_time) and g > lost_wall and g,
                                what=f"a grant time (server clock) after the local loss at {lost_wall}")
        self.assertLess(lost_wall, granted_wall)
        # Lost no earlier than TTL - margin - one renewal interval after the pause.
        self.assertGreater(lost_at["mono"] - paused_at, 2.0 - victim.margin - 2.0 / 6 - 0.1)
        self.assertGreater(other.token, held.token)
        # The leadership passed on only once the session ended on the server.
        s3lead = self.s2.campaign(election, "s2", timeout=5)
        self.assertGreater(s3lead.term, lead.term)
        s3lead.resign()
        victim.close()  # already gone on the server: not an error

    def test_failed_release_and_resign_can_be_repeated(self) -> None:
        """A release (or resign) that failed leaves the grant with the
        session on the server; calling it again gives it up."""
        name, election = unique("again"), unique("again-election")
        p = Proxy(support.endpoint())
        self.addCleanup(p.close)
        via_proxy = coordd.Client([p.endpoint])
        self.addCleanup(via_proxy.close)
        s = via_proxy.session(ttl=30)
        self.addCleanup(s.close)
        held = s.lock(name, timeout=5)
        lead = s.campaign(election, "v", timeout=5)
        p.pause()  # nothing the holder sends arrives
        with self.assertRaises(coordd.CoorddError):
            held.release(timeout=0.3)
        with self.assertRaises(coordd.CoorddError):
            lead.resign(timeout=0.3)
        self.assertTrue(held.done.is_set() and lead.done.is_set())
        with self.assertRaises(coordd.LockHeld):
            self.s2.try_lock(name)
        self.assertEqual(self.client.leader(election).term, lead.term)
        p.resume()
        held.release(timeout=10)
        lead.resign(timeout=10)
        self.s2.try_lock(name).release()
        with self.assertRaises(coordd.NoLeader):
            self.client.leader(election)
        held.release()  # after a success: nothing to do
        lead.resign()


if __name__ == "__main__":
    unittest.main()
