"""Held locks, semaphore grants and read/write lock grants."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING, Iterator

from coordd import errors
from coordd._held import Held, Verdict
from coordd.v1 import lock_pb2

if TYPE_CHECKING:
    from coordd.session import Session

log = logging.getLogger("coordd")

RELEASE_TIMEOUT = 5.0


class Lock(Held):
    """A held lock (a mutex, one grant of a semaphore, or a read or write
    grant of a read/write lock), from Session.lock / try_lock / rlock /
    semaphore.

    **Guarantee**: while ``lost`` is not set, this session holds the lock on
    the server. ``lost`` is set no later than the session's local deadline,
    which falls before the server can expire the session and grant the lock
    to anyone else. So the guarantee of ``with session.lock(...) as held:``
    lasts until ``held.lost`` is set, not until the end of the block: check
    it (``held.check()``) before each step, and pass ``held.token`` with
    every access to the protected resource (or write through ``held.put``),
    so that the resource refuses a holder whose lock has since passed on.

    **The holder knows first**: a release of this grant by someone else (an
    admin, coordctl) is put to this holder first, on a WatchLock stream the
    client keeps open while the lock is held: ``done`` and ``lost`` are set
    (cause NotHolder), then the client releases the grant itself, and only
    then is the next waiter granted. If this process is frozen or cut off,
    the grant ends at the revocation's bound (the session TTL at most)
    without it. A grant that ends on the server otherwise is reported the
    same way, within about one round trip.

    **Non-guarantee**: a lease-based lock alone never gives mutual
    exclusion: a paused process can act after ``lost`` was set, before it
    looks. Only fenced actions are protected.

    Attributes: ``name``, ``token`` (the fencing token, an int strictly
    increasing per lock), ``request_id``, ``read`` (a shared grant),
    ``session``, ``lost`` and ``done`` (threading.Event).

    Exiting a ``with`` block releases the lock. If the lock was lost during
    the block (and the block raised nothing), the exit raises LockLost: the
    block's work ran, at least partly, without the lock.
    """

    def __init__(self, session: "Session", name: str, token: int, request_id: str, read: bool, own_id: bool, revision: int = 0) -> None:
        super().__init__(session, name, token, request_id)
        self.read = read
        self._own_id = own_id
        self._revision = revision
        self._start_watch("locks", "WatchLock", lock_pb2.WatchLockRequest(name=name), self._check)

    @property
    def revision(self) -> int:
        """The etcd revision at which the grant was observed: pass it as
        ``min_revision`` to read the grant in the history."""
        return self._revision

    def _check(self, msg: lock_pb2.WatchLockResponse) -> "Verdict":
        d = msg.lock
        if d.revision < self._revision:
            return None  # a view older than the grant
        for h in d.holders:
            if h.session_id == self.session.id and (h.token == self.token or (h.token == 0 and h.request_id == self.request_id)):
                if h.HasField("revoking_since"):
                    return ("revoked", errors.NotHolder(
                        f"lock {self.name!r} (token {self.token}) is being released from elsewhere (coordctl, an admin): this client let it go"))
                return None
        return ("lost", errors.NotHolder(
            f"the server reports lock {self.name!r} (token {self.token}) released: by a release from elsewhere or because its session was closed"))

    def _let_go(self) -> None:
        try:
            req = self._release_request()
            req.revoked = True  # the answer to a revocation: recorded as acknowledged
            self.session._client._unary("locks", "Release", req, timeout=RELEASE_TIMEOUT, retry=True)
        except errors.CoorddError:
            return  # NotHolder: it ended meanwhile; otherwise the revocation's bound ends it
        if self._own_id:
            self.session._lock_ids.give_back("lock", self.name, self.read, self.request_id)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("released" if self.done.is_set() else "held")
        return f"<coordd.Lock {self.name!r} token={self.token} {state}>"

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        was_lost = self.lost.is_set()
        try:
            self.release()
        except errors.NotHolder as e:
            # The server no longer had the grant: lost without our knowing
            # (released from elsewhere, or the session ended on the server).
            if exc_type is None:
                raise errors.LockLost(f"lock {self.name!r} (token {self.token}) was no longer held at release", e) from e
            return
        except errors.CoorddError as e:
            if exc_type is None:
                raise
            log.warning("coordd: release of %r after an exception failed: %s", self.name, e)
            return
        if was_lost and exc_type is None:
            raise errors.LockLost(f"lock {self.name!r} (token {self.token}) was lost while held", self.cause)

    def check(self) -> None:
        """Raises LockLost if the lock was lost (see ``lost``)."""
        if self.lost.is_set():
            raise errors.LockLost(f"lock {self.name!r} (token {self.token}) was lost: {self.cause}", self.cause)

    @property
    def released(self) -> bool:
        """Whether release() was called (successfully or not)."""
        return self.done.is_set() and not self.lost.is_set()

    def release(self, timeout: float | None = RELEASE_TIMEOUT) -> None:
        """Gives the lock up, retrying while coordd is unavailable, up to
        timeout seconds. If the lock was already lost, it makes one
        best-effort attempt (the server may still hold the grant) and raises
        nothing.

        Raises NotHolder if the server no longer had this grant (it ended
        first). If it fails otherwise, the server holds the lock for the
        session until the session ends or a release succeeds: calling it
        again tries again. Calling it again after it succeeded does
        nothing."""
        first = self._give_up()
        again = not first and self._tell_again()
        if not first and not again:
            if self.lost.is_set():
                self._release_best_effort()
            return
        attempts: list[int] = []
        try:
            self.session._client._unary("locks", "Release", self._release_request(), timeout=timeout, retry=True, attempts=attempts)
        except errors.NotHolder:
            if again or (attempts and attempts[0] > 1):
                return  # an earlier attempt released it; its answer was lost
            raise
        except BaseException:
            self._told(False)
            raise
        if self._own_id:
            self.session._lock_ids.give_back("lock", self.name, self.read, self.request_id)

    def _release_request(self) -> lock_pb2.ReleaseRequest:
        return lock_pb2.ReleaseRequest(name=self.name, token=self.token, session_id=self.session.id, request_id=self.request_id)

    def _release_best_effort(self) -> None:
        self._give_up()
        try:
            self.session._client._unary("locks", "Release", self._release_request(), timeout=1.0)
        except errors.CoorddError:
            pass  # the grant goes with the session anyway

    # Fenced calls -----------------------------------------------------

    def validate(self) -> None:
        """Returns if this grant holds the lock now (linearizable); raises
        StaleToken if not. The answer may be stale by the time it is used."""
        self.session._client.validate_fence(self.token, lock=self.name)

    def put(self, key: str, value: bytes | str) -> int:
        """Writes key in coordd's KV only if this grant still holds the lock,
        in one etcd transaction with the check; raises StaleToken (nothing
        written) otherwise. A read grant cannot write (NotHolder). Returns
        the write's revision. Not retried."""
        return self.session._client.fenced_put(key, value, self.token, lock=self.name)

    def delete(self, key: str) -> int:
        """Deletes key from coordd's KV only if this grant still holds the
        lock, as put writes. Returns the revision."""
        return self.session._client.fenced_delete(key, self.token, lock=self.name)


