"""Where a request's cache breakpoints go: the cache follows the conversation.

Automatic caching (the top-level `cache_control`: the API puts the breakpoint on the last
cacheable block, so it moves forward each turn), and a breakpoint on the last tool and the
last system block (tools render before system: the stable prefix stays cached when the
conversation changes), all with the request's TTL, never more than the API's limit of 4
counting those already in the messages (the run's input may hold some): the system's goes
first, then the tools', never the moving one.
"""

from __future__ import annotations

from typing import Any

# The API refuses a request with more cache_control breakpoints than this.
MAX_CACHE_BREAKPOINTS = 4


def breakpoints(value: Any) -> int:
    """The cache_control breakpoints in messages (blocks, and blocks in tool results)."""
    if isinstance(value, list):
        return sum(breakpoints(item) for item in value)
    if isinstance(value, dict):
        own = 1 if value.get("cache_control") else 0
        return own + breakpoints(value.get("content"))
    return 0


def place(
    params: dict[str, Any],
    tools: list[dict[str, Any]],
    system: list[dict[str, Any]],
    messages: Any,
    ttl: str,
) -> None:
    """Mark `params` (the top-level marker) and the last of `tools` and `system` (copies,
    changed in place) as above."""
    marker: dict[str, Any] = {"type": "ephemeral"}
    if ttl == "1h":
        marker["ttl"] = "1h"
    free = MAX_CACHE_BREAKPOINTS - breakpoints(messages)
    if free >= 1:
        params["cache_control"] = dict(marker)
    if tools and free >= 2:
        tools[-1]["cache_control"] = dict(marker)
    if system and free >= 2 + bool(tools):
        system[-1]["cache_control"] = dict(marker)
