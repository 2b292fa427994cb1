"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1 in a thread, that
records each request (its headers and body) and answers from a script of replies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook

# A Standard Webhooks secret (whsec_ and base64).
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def verified(self, secret: str = SECRET) -> dict:
        """The body, verified against its signature with the library (raises if not)."""
        return Webhook(secret).verify(self.body, self.headers)


@dataclass
class Receiver:
    url: str
    # (status, body, headers) answered in turn; the last one again once they are spent.
    replies: list[tuple[int, bytes, dict[str, str]]] = field(
        default_factory=lambda: [(200, b"ok", {})]
    )
    received: list[Received] = field(default_factory=list)

    def ids(self) -> list[str]:
        return [r.headers["webhook-id"] for r in self.received]


@contextmanager
def receiver() -> Iterator[Receiver]:
    """A receiver at http://127.0.0.1:<free port>/hook, stopped on leaving."""
    state: dict[str, Receiver] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            rec = state["r"]
            with lock:
                rec.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                index = min(len(rec.received), len(rec.replies)) - 1
                status, answer, headers = rec.replies[index]
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["r"] = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hook")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
