"""The config center: snapshots, publishes, subscriptions (in order,
complete, resuming after a broken stream, re-reading after a gap)."""

from __future__ import annotations

import queue
import unittest

import support
from proxy import Proxy
from support import coordd, unique

from coordd.config import BEHIND, GAP, OK, _ConfigState
from coordd.v1 import config_pb2


def namespace() -> str:
    return unique("ns").replace("pytest/", "pytest-")  # namespace segments: [A-Za-z0-9._-] joined by "/"


class ConfigTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = support.client()
        self.addCleanup(self.client.close)

    def test_publish_snapshot_get(self) -> None:
        ns = namespace()
        empty = self.client.config.snapshot(ns)
        self.assertEqual((empty.release, empty.values), (0, {}))
        r1 = self.client.config.publish(ns, {"a": "1", "b": "2"}, author="test", message="first")
        self.assertEqual(r1.number, 1)
        self.assertEqual({c.key for c in r1.changes}, {"a", "b"})
        r2 = self.client.config.publish(ns, {"a": "3", "b": None})
        self.assertEqual(r2.number, 2)
        snap = self.client.config.snapshot(ns)
        self.assertEqual((snap.release, snap.values), (2, {"a": "3"}))
        self.assertEqual(self.client.config.get(ns, "a")[0], "3")
        with self.assertRaises(coordd.KeyNotFound):
            self.client.config.get(ns, "b")
        old = self.client.config.snapshot(ns, revision=r1.revision)
        self.assertEqual(old.values, {"a": "1", "b": "2"})
        with self.assertRaises(coordd.RevisionMismatch):
            self.client.config.publish(ns, {"a": "4"}, expected_revision=r1.revision)
        self.assertEqual([r.number for r in self.client.config.releases(ns)], [2, 1])
        r3 = self.client.config.rollback(ns, 1)
        self.assertEqual((r3.number, r3.rollback_of), (3, 1))
        self.assertEqual(self.client.config.snapshot(ns).values, {"a": "1", "b": "2"})

    def test_subscription_delivers_complete_releases_in_order(self) -> None:
        ns = namespace()
        self.client.config.publish(ns, {"k0": "0"})
        got: queue.Queue = queue.Queue()
        sub = self.client.config.subscribe(ns, got.put)
        self.addCleanup(sub.close)
        first = got.get(timeout=5)  # delivered before subscribe returned
        self.assertEqual((first.kind, first.release, first.values), ("snapshot", 1, {"k0": "0"}))
        expected = {"k0": "0"}
        for i in range(1, 6):
            # Several keys per release: a callback never sees half of one.
            changes = {f"k{i}": str(i), f"x{i}": "y", f"k{i - 1}": None}
            self.client.config.publish(ns, changes)
            for k, v in changes.items():
                if v is None:
                    expected.pop(k, None)
                else:
                    expected[k] = v
            u = got.get(timeout=5)
            self.assertEqual((u.kind, u.release), ("change", i + 1))
            self.assertEqual(u.values, expected)
            self.assertEqual({c.key for c in u.changes}, set(changes))
        self.assertEqual(sub.snapshot(ns).values, expected)
        self.assertEqual(sub.snapshot(ns).release, 6)
        self.assertTrue(got.empty())

    def test_subscription_resumes_after_broken_stream(self) -> None:
        ns, other = namespace(), namespace()
        p = Proxy(support.endpoint())
        self.addCleanup(p.close)
        via_proxy = coordd.Client([p.endpoint])
        self.addCleanup(via_proxy.close)
        got: queue.Queue = queue.Queue()
        sub = via_proxy.config.subscribe([ns, other], got.put)
        self.addCleanup(sub.close)
        self.assertEqual(got.get(timeout=5).release, 0)  # both empty: two snapshots
        self.assertEqual(got.get(timeout=5).release, 0)
        self.client.config.publish(ns, {"a": "1"})
        self.assertEqual(got.get(timeout=5).release, 1)
        p.pause()  # the stream breaks; reconnects are refused for now
        for i in range(2, 5):
            self.client.config.publish(ns, {"a": str(i)})
        self.client.config.publish(other, {"o": "1"})
        p.resume()
        updates = [got.get(timeout=10) for _ in range(4)]
        mine = [u for u in updates if u.namespace == ns]
        self.assertEqual([(u.kind, u.release, u.values["a"]) for u in mine], [("change", i, str(i)) for i in range(2, 5)])
        theirs = [u for u in updates if u.namespace == other]
        self.assertEqual([(u.kind, u.release, u.values) for u in theirs], [("change", 1, {"o": "1"})])
        self.assertGreaterEqual(sub.reconnects, 1)
        self.assertEqual(sub.relists, 0, "resumed from its revision, no fresh snapshot needed")

    def test_invalid_namespace_refused(self) -> None:
        with self.assertRaises(coordd.InvalidArgument):
            self.client.config.subscribe("bad namespace!", lambda u: None)

    def test_callback_errors_reported_and_subscription_goes_on(self) -> None:
        ns = namespace()
        errs: queue.Queue = queue.Queue()
        got: queue.Queue = queue.Queue()

        def cb(u: coordd.ConfigUpdate) -> None:
            got.put(u)
            if u.release == 1:
                raise RuntimeError("bad release")

        sub = self.client.config.subscribe(ns, cb, on_error=errs.put)
        self.addCleanup(sub.close)
        self.client.config.publish(ns, {"a": "1"})
        self.client.config.publish(ns, {"a": "2"})
        self.assertEqual([got.get(timeout=5).release for _ in range(3)], [0, 1, 2])
        self.assertIsInstance(errs.get(timeout=5), RuntimeError)


