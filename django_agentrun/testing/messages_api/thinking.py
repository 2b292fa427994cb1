"""The prefix rule of thinking blocks, as current Claude models enforce it.

A thinking block is valid only after exactly what preceded it when the model wrote it: the
top-level `system`, `tools` and every earlier message are its prefix; if any of them
changed, that block and every later one fail, and the request is refused with a 400
(preserved thinking, https://platform.claude.com/docs/en/build-with-claude/preserved-thinking,
and "The block is bound to a different conversation",
https://platform.claude.com/docs/en/build-with-claude/preserved-thinking/fix-bound-to-a-different-conversation).
A block is also tied to the model that wrote it ("Thinking blocks are tied to the model and
the conversation", https://platform.claude.com/docs/en/models/sonnet-5-5/whats-new-sonnet-5-5).
The API drops a block that the current model cannot read without an error; the stand-in
is stricter and refuses it, so that a test shows the app never sends one.

The prefix check is run by the preserved-thinking models only ("Starting with Claude Fable
5.1 ... the API checks the block's signature", preserved thinking; the model table's
`preserved_thinking`). Earlier models check that a block is the one their model wrote,
unchanged, and require the open tool-use loop's last assistant turn to keep its thinking
("During tool use, you must pass thinking blocks back to the API for the last assistant
message", extended thinking, https://platform.claude.com/docs/en/build-with-claude/extended-thinking;
the handler checks that one, as it remembers which answers carried thinking).

The stand-in signs every thinking block it answers with (HMAC-SHA256 over the model, the
request's system prompt, tools and messages, and the block's text; cache_control markers
are not part of the prefix) and checks a block in `messages[i]` against the model, system,
tools and `messages[:i]` of the request that carries it. The key is fixed, so a stand-in
started again still accepts what an earlier one signed.
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


BOUND = (
    "The block is bound to a different conversation. Remove the block, or set "
    '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
)


def prefix(body: dict[str, Any], upto: int | None = None) -> bytes:
    """The request's model, system prompt, tools and messages before `messages[upto]` (all
    of them when None), canonical (a string system prompt or content as one text block;
    no cache_control)."""
    system = body.get("system") or []
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    messages = list(body.get("messages") or [])
    messages = [
        {**m, "content": [{"type": "text", "text": m["content"]}]}
        if isinstance(m, dict) and isinstance(m.get("content"), str)
        else m
        for m in (messages if upto is None else messages[:upto])
    ]
    value = _without_cache_control(
        {
            "model": body.get("model"),
            "system": system,
            "tools": body.get("tools") or [],
            "messages": messages,
        }
    )
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.encode()


def _mac(body: dict[str, Any], text: str, upto: int | None = None) -> bytes:
    message = prefix(body, upto) + b"\0" + text.encode("utf-8", "surrogatepass")
    return hmac.new(KEY, message, hashlib.sha256).digest()


def _own(body: dict[str, Any], text: str) -> bytes:
    """The MAC of a block's text and the model that wrote it (no prefix)."""
    message = str(body.get("model")).encode() + b"\0" + text.encode("utf-8", "surrogatepass")
    return hmac.new(KEY, message, hashlib.sha256).digest()


def preserved(model: Any) -> bool:
    """Whether `model` runs the prefix check (the shipped table's preserved_thinking)."""
    try:
        from django_agentrun.catalog import shipped_info
    except ImportError:
        return True
    info = shipped_info(str(model))
    return info.preserved_thinking if info is not None else True


def signature(body: dict[str, Any], thinking: str, upto: int | None = None) -> str:
    """The signature of a thinking block with this text, made under this request's prefix
    (and, for the models without the prefix check, by this model)."""
    return base64.b64encode(_MARK + _mac(body, thinking, upto) + _own(body, thinking)).decode()


def seal(body: dict[str, Any], data: str) -> str:
    """A redacted_thinking block's `data`: the scripted data, bound to this prefix."""
    payload = json.dumps(
        {"data": data, "mac": _mac(body, data).hex(), "own": _own(body, data).hex()}
    )
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


def valid(body: dict[str, Any], block: dict[str, Any], at: int) -> bool:
    """Whether a thinking or redacted_thinking block of `body`'s `messages[at]` is unchanged
    and was made by `body`'s model (on a preserved-thinking model: after `body`'s system
    prompt, tools and `messages[:at]`)."""
    checked = preserved(body.get("model"))
    if block.get("type") == "thinking":
        given = block.get("signature")
        thinking = block.get("thinking")
        if not isinstance(given, str) or not isinstance(thinking, str):
            return False
        if checked:
            return hmac.compare_digest(given, signature(body, thinking, at))
        try:
            raw = base64.b64decode(given, validate=True)
        except (binascii.Error, ValueError):
            return False
        own = raw[len(_MARK) + 32 :] if raw.startswith(_MARK) else b""
        return hmac.compare_digest(own, _own(body, thinking))
    try:
        raw = base64.b64decode(str(block.get("data", "")), validate=True)
        if not raw.startswith(_MARK):
            return False
        sealed = json.loads(raw[len(_MARK) :])
        data, mac, own = sealed["data"], sealed["mac"], sealed["own"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        return False
    if not isinstance(data, str):
        return False
    if checked:
        return hmac.compare_digest(str(mac), _mac(body, data, at).hex())
    return hmac.compare_digest(str(own), _own(body, data).hex())
