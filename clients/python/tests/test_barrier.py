"""Barriers from Python: enter until count are in, leave until all are out."""

from __future__ import annotations

import threading
import unittest

import support
from support import coordd, unique


class BarrierTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = support.client()
        self.addCleanup(self.client.close)
        self.sessions = [self.client.session(ttl=5, owner=f"test-b{i}") for i in range(3)]

    def test_opens_when_count_are_in_and_leaves_together(self) -> None:
        name = unique("barrier")
        entered: list[coordd.Barrier] = []
        failures: list[BaseException] = []
        mu = threading.Lock()

        def run(session: coordd.Session) -> None:
            try:
                with session.enter_barrier(name, 3, timeout=10) as b:
                    with mu:
                        entered.append(b)
            except BaseException as e:  # reported below, on the test's thread
                failures.append(e)

        threads = [threading.Thread(target=run, args=(s,)) for s in self.sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures, [])
        self.assertEqual(sorted(b.participants for b in entered), [3, 3, 3])

    def test_a_wait_that_times_out_leaves_no_participant(self) -> None:
        name = unique("barrier")
        with self.assertRaises(coordd.DeadlineExceeded):
            self.sessions[0].enter_barrier(name, 2, timeout=0.2)
        # Had the first stayed in, this would open with 2 at once.
        with self.assertRaises(coordd.DeadlineExceeded):
            self.sessions[1].enter_barrier(name, 2, timeout=0.2)


if __name__ == "__main__":
    unittest.main()
