"""The two formats of the live streams, as Server-Sent Events.

- `events` (this app's own): each durable event as `event: run_event` with `id:` its cursor
  and the API's public view of it as data (`{"seq", "type", "payload", "created_at"}`, the
  payload cut to `events.ALLOWLIST`); each delta as `event: delta` without an id (an
  `attempt` delta with `"restart": true` says to drop what this stream showed of that
  turn's answer so far); `event: end` with the run's state when the run rests.
- `ai-sdk`: the Vercel AI SDK's UI message stream protocol (v1), in ui_messages.py.
"""

from __future__ import annotations

import json
from typing import Any

# Characters that some line-splitting readers take for line ends (JavaScript's and Python's
# `splitlines`, U+0085 NEL, U+2028 and U+2029): always JSON-escaped, so that no text in a
# `data:` line can start a line of its own (a forged `event:` or `id:`).
_LINE_BREAKS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def dumps(value: Any) -> str:
    """JSON on one line; text that cannot be UTF-8 (a lone surrogate a tool returned) is
    escaped instead, and so is every character a reader could take for a line end."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    # Only inside JSON strings can these occur, where `\uXXXX` means the same character.
    return text.translate(_LINE_BREAKS)


def frame(data: Any, *, event: str | None = None, id: str | None = None) -> str:
    lines = []
    if event:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.append(f"data: {data if isinstance(data, str) else dumps(data)}")
    return "\n".join(lines) + "\n\n"


KEEPALIVE = ": keep-alive\n\n"


class EventsFormat:
    """This app's own events."""

    name = "events"
    headers: dict[str, str] = {}

    def __init__(self, run_id: Any) -> None:
        self.run_id = run_id

    def open(self) -> list[str]:
        return ["retry: 2000\n\n"]

    def event(self, event: dict[str, Any], cursor: str) -> list[str]:
        return [frame(event, event="run_event", id=cursor)]

    def delta(self, delta: dict[str, Any]) -> list[str]:
        # A delta the hub decoded (streams.reader.Item) is framed once for all its watchers.
        framed = getattr(delta, "framed", None)
        if framed is None:
            framed = frame(delta, event="delta")
            if hasattr(delta, "framed"):
                delta.framed = framed  # type: ignore[attr-defined]
        return [framed]

    def close(self, run_state: str, cursor: str) -> list[str]:
        return [frame({"run_state": run_state, "cursor": cursor}, event="end")]

    def pause(self, cursor: str) -> list[str]:
        """The stream ends before the run rests (its lifetime, a slow reader): reconnect."""
        return [frame({"cursor": cursor}, event="reconnect")]
