"""What a held lock and a leadership share: the lost and done signals,
and the stream that tells the holder when the server ends or revokes it."""

from __future__ import annotations

import random
import threading
from typing import TYPE_CHECKING, Any, Callable

import grpc

from coordd import errors

if TYPE_CHECKING:
    from coordd.session import Session

# What a watch's check says of a message: nothing (None), the holding is
# gone ("lost", cause), or the server asks it be given up ("revoked", cause).
Verdict = tuple[str, BaseException] | None

# Stream errors that retrying cannot fix: the watch is given up (the
# holding then ends only with its session or through this process).
_PERMANENT_WATCH = (errors.Unimplemented, errors.PermissionDenied, errors.Unauthenticated, errors.InvalidArgument)


class Held:
    """A holding (lock grant or leadership term) of a session.

    ``lost`` is set when the holding ends without being given up: its
    session ended (at the latest at the session's local deadline, which
    falls before the server can expire the session and hand the holding to
    anyone else), or the server said it no longer has it. ``done`` is set
    when the holder must stop acting as holder: lost, given up (release,
    resign), or asked to stop (a leader loop stopping).
    """

    def __init__(self, session: "Session", name: str, token: int, request_id: str) -> None:
        self.session = session
        self.name = name
        self.token = token
        self.request_id = request_id
        #: Set when the holding is lost (see the class docstring).
        self.lost = threading.Event()
        #: Set when the holder must stop acting as holder.
        self.done = threading.Event()
        self._mu = threading.Lock()
        self._ended = False
        self._untold = False  # given up, but telling the server failed: the next give-up tries again
        self._cause: BaseException | None = None
        self._unregister: Callable[[], None] | None = None
        self._watch_call: Any = None  # the open watch stream, cancelled when the holding ends
        self._over = threading.Event()  # set once the holding has ended (given up or lost)
        self._suspended = False  # a hand-over is under way (see _suspend)
        self._pending: tuple[BaseException, bool] | None = None  # a loss (and whether revoked) reported meanwhile
        unregister = session._ender.register(lambda: self._lose(session.error))
        with self._mu:
            if self._ended:  # the session had ended already: nothing to undo later
                unregister = None
            self._unregister = unregister

    @property
    def cause(self) -> BaseException | None:
        """Why the holding was lost (None while held or when given up)."""
        with self._mu:
            return self._cause

    def _lose(self, cause: BaseException | None, revoked: bool = False) -> bool:
        """Ends the holding as lost; False if it had already ended (or a
        hand-over under way decides, see _settle)."""
        with self._mu:
            if self._ended:
                return False
            if self._suspended and cause is not None:
                if self._pending is None:
                    self._pending = (cause, revoked)
                return False
            self._ended = True
            self._cause = cause
            unregister, self._unregister = self._unregister, None
            call, self._watch_call = self._watch_call, None
        if unregister is not None:
            unregister()
        # done first: a holder that waits on lost finds done set too.
        self.done.set()
        self.lost.set()
        self._over.set()
        if call is not None:
            call.cancel()
        return True

    def _give_up(self) -> bool:
        """Ends the holding as given up; False if it had already ended."""
        with self._mu:
            if self._ended:
                return False
            self._ended = True
            unregister, self._unregister = self._unregister, None
            call, self._watch_call = self._watch_call, None
        if unregister is not None:
            unregister()
        self.done.set()
        self._over.set()
        if call is not None:
            call.cancel()
        return True

    def _suspend(self) -> None:
        """Starts a hand-over the holder brings about (a transfer): done is
        set now, before the request leaves, so that this holder has stopped
        before the next one holds; _settle says how it went."""
        with self._mu:
            self._suspended, self._pending = True, None
        self.done.set()

    def _settle(self, handed_over: bool) -> None:
        """Ends a hand-over: handed over, the holding is given up; refused,
        a loss reported meanwhile is applied now, or else the holding goes
        on (done is cleared)."""
        with self._mu:
            self._suspended = False
            pending, self._pending = self._pending, None
            resume = not handed_over and pending is None and not self._ended
            if resume:
                self.done.clear()
        if handed_over:
            self._give_up()
        elif pending is not None:
            cause, revoked = pending
            if self._lose(cause) and revoked:
                self._let_go()

    def _let_go(self) -> None:
        """Tells the server that this holder gave the holding up when asked
        (its own release or resignation). Subclasses implement it."""

    def _revoked(self, cause: BaseException) -> None:
        """The server asks that the holding be given up (a release or
        resignation from outside): it ends as lost, and only then is the
        server told (_let_go), which lets the next holder in."""
        if self._lose(cause, revoked=True):
            self._let_go()

    def _start_watch(self, service: str, method: str, request: Any, check: Callable[[Any], Verdict]) -> None:
        """Follows the holding on a server stream (WatchLock, Observe) on a
        daemon thread until it ends: check looks at each message. A broken
        stream is opened again with backoff; a refused one is given up."""
        client = self.session._client
        if not getattr(client, "_watch_holdings", True):
            return
        t = threading.Thread(target=self._watch_loop, args=(service, method, request, check),
                             name=f"coordd-watch-{self.name}", daemon=True)
        t.start()

    def _watch_loop(self, service: str, method: str, request: Any, check: Callable[[Any], Verdict]) -> None:
        client = self.session._client
        backoff = 0.1
        while not self._over.is_set():
            try:
                _, call = client._stream(service, method, request)
            except errors.ClientClosed:
                return
            with self._mu:
                if self._ended:
                    call.cancel()
                    return
                self._watch_call = call
            try:
                for msg in call:
                    verdict = check(msg)
                    if verdict is None:
                        backoff = 0.1
                        continue
                    kind, cause = verdict
                    if kind == "revoked":
                        self._revoked(cause)
                    else:
                        self._lose(cause)
                    return
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
                if isinstance(err, _PERMANENT_WATCH):
                    return
            finally:
                call.cancel()
            with self._mu:
                if self._ended:
                    return
            if self._over.wait(backoff * (0.5 + random.random())):
                return
            backoff = min(2 * backoff, 2.0)

    def _tell_again(self) -> bool:
        """After a give-up whose call to the server failed: True once, for
        the next give-up to try again."""
        with self._mu:
            again, self._untold = self._untold, False
            return again

    def _told(self, ok: bool) -> None:
        """Records whether telling the server of the give-up worked."""
        with self._mu:
            self._untold = not ok

    def _request_stop(self) -> None:
        """Tells the holder to stop acting (sets done) without ending it."""
        self.done.set()
