"""The connection to coordd: endpoints, credentials, calls and fail-over."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import grpc

from coordd import errors
from coordd._cancel import Canceller
from coordd._util import timestamp
from coordd.v1 import (
    barrier_pb2_grpc,
    config_pb2_grpc,
    history_pb2,
    history_pb2_grpc,
    election_pb2,
    election_pb2_grpc,
    kv_pb2_grpc,
    lock_pb2,
    lock_pb2_grpc,
    session_pb2_grpc,
)

if TYPE_CHECKING:
    from coordd.election import Leader, Leadership, LeaderLoop, Observer
    from coordd.history import HistoryEvent
    from coordd.session import Session

log = logging.getLogger("coordd")

DEFAULT_ENDPOINT = "127.0.0.1:7420"
DEFAULT_TIMEOUT = 10.0

_CLUSTER_HEADER = "coordd-cluster"  # every answer names the member's cluster

_CLOSE_TIMEOUT = 2.0  # how long close() tries to close each session on the server

_DEFAULT: Any = object()  # "use the client's timeout"

# Keep-alive pings find a dead connection under a stream (a config
# subscription, an observation) within about 15 s. The daemon allows a ping
# every 5 s at most.
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    # Reconnect soon after a daemon restart instead of gRPC's default backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class _Stubs:
    """The service stubs of one endpoint's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.sessions = session_pb2_grpc.SessionServiceStub(channel)
        self.locks = lock_pb2_grpc.LockServiceStub(channel)
        self.elections = election_pb2_grpc.ElectionServiceStub(channel)
        self.config = config_pb2_grpc.ConfigServiceStub(channel)
        self.kv = kv_pb2_grpc.KVServiceStub(channel)
        self.history = history_pb2_grpc.HistoryServiceStub(channel)
        self.barriers = barrier_pb2_grpc.BarrierServiceStub(channel)


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class LockEntry:
    """One holder or waiter of a lock (DescribeLock)."""

    session_id: str
    request_id: str
    token: int
    metadata: str
    owner: str
    hostname: str
    read: bool
    #: When a holder was granted (the server's clock); None for waiters.
    grant_time: datetime.datetime | None


@dataclass(frozen=True)
class LockState:
    """A lock's holders and waiters at one revision (DescribeLock)."""

    name: str
    limit: int
    holders: tuple[LockEntry, ...]
    waiters: tuple[LockEntry, ...]
    revision: int
    #: How many hold and wait, those of other pages included.
    holder_count: int = 0
    waiter_count: int = 0
    #: Pass as ``page_token`` for the next page; "" on the last one.
    next_page_token: str = ""


def _entry(e: lock_pb2.LockEntry) -> LockEntry:
    return LockEntry(e.session_id, e.request_id, e.token, e.metadata, e.owner, e.hostname, e.read,
                     timestamp(e.grant_time) if e.HasField("grant_time") else None)


