"""coordd: the Python client of the coordd coordination daemon.

Locks with fencing tokens, leader elections and a config center, over
coordd's gRPC API (unary and server-streaming calls only)::

    import coordd

    with coordd.Client(["127.0.0.1:7420"]) as client:
        with client.session(ttl=10) as session:
            with session.lock("reports/daily", timeout=30) as held:
                held.check()                      # raises LockLost once lost
                held.put("reports/owner", "me")   # fenced by held.token

Guarantees and non-guarantees are stated on each class (Session, Lock,
Leadership, Observer, LeaderLoop, Subscription) and in the README.
"""

from coordd.client import Client, LockEntry, LockState
from coordd.config import ConfigCenter, ConfigUpdate, KeyChange, NamespaceSnapshot, Release, Subscription
from coordd.election import ElectionEvent, Leader, LeaderLoop, Leadership, Observer
from coordd import errors
from coordd.errors import *  # noqa: F401,F403 - the exception hierarchy
from coordd.kv import KV, KeyValue
from coordd.barrier import Barrier
from coordd.history import HistoryEvent
from coordd.lock import Lock, LockSet
from coordd.session import Session

__all__ = [
    "Client", "Session", "Lock", "LockSet", "LockEntry", "LockState", "Leadership", "Leader", "ElectionEvent",
    "Observer", "LeaderLoop", "ConfigCenter", "ConfigUpdate", "KeyChange", "NamespaceSnapshot",
    "Release", "Subscription", "KV", "KeyValue", "HistoryEvent", "Barrier", "errors", *errors.__all__,
]
