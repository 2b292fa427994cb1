"""Test doubles shipped for users' tests and demos: a scripted model client.

    client = ScriptedClient([
        reply(tool_use("lookup", {"q": "x"})),
        reply(text("done")),
    ])

Replies are chosen by step (the number of assistant messages in the request),
so asking again for the same step gives the same answer, as a replayed
request would. `client.requests` records what the engine sent. A request with an
`on_event` sink gets the reply's content as deltas first, as a streaming client would
(`chunk_delay` seconds apart).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..abort import AbortSignal
from ..clients.base import ModelError, ModelRequest, ModelResponse, StreamAborted, Usage, emit

_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(
    name: str, input: dict[str, Any] | None = None, id: str | None = None
) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": id or f"toolu_{next(_ids):024d}",
        "name": name,
        "input": input or {},
    }


@dataclass
class Reply:
    content: list[dict[str, Any]]
    stop_reason: str | None = None
    usage: Usage | None = None
    delay: float = 0.0
    error: ModelError | None = None
    chunk_delay: float = 0.0  # seconds between deltas, when the request streams them


def reply(
    *content: dict[str, Any],
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
    delay: float = 0.0,
    chunk_delay: float = 0.0,
) -> Reply:
    return Reply(
        list(content), stop_reason, Usage(**usage) if usage else None, delay, None, chunk_delay
    )


def error(message: str = "overloaded", *, retryable: bool = True, status: int = 529) -> Reply:
    return Reply([], error=ModelError(message, retryable=retryable, status=status))


@dataclass
class ScriptedClient:
    """A ModelClient that answers from a script (a list by step, or a callable of the request)."""

    script: list[Reply] | Callable[[ModelRequest], Reply] = field(default_factory=list)
    requests: list[ModelRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._errors_sent: Counter = Counter()

    def steps(self) -> Counter:
        return Counter(_step(r) for r in self.requests)

    def create(self, request: ModelRequest, *, abort: AbortSignal) -> ModelResponse:
        if abort.aborted:
            raise StreamAborted(abort.reason)
        with self._lock:
            self.requests.append(request)
            step = _step(request)
        found = self.script(request) if callable(self.script) else self._by_step(step)
        if found.error is not None:
            raise found.error
        if found.delay and abort.wait(found.delay):
            raise StreamAborted(abort.reason)
        if request.on_event is not None:
            stream_deltas(found.content, request.on_event, abort, found.chunk_delay)
        has_tools = any(b.get("type") == "tool_use" for b in found.content)
        prompt = sum(len(str(m.get("content"))) for m in request.messages) // 4 + 1
        return ModelResponse(
            message_id=f"msg_scripted_{next(_ids):06d}",
            request_id=f"req_scripted_{next(_ids):06d}",
            content=[dict(b) for b in found.content],
            stop_reason=found.stop_reason or ("tool_use" if has_tools else "end_turn"),
            usage=found.usage or Usage(input_tokens=prompt, output_tokens=10),
            model=request.model,
        )

    def _by_step(self, step: int) -> Reply:
        assert isinstance(self.script, list)
        if step >= len(self.script):
            raise ModelError(
                f"ScriptedClient: no reply scripted for step {step}", retryable=False, status=400
            )
        found = self.script[step]
        if found.error is not None:
            # An error reply fails once, then the next entry answers the same step.
            with self._lock:
                self._errors_sent[step] += 1
                sent = self._errors_sent[step]
            if sent > 1 and step + 1 < len(self.script):
                return self.script[step + 1]
        return found


CHUNK = 8  # characters per scripted delta


def stream_deltas(
    content: list[dict[str, Any]], on_event: Any, abort: AbortSignal, pause: float = 0.0
) -> None:
    """Hand `content` to `on_event` as a streaming client would: each block opened, its text,
    thinking or arguments in pieces, closed."""

    def send(delta: dict[str, Any]) -> None:
        if pause and abort.wait(pause):
            raise StreamAborted(abort.reason)
        emit(on_event, delta)

    for index, block in enumerate(content):
        kind = block.get("type")
        start: dict[str, Any] = {"kind": "block_start", "index": index, "block": kind}
        if kind == "tool_use":
            start.update(id=block.get("id"), name=block.get("name"))
        emit(on_event, start)
        field, value = {
            "text": ("text", block.get("text", "")),
            "thinking": ("thinking", block.get("thinking", "")),
            "tool_use": ("partial_json", json.dumps(block.get("input") or {})),
        }.get(kind or "", ("", ""))
        delta_kind = "input_json" if field == "partial_json" else field
        for at in range(0, len(value), CHUNK):
            send({"kind": delta_kind, "index": index, field: value[at : at + CHUNK]})
        emit(on_event, {"kind": "block_stop", "index": index})


def _step(request: ModelRequest) -> int:
    return sum(1 for m in request.messages if m["role"] == "assistant")


def sleep_reply(seconds: float) -> Reply:
    """A reply that takes `seconds` (abortable) before answering."""
    return Reply([text("slow answer")], delay=seconds)


__all__ = ["Reply", "ScriptedClient", "error", "reply", "sleep_reply", "text", "tool_use"]
