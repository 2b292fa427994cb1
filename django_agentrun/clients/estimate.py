"""What a request spends of the account's input-tokens-per-minute limit, estimated before it
is sent (the rate-limit governor spends it; governor.estimate_input_tokens).

What counts: "For most Claude models, only uncached input tokens count toward your ITPM rate
limits": `input_tokens` (the tokens after the last cache breakpoint) and
`cache_creation_input_tokens` (tokens written to the cache) count, `cache_read_input_tokens`
do not (Rate limits, "Cache-aware ITPM", https://platform.claude.com/docs/en/api/rate-limits;
the one exception it names, Claude Haiku 3.5, is not in the model table). The prompt renders
tools, then system, then messages (Prompt caching, "Prompt caching caches the full prefix",
https://platform.claude.com/docs/en/build-with-claude/prompt-caching); a breakpoint is a
block with `cache_control`, or with the top-level `cache_control` (automatic caching) the
last block.

So the estimate is the request's tokens after its last breakpoint, plus those up to it that
the cache does not already hold. What it holds is learned from the run's previous answer
(`previous`: its usage): that request's prefix up to its own last breakpoint,
`cache_read_input_tokens + cache_creation_input_tokens` of it. The same answer corrects the
estimate's scale: its whole prompt (input + cache writes + cache reads) against the
estimate of this request's messages before that answer (the conversation only grows). With
no previous answer (a run's first request) nothing is taken as cached: on a cold cache every
token counts, as an input or a cache write. Tokens are 4 characters each, images and PDFs as
the API bills them (media.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..media import block_tokens

# The correction a previous answer may make to the scale of the estimate, at most.
_SCALE = (0.5, 3.0)


def _tokens(block: Any) -> int:
    if isinstance(block, dict):
        media = block_tokens(block)
        if media is not None:
            return media
        inner = block.get("content")
        if block.get("type") == "tool_result" and isinstance(inner, list):
            rest = {k: v for k, v in block.items() if k not in ("content", "cache_control")}
            return len(json.dumps(rest, default=str)) // 4 + sum(_tokens(b) for b in inner)
        block = {k: v for k, v in block.items() if k != "cache_control"}
    return len(json.dumps(block, default=str)) // 4


def _marked(block: Any) -> bool:
    if not isinstance(block, dict):
        return False
    if block.get("cache_control"):
        return True
    inner = block.get("content")
    return isinstance(inner, list) and any(_marked(b) for b in inner)


def units(params: Mapping[str, Any]) -> tuple[list[tuple[int, bool]], list[int]]:
    """(tokens, a breakpoint) of each block in rendering order, and the index of the first
    unit of each message."""
    out: list[tuple[int, bool]] = []
    for tool in params.get("tools") or ():
        out.append((_tokens(tool), _marked(tool)))
    system = params.get("system") or []
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system:
        out.append((_tokens(block), _marked(block)))
    starts = []
    for message in params.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        starts.append(len(out))
        for block in blocks or ():
            out.append((_tokens(block) + 1, _marked(block)))
    if params.get("cache_control") and out:
        out[-1] = (out[-1][0], True)
    return out, starts


def uncached_input(params: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> int:
    """The input tokens of `params` that count against the limit (see the module)."""
    found, starts = units(params)
    total = sum(n for n, _ in found)
    last = max((i for i, (_, mark) in enumerate(found) if mark), default=-1)
    after = sum(n for n, _ in found[last + 1 :])
    if not previous or last < 0:
        return total + 1
    prompt = sum(
        int(previous.get(key) or 0)
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    cached = int(previous.get("cache_read_input_tokens") or 0)
    cached += int(previous.get("cache_creation_input_tokens") or 0)
    scale = 1.0
    answered = _before_last_answer(params, starts)
    estimated = sum(n for n, _ in found[:answered]) if answered is not None else 0
    if prompt and estimated:
        scale = min(max(prompt / estimated, _SCALE[0]), _SCALE[1])
    upto = (total - after) * scale
    return int(after * scale + max(0.0, upto - cached)) + 1


def _before_last_answer(params: Mapping[str, Any], starts: list[int]) -> int | None:
    """The units before the last assistant message (what the previous request sent)."""
    messages = list(params.get("messages") or ())
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "assistant":
            return starts[i]
    return None
