"""The client itself: endpoints and fail-over, bearer tokens, and that
close() leaves no thread behind."""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import threading
import unittest

import daemon
import support
from support import coordd, unique, wait_for


def dead_endpoint() -> str:
    """A loopback port nobody listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


class ClientTest(unittest.TestCase):
    def test_refuses_endpoints_of_two_clusters(self) -> None:
        """A client that meets a member of a second cluster (after a
        fail-over) refuses that answer and every call after: a lock taken on
        one cluster would not exclude a holder on the other."""
        other = support.other_endpoint()
        if other is None:
            self.skipTest("needs a second daemon (COORDD_OTHER_ENDPOINT)")
        with coordd.Client([support.endpoint(), other], timeout=5) as c:
            c.describe_lock(unique("two-clusters"))  # the first cluster, noted
            c._advance(0)  # as after a fail-over
            for _ in range(2):
                with self.assertRaises(coordd.InvalidArgument) as cm:
                    c.describe_lock(unique("two-clusters"))
                self.assertIn("two clusters", str(cm.exception))

    def test_fails_over_to_the_next_endpoint(self) -> None:
        with coordd.Client([dead_endpoint(), support.endpoint()], timeout=5) as c:
            with self.assertRaises(coordd.NoLeader):  # answered by the live endpoint
                c.leader(unique("failover"))
            with c.session(ttl=3) as s, s.lock(unique("failover"), timeout=5) as held:
                self.assertGreater(held.token, 0)

    def test_unreachable_endpoint_is_unavailable(self) -> None:
        # Refused connections are UNAVAILABLE; on a loaded machine the
        # call's own deadline may run out first, between retries.
        with coordd.Client([dead_endpoint()], timeout=0.5) as c:
            with self.assertRaises((coordd.Unavailable, coordd.DeadlineExceeded)):
                c.leader("x")

    def test_token_refused_in_plaintext_off_loopback(self) -> None:
        with self.assertRaises(coordd.InvalidArgument):
            coordd.Client(["192.0.2.1:7420"], token="secret")
        coordd.Client(["127.0.0.1:7420"], token="secret").close()  # loopback: allowed

    def test_close_stops_every_thread(self) -> None:
        before = set(threading.enumerate())
        c = coordd.Client([support.endpoint()])
        s = c.session(ttl=3)
        s.lock(unique("leak"), timeout=5)
        s.campaign(unique("leak"), "v", timeout=5)
        c.config.subscribe(unique("leak").replace("pytest/", "pytest-"), lambda u: None)
        obs = c.observe(unique("leak"))
        it = iter(obs)
        self.assertEqual(next(it).type, "VACANT")
        loop = c.run_as_leader(unique("leak"), "v", lambda lead: lead.done.wait())
        wait_for(lambda: loop.leadership is not None, what="the leader loop to lead")
        self.assertGreater(len(set(threading.enumerate()) - before), 2)
        c.close()
        self.assertTrue(s.done.is_set())
        self.assertFalse(loop.is_alive())
        self.assertEqual(list(it), [])  # the observer ended
        wait_for(lambda: set(threading.enumerate()) <= before, what=f"threads to stop: {set(threading.enumerate()) - before}")
        with self.assertRaises(coordd.ClientClosed):
            c.session()
        c.close()  # idempotent


@unittest.skipUnless(support.owns_daemon(), "needs a daemon of its own (COORDD_ENDPOINT is set)")
class AuthTest(unittest.TestCase):
    """Bearer tokens and a policy, on a second daemon started for them."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.dir = tempfile.mkdtemp(prefix="coordd-pytest-auth-")
        cls.token = "test-token-" + os.urandom(8).hex()
        with open(os.path.join(cls.dir, "tokens.yaml"), "w") as f:
            f.write(f"tokens:\n  - principal: tester\n    sha256: {hashlib.sha256(cls.token.encode()).hexdigest()}\n")
        with open(os.path.join(cls.dir, "policy.yaml"), "w") as f:
            f.write('rules:\n  - principals: [tester]\n    actions: [session, "lock.*"]\n    locks: ["ok/*"]\n')
        cls.daemon = daemon.start(["--token-file", os.path.join(cls.dir, "tokens.yaml"), "--policy-file", os.path.join(cls.dir, "policy.yaml")])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    def test_token_names_the_principal(self) -> None:
        with coordd.Client([self.daemon.endpoint], token=self.token) as c, c.session(ttl=3) as s:
            s.try_lock("ok/a").release()
            with self.assertRaises(coordd.PermissionDenied) as cm:
                s.try_lock("other/a")
            self.assertEqual(cm.exception.reason, "PERMISSION_DENIED")
        with coordd.Client([self.daemon.endpoint], token="wrong") as c:
            with self.assertRaises(coordd.Unauthenticated):
                c.session(ttl=3)
        with coordd.Client([self.daemon.endpoint]) as c:
            with self.assertRaises((coordd.Unauthenticated, coordd.PermissionDenied)):
                c.session(ttl=3)


if __name__ == "__main__":
    unittest.main()
