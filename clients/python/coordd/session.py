"""Sessions: the liveness unit every lock and candidacy hangs off, kept
alive by a background thread, with a local deadline."""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import grpc

from coordd import errors
from coordd._cancel import Canceller
from coordd._util import duration, seconds, server_wait
from coordd.v1 import barrier_pb2, election_pb2, lock_pb2, session_pb2

T = TypeVar("T")

if TYPE_CHECKING:
    from coordd.barrier import Barrier
    from coordd.client import Client
    from coordd.election import Leadership
    from coordd.lock import Lock, LockSet

log = logging.getLogger("coordd")


def safety_margin(ttl: float) -> float:
    """How long before ``sent + TTL`` the local deadline falls:
    max(250 ms, TTL/10), as in the Go SDK. It covers the difference of the
    client's and the server's clock rates over one TTL."""
    return max(0.25, ttl / 10)


def _base_interval(ttl: float) -> float:
    """The pause between renewals before jitter: TTL/3, or TTL/6 under 6 s."""
    return ttl / 6 if ttl < 6 else ttl / 3


class _RequestIDs:
    """Request ids of a session's released locks (resigned campaigns), one
    per name and mode, used again for the next acquisition: the server's
    waiter key is made of session and request id, so a lock taken in a
    loop then writes one etcd key again instead of a new one each time
    (see the Go SDK's requestIDs). An id is reused only after its release
    succeeded."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._free: dict[tuple[str, str, bool], str] = {}

    def take(self, kind: str, name: str, read: bool = False) -> str:
        with self._mu:
            rid = self._free.pop((kind, name, read), None)
        return rid or secrets.token_hex(8)

    def give_back(self, kind: str, name: str, read: bool, rid: str) -> None:
        with self._mu:
            if len(self._free) < 1024:
                self._free[(kind, name, read)] = rid


class Session:
    """A coordd session, kept alive by a daemon thread that this object
    owns (stopped by close(), or when the session ends).

    The thread renews the session about every TTL/3 (TTL/6 for TTLs under
    6 s, with ±10 % jitter) with the unary KeepAlive call. The session keeps
    a **local deadline**: the time the last acknowledged renewal was *sent*
    plus the TTL minus a safety margin (max(250 ms, TTL/10)). The server
    never ends a session earlier than its TTL after the last renewal it
    answered, and it answers only after the client sent it, so the local
    deadline falls before the server can end the session (as long as the
    two hosts' clocks run at rates within the margin over one TTL).

    When the local deadline passes without an acknowledged renewal, the
    session is **expired locally**: ``lost`` is set, ``error`` is
    :class:`~coordd.errors.SessionExpired`, every lock and leadership held
    under it has its ``lost`` event set, waits under it are cancelled, and
    the on_lost callbacks run — all before the server can grant those
    locks to anyone else, although the server may still keep the session
    for the rest of its TTL. The client then asks the server to close it
    (best effort), so others do not wait for the TTL. The same happens,
    with :class:`~coordd.errors.SessionNotFound`, when the server answers
    that the session no longer exists.

    Non-guarantees: a lost session is not recreated (create a new one);
    the thread cannot stop your code from acting after ``lost`` is set
    (check it, and fence writes with the token); callbacks run on the
    keep-alive thread and must not block for long.
    """

    def __init__(self, client: "Client", sid: str, ttl: float, deadline: float) -> None:
        self._client = client
        #: The session's id (16 hexadecimal digits).
        self.id = sid
        #: The TTL the server granted, in seconds.
        self.ttl = ttl
        self.margin = safety_margin(ttl)
        #: Set when the session ends for any reason, close() included.
        self.done = threading.Event()
        #: Set when the session ends without close(): expired locally, or
        #: reported gone by the server.
        self.lost = threading.Event()
        self._mu = threading.Lock()
        self._deadline = deadline  # time.monotonic() seconds; guarded by _mu
        self._error: errors.CoorddError | None = None
        self._on_lost: list[Callable[[errors.CoorddError], None]] = []
        # Cancelled when the session ends: held locks and leaderships lose
        # themselves, waits in flight (acquire, campaign) are cancelled.
        self._ender = Canceller()
        self._wake = threading.Event()
        self._paused = False  # test hook: see _pause_keepalive
        self._inflight = None  # the keep-alive call in flight (a grpc future)
        self._lock_ids = _RequestIDs()
        self._thread = threading.Thread(target=self._run, name=f"coordd-keepalive-{sid}", daemon=True)

    @classmethod
    def _create(cls, client: "Client", ttl: float, owner: str, hostname: str, labels: dict[str, str]) -> "Session":
        sent = time.monotonic()
        req = session_pb2.CreateSessionRequest(ttl=duration(ttl), owner=owner, hostname=hostname, labels=labels)
        # Not retried: a retry would create a second session.
        resp = client._unary("sessions", "CreateSession", req)
        granted = seconds(resp.session.ttl)
        s = cls(client, resp.session.id, granted, sent + granted - safety_margin(granted))
        if time.monotonic() >= s._deadline:
            # The answer came too late to renew in time: do not hand it out.
            s._close_on_server(timeout=2.0)
            raise errors.SessionExpired(f"creating session {s.id} took longer than its TTL minus the safety margin")
        try:
            client._own(s)
        except errors.ClientClosed:
            s._close_on_server(timeout=2.0)
            raise
        s._thread.start()
        return s

    # ------------------------------------------------------------------
    # State

    def __repr__(self) -> str:
        return f"<coordd.Session {self.id} ttl={self.ttl:g}s {'ended' if self.done.is_set() else 'alive'}>"

    @property
    def deadline(self) -> float:
        """The local deadline, in time.monotonic() seconds."""
        with self._mu:
            return self._deadline

    def remaining(self) -> float:
        """Seconds until the local deadline (negative once passed)."""
        return self.deadline - time.monotonic()

    @property
    def error(self) -> errors.CoorddError | None:
        """None while alive; afterwards why the session ended:
        SessionClosed, SessionExpired or SessionNotFound."""
        with self._mu:
            return self._error

    def check(self) -> None:
        """Raises the session's error if it has ended."""
        err = self.error
        if err is not None:
            raise err

    def on_lost(self, callback: Callable[[errors.CoorddError], None]) -> None:
        """Calls callback(error) once when the session is lost (not when
        closed), on the keep-alive thread; at once if already lost."""
        with self._mu:
            if not self.done.is_set():
                self._on_lost.append(callback)
                return
            err = self._error
        if self.lost.is_set() and err is not None:
            callback(err)

    # ------------------------------------------------------------------
    # Ending

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Stops the keep-alives and closes the session on the server,
        releasing everything held under it. Held locks and leaderships get
        ``lost`` set. Idempotent; a session already gone on the server is
        not an error."""
        self._end(errors.SessionClosed(f"session {self.id} closed"))
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join()
        self._client._disown(self)
        self._close_on_server(timeout=timeout if timeout is not None else self._client.timeout)

    def _close_on_server(self, timeout: float | None) -> None:
        try:
            # By its owner: every holding ended with the session here.
            self._client._unary("sessions", "CloseSession", session_pb2.CloseSessionRequest(session_id=self.id, by_owner=True),
                                timeout=timeout, retry=True)
        except errors.SessionNotFound:
            pass

    def _end(self, err: errors.CoorddError) -> None:
        """Ends the session locally with err (the first reason wins)."""
        with self._mu:
            if self._error is not None:
                return
            self._error = err
            callbacks, self._on_lost = self._on_lost, []
            inflight = self._inflight
        lost = not isinstance(err, errors.SessionClosed)
        if lost:
            self.lost.set()
            log.warning("coordd: session %s lost: %s", self.id, err)
        self.done.set()
        self._ender.cancel()  # holders lose their holdings; waits are cancelled
        self._wake.set()
        if inflight is not None:
            inflight.cancel()
        if lost:
            for cb in callbacks:
                try:
                    cb(err)
                except Exception:  # noqa: BLE001 - a callback's failure is the caller's
                    log.exception("coordd: session on_lost callback failed")

    # ------------------------------------------------------------------
    # Keep-alive loop

    def _pause_keepalive(self, paused: bool = True) -> None:
        """Test hook: while paused, the keep-alive thread sends nothing (no
        renewal, and no close after a local expiry), as if this process
        were stalled or cut off. The local deadline still ends the session."""
        with self._mu:
            self._paused = paused
        self._wake.set()

    def _interval(self) -> float:
        base = _base_interval(self.ttl)
        return base * random.uniform(0.9, 1.1)

    def _run(self) -> None:
        retry = 0.05
        next_at = time.monotonic() + self._interval()
        req = session_pb2.KeepAliveRequest(session_id=self.id)
        while True:
            with self._mu:
                if self._error is not None:
                    return
                deadline, paused = self._deadline, self._paused
            now = time.monotonic()
            if now >= deadline:
                self._end(errors.SessionExpired(f"session {self.id}: no keep-alive acknowledged before the local deadline"))
                if not paused and not self._client.closed:
                    try:  # best effort: the server may still hold it
                        self._close_on_server(timeout=1.0)
                    except errors.CoorddError as e:
                        log.info("coordd: closing expired session %s: %s", self.id, e)
                return
            if paused or now < next_at:
                self._wake.wait(deadline - now if paused else min(next_at, deadline) - now)
                self._wake.clear()
                continue
            sent = time.monotonic()
            try:
                resp = self._renew(req, sent, deadline)
            except errors.SessionNotFound as e:
                self._end(e)
                return
            except errors.ClientClosed:
                self._end(errors.SessionClosed(f"session {self.id}: the client is closed"))
                return
            except errors.CoorddError as e:
                if self.done.is_set():
                    return
                log.warning("coordd: keep-alive of session %s failed (%s); retrying, %.2fs to the local deadline", self.id, e, deadline - time.monotonic())
                next_at = time.monotonic() + retry
                retry = min(2 * retry, 0.25)
                continue
            if resp is None:  # no answer before the deadline
                continue
            with self._mu:
                d = sent + seconds(resp.ttl) - self.margin
                if d > self._deadline:
                    self._deadline = d
            retry = 0.05
            next_at = sent + self._interval()

    def _renew(self, req: session_pb2.KeepAliveRequest, sent: float, deadline: float) -> session_pb2.KeepAliveResponse | None:
        """Sends one KeepAlive and waits for its answer, at most until the
        local deadline (or the session's end). Returns the response, or None
        if the deadline came first."""
        idx, stubs = self._client._pick()
        # An unanswered renewal is given up before the next one is due (at
        # least a second), or at the deadline.
        timeout = max(min(max(_base_interval(self.ttl), 1.0), deadline - sent), 0.001)
        self._wake.clear()
        try:
            fut = stubs.sessions.KeepAlive.future(req, timeout=timeout, metadata=self._client._metadata)
        except ValueError:
            raise errors.ClientClosed("the client is closed") from None
        with self._mu:
            self._inflight = fut
        fut.add_done_callback(lambda _f: self._wake.set())
        try:
            while not fut.done():
                left = deadline - time.monotonic()
                if left <= 0 or self.done.is_set():
                    fut.cancel()
                    return None
                self._wake.wait(left)
                self._wake.clear()
            try:
                return fut.result()
            except Exception as e:  # grpc.RpcError, or FutureCancelledError
                if isinstance(e, grpc.RpcError):
                    err = errors.from_rpc_error(e)
                    if isinstance(err, errors.Unavailable):
                        self._client._advance(idx)
                    raise err from None
                return None
        finally:
            with self._mu:
                self._inflight = None

    # ------------------------------------------------------------------
    # Locks

    def lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        limit: int = 1,
        read: bool = False,
        metadata: str = "",
        lock_delay: float | None = None,
        request_id: str | None = None,
    ) -> "Lock":
        """Acquires the named lock for this session, waiting up to timeout
        seconds (None: as long as the session lives), and returns the held
        :class:`~coordd.lock.Lock` (usable as ``with session.lock(...) as held``).

        limit > 1 makes it a semaphore (every user of a lock must give the
        same limit, else LimitMismatch); read=True asks for a shared grant
        of a read/write lock. lock_delay keeps the lock from the next waiter
        that long after this holder's session expires (not after release).

        Raises DeadlineExceeded when timeout runs out (nothing stays
        queued), the session's error when the session ends while waiting,
        LimitMismatch, InvalidArgument. UNAVAILABLE is retried with the
        same request id, so a retry never takes the lock twice."""
        return self._acquire(name, True, timeout, limit, read, metadata, lock_delay, request_id)

    acquire = lock

    def run_locked(self, name: str, fn: "Callable[[Lock], T]", timeout: float | None = None, **options: Any) -> T:
        """Runs fn(held) while holding the named lock and releases it after,
        also when fn raises (``RunLocked`` in Go, ``runLocked`` in
        TypeScript); returns what fn returns. Takes lock()'s options. fn
        must stop once ``held.check()`` raises, and pass ``held.token`` to
        every access of the protected resource. Raises LockLost when the
        lock was lost while fn ran and fn did not raise."""
        with self.lock(name, timeout, **options) as held:
            return fn(held)

    def run_read_locked(self, name: str, fn: "Callable[[Lock], T]", timeout: float | None = None, **options: Any) -> T:
        """run_locked with a shared (read) grant of a read/write lock."""
        return self.run_locked(name, fn, timeout, read=True, **options)

    def try_lock(
        self,
        name: str,
        *,
        limit: int = 1,
        read: bool = False,
        metadata: str = "",
        lock_delay: float | None = None,
        request_id: str | None = None,
    ) -> "Lock":
        """Acquires the named lock only if it is free now; raises LockHeld
        otherwise (nothing stays queued)."""
        return self._acquire(name, False, None, limit, read, metadata, lock_delay, request_id)

    def rlock(self, name: str, timeout: float | None = None, *, metadata: str = "",
              lock_delay: float | None = None, request_id: str | None = None) -> "Lock":
        """Acquires a shared (read) grant of a read/write lock: held together
        with other read grants, never with a write grant. As lock(read=True)."""
        return self._acquire(name, True, timeout, 1, True, metadata, lock_delay, request_id)

    def semaphore(self, name: str, limit: int, timeout: float | None = None, *, metadata: str = "",
                  lock_delay: float | None = None, request_id: str | None = None) -> "Lock":
        """Acquires one of limit grants of a semaphore. As lock(limit=limit)."""
        return self._acquire(name, True, timeout, limit, False, metadata, lock_delay, request_id)

    def lock_all(self, names: Sequence[str], timeout: float | None = None, *, metadata: str = "",
                 request_id: str | None = None) -> "LockSet":
        """Acquires every named lock for this session, all or none, with one
        request (``LockAll`` in Go, ``lockAll`` in TypeScript), and returns
        the :class:`~coordd.lock.LockSet` (usable as ``with
        session.lock_all(...) as locks``) once it holds them all, one grant
        and one fencing token per lock. The server queues for them one at a
        time in the order of their names, so lock_all calls for overlapping
        sets never deadlock each other, and each lock's queue stays first
        come, first served. Each lock is a mutex taken for writing.

        Raises as lock() does, leaving none of the locks held or queued.
        UNAVAILABLE is retried with the same request id, so a retry resumes
        the same grants. Not guaranteed: that the locks are taken at one
        instant (others may see some held while the call waits for the
        rest)."""
        from coordd.lock import Lock, LockSet

        self.check()
        req = lock_pb2.AcquireAllRequest(names=list(names), session_id=self.id,
                                         request_id=request_id or secrets.token_hex(8), metadata=metadata)
        rpc_timeout = server_wait(req, timeout)
        try:
            resp = self._client._unary("locks", "AcquireAll", req, timeout=rpc_timeout, retry=True, cancel=[self._ender])
        except errors.CoorddError:
            self.check()
            raise
        locks = LockSet([Lock(self, g.name, g.token, g.request_id, False, False, revision=g.revision) for g in resp.grants])
        if self.done.is_set():
            for held in locks:
                held._release_best_effort()
            self.check()
        return locks

    def enter_barrier(self, name: str, count: int, timeout: float | None = None, *, participant: str = "") -> "Barrier":
        """Enters the named barrier as one of this session's participants
        (``participant``, "default" when empty) and waits until it is open:
        count participants in it at one etcd revision, or opened by an
        operator (``EnterBarrier`` in Go, ``enterBarrier`` in TypeScript).
        Returns the :class:`~coordd.barrier.Barrier`; its ``leave()`` is a
        double barrier's exit. Raises DeadlineExceeded when timeout runs out
        (the participant is taken out again), the session's error when the
        session ends while waiting. Retried while coordd is unavailable (the
        same participant)."""
        from coordd.barrier import Barrier

        self.check()
        req = barrier_pb2.EnterBarrierRequest(name=name, session_id=self.id, count=count, participant=participant)
        rpc_timeout = server_wait(req, timeout)
        try:
            resp = self._client._unary("barriers", "EnterBarrier", req, timeout=rpc_timeout, retry=True, cancel=[self._ender])
        except errors.CoorddError:
            self.check()
            raise
        return Barrier(self, name, participant, resp.participants, resp.revision)

    def _acquire(self, name: str, wait: bool, timeout: float | None, limit: int, read: bool, metadata: str,
                 lock_delay: float | None, request_id: str | None) -> "Lock":
        from coordd.lock import Lock

        self.check()
        own = request_id is None
        rid = request_id or self._lock_ids.take("lock", name, read)
        common = dict(name=name, session_id=self.id, limit=limit, request_id=rid, metadata=metadata, read=read)
        if lock_delay:
            common["lock_delay"] = duration(lock_delay)
        try:
            if wait:
                req = lock_pb2.AcquireRequest(**common)
                rpc_timeout = server_wait(req, timeout)
                resp = self._client._unary("locks", "Acquire", req, timeout=rpc_timeout, retry=True, cancel=[self._ender])
            else:
                resp = self._client._unary("locks", "TryAcquire", lock_pb2.TryAcquireRequest(**common), retry=True, cancel=[self._ender])
        except errors.CoorddError:
            self.check()  # the session's end explains a cancelled wait
            raise
        g = resp.grant
        held = Lock(self, g.name or name, g.token, g.request_id, g.read, own, revision=g.revision)
        if self.done.is_set():
            held._release_best_effort()
            self.check()
        return held

    # ------------------------------------------------------------------
    # Elections

    def campaign(self, name: str, value: str = "", timeout: float | None = None, *, request_id: str | None = None,
                 priority: int = 0, preempt: bool = False) -> "Leadership":
        """Runs for leader of the named election with value (what the leader
        proclaims: an address, an id) and returns the
        :class:`~coordd.election.Leadership` once this session leads, waiting
        up to timeout seconds (None: as long as the session lives).

        Raises DeadlineExceeded when timeout runs out (nothing stays
        queued), the session's error when the session ends while waiting,
        AlreadyLeader if this session leads under another campaign id.
        UNAVAILABLE is retried with the same campaign id. priority orders
        the waiting candidates (highest first, then arrival); preempt asks
        a leader of lower priority to step down (it decides when)."""
        return self._campaign(name, value, timeout, request_id, (), priority, preempt)

    def _campaign(self, name: str, value: str, timeout: float | None, request_id: str | None,
                  cancel: Sequence[Canceller], priority: int = 0, preempt: bool = False) -> "Leadership":
        from coordd.election import Leadership

        self.check()
        own = request_id is None
        rid = request_id or self._lock_ids.take("election", name)
        req = election_pb2.CampaignRequest(name=name, session_id=self.id, value=value, request_id=rid, priority=priority, preempt=preempt)
        rpc_timeout = server_wait(req, timeout)
        try:
            resp = self._client._unary("elections", "Campaign", req, timeout=rpc_timeout, retry=True, cancel=[self._ender, *cancel])
        except errors.CoorddError:
            self.check()
            raise
        ld = resp.leadership
        lead = Leadership(self, ld.name or name, ld.term, ld.request_id, ld.value, own)
        if self.done.is_set():
            lead._resign_best_effort()
            self.check()
        return lead