class Client:
    """A connection to a coordd cluster over gRPC. Thread-safe; close it
    (or use it as a context manager) when done.

    Args:
        endpoints: coordd gRPC addresses (``host:port``). Calls go to one
            endpoint; when a call fails with UNAVAILABLE the client moves to
            the next one, and calls that are safe to repeat (reads,
            keep-alives, lock and election calls, which carry a request id)
            are retried there until their timeout. Writes that are not
            idempotent (config publishes, fenced writes, session creation)
            are not retried: after :class:`~coordd.errors.Unavailable` they
            may or may not have happened.
        credentials: gRPC channel credentials for TLS (e.g.
            ``grpc.ssl_channel_credentials(ca, key, cert)`` for mutual TLS).
        tls: with no ``credentials``, connect over TLS verified by the
            system's roots. Default: plaintext.
        token: a bearer token naming the caller's principal, sent with every
            call (``authorization: Bearer ...``). Refused over plaintext to
            a non-loopback endpoint, as the Go SDK refuses it.
        timeout: the default deadline, in seconds, of each unary call (and of
            each call's retries together). Waits (lock, campaign) have their
            own timeouts.

    Guarantees: every background thread the client or its sessions,
    subscriptions and leader loops start is owned and stopped by close().
    Non-guarantees: there is no preference for the member that leads etcd
    (the Go SDK's default); streams already open stay on their endpoint
    until they break.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str = (DEFAULT_ENDPOINT,),
        *,
        credentials: grpc.ChannelCredentials | None = None,
        tls: bool = False,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        watch_holdings: bool = True,
    ) -> None:
        #: Keep one server stream (WatchLock, Observe) open per held lock and
        #: leadership, on a thread of its own, so that a release or
        #: resignation from outside is put to the holder first (see Lock).
        self._watch_holdings = watch_holdings
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        self._endpoints = [e for e in endpoints if e]
        if not self._endpoints:
            raise errors.InvalidArgument("no endpoints given")
        if credentials is None and tls:
            credentials = grpc.ssl_channel_credentials()
        self._credentials = credentials
        if token and credentials is None:
            for ep in self._endpoints:
                if not _is_loopback(ep):
                    raise errors.InvalidArgument(
                        f"a bearer token is sent only over TLS or to a loopback endpoint, not in plaintext to {ep}"
                    )
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout = timeout

        self._mu = threading.Lock()
        # The cluster the endpoints answered for (the coordd-cluster header
        # of every answer), the endpoint that named it first, and the
        # refusal once another named another cluster.
        self._cluster: tuple[str, str] | None = None
        self._mixed: errors.InvalidArgument | None = None
        self._stubs: list[_Stubs | None] = [None] * len(self._endpoints)
        self._current = 0
        self._closed = threading.Event()
        # What close() must stop, weakly held: objects the caller dropped
        # were closed already (or never started anything).
        self._owned: weakref.WeakSet[Any] = weakref.WeakSet()

        from coordd.config import ConfigCenter
        from coordd.kv import KV

        #: The config center's calls (snapshot, publish, subscribe, ...).
        self.config = ConfigCenter(self)
        #: Reads of coordd's fenced key-value store.
        self.kv = KV(self)

    # ------------------------------------------------------------------
    # Lifecycle

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed.is_set()

    def close(self) -> None:
        """Closes every session (releasing what they hold), subscription,
        observer and leader loop of this client, waits for their threads,
        then closes the connections. Idempotent; errors are logged."""
        with self._mu:
            if self._closed.is_set():
                return
            owned = list(self._owned)
        # Leader loops first (they resign and close their sessions), then
        # the rest; the connections stay open until everything is stopped.
        owned.sort(key=lambda o: 0 if type(o).__name__ == "LeaderLoop" else 1)
        for o in owned:
            try:
                if type(o).__name__ == "Session":
                    o.close(timeout=_CLOSE_TIMEOUT)  # do not wait long for a dead daemon
                else:
                    o.close()
            except Exception as e:  # noqa: BLE001 - best effort at shutdown
                log.warning("coordd: closing %r: %s", o, e)
        with self._mu:
            self._closed.set()
            stubs, self._stubs = self._stubs, [None] * len(self._endpoints)
        for s in stubs:
            if s is not None:
                s.channel.close()

    def _own(self, obj: Any) -> None:
        """Registers obj (with a close() method) to be closed by close()."""
        with self._mu:
            if self._closed.is_set():
                raise errors.ClientClosed("the client is closed")
            self._owned.add(obj)

    def _disown(self, obj: Any) -> None:
        with self._mu:
            self._owned.discard(obj)

    def _sleep(self, seconds: float) -> bool:
        """Sleeps up to seconds; returns True (early) if the client closes."""
        return self._closed.wait(max(seconds, 0.0))

    # ------------------------------------------------------------------
    # Calls

    def _note_cluster(self, idx: int, metadata: Any) -> None:
        """Notes the cluster an answer of endpoint idx named; raises (and
        refuses every call from then on) once the endpoints answered for two
        clusters: a lock taken on one would not exclude a holder on the
        other. An answer without the header (an older server) says
        nothing."""
        named = next((v for k, v in (metadata or ()) if k == _CLUSTER_HEADER), "")
        with self._mu:
            if self._mixed is None and named:
                ep = self._endpoints[idx]
                if self._cluster is None:
                    self._cluster = (named, ep)
                elif self._cluster[0] != named:
                    first, by = self._cluster
                    self._mixed = errors.InvalidArgument(
                        f"the endpoints name members of two clusters: {by} answers for cluster {first}, "
                        f"{ep} for cluster {named}; give a client the endpoints of one cluster"
                    )
            if self._mixed is not None:
                raise self._mixed

    def _pick(self) -> tuple[int, _Stubs]:
        """The current endpoint's index and stubs (connecting lazily)."""
        with self._mu:
            if self._closed.is_set():
                raise errors.ClientClosed("the client is closed")
            if self._mixed is not None:
                raise self._mixed
            i = self._current
            s = self._stubs[i]
            if s is None:
                ep = self._endpoints[i]
                if self._credentials is not None:
                    ch = grpc.secure_channel(ep, self._credentials, options=_CHANNEL_OPTIONS)
                else:
                    ch = grpc.insecure_channel(ep, options=_CHANNEL_OPTIONS)
                s = self._stubs[i] = _Stubs(ch)
            return i, s

    def _advance(self, failed: int) -> None:
        """Moves to the next endpoint if the failed one is still current."""
        with self._mu:
            if self._current == failed and len(self._endpoints) > 1:
                self._current = (failed + 1) % len(self._endpoints)
                log.info("coordd: endpoint %s unavailable; moving to %s", self._endpoints[failed], self._endpoints[self._current])

    def _unary(
        self,
        service: str,
        method: str,
        request: Any,
        *,
        timeout: float | None = _DEFAULT,
        retry: bool = False,
        cancel: Iterable[Canceller] = (),
        attempts: list[int] | None = None,
    ) -> Any:
        """Calls one unary RPC and returns its response, or raises its
        CoorddError. With retry, UNAVAILABLE is retried (on the next
        endpoint at once, then with backoff) until timeout; a cancel
        signal cancels the call in flight (raising errors.Cancelled).
        attempts, when given, gets the number of calls made appended."""
        if timeout is _DEFAULT:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = 0.05
        n = 0
        try:
            while True:
                n += 1
                idx, stubs = self._pick()
                left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                try:
                    resp, call = self._call_once(getattr(getattr(stubs, service), method), request, left, cancel)
                    self._note_cluster(idx, call.initial_metadata())
                    return resp
                except errors.Unavailable:
                    self._advance(idx)
                    if not retry or any(c.cancelled for c in cancel):
                        raise
                    if n % len(self._endpoints) == 0:  # every endpoint tried: back off
                        wait = backoff if deadline is None else min(backoff, deadline - time.monotonic())
                        if wait <= 0:
                            raise
                        if self._sleep(wait):
                            raise errors.ClientClosed("the client is closed") from None
                        backoff = min(2 * backoff, 1.0)
                    elif deadline is not None and time.monotonic() >= deadline:
                        raise
        finally:
            if attempts is not None:
                attempts.append(n)

    def _call_once(self, fn: Any, request: Any, timeout: float | None, cancel: Iterable[Canceller]) -> tuple[Any, Any]:
        """Makes one call; returns its response and the call (for its
        initial metadata)."""
        cancel = list(cancel)
        try:
            if not cancel:
                return fn.with_call(request, timeout=timeout, metadata=self._metadata)
            fut = fn.future(request, timeout=timeout, metadata=self._metadata)
            unregister = [c.register(fut.cancel) for c in cancel]
            try:
                return fut.result(), fut
            finally:
                for u in unregister:
                    u()
        except grpc.FutureCancelledError:
            raise errors.Cancelled("the call was cancelled") from None
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        except ValueError as e:  # "Cannot invoke RPC on closed channel!"
            if self._closed.is_set():
                raise errors.ClientClosed("the client is closed") from None
            raise

    def _stream(self, service: str, method: str, request: Any) -> tuple[int, Any]:
        """Opens a server-streaming RPC (no deadline) on the current
        endpoint; returns the endpoint's index and the call (an iterator of
        responses with cancel())."""
        idx, stubs = self._pick()
        try:
            return idx, getattr(getattr(stubs, service), method)(request, metadata=self._metadata)
        except ValueError:
            raise errors.ClientClosed("the client is closed") from None

    # ------------------------------------------------------------------
    # Sessions

    def session(
        self,
        ttl: float = 10.0,
        *,
        owner: str | None = None,
        hostname: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> "Session":
        """Creates a session with the given TTL (2 s to 1 h, rounded up to a
        whole second by the server) and starts keeping it alive on a
        background thread. See :class:`coordd.session.Session`.

        owner defaults to the program's name, hostname to this host's."""
        from coordd.session import Session

        if owner is None:
            owner = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        if hostname is None:
            hostname = socket.gethostname()
        return Session._create(self, ttl, owner, hostname, dict(labels or {}))

    # ------------------------------------------------------------------
    # Locks (reads) and fencing

    def describe_lock(self, name: str, *, page_size: int = 1000, page_token: str = "") -> LockState:
        """Returns the lock's holder and waiter counts and its first
        ``page_size`` holders and waiters (1-1000), in grant order; for a
        crowd, ``next_page_token`` continues (as ``page_token``)."""
        r = self._unary("locks", "DescribeLock", lock_pb2.DescribeLockRequest(name=name, page_size=page_size, page_token=page_token), retry=True)
        return LockState(r.name, r.limit, tuple(_entry(e) for e in r.holders), tuple(_entry(e) for e in r.waiters), r.revision,
                         r.holder_count, r.waiter_count, r.next_page_token)

    def lock_history(self, name: str = "", *, owner: str = "", since: datetime.datetime | None = None,
                     until: datetime.datetime | None = None, page_size: int = 0, newest_first: bool = False,
                     min_revision: int = 0) -> "Iterator[HistoryEvent]":
        """The grant history of the lock name (every lock's when empty), as
        the Go SDK's ``Admin.LockHistory``: each grant and each end of one,
        oldest first (``newest_first`` reverses), filtered by owner and
        time, fetched a page at a time as the iteration goes. With
        ``min_revision`` the server first waits until it has recorded every
        event up to that etcd revision (a grant's ``revision``); events are
        recorded within about 250 ms of their commit. Not retried."""
        from coordd.history import events

        return events(self, "ListLockHistory", history_pb2.ListLockHistoryRequest, name, owner, since, until,
                      page_size, newest_first, min_revision)

    def election_history(self, name: str = "", *, owner: str = "", since: datetime.datetime | None = None,
                         until: datetime.datetime | None = None, page_size: int = 0, newest_first: bool = False,
                         min_revision: int = 0) -> "Iterator[HistoryEvent]":
        """The history of the election name (every election's when empty), as
        lock_history does for locks."""
        from coordd.history import events

        return events(self, "ListElectionHistory", history_pb2.ListElectionHistoryRequest, name, owner, since, until,
                      page_size, newest_first, min_revision)

    def validate_fence(self, token: int, *, lock: str = "", election: str = "") -> None:
        """Returns if token holds the lock (or is the term leading the
        election) now; raises StaleToken if not. Linearizable, but stale by
        the time the caller acts: to protect a write use fenced_put."""
        self._unary("locks", "ValidateFence", lock_pb2.ValidateFenceRequest(name=lock, election=election, token=token), retry=True)

    def fenced_put(self, key: str, value: bytes | str, token: int, *, lock: str = "", election: str = "") -> int:
        """Writes key in coordd's KV only if token holds the lock (or leads
        the election), in one etcd transaction with the check; otherwise
        raises StaleToken and writes nothing. Returns the write's revision.
        Not retried: after Unavailable the write may or may not have happened."""
        if isinstance(value, str):
            value = value.encode()
        r = self._unary("locks", "FencedPut", lock_pb2.FencedPutRequest(lock=lock, election=election, token=token, key=key, value=value))
        return r.revision

    def fenced_delete(self, key: str, token: int, *, lock: str = "", election: str = "") -> int:
        """Deletes key from coordd's KV only if token holds the lock (or
        leads the election), as fenced_put writes. Returns the revision."""
        r = self._unary("locks", "FencedDelete", lock_pb2.FencedDeleteRequest(lock=lock, election=election, token=token, key=key))
        return r.revision

    # ------------------------------------------------------------------
    # Elections (reads) and leader loops

    def leader(self, name: str) -> "Leader":
        """Returns who leads the election; raises NoLeader if nobody does."""
        from coordd.election import Leader

        r = self._unary("elections", "Leader", election_pb2.LeaderRequest(name=name), retry=True)
        return Leader._from(r.leader)

    def candidates(self, name: str) -> list["Leader"]:
        """Returns the campaigns waiting for the seat, in the order they
        would take it: priority, then arrival (as Leader records with term 0,
        priority and joined)."""
        from coordd.election import Leader

        r = self._unary("elections", "Candidates", election_pb2.CandidatesRequest(name=name), retry=True)
        return [Leader._candidate(c) for c in r.candidates]

    def observe(self, name: str, from_revision: int = 0) -> "Observer":
        """Follows an election: returns an iterable :class:`~coordd.election.Observer`
        of its events, in order. See there."""
        from coordd.election import Observer

        return Observer(self, name, from_revision)

    def run_as_leader(
        self,
        name: str,
        value: str,
        fn: Callable[["Leadership"], object],
        *,
        ttl: float = 10.0,
        owner: str | None = None,
        labels: dict[str, str] | None = None,
        min_backoff: float = 0.1,
        max_backoff: float = 10.0,
    ) -> "LeaderLoop":
        """Starts a :class:`~coordd.election.LeaderLoop`: a background thread
        that campaigns, runs ``fn(leadership)`` while leading, and campaigns
        again (with a new session if its session ended). See there."""
        from coordd.election import LeaderLoop

        return LeaderLoop(self, name, value, fn, ttl=ttl, owner=owner, labels=labels, min_backoff=min_backoff, max_backoff=max_backoff)