class LockSet:
    """Several locks held together by one session (Session.lock_all), sorted
    by name; iterable, and indexable by name. Each is a :class:`Lock` with
    its own token and its own loss: pass each lock's token to what it
    protects. Usable as ``with session.lock_all(names) as locks:``, which
    releases them all at the end of the block."""

    def __init__(self, locks: "list[Lock]") -> None:
        self._locks = tuple(sorted(locks, key=lambda held: held.name))

    def __iter__(self) -> "Iterator[Lock]":
        return iter(self._locks)

    def __len__(self) -> int:
        return len(self._locks)

    def __getitem__(self, name: str) -> Lock:
        for held in self._locks:
            if held.name == name:
                return held
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"<coordd.LockSet {[held.name for held in self._locks]!r}>"

    def check(self) -> None:
        """Raises LockLost if any lock of the set was lost."""
        for held in self._locks:
            held.check()

    def release(self, timeout: float | None = RELEASE_TIMEOUT) -> None:
        """Releases every lock of the set (each as Lock.release), all of them
        also when one fails; then raises the first failure, if any."""
        first: BaseException | None = None
        for held in self._locks:
            try:
                held.release(timeout)
            except errors.CoorddError as e:
                first = first or e
        if first is not None:
            raise first

    def __enter__(self) -> "LockSet":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        first: BaseException | None = None
        for held in self._locks:
            try:
                held.__exit__(exc_type, exc, tb)
            except errors.CoorddError as e:
                first = first or e
        if first is not None:
            raise first
