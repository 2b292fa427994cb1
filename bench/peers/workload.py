"""The side-by-side workload, the same for django-agentrun, DBOS and LangGraph.

Standard library only: the peers' virtualenv imports it as well as the project's.

A run's input is one line of text, `side-by-side k=K turns=T payload=P id=ID`, and its
messages are plain dicts in the Messages API's shape. The "zero-latency model"
(`model_reply`) answers from the messages so far: the reply's step is the number of
assistant messages already there, so asking again for a step gives the same answer,
ids included. Steps 0 .. T-1 are the run's T turns: a text block and k `tool_use` blocks
(stop_reason `tool_use`; with k = 0 `pause_turn`, the same loop without tools); step T
is the final answer (`end_turn`). A T-turn run therefore makes T + 1 model calls.

Payloads: `small` (a few bytes of text, a `lookup` call with a one-word query whose
result is a two-key JSON object) and `realistic` (2,000 characters of text per model
response, a `fetch_page` call whose result is 1,000 characters). Text is incompressible
(base64 of hashes), so TOAST compression hides nothing. The tools are the ones of
bench/benchapp/agents.py (`lookup`, `fetch_page`) with the same results.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

PAYLOADS = ("small", "realistic")
REALISTIC_TEXT = 2000  # characters of text per model response
REALISTIC_RESULT = 1000  # characters per tool result


def noise(size: int, seed: str = "") -> str:
    """`size` characters of deterministic, incompressible text (bench.benchapp.agents.noise)."""
    out, block = [], seed.encode()
    while sum(len(x) for x in out) < size:
        block = hashlib.sha256(block).digest()
        out.append(base64.b64encode(block).decode())
    return "".join(out)[:size]


def input_text(k: int, turns: int, payload: str, run_id: str) -> str:
    return f"side-by-side k={k} turns={turns} payload={payload} id={run_id}"


def params(messages: list[dict[str, Any]]) -> dict[str, str]:
    first = messages[0]["content"] if messages else ""
    if isinstance(first, list):  # [{"type": "text", "text": ...}]
        first = " ".join(b.get("text", "") for b in first)
    text = first if isinstance(first, str) else ""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def _tool_use(name: str, input: dict[str, Any], key: str) -> dict[str, Any]:
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return {"type": "tool_use", "id": f"toolu_{digest}", "name": name, "input": input}


def reply(p: dict[str, str], step: int) -> tuple[list[dict[str, Any]], str]:
    """(content, stop_reason) of the model's answer at `step` of the run with params `p`."""
    k, turns, payload, run_id = int(p["k"]), int(p["turns"]), p["payload"], p["id"]
    key = f"{run_id}:{step}"
    realistic = payload == "realistic"
    if step >= turns:
        text = noise(REALISTIC_TEXT, key) if realistic else "final answer"
        return [{"type": "text", "text": text}], "end_turn"
    text = noise(REALISTIC_TEXT, key) if realistic else f"step {step}"
    if realistic:
        calls = [
            _tool_use(
                "fetch_page", {"query": f"p{step}-{i}", "size": REALISTIC_RESULT}, f"{key}:{i}"
            )
            for i in range(k)
        ]
    else:
        calls = [_tool_use("lookup", {"query": f"q{step}-{i}"}, f"{key}:{i}") for i in range(k)]
    return [{"type": "text", "text": text}, *calls], "tool_use" if k else "pause_turn"


def model_reply(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The zero-latency model: the canned reply to `messages` (see the module docstring)."""
    step = sum(1 for m in messages if m["role"] == "assistant")
    return reply(params(messages), step)


def run_tool(name: str, input: dict[str, Any]) -> Any:
    """The no-op tools: bench.benchapp.agents.lookup and fetch_page, returning at once."""
    if name == "lookup":
        return {"query": input["query"], "answer": "42"}
    if name == "fetch_page":
        return noise(int(input["size"]), input["query"])
    raise ValueError(f"unknown tool {name!r}")


def tool_result_block(call: dict[str, Any]) -> dict[str, Any]:
    """The tool_result block of one tool_use block (a result that is not text as JSON)."""
    value = run_tool(call["name"], call["input"])
    content = value if isinstance(value, str) else json.dumps(value)
    return {"type": "tool_result", "tool_use_id": call["id"], "content": content}


def tool_uses(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in content if b.get("type") == "tool_use"]


def transcript(k: int, turns: int, payload: str, run_id: str) -> list[dict[str, Any]]:
    """The whole conversation of a run, as the model would be sent it after its last turn:
    the input, each answer, and after each answer with tool calls one user message with
    their results (in order)."""
    p = {"k": str(k), "turns": str(turns), "payload": payload, "id": run_id}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": input_text(k, turns, payload, run_id)}
    ]
    for step in range(turns + 1):
        content, _ = reply(p, step)
        messages.append({"role": "assistant", "content": content})
        calls = tool_uses(content)
        if calls:
            messages.append({"role": "user", "content": [tool_result_block(c) for c in calls]})
    return messages


def transcript_bytes(k: int, turns: int, payload: str, run_id: str = "x" * 12) -> int:
    """Bytes of the transcript's JSON (the id's length only changes a few bytes)."""
    return len(json.dumps(transcript(k, turns, payload, run_id)).encode())


def _normal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with each tool result that is JSON parsed (a system may store a result
    as JSON of its own formatting: compact, keys sorted)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [_parsed(b) if b.get("type") == "tool_result" else b for b in content]
        out.append({"role": m["role"], "content": content})
    return out


def _parsed(block: dict[str, Any]) -> dict[str, Any]:
    try:
        return {**block, "content": json.loads(block["content"])}
    except (TypeError, ValueError):
        return block


class Recorder:
    """Wraps the model for one system: records the time (and the process's CPU time) of
    every call and, in counted runs, what `probe` returns at each call (the WAL insert
    position, read through a connection of its own), and checks the messages."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.probes: list[Any] = []
        self.probe: Callable[[], Any] | None = None
        self.check = False  # compare the messages each call sees with the transcript
        self.mismatches: list[str] = []

    def reset(self, probe: Callable[[], Any] | None = None, check: bool = False) -> None:
        self.times, self.cpu, self.probes = [], [], []
        self.probe, self.check, self.mismatches = probe, check, []

    def model(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        self.times.append(time.perf_counter())
        self.cpu.append(time.process_time())
        if self.probe is not None:
            self.probes.append(self.probe())
        if self.check:
            self._check(messages)
        return model_reply(messages)

    def _check(self, messages: list[dict[str, Any]]) -> None:
        """The messages a system hands the model must be the transcript so far."""
        p = params(messages)
        expected = _normal(transcript(int(p["k"]), int(p["turns"]), p["payload"], p["id"]))
        seen = _normal([{"role": m["role"], "content": m["content"]} for m in messages])
        if seen != expected[: len(seen)]:
            step = sum(1 for m in messages if m["role"] == "assistant")
            self.mismatches.append(
                f"step {step}: {json.dumps(seen)[-300:]} != {json.dumps(expected[: len(seen)])[-300:]}"
            )

    def figures(self) -> dict[str, Any]:
        return {
            "times": self.times,
            "cpu": self.cpu,
            "probes": self.probes,
            "mismatches": self.mismatches,
        }
