"""A small cancellation signal that blocking calls can subscribe to."""

from __future__ import annotations

import threading
from typing import Callable


class Canceller:
    """Runs registered callbacks once, when cancel() is first called.

    A callback registered after cancel() runs at once. Thread-safe.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._cancelled = False
        self._next = 0
        self._callbacks: dict[int, Callable[[], None]] = {}

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called."""
        with self._mu:
            return self._cancelled

    def register(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls fn on cancel (now, if already cancelled); returns a function
        that unregisters it."""
        with self._mu:
            if not self._cancelled:
                key = self._next
                self._next += 1
                self._callbacks[key] = fn
                return lambda: self._unregister(key)
        fn()
        return lambda: None

    def _unregister(self, key: int) -> None:
        with self._mu:
            self._callbacks.pop(key, None)

    def cancel(self) -> None:
        """Runs every registered callback (once), on the calling thread."""
        with self._mu:
            if self._cancelled:
                return
            self._cancelled = True
            fns = list(self._callbacks.values())
            self._callbacks.clear()
        for fn in fns:
            fn()
