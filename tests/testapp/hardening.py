"""Agents and tools of the hardening tests (chaos, leases, cancellation edges): every
execution records its start and end, with wall-clock times, across processes."""

from __future__ import annotations

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


Agent(
    name="hardening",
    model="claude-sonnet-4-5",
    system="You are a test agent.",
    tools=[slow_read, stubborn, deliver],
    max_turns=10,
)
