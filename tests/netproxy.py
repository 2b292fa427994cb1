"""A TCP proxy for the chaos test: network faults between worker processes and Postgres or
Redis, on live connections. Workers connect to `Proxy.port` instead of the server (their
DATABASE_URL, their broker URL); the test then makes every byte late (`delay`), cuts every
live connection with a reset (`reset`: RST to both ends, as a stateful firewall or a
restarted load balancer does), or lets nothing through either way (`partition`: bytes are
held, new connections are accepted and wait, until `heal`), as a broken link does without
telling anybody.

A thread per direction of each connection: a few dozen threads in a test, which is all it
needs.
"""

from __future__ import annotations

import socket
import struct
import threading
import time


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket) -> None:
        self.sockets = [client]
        self.cut = False

    def abort(self) -> None:
        """Reset both ends: SO_LINGER 0, so that the close sends RST, not FIN. SHUT_RD first
        wakes a pump blocked in recv (a close from another thread would not), and sends
        nothing to the peer."""
        self.cut = True
        for sock in self.sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass


class Proxy:
    """Forward connections from 127.0.0.1:`port` to (`host`, `target_port`)."""

    def __init__(self, host: str, target_port: int) -> None:
        self.target = (host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self.delay = 0.0  # seconds added before each chunk is passed on, either way
        self._open = threading.Event()  # cleared: partitioned
        self._open.set()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._stopped = False

    def start(self) -> Proxy:
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()
        self.heal()
        self.reset()

    # -- faults ---------------------------------------------------------------------------

    def reset(self) -> int:
        """Cut every live connection with a reset; how many were cut."""
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            link.abort()
        return len(links)

    def partition(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    # -- forwarding -----------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        link = _Link(client)
        with self._lock:
            self._links.add(link)
        try:
            if self._held(link):  # a partition holds new connections too
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                link.abort()
                return
            server.settimeout(None)
            link.sockets.append(server)
            if link.cut:  # reset while connecting
                link.abort()
                return
            for sock in link.sockets:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pumps = [
                threading.Thread(target=self._pump, args=(link, src, dst), daemon=True)
                for src, dst in ((client, server), (server, client))
            ]
            for pump in pumps:
                pump.start()
            for pump in pumps:
                pump.join()
        finally:
            with self._lock:
                self._links.discard(link)
            for sock in link.sockets:
                sock.close()

    def _held(self, link: _Link) -> bool:
        """Wait while partitioned; whether the link was cut meanwhile."""
        while not self._open.wait(0.1):
            if link.cut:
                return True
        return link.cut

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or link.cut:
                    if not link.cut:
                        dst.shutdown(socket.SHUT_WR)  # a clean close passes on as one
                    return
                if self.delay:
                    time.sleep(self.delay)
                if self._held(link):  # partitioned: the bytes are held, not lost
                    return
                dst.sendall(data)
        except OSError:
            link.abort()
