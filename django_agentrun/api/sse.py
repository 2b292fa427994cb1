"""The two formats of the live streams, as Server-Sent Events.

- `events` (this app's own): each durable event as `event: run_event` with `id:` its cursor
  and the API's public view of it as data (`{"seq", "type", "payload", "created_at"}`, the
  payload cut to `events.ALLOWLIST`); each delta as `event: delta` without an id (an
  `attempt` delta with `"restart": true` says to drop what this stream showed of that
  turn's answer so far); `event: end` with the run's state when the run rests.
- `ai-sdk`: the Vercel AI SDK's UI message stream protocol (v1): a run is one assistant
  message (`start` with the run's id), each turn a step; text, reasoning and tool-input
  deltas, tool inputs, approval requests, outputs; every durable event also as a
  transient `data-agentrun-event` chunk; `finish` and `data: [DONE]` when the run rests.
"""

from __future__ import annotations

import json
from typing import Any

from ..servertools import SERVER_BLOCK_TYPES

# The protocol's finish reason for each resting state.
FINISH_REASONS = {
    "completed": "stop",
    "awaiting_approval": "tool-calls",
    "failed": "error",
    "cancelled": "other",
    "timed_out": "other",
}

# The state each event that ends a run leaves it in.
RUN_ENDINGS = {
    "run_completed": "completed",
    "run_failed": "failed",
    "run_cancelled": "cancelled",
    "run_timed_out": "timed_out",
}


def dumps(value: Any) -> str:
    """JSON on one line; text that cannot be UTF-8 (a lone surrogate a tool returned) is
    escaped instead."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return text


def frame(data: Any, *, event: str | None = None, id: str | None = None) -> str:
    lines = []
    if event:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.append(f"data: {data if isinstance(data, str) else dumps(data)}")
    return "\n".join(lines) + "\n\n"


KEEPALIVE = ": keep-alive\n\n"


class EventsFormat:
    """This app's own events."""

    name = "events"
    headers: dict[str, str] = {}

    def __init__(self, run_id: Any) -> None:
        self.run_id = run_id

    def open(self) -> list[str]:
        return ["retry: 2000\n\n"]

    def event(self, event: dict[str, Any], cursor: str) -> list[str]:
        return [frame(event, event="run_event", id=cursor)]

    def delta(self, delta: dict[str, Any]) -> list[str]:
        return [frame(delta, event="delta")]

    def close(self, run_state: str, cursor: str) -> list[str]:
        return [frame({"run_state": run_state, "cursor": cursor}, event="end")]


