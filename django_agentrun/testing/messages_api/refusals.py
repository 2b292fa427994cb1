"""Refused answers, as the API goes on after them.

A response that ends `stop_reason: "refusal"` may have streamed content first (text, a
tool_use). "When you receive stop_reason: refusal, you must reset the conversation context
by removing or updating the turn that was refused before continuing. Attempting to
continue without resetting will result in continued refusals." (Streaming refusals,
https://platform.claude.com/docs/en/test-and-evaluate/strengthen-guardrails/handle-streaming-refusals.)
The stand-in keeps what each refused answer streamed (its tool_use ids and its text) and
answers a later request that sends any of it back in an assistant message with another
refusal, without asking the script: a client that sends the refused turn again is told so
the way the API tells it.
"""

from __future__ import annotations

import threading
from typing import Any

from .script import Reply


def _marks(blocks: Any) -> set[str]:
    marks: set[str] = set()
    for block in blocks if isinstance(blocks, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") in ("tool_use", "server_tool_use") and block.get("id"):
            marks.add(f"id:{block['id']}")
        elif block.get("type") == "text" and str(block.get("text") or "").strip():
            marks.add(f"text:{block['text']}")
    return marks


class RefusedAnswers:
    """What the refused answers streamed (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: set[str] = set()

    def clear(self) -> None:
        with self._lock:
            self._marks.clear()

    def remember(self, reply: Reply) -> None:
        """Keep what `reply` streams, if it is a refusal."""
        if reply.stop_reason == "refusal":
            with self._lock:
                self._marks |= _marks(reply.blocks())

    def sent_again(self, body: dict[str, Any]) -> bool:
        """Whether `body` sends back any of a refused answer in an assistant message."""
        with self._lock:
            if not self._marks:
                return False
            return any(
                _marks(m.get("content")) & self._marks
                for m in body.get("messages") or ()
                if isinstance(m, dict) and m.get("role") == "assistant"
            )


def continued_refusal() -> Reply:
    """The answer to a request that sends a refused turn again: refused, nothing streamed
    (the category is UNSOURCED for this case: none)."""
    return Reply(content=[], stop_reason="refusal")
