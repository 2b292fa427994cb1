"""A scripted reply as the real API sends it: a message (JSON) or its Server-Sent Events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from . import servertools, thinking
from .cache import tokens
from .script import Reply, last_tool_use_index, new_id


def _chunks(s: str, size: int) -> list[str]:
    size = max(1, size)
    return [s[k : k + size] for k in range(0, len(s), size)]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def usage(
    body: dict[str, Any],
    reply: Reply,
    content: list[dict[str, Any]],
    prompt: dict[str, Any] | None = None,
) -> dict:
    """Token counts, unless scripted: the input side as `prompt` says (the prompt cache's
    account of the request; without it, all of the request at full price), the output
    estimated from the content's size (about 4 characters a token), and the server tool
    requests the content made."""
    counts: dict[str, Any] = {
        "input_tokens": max(1, tokens(body)),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        **(prompt or {}),
        "output_tokens": max(1, len(json.dumps(content)) // 4),
    }
    if body.get("inference_geo") is not None:
        # Where inference ran (usage.inference_geo, data-residency page): as asked.
        counts["inference_geo"] = body["inference_geo"]
    if any(b.get("type") == "server_tool_use" for b in content):
        counts["server_tool_use"] = servertools.server_tool_usage(content)
    scripted = reply.usage or {}
    counts.update(scripted)
    if "cache_creation_input_tokens" in scripted and "cache_creation" not in scripted:
        # Scripted writes without their TTL split: 5-minute writes, as by default.
        counts["cache_creation"] = {
            "ephemeral_5m_input_tokens": scripted["cache_creation_input_tokens"],
            "ephemeral_1h_input_tokens": 0,
        }
    reasoning = sum(
        len(str(b.get("thinking") or b.get("data") or ""))
        for b in content
        if b.get("type") in ("thinking", "redacted_thinking")
    )
    if reasoning and "output_tokens_details" not in counts:
        # Thinking counts in output_tokens; the API says how much of it was reasoning.
        thinking_tokens = min(counts["output_tokens"], max(1, reasoning // 4))
        counts["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    return counts


def message(
    body: dict[str, Any],
    reply: Reply,
    content: list[dict[str, Any]],
    prompt: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Message object of a reply with `content` (its thinking blocks signed)."""
    content = thinking.sign(body, content)
    return {
        "id": reply.message_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": reply.model or body["model"],
        "content": content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "stop_details": reply.stop_details,
        "usage": {**usage(body, reply, content, prompt), "service_tier": "standard"},
    }


def events(
    body: dict[str, Any], reply: Reply, request_id: str, prompt: dict[str, Any] | None = None
) -> Iterator[bytes]:
    """The SSE events of a streamed reply, in the real API's order and shape."""
    content = thinking.sign(body, [dict(b) for b in reply.content])  # type: ignore[union-attr]
    cut = last_tool_use_index(content) if reply.truncate_input else None
    if cut is not None:
        content = content[: cut + 1]
    start_message = message(body, reply, [], prompt)
    start_message["stop_reason"] = start_message["stop_sequence"] = None  # only known at the end
    start_message["stop_details"] = None
    counts = usage(body, reply, content, prompt)
    details = counts.pop("output_tokens_details", None)
    start_message["usage"] = {**counts, "output_tokens": 1, "service_tier": "standard"}
    yield _sse("message_start", {"type": "message_start", "message": start_message})
    yield _sse("ping", {"type": "ping"})
    for index, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            start: dict[str, Any] = {**block, "text": ""}
            deltas = [
                {"type": "text_delta", "text": c} for c in _chunks(block["text"], reply.chunk_size)
            ]
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            start = {**block, "input": {}}
            payload = json.dumps(block.get("input") or {})
            if index == cut:
                payload = payload[: len(payload) // 2] if len(payload) > 2 else ""
            # The real API opens every tool input with an empty partial_json.
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": c}
                for c in _chunks(payload, reply.chunk_size)
            ]
        elif kind == "thinking":
            start = {**block, "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": c}
                for c in _chunks(block.get("thinking", ""), reply.chunk_size)
            ] + [{"type": "signature_delta", "signature": block.get("signature", "")}]
        else:
            start, deltas = block, []
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        for delta in deltas:
            yield _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    if reply.stream_error:
        yield _sse(
            "error",
            {
                "type": "error",
                "error": {"type": reply.stream_error, "message": f"fake {reply.stream_error}"},
                "request_id": request_id,
            },
        )
        return
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": reply.stop_reason,
                "stop_sequence": reply.stop_sequence,
                "stop_details": reply.stop_details,
            },
            "usage": {
                "output_tokens": counts["output_tokens"],
                # The final usage, as the real API sends it here (server tool requests too).
                **{
                    k: v
                    for k, v in counts.items()
                    if k
                    in (
                        "input_tokens",
                        "cache_creation_input_tokens",
                        "cache_read_input_tokens",
                        "server_tool_use",
                    )
                },
                **({"output_tokens_details": details} if details else {}),
            },
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})
