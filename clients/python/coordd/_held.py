"""What a held lock and a leadership share: the lost and done signals."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from coordd.session import Session


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

    def _lose(self, cause: BaseException | None) -> None:
        with self._mu:
            if self._ended:
                return
            self._ended = True
            self._cause = cause
            unregister, self._unregister = self._unregister, None
        if unregister is not None:
            unregister()
        self.lost.set()
        self.done.set()

    def _give_up(self) -> bool:
        """Ends the holding as given up; False if it had already ended."""
        with self._mu:
            if self._ended:
                return False
            self._ended = True
            unregister, self._unregister = self._unregister, None
        if unregister is not None:
            unregister()
        self.done.set()
        return True

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
