"""Reading live streams in tests: an in-process request through Django's AsyncClient, and
the Server-Sent Events of a body parsed into frames."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.test import AsyncClient


@dataclass
class Frame:
    event: str  # "message" when the frame names none
    data: str
    id: str | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.data)


def frames(body: str) -> list[Frame]:
    """The frames of an SSE body (comments and `retry:` lines left out)."""
    return [f for f in parse([*body.split("\n"), ""]) if f.event != "comment"]


def parse(lines: Iterable[str]) -> Iterator[Frame]:
    """Frames from SSE lines as they come (a blank line ends one), and each comment line as
    Frame("comment", text); `retry:` and unknown fields are left out."""
    event, data, frame_id = "message", [], None
    for line in lines:
        if line == "":
            if data:
                yield Frame(event, "\n".join(data), frame_id)
            event, data, frame_id = "message", [], None
            continue
        if line.startswith(":"):
            yield Frame("comment", line)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            frame_id = value


def comments(body: str) -> list[str]:
    return [line for line in body.split("\n") if line.startswith(":")]


def stream(path: str, *, user=None, chunks: int | None = None, **headers: str):
    """GET `path` in process (the async view, on this thread's event loop); the response
    and its body, read to its end or for `chunks` chunks only (then closed, as a client
    that goes away)."""

    async def go():
        client = AsyncClient()
        if user is not None:
            await client.aforce_login(user)
        response = await client.get(path, headers=headers)
        body = []
        if response.streaming:
            iterator = response.streaming_content
            async for chunk in iterator:
                body.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
                if chunks is not None and len(body) >= chunks:
                    break
            await iterator.aclose()
        else:
            body.append(response.content.decode())
        return response, "".join(body)

    return async_to_sync(go)()


class LiveStream:
    """A stream read from a real server over HTTP, frame by frame; `close()` drops the
    connection wherever it is (a client that goes away)."""

    def __init__(self, base_url: str, path: str, *, auth: tuple[str, str], **headers: str):
        import base64
        import http.client
        from urllib.parse import urlsplit

        parts = urlsplit(base_url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        self.conn.request("GET", path, headers={"Authorization": f"Basic {token}", **headers})
        self.response = self.conn.getresponse()
        self.status = self.response.status

    def frames(self):
        """Frames as they arrive, and comments (as Frame("comment", text))."""
        return parse(self._lines())

    def _lines(self) -> Iterator[str]:
        while raw := self.response.readline():
            yield raw.decode().rstrip("\n")

    def close(self) -> None:
        self.response.close()  # it holds the socket after a read-to-close response
        self.conn.close()


def read_with_drops(
    server, path: str, rng, *, timeout: float = 60, on_end=None, auth=("alice", "pw")
):
    """Read the stream at `path` (of a live `server`) to its end, dropping the connection
    after a random number of frames each time and reconnecting with Last-Event-ID; per
    connection its frames. At an `end` frame, `on_end(its data)` may return True to read
    on (something was done that makes the stream go on, e.g. an approval)."""
    import time

    cursor, connections = None, []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        headers = {"Last-Event-ID": cursor} if cursor else {}
        live = LiveStream(server.url, path, auth=auth, **headers)
        if live.status == 204:
            live.close()
            return connections
        assert live.status == 200, live.status
        # Mostly early drops, sometimes late enough to see a turn's answer whole.
        budget = rng.randint(1, 12) if rng.random() < 0.7 else rng.randint(40, 160)
        frames, ended = [], None
        for frame in live.frames():
            if frame.event == "comment":
                continue
            frames.append(frame)
            if frame.id is not None:
                cursor = frame.id
            if frame.event == "end":
                ended = frame.json
                break
            if len(frames) >= budget:
                break
        live.close()
        connections.append(frames)
        if ended is not None and not (on_end is not None and on_end(ended)):
            return connections
    raise AssertionError("the stream did not end in time")
