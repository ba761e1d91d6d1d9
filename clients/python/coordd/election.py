"""Leader elections: leadership, observation, and a self-healing leader loop."""

from __future__ import annotations

import datetime
import logging
import random
import secrets
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Iterator

import grpc

from coordd import errors
from coordd._cancel import Canceller
from coordd._held import Held, Verdict
from coordd._util import timestamp
from coordd.v1 import election_pb2

if TYPE_CHECKING:
    from coordd.client import Client
    from coordd.session import Session

log = logging.getLogger("coordd")

RESIGN_TIMEOUT = 5.0


@dataclass(frozen=True)
class Leader:
    """Who leads an election (or, from candidates(), who waits: term is then
    0, since a candidate's term is given when it takes the seat, and
    joined is the revision at which it joined)."""

    term: int
    value: str
    session_id: str
    request_id: str
    owner: str
    hostname: str
    since: datetime.datetime | None
    proclaims: int
    priority: int = 0
    joined: int = 0

    @classmethod
    def _from(cls, p: election_pb2.ElectionLeader) -> "Leader":
        return cls(p.term, p.value, p.session_id, p.request_id, p.owner, p.hostname, timestamp(p.since) if p.HasField("since") else None, p.proclaims, p.priority)

    @classmethod
    def _candidate(cls, c: election_pb2.ElectionCandidate) -> "Leader":
        return cls(0, c.value, c.session_id, c.request_id, c.owner, c.hostname,
                   timestamp(c.enqueue_time) if c.HasField("enqueue_time") else None, 0, c.priority, c.joined_revision)


#: Election event types, as the server names them without the prefix.
ELECTED, PROCLAIMED, RESIGNED, EXPIRED, VACANT = "ELECTED", "PROCLAIMED", "RESIGNED", "EXPIRED", "VACANT"
#: A waiting candidate that outranks the leader asked it to step down
#: (ElectionEvent.by); the leader decides when.
PREEMPT_REQUESTED = "PREEMPT_REQUESTED"


@dataclass(frozen=True)
class ElectionEvent:
    """One change of an election.

    type: ELECTED, PROCLAIMED, RESIGNED, EXPIRED or VACANT. leader: the new
    leader (ELECTED, PROCLAIMED) or the one that left (RESIGNED, EXPIRED);
    None for VACANT. current: the event states the election's state at
    revision rather than a change made at it (the first event of an
    observation, or the first after a gap the server could not replay);
    events before it may have been missed.
    """

    type: str
    revision: int
    leader: Leader | None
    current: bool
    #: PREEMPT_REQUESTED: the candidate that asked (session_id, request_id, priority).
    by: Leader | None = None

    @classmethod
    def _from(cls, e: election_pb2.ElectionEvent) -> "ElectionEvent":
        name = election_pb2.ElectionEventType.Name(e.type).removeprefix("ELECTION_EVENT_TYPE_")
        return cls(name, e.revision, Leader._from(e.leader) if e.HasField("leader") else None, e.current,
                   Leader._candidate(e.by) if e.HasField("by") else None)


