"""The prompt cache as the API bills it: reads, writes by TTL, and the rest at full price.

A request's prompt is a sequence of blocks in the order the API renders it: tools, then
system, then each message's content blocks. A breakpoint is a block with `cache_control`
(or, with the top-level `cache_control` of automatic caching, the last block). For each
breakpoint the cache looks back up to 20 blocks for the longest prefix it holds (written
by an earlier request, still within its TTL): that prefix is read
(`cache_read_input_tokens`, the entry's TTL starts over). What lies between it and the
last breakpoint is written (`cache_creation_input_tokens`, split by the breakpoints' TTL
into `cache_creation.ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`), each
breakpoint's prefix becoming an entry; the rest is `input_tokens`. A prefix shorter than
the model's minimum is not cached. Tokens are the stand-in's estimate: 4 characters each,
a few more for each message's role, and a few for the request itself (never cached).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
LOOKBACK = 20
DEFAULT_MIN_TOKENS = 1024
REQUEST_TOKENS = 4  # the request's own framing, after the last block
ROLE_TOKENS = 3  # a message's role marker, counted with its first block


def tokens(value: Any) -> int:
    """The stand-in's token estimate of a JSON value: 4 characters a token."""
    return len(json.dumps(value)) // 4


def _plain(block: Any) -> Any:
    if isinstance(block, dict):
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _units(body: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    """(canonical text, tokens, breakpoint TTL or None) per block, in rendering order."""
    units: list[tuple[str, int, str | None]] = []

    def add(prefix: str, block: Any, extra: int = 0) -> None:
        marker = block.get("cache_control") if isinstance(block, dict) else None
        ttl = (marker.get("ttl") or "5m") if isinstance(marker, dict) else None
        plain = _plain(block)
        units.append((prefix + json.dumps(plain, sort_keys=True), tokens(plain) + extra, ttl))

    for tool in body.get("tools") or ():
        add("tool:", tool)
    system = body.get("system") or []
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system:
        add("system:", block)
    for message in body.get("messages") or ():
        content = message.get("content")
        role = message.get("role")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for k, block in enumerate(blocks):
            add(f"{role}:" if k else f"new {role}:", block, ROLE_TOKENS if k == 0 else 0)
    return units


def _min_tokens(model: str) -> int:
    try:
        from django_agentrun.catalog import shipped_info
    except ImportError:
        return DEFAULT_MIN_TOKENS
    info = shipped_info(model)
    return info.cache_min_tokens if info is not None else DEFAULT_MIN_TOKENS


class PromptCache:
    """The cache entries the stand-in holds (prefix hash -> TTL and expiry), thread-safe.
    `clock` (seconds, monotonic) may be replaced by a test to let entries expire."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[str, float]] = {}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def account(self, body: dict[str, Any]) -> dict[str, Any]:
        """The input side of the usage of `body`, and the cache updated as the API does."""
        units = _units(body)
        marks = {i: ttl for i, (_, _, ttl) in enumerate(units) if ttl}
        auto = body.get("cache_control")
        if isinstance(auto, dict) and units:
            marks.setdefault(len(units) - 1, auto.get("ttl") or "5m")
        usage: dict[str, Any] = {
            # Without breakpoints, the estimate the stand-in always made: the body's size.
            "input_tokens": max(1, tokens(body)),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        }
        if not marks:
            return usage
        hashes, counts = [], []
        digest, count = hashlib.sha256(), 0
        for text, n, _ in units:
            digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
            hashes.append(digest.hexdigest())
            count += n
            counts.append(count)
        minimum = _min_tokens(str(body.get("model")))
        now = self.clock()
        with self._lock:
            read_end = -1
            for mark in sorted(marks):
                for j in range(mark, max(-1, mark - LOOKBACK - 1), -1):
                    entry = self._entries.get(hashes[j])
                    if entry is not None and entry[1] > now:
                        read_end = max(read_end, j)
                        break
            if read_end >= 0:
                ttl = self._entries[hashes[read_end]][0]
                self._entries[hashes[read_end]] = (ttl, now + TTL_SECONDS[ttl])
            written = {"5m": 0, "1h": 0}
            start = read_end
            for mark in sorted(marks):
                if mark <= read_end or counts[mark] < minimum:
                    continue
                ttl = marks[mark]
                written[ttl] += counts[mark] - (counts[start] if start >= 0 else 0)
                self._entries[hashes[mark]] = (ttl, now + TTL_SECONDS[ttl])
                start = mark
        read = counts[read_end] if read_end >= 0 else 0
        write = written["5m"] + written["1h"]
        total = counts[-1] + REQUEST_TOKENS
        usage.update(
            input_tokens=total - read - write,
            cache_creation_input_tokens=write,
            cache_read_input_tokens=read,
            cache_creation={
                "ephemeral_5m_input_tokens": written["5m"],
                "ephemeral_1h_input_tokens": written["1h"],
            },
        )
        return usage


# At most this many cache_control breakpoints, counted over tools, system, messages (tool
# results' content included) and the top level; a longer TTL never after a shorter one
# ("Mixing different TTLs", https://platform.claude.com/docs/en/build-with-claude/prompt-caching).
MAX_BREAKPOINTS = 4


def _ttls(value: Any) -> list[str]:
    if isinstance(value, list):
        return [ttl for item in value for ttl in _ttls(item)]
    if not isinstance(value, dict):
        return []
    marker = value.get("cache_control")
    own = [str(marker.get("ttl") or "5m")] if isinstance(marker, dict) else []
    return own + _ttls(value.get("content"))


def _ttl(marker: Any) -> str:
    return str(marker.get("ttl") or "5m") if isinstance(marker, dict) else "5m"


def _last_block(body: dict[str, Any]) -> Any:
    """The block automatic caching marks: the last block of the last message (a string
    content is one text block); the system's or the tools' last without messages."""
    messages = body.get("messages") or []
    if messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        if isinstance(content, list) and content:
            return content[-1]
        return None
    system = body.get("system")
    if isinstance(system, list) and system:
        return system[-1]
    tools = body.get("tools") or []
    return tools[-1] if tools else None


def breakpoint_problem(body: dict[str, Any]) -> str | None:
    """Why the API refuses the request's breakpoints (too many, or TTLs out of order)."""
    system = body.get("system")
    ttls = [
        *_ttls(body.get("tools") or []),
        *_ttls(system if isinstance(system, list) else []),
        *_ttls(body.get("messages") or []),
        *_ttls([{"cache_control": body.get("cache_control")}]),
    ]
    if len(ttls) > MAX_BREAKPOINTS:
        return (
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(ttls)}."
        )
    auto = body.get("cache_control")
    last = _last_block(body)
    if isinstance(auto, dict) and isinstance(last, dict) and last.get("cache_control"):
        # "If the last block has an explicit cache_control with a different TTL, the API
        # returns a 400 error" (Prompt caching, Automatic caching, "Edge cases"; wording
        # UNSOURCED); with the same TTL automatic caching is a no-op.
        if _ttl(last["cache_control"]) != _ttl(auto):
            return (
                "cache_control: automatic caching's ttl differs from the explicit "
                "cache_control of the last block."
            )
    for k in range(1, len(ttls)):
        if ttls[k] == "1h" and "5m" in ttls[:k]:
            # The wording is the stand-in's own: the stored documentation gives the rule only.
            return (
                "cache_control: a breakpoint with ttl '1h' must not come after a breakpoint "
                "with ttl '5m' (longer TTLs must come first: tools, then system, then messages)."
            )
    return None
