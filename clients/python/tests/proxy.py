"""A TCP proxy in front of the daemon, whose connections a test can cut and
whose listener it can pause: a way to break a client's streams for real."""

from __future__ import annotations

import socket
import threading


class Proxy:
    """Forwards 127.0.0.1:<port> to target (host:port). Threads: one accept
    loop while listening, two pumps per connection; close() stops them all."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._mu = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _listen(self) -> None:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(16)
        self.port = ls.getsockname()[1]
        with self._mu:
            self._listener = ls
        self._start(self._accept, ls)

    def _start(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name="test-proxy")
        with self._mu:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return  # listener closed
            try:
                u = socket.create_connection(self._target)
            except OSError:
                c.close()
                continue
            with self._mu:
                self._conns += [c, u]
            self._start(self._pump, c, u)
            self._start(self._pump, u, c)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                dst.sendall(b)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Breaks every open connection (the client sees its streams fail)."""
        with self._mu:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def pause(self) -> None:
        """Stops listening (new connections are refused) and cuts the open ones."""
        with self._mu:
            ls, self._listener = self._listener, None
        if ls is not None:
            try:
                ls.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            ls.close()
        self.cut()

    def resume(self) -> None:
        """Listens again on the same port."""
        self._listen()

    def close(self) -> None:
        """Stops listening, cuts everything, and waits for the threads."""
        self.pause()
        with self._mu:
            threads = list(self._threads)
        for t in threads:
            t.join(5)
