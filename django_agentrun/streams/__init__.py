"""Live streams of runs: the model's deltas and the nudges after each commit, published
to Redis Streams without ever slowing a turn (publisher.py), read by the API's streaming
views (reader.py), and the cursors clients resume from (cursor.py). Deltas are never
durable: the committed response is the record."""

from __future__ import annotations

from .config import conversation_key, redis_url, run_key
from .cursor import (
    InvalidCursor,
    conversation_cursor,
    parse_conversation_cursor,
    parse_run_cursor,
)
from .publisher import TurnStream, notify, progress, publisher, turn_stream

__all__ = [
    "InvalidCursor",
    "conversation_key",
    "TurnStream",
    "conversation_cursor",
    "notify",
    "parse_conversation_cursor",
    "parse_run_cursor",
    "progress",
    "publisher",
    "redis_url",
    "run_key",
    "turn_stream",
]