def _snapshot_msg(rev: int, ns: str, release: int, values: dict, cluster: str = "c1") -> config_pb2.WatchResponse:
    return config_pb2.WatchResponse(
        type=config_pb2.WATCH_EVENT_TYPE_SNAPSHOT, revision=rev, cluster_id=cluster,
        snapshots=[config_pb2.NamespaceSnapshot(namespace=ns, release=release, revision=rev, entries=[config_pb2.ConfigEntry(key=k, value=v) for k, v in values.items()])])


def _change_msg(rev: int, ns: str, number: int, key: str, new: str | None) -> config_pb2.WatchResponse:
    ch = config_pb2.ConfigChange(key=key) if new is None else config_pb2.ConfigChange(key=key, new_value=new)
    return config_pb2.WatchResponse(type=config_pb2.WATCH_EVENT_TYPE_CHANGE, revision=rev,
                                    release=config_pb2.ConfigRelease(namespace=ns, number=number, revision=rev, changes=[ch]))


class ConfigStateTest(unittest.TestCase):
    """The subscription's state machine on messages a server could send
    after a gap or from a lagging member (hard to provoke on one daemon)."""

    def test_gap_asks_for_a_snapshot_and_behind_is_refused(self) -> None:
        st = _ConfigState(["n"])
        self.assertEqual(st.apply(_change_msg(5, "n", 1, "a", "1"))[0], GAP)  # a change before any snapshot
        res, ups = st.apply(_snapshot_msg(10, "n", 3, {"a": "1"}))
        self.assertEqual((res, [u.release for u in ups]), (OK, [3]))
        res, ups = st.apply(_change_msg(11, "n", 4, "b", "2"))
        self.assertEqual((res, ups[0].values), (OK, {"a": "1", "b": "2"}))
        self.assertEqual(st.apply(_change_msg(13, "n", 6, "c", "3"))[0], GAP)  # release 5 missing
        self.assertEqual(st.spaces["n"].release, 4)  # nothing applied
        self.assertEqual(st.apply(_snapshot_msg(9, "n", 3, {"a": "1"}))[0], BEHIND)  # older: refused
        self.assertEqual(st.spaces["n"].values, {"a": "1", "b": "2"})
        # A fresh snapshot after the gap: delivered with what changed since.
        res, ups = st.apply(_snapshot_msg(14, "n", 6, {"a": "1", "c": "3"}))
        self.assertEqual(res, OK)
        self.assertEqual(({c.key for c in ups[0].changes}, ups[0].kind), ({"b", "c"}, "snapshot"))
        # The same state again (a reconnect's snapshot) is not delivered again.
        self.assertEqual(st.apply(_snapshot_msg(15, "n", 6, {"a": "1", "c": "3"})), (OK, []))
        # Another cluster (a restored backup) replaces the state whatever its revision.
        res, ups = st.apply(_snapshot_msg(2, "n", 1, {"z": "9"}, cluster="c2"))
        self.assertEqual((res, ups[0].values), (OK, {"z": "9"}))

    def test_secrets_are_left_out(self) -> None:
        """A secret's value never reaches this client (it does not ask for
        it): the key is left out of snapshots and changes, not set to ""."""
        st = _ConfigState(["n"])
        snap = _snapshot_msg(10, "n", 3, {"a": "1"})
        snap.snapshots[0].entries.append(config_pb2.ConfigEntry(key="pw", value="", secret=True))
        res, ups = st.apply(snap)
        self.assertEqual((res, ups[0].values), (OK, {"a": "1"}))
        change = _change_msg(11, "n", 4, "pw", "")
        change.release.changes[0].secret = True
        res, ups = st.apply(change)
        self.assertEqual((res, ups[0].values), (OK, {"a": "1"}))


if __name__ == "__main__":
    unittest.main()