class Leadership(Held):
    """A won election, from Session.campaign.

    **Guarantee**: while ``lost`` is not set, this session leads. ``lost`` is
    set no later than the session's local deadline, before the server can
    elect anyone else, or when a proclaim is answered NOT_LEADER. Act as
    leader only until then, and pass ``term`` (== ``token``) with every
    access to what the leader controls (or write through ``put``).

    **The leader knows first**: a resignation of this term by someone else
    (an admin, coordctl) is put to this leader first, on an Observe stream
    the client keeps open while leading: ``done`` and ``lost`` are set
    (cause NotLeader), then the client resigns itself, and only then is the
    next leader elected (or at the revocation's bound, the session TTL at
    most, if this process cannot answer). A term that ends otherwise is
    reported the same way, within about one round trip.

    **Non-guarantee**: leadership alone never gives mutual exclusion (a
    paused leader acts late).

    Exiting a ``with`` block resigns. If the leadership was lost during the
    block (and the block raised nothing), the exit raises LeadershipLost.
    """

    def __init__(self, session: "Session", name: str, term: int, request_id: str, value: str, own_id: bool) -> None:
        super().__init__(session, name, term, request_id)
        self.value = value
        self._own_id = own_id
        # From the current state (the first message says who leads now):
        # a resume from the term would replay history, which etcd serves
        # up to 100 ms late.
        self._start_watch("elections", "Observe", election_pb2.ObserveRequest(name=name), self._check)

    def _check(self, msg: election_pb2.ObserveResponse) -> "Verdict":
        t = election_pb2.ElectionEventType
        for ev in msg.events:
            ours = ev.leader.term == self.term
            if ev.type == t.ELECTION_EVENT_TYPE_REVOKING and ours:
                return ("revoked", errors.NotLeader(
                    f"the leadership of {self.name!r} (term {self.term}) is being resigned from elsewhere (coordctl, an admin): this client stepped down"))
            ended = (ev.type == t.ELECTION_EVENT_TYPE_VACANT
                     or (ev.type in (t.ELECTION_EVENT_TYPE_RESIGNED, t.ELECTION_EVENT_TYPE_EXPIRED) and ours)
                     or (ev.type in (t.ELECTION_EVENT_TYPE_ELECTED, t.ELECTION_EVENT_TYPE_PROCLAIMED) and not ours))
            if ended:
                return ("lost", errors.NotLeader(
                    f"the server reports the leadership of {self.name!r} (term {self.term}) ended: resigned from elsewhere or its session was closed"))
        return None

    def _let_go(self) -> None:
        try:
            req = self._resign_request()
            req.revoked = True  # the answer to a revocation: recorded as acknowledged
            self.session._client._unary("elections", "Resign", req, timeout=RESIGN_TIMEOUT, retry=True)
        except errors.CoorddError:
            return  # NotLeader: it ended meanwhile; otherwise the revocation's bound ends it
        if self._own_id:
            self.session._lock_ids.give_back("election", self.name, False, self.request_id)

    @property
    def term(self) -> int:
        """The leadership's fencing token: greater than every earlier term."""
        return self.token

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("resigned" if self.done.is_set() else "leading")
        return f"<coordd.Leadership {self.name!r} term={self.term} {state}>"

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        was_lost = self.lost.is_set()
        try:
            self.resign()
        except errors.NotLeader as e:
            if exc_type is None:
                raise errors.LeadershipLost(f"election {self.name!r} (term {self.term}) no longer led at resign", e) from e
            return
        except errors.CoorddError as e:
            if exc_type is None:
                raise
            log.warning("coordd: resign of %r after an exception failed: %s", self.name, e)
            return
        if was_lost and exc_type is None:
            raise errors.LeadershipLost(f"leadership of {self.name!r} (term {self.term}) was lost while held", self.cause)

    def check(self) -> None:
        """Raises LeadershipLost if the leadership was lost."""
        if self.lost.is_set():
            raise errors.LeadershipLost(f"leadership of {self.name!r} (term {self.term}) was lost: {self.cause}", self.cause)

    def proclaim(self, value: str, timeout: float | None = RESIGN_TIMEOUT) -> int:
        """Replaces the value the leader proclaims, retrying while coordd is
        unavailable (the attempts carry one proclaim id, so a retry after a
        lost answer is observed once). Returns the proclamation's revision. If the server answers NOT_LEADER, the
        leadership is lost (``lost`` is set) and NotLeader is raised."""
        if self.done.is_set():
            raise errors.NotLeader(f"leadership of {self.name!r} (term {self.term}) has ended")
        try:
            r = self.session._client._unary("elections", "Proclaim", election_pb2.ProclaimRequest(name=self.name, term=self.term, value=value, proclaim_id=secrets.token_hex(8)), timeout=timeout, retry=True)
        except errors.NotLeader as e:
            self._lose(e)
            raise
        self.value = value
        return r.revision

    def resign(self, timeout: float | None = RESIGN_TIMEOUT) -> None:
        """Gives the leadership up, retrying while coordd is unavailable;
        the next candidate leads at once. If the leadership was already
        lost, one best-effort attempt is made and nothing is raised. Raises
        NotLeader if the server no longer had this term. If it fails
        otherwise, calling it again tries again; after it succeeded,
        calling it again does nothing."""
        first = self._give_up()
        again = not first and self._tell_again()
        if not first and not again:
            if self.lost.is_set():
                self._resign_best_effort()
            return
        attempts: list[int] = []
        try:
            self.session._client._unary("elections", "Resign", self._resign_request(), timeout=timeout, retry=True, attempts=attempts)
        except errors.NotLeader:
            if again or (attempts and attempts[0] > 1):
                return  # an earlier attempt resigned; its answer was lost
            raise
        except BaseException:
            self._told(False)
            raise
        if self._own_id:
            self.session._lock_ids.give_back("election", self.name, False, self.request_id)

    def transfer(self, successor_session_id: str, request_id: str | None = None, timeout: float | None = RESIGN_TIMEOUT) -> int:
        """Hands the leadership to a waiting campaign of the session
        successor_session_id (its first in line, or the campaign request_id
        names) in one commit, and returns the successor's term: a new
        fencing token. Observers see RESIGNED and ELECTED at one revision,
        never VACANT. This leadership then ends (not as a loss): ``done``
        is set before the request is sent. Raises CandidateNotFound if that
        session has no campaign waiting (the leadership is kept: ``done``
        is cleared), NotLeader if this term no longer leads."""
        if self.done.is_set():
            raise errors.NotLeader(f"leadership of {self.name!r} (term {self.term}) has ended")
        req = election_pb2.TransferRequest(name=self.name, term=self.term, successor_session_id=successor_session_id,
                                           successor_request_id=request_id or "")
        # done is set before the request leaves: this leader has stopped
        # before the successor leads (cleared again if the server refuses).
        self._suspend()
        try:
            r = self.session._client._unary("elections", "Transfer", req, timeout=timeout, retry=True)
        except errors.NotLeader as e:
            self._settle(False)
            self._lose(e)
            raise
        except BaseException:
            self._settle(False)
            raise
        self._settle(True)
        if self._own_id:
            self.session._lock_ids.give_back("election", self.name, False, self.request_id)
        return r.term

    def _resign_request(self) -> election_pb2.ResignRequest:
        return election_pb2.ResignRequest(name=self.name, term=self.term, session_id=self.session.id, request_id=self.request_id)

    def _resign_best_effort(self) -> None:
        self._give_up()
        try:
            self.session._client._unary("elections", "Resign", self._resign_request(), timeout=1.0)
        except errors.CoorddError:
            pass

    def validate(self) -> None:
        """Returns if this term leads now; raises StaleToken if not."""
        self.session._client.validate_fence(self.term, election=self.name)

    def put(self, key: str, value: bytes | str) -> int:
        """Writes key in coordd's KV only if this term still leads, in one
        etcd transaction with the check; raises StaleToken otherwise."""
        return self.session._client.fenced_put(key, value, self.term, election=self.name)

    def delete(self, key: str) -> int:
        """Deletes key from coordd's KV only if this term still leads."""
        return self.session._client.fenced_delete(key, self.term, election=self.name)


