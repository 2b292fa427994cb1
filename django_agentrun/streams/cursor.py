"""Cursors of live streams: the SSE `id:` of each durable event, which a client that
reconnects sends back (`Last-Event-ID`, or `?after=`) to receive what followed, nothing twice.

- A run's stream: the event's `seq` (`"17"`).
- A conversation's stream: `"<position>-<seq>"`, the position of the run in the
  conversation (0, 1, ...) and the event's seq in that run (`"2-5"`); cursors order as
  (position, seq) pairs.
"""

from __future__ import annotations

# RunEvent.seq is a PositiveIntegerField.
MAX_SEQ = 2**31 - 1


class InvalidCursor(ValueError):
    """A cursor that is not of the stream's form."""


def _number(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 10 or int(text) > MAX_SEQ:
        raise InvalidCursor(f"{what} must be an integer from 0 to {MAX_SEQ}")
    return int(text)


def parse_run_cursor(value: str | None) -> int:
    """The seq after which a run's stream resumes (0: from its start)."""
    if value is None or value.strip() == "":
        return 0
    return _number(value.strip(), "The cursor (Last-Event-ID or ?after=)")


def parse_conversation_cursor(value: str | None) -> tuple[int, int]:
    """(position, seq) after which a conversation's stream resumes ((0, 0): from its start)."""
    if value is None or value.strip() == "":
        return (0, 0)
    position, sep, seq = value.strip().partition("-")
    if not sep:
        raise InvalidCursor("A conversation's cursor is <position>-<seq>, e.g. 2-5")
    return _number(position, "The cursor's position"), _number(seq, "The cursor's seq")


def conversation_cursor(position: int, seq: int) -> str:
    return f"{position}-{seq}"
