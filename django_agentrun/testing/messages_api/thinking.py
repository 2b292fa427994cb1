"""The prefix rule of thinking blocks, as current Claude models enforce it.

A thinking block comes back in later requests exactly as the API sent it, under the same
system prompt and tools: its `signature` (a `redacted_thinking` block's `data`) is bound
to its text and to that prefix, and a request that changed either is refused. The stand-in
signs every thinking block it answers with (HMAC-SHA256 over the request's system prompt
and tools and the block's text; cache_control markers are not part of the prefix) and
checks the blocks a request carries against the request's own system prompt and tools.
The key is fixed, so a stand-in started again still accepts what an earlier one signed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any

KEY = b"django-agentrun Messages API stand-in: thinking signatures"
_MARK = b"agentrun-standin:"


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


def prefix(body: dict[str, Any]) -> bytes:
    """The request's system prompt and tools, canonical (a string system prompt as one
    text block; no cache_control)."""
    system = body.get("system") or []
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    value = _without_cache_control({"system": system, "tools": body.get("tools") or []})
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.encode()


def _mac(body: dict[str, Any], text: str) -> bytes:
    message = prefix(body) + b"\0" + text.encode("utf-8", "surrogatepass")
    return hmac.new(KEY, message, hashlib.sha256).digest()


def signature(body: dict[str, Any], thinking: str) -> str:
    """The signature of a thinking block with this text, made under this request's prefix."""
    return base64.b64encode(_MARK + _mac(body, thinking)).decode()


def seal(body: dict[str, Any], data: str) -> str:
    """A redacted_thinking block's `data`: the scripted data, bound to this prefix."""
    payload = json.dumps({"data": data, "mac": _mac(body, data).hex()})
    return base64.b64encode(_MARK + payload.encode()).decode()


def sign(body: dict[str, Any], content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content of a reply to `body`, its thinking blocks signed (copies)."""
    signed = []
    for block in content:
        if block.get("type") == "thinking":
            block = {**block, "signature": signature(body, str(block.get("thinking", "")))}
        elif block.get("type") == "redacted_thinking":
            block = {**block, "data": seal(body, str(block.get("data", "")))}
        signed.append(block)
    return signed


def valid(body: dict[str, Any], block: dict[str, Any]) -> bool:
    """Whether a thinking or redacted_thinking block of `body`'s history is unchanged and
    was made under `body`'s system prompt and tools."""
    if block.get("type") == "thinking":
        given = block.get("signature")
        thinking = block.get("thinking")
        if not isinstance(given, str) or not isinstance(thinking, str):
            return False
        return hmac.compare_digest(given, signature(body, thinking))
    try:
        raw = base64.b64decode(str(block.get("data", "")), validate=True)
        if not raw.startswith(_MARK):
            return False
        sealed = json.loads(raw[len(_MARK) :])
        data, mac = sealed["data"], sealed["mac"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        return False
    return isinstance(data, str) and hmac.compare_digest(str(mac), _mac(body, data).hex())
