"""Agents and tools of the hardening tests (chaos, leases, cancellation edges): every
execution records its start and end, with wall-clock times, across processes."""

from __future__ import annotations

import sys
import time

from django_agentrun import Agent, Reconciliation, SideEffect, ToolContext, tool

from .agents import executions, record


@tool(side_effect=SideEffect.READ_ONLY)
def slow_read(ctx: ToolContext, seconds: float, label: str = "", once: bool = False) -> str:
    """Read slowly (cooperative: stops when cancelled); `once`: slowly on the first attempt
    only (a re-run after recovery is quick)."""
    record("slow_read", key=ctx.idempotency_key, phase="start", t=time.time(), label=label)
    end = time.monotonic() + (0 if once and ctx.attempt > 1 else seconds)
    while time.monotonic() < end:
        ctx.raise_if_cancelled()
        time.sleep(0.02)
    record("slow_read", key=ctx.idempotency_key, phase="end", t=time.time(), label=label)
    return f"read {label}"


@tool(side_effect=SideEffect.READ_ONLY)
def stubborn(ctx: ToolContext, seconds: float) -> str:
    """Work without ever looking at ctx.cancelled (on the first attempt; a re-run after
    recovery is quick)."""
    record("stubborn", key=ctx.idempotency_key, phase="start", t=time.time())
    time.sleep(seconds if ctx.attempt <= 1 else 0)
    record("stubborn", key=ctx.idempotency_key, phase="end", t=time.time())
    return "done"


def _delivered(ctx: ToolContext, to: str, body: str, seconds: float = 0) -> Reconciliation:
    for row in executions("deliver"):
        if row["key"] == ctx.idempotency_key and row["phase"] == "delivered":
            return Reconciliation.done({"message_id": f"m-{row['key'][:12]}"})
    return Reconciliation.not_done()


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_delivered)
def deliver(ctx: ToolContext, to: str, body: str, seconds: float = 0) -> dict:
    """Deliver a message after `seconds` of work (the provider records it on delivery)."""
    record("deliver", key=ctx.idempotency_key, phase="start", t=time.time(), to=to)
    time.sleep(seconds)
    record("deliver", key=ctx.idempotency_key, phase="delivered", t=time.time(), to=to)
    return {"message_id": f"m-{ctx.idempotency_key[:12]}"}


@tool(side_effect=SideEffect.ATOMIC)
def slow_counter(ctx: ToolContext, name: str, seconds: float) -> int:
    """Count, slowly, in the database only (inside the result's transaction)."""
    from django.contrib.auth.models import Group

    record("slow_counter", key=ctx.idempotency_key, phase="start", t=time.time())
    time.sleep(seconds)
    Group.objects.create(name=f"slow-{name}-{ctx.idempotency_key[:16]}")
    record("slow_counter", key=ctx.idempotency_key, phase="end", t=time.time())
    return Group.objects.filter(name__startswith=f"slow-{name}-").count()


@tool(side_effect=SideEffect.READ_ONLY)
def busy_read(ctx: ToolContext, seconds: float, label: str = "") -> str:
    """Read for `seconds`, telling the runtime it is alive every 0.1 s (ctx.heartbeat writes
    the call's heartbeat through the ORM: this thread holds a database connection meanwhile,
    as an MCP call's progress ticks do)."""
    record("busy_read", key=ctx.idempotency_key, phase="start", t=time.time(), label=label)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.raise_if_cancelled()
        ctx.heartbeat()
        time.sleep(0.1)
    record("busy_read", key=ctx.idempotency_key, phase="end", t=time.time(), label=label)
    return f"read {label}"


# The child: after `seconds`, it has its effect (a line in the test log, flushed to disk).
_CHILD = """
import json, os, sys, time
seconds, key, attempt = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
time.sleep(seconds)
line = {"kind": "child_effect", "phase": "effect", "key": key, "attempt": attempt,
        "pid": os.getpid()}
with open(os.environ["AGENTRUN_TEST_LOG"], "a") as fh:
    fh.write(json.dumps(line, sort_keys=True) + "\\n")
    fh.flush()
    os.fsync(fh.fileno())
"""


def _child_effect_done(ctx: ToolContext, seconds: float) -> Reconciliation:
    for row in executions("child_effect"):
        if row["phase"] == "effect" and row["key"] == ctx.idempotency_key:
            return Reconciliation.done({"effect_of_attempt": row["attempt"]})
    return Reconciliation.not_done()


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_child_effect_done)
def child_effect(ctx: ToolContext, seconds: float) -> str:
    """Deliver through a child process, which has its effect after `seconds`."""
    record("child_effect", key=ctx.idempotency_key, phase="start", attempt=ctx.attempt)
    args = [sys.executable, "-c", _CHILD, str(seconds), ctx.idempotency_key, str(ctx.attempt)]
    ctx.run_subprocess(args, timeout=seconds + 30)
    return "delivered"


Agent(
    name="hardening",
    model="claude-sonnet-4-6",
    system="You are a test agent.",
    tools=[slow_read, stubborn, deliver, slow_counter, child_effect, busy_read],
    max_turns=10,
)