class UIMessageFormat:
    """The AI SDK's UI message stream protocol (see the module's docstring)."""

    name = "ai-sdk"
    headers = {"x-vercel-ai-ui-message-stream": "v1"}

    def __init__(self, run_id: Any) -> None:
        self.run_id = str(run_id)
        self.step_open = False
        # (turn, index) -> {"id", "kind" (text | reasoning | tool), "sent", "open"}
        self.parts: dict[tuple[int, int], dict[str, Any]] = {}
        self.attempts: dict[int, str] = {}  # turn -> the id of the attempt streamed
        # A turn's tool calls are recorded before its answer's event: their parts wait for it,
        # to follow the answer's blocks in order.
        self.held: dict[str, dict[str, Any]] = {}
        self.answered: set[int] = set()

    def open(self) -> list[str]:
        return [frame({"type": "start", "messageId": self.run_id})]

    def _step(self) -> list[dict[str, Any]]:
        if self.step_open:
            return []
        self.step_open = True
        return [{"type": "start-step"}]

    def _end_step(self) -> list[dict[str, Any]]:
        if not self.step_open:
            return []
        self.step_open = False
        return [{"type": "finish-step"}]

    def _close_turn_parts(self, turn: int) -> list[dict[str, Any]]:
        chunks = []
        for (t, _), part in list(self.parts.items()):
            if t == turn and part["open"] and part["kind"] != "tool":
                part["open"] = False
                chunks.append({"type": f"{part['kind']}-end", "id": part["id"]})
        return chunks

    # -- deltas ----------------------------------------------------------------------------

    def delta(self, delta: dict[str, Any]) -> list[str]:
        return [frame(c) for c in self._delta(delta)]

    def _delta(self, d: dict[str, Any]) -> list[dict[str, Any]]:
        kind, turn = d.get("kind"), d.get("turn", 0)
        if kind == "attempt":
            chunks = self._step()
            if d.get("restart"):
                chunks += self._close_turn_parts(turn)
                for key in [k for k in self.parts if k[0] == turn]:
                    del self.parts[key]
                data = {"turn": turn, "attempt": d.get("attempt")}
                chunks.append({"type": "data-agentrun-restart", "data": data, "transient": True})
            self.attempts[turn] = str(d.get("attempt_id") or d.get("attempt"))
            return chunks
        key = (turn, d.get("index", 0))
        part = self.parts.get(key)
        if kind == "block_start":
            block = d.get("block")
            part_id = f"{turn}-{self.attempts.get(turn, '0')}-{key[1]}"
            if block == "text":
                self.parts[key] = {"id": part_id, "kind": "text", "sent": "", "open": True}
                return [*self._step(), {"type": "text-start", "id": part_id}]
            if block == "thinking":
                self.parts[key] = {"id": part_id, "kind": "reasoning", "sent": "", "open": True}
                return [*self._step(), {"type": "reasoning-start", "id": part_id}]
            if block in ("tool_use", "server_tool_use") and d.get("id"):
                self.parts[key] = {"id": d["id"], "kind": "tool", "sent": "", "open": True}
                start = {"type": "tool-input-start", "toolCallId": d["id"], "toolName": d["name"]}
                if block == "server_tool_use":
                    start["providerExecuted"] = True  # the API runs it: never this app's call
                return [*self._step(), start]
            return []
        if part is None:
            return []
        if kind in ("text", "thinking") and part["open"]:
            text = d.get(kind) or ""
            part["sent"] += text
            return [{"type": f"{part['kind']}-delta", "id": part["id"], "delta": text}]
        if kind == "input_json" and part["open"]:
            text = d.get("partial_json") or ""
            return [{"type": "tool-input-delta", "toolCallId": part["id"], "inputTextDelta": text}]
        if kind == "block_stop" and part["open"] and part["kind"] != "tool":
            part["open"] = False
            return [{"type": f"{part['kind']}-end", "id": part["id"]}]
        return []

    # -- durable events --------------------------------------------------------------------

    def event(self, event: dict[str, Any], cursor: str) -> list[str]:
        chunks = self._event(event)
        data = {"type": "data-agentrun-event", "data": event, "transient": True}
        return [frame(c) for c in chunks] + [frame(data, id=cursor)]

    def _event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind, payload = event["type"], event.get("payload") or {}
        call_id = payload.get("tool_call_id")
        if kind == "model_response":
            return self._answer(payload)
        if kind == "tool_call_requested":
            chunk = {
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": payload.get("name", ""),
                "input": payload.get("arguments", {}),
            }
            if payload.get("turn_index") in self.answered:
                return [*self._step(), chunk]
            self.held[call_id] = chunk
            return []
        if kind == "approval_requested":
            approval = str(event.get("call") or call_id)
            return [
                {"type": "tool-approval-request", "approvalId": approval, "toolCallId": call_id}
            ]
        if payload.get("decision") == "rejected":
            return [{"type": "tool-output-denied", "toolCallId": call_id}]
        if "result" in payload and call_id and kind != "tool_result_replaced":
            if payload.get("is_error"):
                text = payload["result"]
                text = text if isinstance(text, str) else dumps(text)
                return [{"type": "tool-output-error", "toolCallId": call_id, "errorText": text}]
            return [
                {
                    "type": "tool-output-available",
                    "toolCallId": call_id,
                    "output": payload["result"],
                }
            ]
        if kind in ("turn_completed", "turn_cancelled", "turn_failed"):
            return self._close_turn_parts(payload.get("turn_index", 0)) + self._end_step()
        if kind == "run_failed":
            return [{"type": "error", "errorText": payload.get("error_message") or "failed"}]
        return []

    def _answer(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """The committed answer: what its deltas did not show (all of it, for a stream that
        connected after it was written)."""
        turn = payload.get("turn_index", 0)
        self.answered.add(turn)
        chunks = self._step()
        for index, block in enumerate(payload.get("content") or []):
            kind = {"text": "text", "thinking": "reasoning"}.get(block.get("type"))
            if block.get("type") == "tool_use" and block.get("id") in self.held:
                chunks.append(self.held.pop(block["id"]))
            chunks += _server_tool_parts(block)
            if kind is None:
                continue
            text = block.get("text" if kind == "text" else "thinking") or ""
            part = self.parts.get((turn, index))
            if part is None:
                part_id = f"{turn}-r-{index}"
                chunks.append({"type": f"{kind}-start", "id": part_id})
                if text:
                    chunks.append({"type": f"{kind}-delta", "id": part_id, "delta": text})
                chunks.append({"type": f"{kind}-end", "id": part_id})
                continue
            if part["open"] and text.startswith(part["sent"]) and len(text) > len(part["sent"]):
                rest = text[len(part["sent"]) :]
                chunks.append({"type": f"{kind}-delta", "id": part["id"], "delta": rest})
        chunks += list(self.held.values())  # calls the content did not name (none expected)
        self.held.clear()
        return chunks + self._close_turn_parts(turn)

    def close(self, run_state: str, cursor: str) -> list[str]:
        chunks = self._end_step()
        chunks.append({"type": "finish", "finishReason": FINISH_REASONS.get(run_state, "other")})
        return [frame(c) for c in chunks] + ["data: [DONE]\n\n"]


def _server_tool_parts(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A server tool's blocks as the AI SDK's provider-executed tool parts: the API ran
    it, so its input and its result both come with the answer."""
    kind = block.get("type")
    if kind == "server_tool_use":
        return [
            {
                "type": "tool-input-available",
                "toolCallId": block.get("id"),
                "toolName": block.get("name", ""),
                "input": block.get("input") or {},
                "providerExecuted": True,
            }
        ]
    if kind in SERVER_BLOCK_TYPES:
        return [
            {
                "type": "tool-output-available",
                "toolCallId": block.get("tool_use_id"),
                "output": block.get("content"),
                "providerExecuted": True,
            }
        ]
    return []


class ConversationUIMessages:
    """The UI message stream of a conversation: each run one assistant message (`start`
    with the run's id ... `finish`), one after the other; `data: [DONE]` when the
    conversation rests. Durable events and deltas carry their run (`run`, `position`)."""

    name = UIMessageFormat.name
    headers = UIMessageFormat.headers

    def __init__(self, conversation_id: Any) -> None:
        self.conversation_id = str(conversation_id)
        self.position: int | None = None
        self.run: UIMessageFormat | None = None
        self.ended = "completed"

    def open(self) -> list[str]:
        return []

    def _enter(self, item: dict[str, Any]) -> list[str]:
        position = item.get("position", 0)
        if self.run is not None and position == self.position:
            return []
        chunks = []
        if self.run is not None:
            # The run the conversation went past has ended: its last state event said how.
            finish = {"type": "finish", "finishReason": FINISH_REASONS.get(self.ended, "other")}
            chunks = [frame(c) for c in [*self.run._end_step(), finish]]
        self.position, self.run = position, UIMessageFormat(item.get("run") or "")
        self.ended = "completed"
        return chunks + self.run.open()

    def event(self, event: dict[str, Any], cursor: str) -> list[str]:
        chunks = self._enter(event)
        if event["type"] in RUN_ENDINGS:
            self.ended = RUN_ENDINGS[event["type"]]
        return chunks + self.run.event(event, cursor)  # type: ignore[union-attr]

    def delta(self, delta: dict[str, Any]) -> list[str]:
        return self._enter(delta) + self.run.delta(delta)  # type: ignore[union-attr]

    def close(self, run_state: str, cursor: str) -> list[str]:
        if self.run is None:
            return ["data: [DONE]\n\n"]
        return self.run.close(run_state, cursor)


FORMATS = {f.name: f for f in (EventsFormat, UIMessageFormat)}
# The formats of a conversation's stream, by the same names.
CONVERSATION_FORMATS = {"events": EventsFormat, "ai-sdk": ConversationUIMessages}
# Media types of Accept that choose a format (`?format=` wins).
ACCEPT = {
    "application/x-vercel-ai-ui-message-stream": "ai-sdk",
    "text/event-stream": "events",
}
