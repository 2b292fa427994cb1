"""What the API refuses in the shape of a request's history: an assistant prefill.

From Claude Opus 4.6 and Sonnet 4.6 on, a request whose last message is an assistant
message (a prefill) is refused ("Prefill removal",
https://platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-6#prefill-removal;
the 5.5 generation: https://platform.claude.com/docs/en/models/sonnet-5-5/migration-guide,
"assistant prefill" among the settings that return 400). Sending back a turn the API
paused (`pause_turn`: its server_tool_use still open) or stopped after compacting is how
those turns continue, not a prefill.
"""

from __future__ import annotations

import re
from typing import Any

PREFILL_REFUSED = (
    "This model does not support assistant message prefill. The conversation must end with "
    "a user message."
)
_VERSION = re.compile(r"^claude-(?:opus|sonnet|haiku)-(\d+)(?:-(\d))?(?:-\d{8})?$")
_OLDER = re.compile(r"^claude-3")


def accepts_prefill(model: str) -> bool:
    """Only the models before the 4.6 generation take a prefill."""
    if _OLDER.match(model):
        return True
    found = _VERSION.match(model)
    if found is None:
        return False  # Fable, Mythos and every model named later: the current rule
    major, minor = int(found.group(1)), int(found.group(2) or 0)
    return (major, minor) < (4, 6)


def _continues(blocks: list[dict[str, Any]]) -> bool:
    answered = {b.get("tool_use_id") for b in blocks}
    open_use = any(b["type"] == "server_tool_use" and b.get("id") not in answered for b in blocks)
    return open_use or any(b["type"] == "compaction" for b in blocks)


def prefill_problem(body: dict[str, Any], parsed: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """The refusal of a prefill on a model that takes none, or ""."""
    if not parsed or parsed[-1][0] != "assistant" or accepts_prefill(str(body.get("model"))):
        return ""
    tail: list[dict[str, Any]] = []
    for role, blocks in reversed(parsed):
        if role != "assistant":
            break
        tail = blocks + tail  # consecutive assistant messages are one turn
    return "" if _continues(tail) else PREFILL_REFUSED
