"""Where a request's cache breakpoints go, seen over the whole request.

Automatic caching (the top-level `cache_control`: the API puts the breakpoint on the last
cacheable block, so it moves forward each turn), and a breakpoint on the last tool and the
last system block (tools render before system: the stable prefix stays cached when the
conversation changes), with the request's TTL. The host's own markers (on tools, server
tools included, system blocks, input blocks and tool-result content) are counted first and
never changed; the API takes at most 4 in all, so the app's go where room is left, in this
order: the moving one, the tools', the system's.

TTL order: the API requires a breakpoint with a longer TTL to come before any with a
shorter one, in the order tools, system, messages (prompt caching, "Mixing different
TTLs": https://platform.claude.com/docs/en/build-with-claude/prompt-caching). So an app
marker after a host's 5-minute marker takes 5 minutes too (the host's choice wins), and an
app marker of 5 minutes before a host's 1-hour marker is left out (the host's marker,
later in the prompt, caches that prefix for longer anyway).
"""

from __future__ import annotations

from typing import Any

# The API refuses a request with more cache_control breakpoints than this.
MAX_CACHE_BREAKPOINTS = 4
_RANK = {"5m": 0, "1h": 1}


def ttl_of(marker: Any) -> str:
    """A cache_control marker's TTL ("5m" when it names none)."""
    return str(marker.get("ttl") or "5m") if isinstance(marker, dict) else "5m"


def markers(value: Any) -> list[str]:
    """The TTL of each cache_control marker in blocks or messages, in the prompt's order
    (a message's content, a tool result's content)."""
    if isinstance(value, list):
        return [ttl for item in value for ttl in markers(item)]
    if isinstance(value, dict):
        own = [ttl_of(value["cache_control"])] if value.get("cache_control") else []
        return own + markers(value.get("content"))
    return []


def breakpoints(value: Any) -> int:
    """The cache_control breakpoints in messages (blocks, and blocks in tool results)."""
    return len(markers(value))


def host_markers(tools: list[dict[str, Any]], system: list[dict[str, Any]]) -> int:
    """The breakpoints a host put on an Agent's tools and system blocks itself."""
    return breakpoints(tools) + breakpoints(system)


def _last_marked(messages: Any) -> bool:
    """Whether the last block of the last message carries a host's cache_control."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    content = messages[-1].get("content")
    return (
        isinstance(content, list)
        and bool(content)
        and bool(isinstance(content[-1], dict) and content[-1].get("cache_control"))
    )


def place(
    params: dict[str, Any],
    tools: list[dict[str, Any]],
    system: list[dict[str, Any]],
    messages: Any,
    ttl: str,
) -> None:
    """Mark `params` (the top-level marker) and the last of `tools` and `system` (copies,
    changed in place) as above: never past the limit, in the API's TTL order."""
    # (place in the prompt, TTL) of each host marker: tools, system, messages, top level.
    host = [
        ((0, i), ttl_of(t.get("cache_control")))
        for i, t in enumerate(tools)
        if t.get("cache_control")
    ]
    host += [
        ((1, i), ttl_of(b.get("cache_control")))
        for i, b in enumerate(system)
        if b.get("cache_control")
    ]
    host += [((2, k), t) for k, t in enumerate(markers(messages))]
    if params.get("cache_control"):
        host.append(((3, 0), ttl_of(params["cache_control"])))
    free = MAX_CACHE_BREAKPOINTS - len(host)
    wanted: list[tuple[tuple[int, int], Any]] = []
    if not params.get("cache_control") and not _last_marked(messages):
        # The top-level marker goes on the last block: where the host marked that block
        # itself, automatic caching is a no-op (same TTL) or a 400 (another TTL: a 5-minute
        # marker on a host's 1-hour block; prompt caching, Automatic caching, "Edge cases").
        wanted.append(((3, 0), params))
    if tools and not tools[-1].get("cache_control"):
        wanted.append(((0, len(tools) - 1), tools[-1]))
    if system and not system[-1].get("cache_control"):
        wanted.append(((1, len(system) - 1), system[-1]))
    for where, target in wanted[: max(0, free)]:
        before = [t for p, t in host if p < where]
        after = [t for p, t in host if p > where]
        own = min([ttl, *before], key=_RANK.__getitem__)
        if any(_RANK[t] > _RANK[own] for t in after):
            continue  # a longer TTL would follow a shorter one
        marker: dict[str, Any] = {"type": "ephemeral"}
        if own == "1h":
            marker["ttl"] = "1h"
        target["cache_control"] = marker
