"""A TCP proxy on loopback that tests can cut and mend: a real network outage between ftnb and
a storage server (moto), with the server and its data untouched."""

from __future__ import annotations

import socket
import threading


class CuttableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port). ``cut()``: every open
    connection is reset and new ones are accepted and reset at once, as a route that is gone
    looks to a client. ``cut(stall=True)``: connections stay open and nothing goes through
    them, as a network that drops packets looks (requests hang). ``mend()`` lets traffic
    through again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._stall = False
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True, name="netcut-accept").start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self, stall: bool = False) -> None:
        self._stall = stall
        self._cut.set()
        if stall:
            return  # open connections just stop carrying anything (see _pipe)
        with self._lock:
            for s in list(self._open):
                _reset(s)
            self._open.clear()

    def mend(self) -> None:
        self._cut.clear()
        with self._lock:
            for s in self._held:  # requests that hung in a stall: gone now
                _reset(s)
            self._held.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self.mend()  # resets what a stall held
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                if self._stall:
                    with self._lock:
                        self._held.append(client)  # accepted, never answered
                else:
                    _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self._cut.is_set():
                    if not self._stall:
                        break
                    with self._lock:  # dropped, and the connection hangs until mended
                        self._held.extend((src, dst))
                    return
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._open.discard(src)
            self._open.discard(dst)
        _reset(src)
        _reset(dst)


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a clean FIN: what a dropped route looks like.
    ``shutdown`` first: a ``recv`` blocked on the socket in another thread returns (``close``
    alone would leave it, and the connection, alive)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