_PERMANENT = (errors.InvalidArgument, errors.PermissionDenied, errors.Unauthenticated, errors.ClientClosed)


class Observer:
    """Follows an election: iterate over it for its ElectionEvents, in
    revision order. The first event states who leads now (or VACANT), or,
    with from_revision, the events after it. Every change and every
    proclamation follows.

    When the stream breaks (a member stopping, a broken connection) the
    observer reconnects (on the next endpoint after UNAVAILABLE) with
    backoff and resumes after the last revision it delivered, so nothing is
    skipped or repeated; if that revision was compacted the server restarts
    from the current state (an event with ``current`` set), and if it
    answers COMPACTED instead the observer asks for the current state
    itself, as the Go SDK does. Permanent errors (InvalidArgument,
    PermissionDenied) end the iteration by raising.

    close() (from any thread, or the client's close()) ends the iteration.
    The observer runs on the iterating thread; it starts no thread.
    Iterate over it once.
    """

    def __init__(self, client: "Client", name: str, from_revision: int = 0) -> None:
        self._client = client
        self.name = name
        #: The next revision to ask for: the last delivered revision + 1.
        self.from_revision = from_revision
        #: How many times the stream was reopened.
        self.reconnects = 0
        self._mu = threading.Lock()
        self._closed = False
        self._call = None
        self._wake = threading.Event()
        client._own(self)

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the observation: the iteration stops (StopIteration)."""
        with self._mu:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self._wake.set()
        self._client._disown(self)

    def __iter__(self) -> Iterator[ElectionEvent]:
        backoff = 0.05
        while True:
            with self._mu:
                if self._closed:
                    return
            try:
                idx, call = self._client._stream("elections", "Observe", election_pb2.ObserveRequest(name=self.name, from_revision=self.from_revision))
            except errors.ClientClosed:
                return
            with self._mu:
                if self._closed:
                    call.cancel()
                    return
                self._call = call
            try:
                for msg in call:
                    for ev in msg.events:
                        yield ElectionEvent._from(ev)
                    self.from_revision = msg.revision + 1
                    backoff = 0.05
                err: errors.CoorddError | None = None  # the server ended the stream: reopen
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
            finally:
                call.cancel()
                with self._mu:
                    self._call = None
            with self._mu:
                if self._closed:
                    return
            if isinstance(err, _PERMANENT):
                raise err
            if isinstance(err, errors.Compacted):
                self.from_revision = 0  # the current state, marked current
            elif isinstance(err, errors.Unavailable):
                self._client._advance(idx)
            log.info("coordd: observe %r broke (%s); resuming from revision %d", self.name, err, self.from_revision)
            self.reconnects += 1
            if self._wake.wait(backoff * random.uniform(0.5, 1.0)):
                return
            backoff = min(2 * backoff, 2.0)


class LeaderLoop:
    """A background thread (owned by this object; stop() or the client's
    close() stops it) that leads an election for as long as it runs:

    1. creates a session (again whenever its session has ended),
    2. campaigns with value,
    3. when elected, calls ``fn(leadership)`` on its thread. fn must return
       promptly once ``leadership.done`` is set: the leadership was lost
       (at the latest at the session's local deadline, before the server
       can elect anyone else) or stop() was called. Pass ``leadership.term``
       with every access to what the leader controls.
    4. resigns after fn returns (so the next candidate leads at once), and
       campaigns again: at once if the leadership was lost, after a backoff
       if fn raised. If fn returns while still leading, the work is done and
       the loop ends.

    Never runs two fn calls at once. Failures are retried with jittered
    backoff (min_backoff doubling to max_backoff) and logged.
    """

    def __init__(self, client: "Client", name: str, value: str, fn: Callable[[Leadership], object], *,
                 ttl: float = 10.0, owner: str | None = None, labels: dict[str, str] | None = None,
                 min_backoff: float = 0.1, max_backoff: float = 10.0) -> None:
        self._client = client
        self.name = name
        self.value = value
        self._fn = fn
        self._session_opts = dict(ttl=ttl, owner=owner, labels=labels)
        self._min_backoff, self._max_backoff = min_backoff, max_backoff
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._cancel = Canceller()  # cancels a campaign in flight on stop()
        self._lead: Leadership | None = None
        #: The terms this loop led, in order.
        self.terms: list[int] = []
        #: The last exception fn raised, if any.
        self.last_error: BaseException | None = None
        client._own(self)
        self._thread = threading.Thread(target=self._run, name=f"coordd-leader-{name}", daemon=True)
        self._thread.start()

    @property
    def leadership(self) -> Leadership | None:
        """The current leadership while fn runs, else None."""
        with self._mu:
            return self._lead

    def is_alive(self) -> bool:
        """Whether the loop's thread still runs."""
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the loop to end (fn finished while leading, or stop());
        returns whether it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stops the loop: a campaign in flight is cancelled; a running fn is
        told to stop (``leadership.done`` is set) and waited for, then the
        leadership is resigned and the session closed."""
        self._stop.set()
        self._cancel.cancel()
        with self._mu:
            lead = self._lead
        if lead is not None:
            lead._request_stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self._client._disown(self)

    close = stop

    def __enter__(self) -> "LeaderLoop":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pause(self, backoff: float) -> bool:
        return self._stop.wait(random.uniform(backoff / 2, backoff))

    def _run(self) -> None:
        session: Session | None = None
        backoff = self._min_backoff
        try:
            while not self._stop.is_set():
                if session is None or session.done.is_set():
                    if session is not None:
                        self._close_quietly(session)
                    try:
                        session = self._client.session(**self._session_opts)
                    except errors.ClientClosed:
                        return
                    except errors.CoorddError as e:
                        session = None
                        log.warning("coordd: leader loop %r: session: %s", self.name, e)
                        if self._pause(backoff):
                            return
                        backoff = min(2 * backoff, self._max_backoff)
                        continue
                try:
                    lead = session._campaign(self.name, self.value, None, None, [self._cancel])
                except errors.CoorddError as e:
                    if self._stop.is_set():
                        return
                    log.warning("coordd: leader loop %r: campaign: %s", self.name, e)
                    if self._pause(backoff):
                        return
                    backoff = min(2 * backoff, self._max_backoff)
                    continue
                with self._mu:
                    self._lead = lead
                    self.terms.append(lead.term)
                if self._stop.is_set():
                    lead._request_stop()
                failed = False
                try:
                    self._fn(lead)
                except Exception as e:  # noqa: BLE001 - fn's failure is reported and retried
                    failed = True
                    self.last_error = e
                    log.exception("coordd: leader loop %r: fn failed in term %d", self.name, lead.term)
                lost = lead.lost.is_set()
                try:
                    lead.resign()
                except errors.CoorddError as e:
                    log.warning("coordd: leader loop %r: resign of term %d: %s", self.name, lead.term, e)
                with self._mu:
                    self._lead = None
                if self._stop.is_set():
                    return
                if lost:
                    backoff = self._min_backoff
                    continue  # campaign again at once
                if failed:
                    if self._pause(backoff):
                        return
                    backoff = min(2 * backoff, self._max_backoff)
                    continue
                return  # fn finished its work while leading
        finally:
            if session is not None:
                self._close_quietly(session)

    @staticmethod
    def _close_quietly(session: "Session") -> None:
        try:
            session.close(timeout=RESIGN_TIMEOUT)
        except errors.CoorddError as e:
            log.info("coordd: closing session %s: %s", session.id, e)
