"""The AI SDK's format of the live streams (formats in sse.py):

the Vercel AI SDK's UI message stream protocol (v1): a run is one assistant
  message (`start` with the run's id), each turn a step; text, reasoning and tool-input
  deltas, tool inputs, approval requests, outputs; every durable event also as a
  transient `data-agentrun-event` chunk; `finish` and `data: [DONE]` when the run rests.
  A text or reasoning part stays open (`streaming`) until its answer is recorded; one
  whose answer never is (a retried attempt, a cancelled or failed turn, a delta lost on
  the way) is ended with `providerMetadata.agentrun.withdrawn` (a tool input with a
  `tool-input-error`) and a transient `data-agentrun-withdrawn` chunk naming the parts; the
  recorded answer follows in parts of its own. Part ids carry a token of the connection,
  so a reader that reconnects into the same message never sees an id twice.
"""

from __future__ import annotations

import secrets
from typing import Any

from ..servertools import SERVER_BLOCK_TYPES
from .sse import dumps, frame

# The protocol's finish reason for each resting state.
FINISH_REASONS = {
    "completed": "stop",
    "awaiting_approval": "tool-calls",
    "failed": "error",
    "cancelled": "other",
    "timed_out": "other",
}

# What a withdrawn part's end carries (the AI SDK keeps it in the part's providerMetadata).
WITHDRAWN = {"agentrun": {"withdrawn": True}}
WITHDRAWN_TEXT = "Withdrawn: this answer was not recorded."

# The state each event that ends a run leaves it in.
RUN_ENDINGS = {
    "run_completed": "completed",
    "run_failed": "failed",
    "run_cancelled": "cancelled",
    "run_timed_out": "timed_out",
}


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
        # Part ids are unique across this run's connections (a reader that reconnects keeps
        # the message, and with it the ids it saw).
        self.token = secrets.token_hex(4)

    def open(self) -> list[str]:
        return [frame({"type": "start", "messageId": self.run_id})]

    def _step(self) -> list[dict[str, Any]]:
        if self.step_open:
            return []
        self.step_open = True
        return [{"type": "start-step"}]

    def _end_message(self) -> list[dict[str, Any]]:
        """End every part still open (withdrawn, unless its answer is recorded), then the
        step: the message ends with nothing left streaming."""
        chunks = []
        for turn in sorted({t for t, _ in self.parts}):
            chunks += self._close_turn_parts(turn)
        return chunks + self._end_step()

    def _end_step(self) -> list[dict[str, Any]]:
        if not self.step_open:
            return []
        self.step_open = False
        return [{"type": "finish-step"}]

    def _close_turn_parts(self, turn: int) -> list[dict[str, Any]]:
        """End the turn's open parts: recorded ones as done, the rest withdrawn."""
        if turn not in self.answered:
            return self._withdraw(turn)
        chunks = []
        for (t, _), part in list(self.parts.items()):
            if t == turn and part["open"] and part["kind"] != "tool":
                part["open"] = False
                chunks.append({"type": f"{part['kind']}-end", "id": part["id"]})
        return chunks

    def _withdraw(self, turn: int | None = None, keys: list[Any] | None = None) -> list[Any]:
        """End the parts of `turn` (or those at `keys`) that show what was never recorded,
        marked withdrawn, and forget them; a transient chunk names them."""
        chunks: list[dict[str, Any]] = []
        withdrawn = []
        for key in keys if keys is not None else [k for k in self.parts if k[0] == turn]:
            part = self.parts.pop(key)
            if not part["open"]:
                continue
            withdrawn.append(part["id"])
            if part["kind"] == "tool":
                chunks.append(
                    {
                        "type": "tool-input-error",
                        "toolCallId": part["id"],
                        "toolName": part.get("name", ""),
                        "input": None,
                        "errorText": WITHDRAWN_TEXT,
                        "providerMetadata": WITHDRAWN,
                    }
                )
            else:
                end = {"type": f"{part['kind']}-end", "id": part["id"]}
                chunks.append({**end, "providerMetadata": WITHDRAWN})
        if withdrawn:
            data = {"parts": withdrawn}
            chunks.append({"type": "data-agentrun-withdrawn", "data": data, "transient": True})
        return chunks

    # -- deltas ----------------------------------------------------------------------------

    def delta(self, delta: dict[str, Any]) -> list[str]:
        return [frame(c) for c in self._delta(delta)]

    def _delta(self, d: dict[str, Any]) -> list[dict[str, Any]]:
        kind, turn = d.get("kind"), d.get("turn", 0)
        if kind == "tool_progress":  # an MCP server's progress on a call: transient data
            keys = ("tool_call_id", "tool", "progress", "total", "message")
            data = {k: d.get(k) for k in keys}
            return [{"type": "data-agentrun-tool-progress", "data": data, "transient": True}]
        if kind == "attempt":
            chunks = self._step()
            if d.get("restart"):
                chunks += self._withdraw(turn)
                data = {"turn": turn, "attempt": d.get("attempt")}
                chunks.append({"type": "data-agentrun-restart", "data": data, "transient": True})
            self.attempts[turn] = str(d.get("attempt_id") or d.get("attempt"))
            return chunks
        key = (turn, d.get("index", 0))
        part = self.parts.get(key)
        if kind == "block_start":
            block = d.get("block")
            part_id = f"{turn}-{self.attempts.get(turn, '0')}-{key[1]}-{self.token}"
            if block == "text":
                self.parts[key] = {"id": part_id, "kind": "text", "sent": "", "open": True}
                return [*self._step(), {"type": "text-start", "id": part_id}]
            if block == "thinking":
                self.parts[key] = {"id": part_id, "kind": "reasoning", "sent": "", "open": True}
                return [*self._step(), {"type": "reasoning-start", "id": part_id}]
            if block in ("tool_use", "server_tool_use") and d.get("id"):
                self.parts[key] = {
                    "id": d["id"],
                    "kind": "tool",
                    "name": d.get("name", ""),
                    "sent": "",
                    "open": True,
                }
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
        # A block's end is not its record: the part stays open until the answer is recorded
        # (then done) or is not (then withdrawn).
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
            if part is not None and part["open"] and not text.startswith(part["sent"]):
                # What the deltas showed is not what was recorded (one was lost on the
                # way): withdraw it and show the record whole.
                chunks += self._withdraw(keys=[(turn, index)])
                part = None
            if part is None:
                part_id = f"{turn}-r-{index}-{self.token}"
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
        chunks = self._end_message()
        chunks.append({"type": "finish", "finishReason": FINISH_REASONS.get(run_state, "other")})
        return [frame(c) for c in chunks] + ["data: [DONE]\n\n"]

    def pause(self, cursor: str) -> list[str]:
        """The stream ends before the run rests: no `finish`; the reader reconnects (what
        was not recorded is withdrawn: the turn's deltas come again from its start)."""
        data = {"type": "data-agentrun-reconnect", "data": {"cursor": cursor}, "transient": True}
        return [frame(c) for c in [*self._end_message(), data]]


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
            chunks = [frame(c) for c in [*self.run._end_message(), finish]]
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

    def pause(self, cursor: str) -> list[str]:
        return self.run.pause(cursor) if self.run is not None else []
