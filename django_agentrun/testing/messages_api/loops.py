"""The open tool-use loop's thinking, as the models without the prefix check require it.

"During tool use, you must pass thinking blocks back to the API for the last assistant
message" (extended thinking, tool use,
https://platform.claude.com/docs/en/build-with-claude/extended-thinking): on a model that
does not run the preserved-thinking prefix check (thinking.preserved), a request that
answers an assistant turn's tool_use blocks with thinking on, where that turn was answered
with thinking, must send its thinking back. The stand-in remembers which tool_use ids its
answers with thinking held and refuses such a request without them, in the API's wording
as clients quote it (third-party: the error "When `thinking` is enabled, a final
`assistant` message must start with a thinking block"). The preserved-thinking models drop
a block that no longer holds themselves (or refuse it): not checked here.
"""

from __future__ import annotations

import threading
from typing import Any

from .script import Reply
from .thinking import preserved

_THINKING = ("thinking", "redacted_thinking")
MESSAGE = (
    "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
    "We recommend you include thinking blocks from previous turns. To avoid this "
    "requirement, disable `thinking`."
)


class ThinkingLoops:
    """The tool_use ids of the answers that held thinking (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def remember(self, reply: Reply) -> None:
        blocks = reply.blocks()
        if any(b.get("type") in _THINKING for b in blocks):
            with self._lock:
                self._ids |= {
                    b["id"] for b in blocks if b.get("type") == "tool_use" and b.get("id")
                }

    def problem(self, body: dict[str, Any]) -> str | None:
        thinking = body.get("thinking")
        if not isinstance(thinking, dict) or thinking.get("type") in (None, "disabled"):
            return None
        if preserved(body.get("model")):
            return None
        messages = body.get("messages") or []
        if len(messages) < 2 or messages[-2].get("role") != "assistant":
            return None
        content = messages[-2].get("content")
        if not isinstance(content, list) or not content:
            return None
        ids = {b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"}
        with self._lock:
            held = bool(ids & self._ids)
        first = content[0] if isinstance(content[0], dict) else {}
        if held and first.get("type") not in _THINKING:
            return MESSAGE.format(i=len(messages) - 2, found=first.get("type"))
        return None
