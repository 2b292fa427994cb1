"""Agents of the benchmarks. Each agent's system prompt names its scenario
("bench:<name>"), which is how bench.clients.BenchClient picks the script."""

from __future__ import annotations

import base64
import hashlib
import time

from django_agentrun import Agent, SideEffect, ToolContext, tool


def noise(size: int, seed: str = "") -> str:
    """`size` characters of deterministic, incompressible text (like real content to TOAST)."""
    out, block = [], seed.encode()
    while sum(len(x) for x in out) < size:
        block = hashlib.sha256(block).digest()
        out.append(base64.b64encode(block).decode())
    return "".join(out)[:size]


@tool(side_effect=SideEffect.READ_ONLY)
def lookup(ctx: ToolContext, query: str) -> dict:
    """Look up a fact (returns at once)."""
    from bench.clients import log_call

    log_call("tool", ctx.idempotency_key)
    return {"query": query, "answer": "42"}


@tool(side_effect=SideEffect.READ_ONLY)
def fetch_page(query: str, size: int) -> str:
    """Fetch a page of text (returns `size` characters at once)."""
    return noise(size, query)


@tool(side_effect=SideEffect.READ_ONLY)
def stall(ctx: ToolContext, seconds: float) -> str:
    """Hang on the first attempt (the worker is killed meanwhile); return at once on a re-run."""
    if ctx.attempt <= 1:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.05)
    return f"done on attempt {ctx.attempt}"


@tool(side_effect=SideEffect.READ_ONLY)
def shell_sleep(ctx: ToolContext, seconds: str) -> str:
    """Run `sleep SECONDS` as a child process (cancellable through ctx.run_subprocess)."""
    result = ctx.run_subprocess(["sleep", seconds])
    return f"exit {result.returncode}"


@tool(side_effect=SideEffect.READ_ONLY)
def wait(ctx: ToolContext, ms: int, n: int) -> str:
    """Look something up that takes `ms` milliseconds (a real lookup's latency)."""
    ctx.abort.wait(ms / 1000)
    return f"answer {n}"


def _agent(name: str, tools: list, max_turns: int = 1000) -> Agent:
    return Agent(
        name=name,
        model="claude-sonnet-4-6",
        system=f"bench:{name.removeprefix('bench-')}",
        tools=tools,
        max_turns=max_turns,
        max_tool_calls_per_turn=16,
    )


ENGINE = _agent("bench-engine", [lookup])
THROUGHPUT = _agent("bench-throughput", [lookup])
RECOVERY = _agent("bench-recovery", [stall])
FAILPOINTS = _agent("bench-failpoints", [lookup, fetch_page])
CANCEL_STREAM = _agent("bench-cancel-stream", [])
CANCEL_TOOL = _agent("bench-cancel-tool", [shell_sleep])
STORAGE = _agent("bench-storage", [fetch_page])
PARALLEL = _agent("bench-parallel", [wait])
GOVERNOR = _agent("bench-governor", [lookup])
