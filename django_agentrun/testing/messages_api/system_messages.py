"""Mid-conversation system messages: a `{"role": "system"}` entry in `messages`, as the API
takes it (Mid-conversation system messages and tool changes,
https://platform.claude.com/docs/en/build-with-claude/mid-conversation-system-messages).

- Available on Claude Fable 5.1, Mythos 5.1, Fable 5, Mythos 5, Opus 4.8 and Opus 5, "not
  available on Claude Sonnet 5" (the page's note). The page predates the 5.2 and 5.5
  models: the stand-in takes them there too (UNSOURCED), and refuses them on every other
  model, with the role error a request had before the feature.
- Placement: a system message that carries content "cannot be the first entry", "must
  immediately follow a user turn (including a user turn that carries tool_result blocks)
  or an assistant turn ending in a server tool result, and must precede an assistant turn
  or end the array"; consecutive system messages are judged together; "Placing it
  elsewhere returns a 400 error" (the wording of that error is the stand-in's: UNSOURCED).
- Content: text blocks (or a string). `tool_addition` / `tool_removal` blocks (a beta) and
  `clear_at` are not taken here.
"""

from __future__ import annotations

from typing import Any

from .servertools import RESULT_BLOCKS

# The page's models; the later generation (UNSOURCED) named after them.
MODELS = frozenset(
    {
        "claude-fable-5-1",
        "claude-mythos-5-1",
        "claude-fable-5",
        "claude-mythos-5",
        "claude-opus-4-8",
        "claude-opus-5",
        "claude-fable-5-2",
        "claude-mythos-5-2",
        "claude-opus-5-5",
        "claude-sonnet-5-5",
        "claude-haiku-5-5",
    }
)


def block_problem(block: Any, where: str) -> str:
    """Why a system message's block is refused (text only, here), or ""."""
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        return f"{where}: a `system` message takes text blocks here, not `{kind}`"
    return ""


def problem(body: dict[str, Any], parsed: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """Why the request's system messages are refused, or ""."""
    at = [i for i, (role, _) in enumerate(parsed) if role == "system"]
    if not at:
        return ""
    if str(body.get("model")) not in MODELS:
        return f"messages.{at[0]}.role: Input should be 'user' or 'assistant'"
    i = 0
    while i < len(parsed):
        if parsed[i][0] != "system":
            i += 1
            continue
        first = i
        while i < len(parsed) and parsed[i][0] == "system":
            i += 1
        if first == 0:
            return f"messages.{first}: a system message cannot be the first message"
        role, blocks = parsed[first - 1]
        after_server_result = (
            role == "assistant" and bool(blocks) and blocks[-1].get("type") in RESULT_BLOCKS
        )
        if role != "user" and not after_server_result:
            return (
                f"messages.{first}: a system message must follow a user message or an "
                "assistant message ending in a server tool result"
            )
        if i < len(parsed) and parsed[i][0] != "assistant":
            return f"messages.{first}: a system message must precede an assistant message or end the messages"
    return ""
