"""A real TCP proxy in front of a server whose link moves at most ``rate`` bytes a second each way (a slow, healthy
network: every byte arrives, late), or holds every byte (``hold()``: a server hung mid-response)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

BLOCK = 16 << 10
BUFFER = 64 << 10


class SlowLink:
    """``SlowLink(("127.0.0.1", port), rate)``: listens on a free loopback port (``address``); each connection is
    relayed to the target, each direction paced to ``rate`` bytes/s over all connections."""

    def __init__(self, target: tuple[str, int], rate: float) -> None:
        self.target = target
        self.rate = rate
        self.held = threading.Event()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        # Small buffers on the relay's side: a sender learns its bytes left only as the link takes them (a
        # client's few KiB in its own buffers, not MiBs queued at a relay that reads as fast as it can).
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
        self._listener.settimeout(0.2)
        self._sockets: list[socket.socket] = []
        self._pace = {"up": threading.Lock(), "down": threading.Lock()}
        self._due = {"up": time.monotonic(), "down": time.monotonic()}
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def hold(self) -> None:
        """From now on no byte moves either way (connections stay open): a server hung mid-response."""
        self.held.set()

    def release(self) -> None:
        self.held.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.target)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
            self._sockets += [client, server]
            for source, sink, way in ((client, server, "up"), (server, client, "down")):
                thread = threading.Thread(target=self._relay, args=(source, sink, way), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _relay(self, source: socket.socket, sink: socket.socket, way: str) -> None:
        try:
            while not self._closed.is_set():
                data = source.recv(BLOCK)
                if not data:
                    break
                self._wait_turn(way, len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _wait_turn(self, way: str, size: int) -> None:
        """Sleep until ``size`` more bytes may pass ``way`` at ``rate`` (and not while held)."""
        while self.held.is_set() and not self._closed.is_set():
            time.sleep(0.05)
        with self._pace[way]:
            due = max(self._due[way], time.monotonic()) + size / self.rate
            self._due[way] = due
        time.sleep(max(0.0, due - time.monotonic()))

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a relay blocked in recv (close alone does not)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> SlowLink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
