"""Elections against a real daemon: campaign, proclaim, resign, observe,
resume after a broken stream, and the leader loop."""

from __future__ import annotations

import queue
import threading
import unittest

import support
from proxy import Proxy
from support import coordd, unique, wait_for


def collect(observer: coordd.Observer) -> tuple[queue.Queue, threading.Thread]:
    """Iterates observer on a thread, putting each event (then None, or the
    exception that ended it) on a queue."""
    q: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            for ev in observer:
                q.put(ev)
            q.put(None)
        except Exception as e:  # noqa: BLE001 - handed to the test
            q.put(e)

    t = threading.Thread(target=run, name="test-observer")
    t.start()
    return q, t


def take(q: queue.Queue, n: int, timeout: float = 5.0) -> list:
    out = []
    for _ in range(n):
        ev = q.get(timeout=timeout)
        assert isinstance(ev, coordd.ElectionEvent), f"observer ended: {ev!r}"
        out.append(ev)
    return out


class ElectionTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = support.client()
        self.addCleanup(self.client.close)

    def test_campaign_leader_proclaim_resign_observe_in_order(self) -> None:
        name = unique("election")
        s1 = self.client.session(ttl=5, owner="one")
        s2 = self.client.session(ttl=5, owner="two")
        with self.assertRaises(coordd.NoLeader):
            self.client.leader(name)
        obs = self.client.observe(name)
        q, t = collect(obs)
        self.addCleanup(t.join, 5)
        self.addCleanup(obs.close)
        first = take(q, 1)[0]
        self.assertEqual((first.type, first.current), ("VACANT", True))

        lead1 = s1.campaign(name, "addr-1", timeout=5)
        self.assertEqual(self.client.leader(name).term, lead1.term)
        self.assertEqual(self.client.leader(name).value, "addr-1")
        result: dict = {}
        waiter = threading.Thread(target=lambda: result.update(lead=s2.campaign(name, "addr-2", timeout=10)))
        waiter.start()
        wait_for(lambda: len(self.client.candidates(name)) == 1, what="the second candidate to queue")
        lead1.proclaim("addr-1b")
        self.assertEqual(self.client.leader(name).value, "addr-1b")
        lead1.resign()
        waiter.join(10)
        lead2 = result["lead"]
        self.assertGreater(lead2.term, lead1.term)
        with self.assertRaises(coordd.NotLeader):
            s1._client._unary("elections", "Proclaim", coordd.election.election_pb2.ProclaimRequest(name=name, term=lead1.term, value="late"))
        with lead2:
            self.assertEqual(self.client.leader(name).session_id, s2.id)
        # ELECTED(1), PROCLAIMED(1), RESIGNED(1), ELECTED(2), RESIGNED(2), VACANT
        evs = take(q, 6)
        self.assertEqual([e.type for e in evs], ["ELECTED", "PROCLAIMED", "RESIGNED", "ELECTED", "RESIGNED", "VACANT"])
        self.assertEqual([e.leader.term if e.leader else None for e in evs], [lead1.term] * 3 + [lead2.term] * 2 + [None])
        self.assertEqual(evs[1].leader.value, "addr-1b")
        self.assertEqual(evs[0].leader.owner, "one")
        revs = [e.revision for e in evs]
        self.assertEqual(revs, sorted(revs))
        self.assertFalse(any(e.current for e in evs))
        obs.close()
        self.assertIsNone(q.get(timeout=5))  # close() ends the iteration

    def test_priority_preemption_and_transfer(self) -> None:
        name = unique("handover")
        s1, s2, s3 = (self.client.session(ttl=5, owner=o) for o in ("one", "two", "three"))
        lead1 = s1.campaign(name, "addr-1", timeout=5, priority=1)
        results: dict = {}
        w2 = threading.Thread(target=lambda: results.update(two=s2.campaign(name, "addr-2", timeout=10)))
        w2.start()
        wait_for(lambda: len(self.client.candidates(name)) == 1, what="two to queue")
        w3 = threading.Thread(target=lambda: results.update(three=s3.campaign(name, "addr-3", timeout=10, priority=5, preempt=True)))
        w3.start()
        wait_for(lambda: len(self.client.candidates(name)) == 2, what="three to queue")
        cands = self.client.candidates(name)
        self.assertEqual([(c.value, c.priority, c.term) for c in cands], [("addr-3", 5, 0), ("addr-2", 0, 0)])
        self.assertGreater(cands[0].joined, cands[1].joined)  # priority before arrival
        obs = self.client.observe(name)
        q, t = collect(obs)
        self.addCleanup(t.join, 5)
        self.addCleanup(obs.close)
        first = take(q, 2)
        self.assertEqual([(e.type, e.current) for e in first], [("ELECTED", True), ("PREEMPT_REQUESTED", True)])
        self.assertEqual((first[1].by.session_id, first[1].by.priority), (s3.id, 5))
        with self.assertRaises(coordd.CandidateNotFound):
            lead1.transfer("00000000000000ff")
        term = lead1.transfer(s2.id)  # the leader names its successor
        w2.join(10)
        self.assertEqual(results["two"].term, term)
        self.assertTrue(lead1.done.is_set())
        self.assertFalse(lead1.lost.is_set())
        evs = take(q, 2)
        self.assertEqual([(e.type, e.revision) for e in evs], [("RESIGNED", term), ("ELECTED", term)])
        results["two"].resign()
        w3.join(10)
        self.assertEqual(results["three"].value, "addr-3")
        results["three"].resign()

    def test_observe_resumes_after_broken_stream(self) -> None:
        name = unique("resume")
        p = Proxy(support.endpoint())
        self.addCleanup(p.close)
        via_proxy = coordd.Client([p.endpoint])
        self.addCleanup(via_proxy.close)
        s = self.client.session(ttl=5)
        obs = via_proxy.observe(name)
        q, t = collect(obs)
        self.addCleanup(t.join, 5)
        self.addCleanup(obs.close)
        self.assertEqual(take(q, 1)[0].type, "VACANT")
        lead = s.campaign(name, "v0", timeout=5)
        self.assertEqual(take(q, 1)[0].type, "ELECTED")
        p.pause()  # the stream breaks, and reconnecting fails for now
        for i in range(1, 4):
            lead.proclaim(f"v{i}")
        p.resume()
        evs = take(q, 3, timeout=10)
        # Resumed from the last revision: the missed proclamations, in
        # order, not a fresh "current" state.
        self.assertEqual([(e.type, e.leader.value, e.current) for e in evs], [("PROCLAIMED", f"v{i}", False) for i in range(1, 4)])
        self.assertGreaterEqual(obs.reconnects, 1)
        lead.resign()
        self.assertEqual([e.type for e in take(q, 2)], ["RESIGNED", "VACANT"])

    def test_observe_invalid_name_raises(self) -> None:
        with self.assertRaises(coordd.InvalidArgument):
            for _ in self.client.observe("bad name!"):
                pass

    def test_leader_loop_hands_over_and_recampaigns(self) -> None:
        name = unique("loop")
        elected: queue.Queue = queue.Queue()

        def lead_until_done(tag: str):
            def fn(lead: coordd.Leadership) -> None:
                elected.put((tag, lead.term))
                lead.done.wait()  # lead until told to stop or lost
            return fn

        a = self.client.run_as_leader(name, "a", lead_until_done("a"), ttl=3)
        self.addCleanup(a.stop)
        tag, term_a = elected.get(timeout=5)
        self.assertEqual(tag, "a")
        b = self.client.run_as_leader(name, "b", lead_until_done("b"), ttl=3)
        self.addCleanup(b.stop)
        wait_for(lambda: len(self.client.candidates(name)) == 1, what="b to campaign")
        self.assertEqual(self.client.leader(name).value, "a")
        a.stop(timeout=5)  # fn returns, a resigns: b leads at once
        self.assertFalse(a.is_alive())
        tag, term_b = elected.get(timeout=5)
        self.assertEqual(tag, "b")
        self.assertGreater(term_b, term_a)
        # b's leadership is lost when its session expires (renewals paused):
        # the loop makes a new session and leads again, with a new term.
        b.leadership.session._pause_keepalive()
        tag, term_b2 = elected.get(timeout=10)
        self.assertEqual(tag, "b")
        self.assertGreater(term_b2, term_b)
        self.assertEqual(b.terms, [term_b, term_b2])
        b.stop(timeout=5)
        with self.assertRaises(coordd.NoLeader):
            self.client.leader(name)

    def test_leader_loop_returns_when_fn_finishes(self) -> None:
        name = unique("loop-done")
        ran: list[int] = []
        loop = self.client.run_as_leader(name, "x", lambda lead: ran.append(lead.term))
        self.assertTrue(loop.wait(5))
        self.assertEqual(len(ran), 1)
        with self.assertRaises(coordd.NoLeader):  # resigned after fn returned
            self.client.leader(name)


if __name__ == "__main__":
    unittest.main()
