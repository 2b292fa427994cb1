"""The bench's model client: zero latency, scripted per scenario.

`AGENTRUN_MODEL_CLIENT=bench.clients.BenchClient` (a zero-argument class, imported
by the workers). The scenario is the agent's system prompt ("bench:<name>", see
bench.benchapp.agents); parameters come from the run's input ("k=4 turns=10").
The reply is chosen by step (the number of assistant messages so far), so asking
again for a step (after a crash) gives the same answer, ids included.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from typing import Any

from django_agentrun.abort import AbortSignal
from django_agentrun.clients import ModelRequest, ModelResponse, StreamAborted, Usage

_ids = itertools.count(1)
USAGE = Usage(input_tokens=100, output_tokens=10)


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def _tool_use(name: str, input: dict[str, Any], key: str) -> dict[str, Any]:
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return {"type": "tool_use", "id": f"toolu_{digest}", "name": name, "input": input}


def _params(request: ModelRequest) -> tuple[str, dict[str, str]]:
    first = request.messages[0]["content"] if request.messages else ""
    text = first if isinstance(first, str) else ""
    params = dict(part.split("=", 1) for part in text.split() if "=" in part)
    return text, params


def log_call(kind: str, key: str) -> None:
    """One line per model answer or tool execution in BENCH_CALLS_LOG (bench/load.py counts
    the keys seen twice): an O_APPEND write of a short line, whole from every process."""
    path = os.environ.get("BENCH_CALLS_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{kind} {key}\n".encode())
        finally:
            os.close(fd)


def _run_key(request: ModelRequest) -> str:
    text, params = _params(request)
    step = sum(1 for m in request.messages if m["role"] == "assistant")
    return f"{params.get('id', text)}:{step}"


def scenario_of(request: ModelRequest) -> str:
    for block in request.system:
        value = block.get("text", "")
        if value.startswith("bench:"):
            return value.removeprefix("bench:")
    return ""


def script(request: ModelRequest) -> tuple[list[dict[str, Any]], str]:
    """(content, stop_reason) of the reply to `request`."""
    scenario = scenario_of(request)
    step = sum(1 for m in request.messages if m["role"] == "assistant")
    text, params = _params(request)
    run_key = f"{params.get('id', text)}:{step}"
    if scenario == "engine":
        k, turns = int(params["k"]), int(params["turns"])
        if step >= turns - 1:
            return [_text("final answer")], "end_turn"
        calls = [_tool_use("lookup", {"query": f"q{step}-{i}"}, f"{run_key}:{i}") for i in range(k)]
        return [_text(f"step {step}"), *calls], "tool_use" if k else "pause_turn"
    if scenario == "parallel":
        if step >= 1:
            return [_text("done")], "end_turn"
        k, ms = int(params["k"]), int(params["ms"])
        calls = [_tool_use("wait", {"ms": ms, "n": i}, f"{run_key}:{i}") for i in range(k)]
        return calls, "tool_use"
    if scenario == "throughput":
        if step >= 2:
            return [_text("done")], "end_turn"
        return [_tool_use("lookup", {"query": f"q{step}"}, run_key)], "tool_use"
    if scenario == "recovery":
        if step >= 1:
            return [_text("recovered")], "end_turn"
        return [_tool_use("stall", {"seconds": 60}, run_key)], "tool_use"
    if scenario == "failpoints":
        if step >= 1:
            return [_text("recovered")], "end_turn"
        calls = [
            _tool_use("lookup", {"query": "q"}, f"{run_key}:0"),
            _tool_use("fetch_page", {"query": "p", "size": 100}, f"{run_key}:1"),
        ]
        return calls, "tool_use"
    if scenario == "cancel-tool":
        if step >= 1:
            return [_text("slept")], "end_turn"
        return [_tool_use("shell_sleep", {"seconds": params["sleep"]}, run_key)], "tool_use"
    if scenario == "storage":
        from .benchapp.agents import noise

        turns, size = int(params["turns"]), int(params["text"])
        answer = _text(noise(size, run_key))
        if step >= turns - 1:
            return [answer], "end_turn"
        query = {"query": f"page {step}", "size": int(params["result"])}
        return [answer, _tool_use("fetch_page", query, run_key)], "tool_use"
    return [_text(f"no bench script for scenario {scenario!r}")], "end_turn"


class BenchClient:
    """A ModelClient answering from `script` at once (no I/O, no sleeping)."""

    def create(self, request: ModelRequest, *, abort: AbortSignal) -> ModelResponse:
        if abort.aborted:
            raise StreamAborted(abort.reason)
        content, stop = script(request)
        log_call("model", _run_key(request))
        n = next(_ids)
        return ModelResponse(
            message_id=f"msg_bench_{n:08d}",
            request_id=f"req_bench_{n:08d}",
            content=content,
            stop_reason=stop,
            usage=USAGE,
            model=request.model,
        )
