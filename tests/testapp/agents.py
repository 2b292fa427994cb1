"""Agents and tools used by the test suite, in worker processes too.

Every handler appends a line to the file named by AGENTRUN_TEST_LOG (if set), so
tests can count executions across processes that were killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django_agentrun import (
    Agent,
    Budget,
    Reconciliation,
    SideEffect,
    ToolContext,
    ToolError,
    ToolResult,
    server_tool,
    tool,
)
from django_agentrun.content import image_block
from django_agentrun.mcp import MCPServer
from tests.mediafiles import png


def record(kind: str, **data) -> None:
    path = os.environ.get("AGENTRUN_TEST_LOG")
    if not path:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), **data}, sort_keys=True)
    with open(path, "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def executions(kind: str | None = None) -> list[dict]:
    path = os.environ.get("AGENTRUN_TEST_LOG")
    if not path or not Path(path).exists():
        return []
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]


@tool(side_effect=SideEffect.READ_ONLY)
def lookup(ctx: ToolContext, query: str) -> dict:
    """Look up a fact."""
    record("lookup", key=ctx.idempotency_key, attempt=ctx.attempt, query=query)
    return {"query": query, "answer": f"fact about {query}"}


@tool(side_effect=SideEffect.IDEMPOTENT_WRITE)
def save_note(ctx: ToolContext, text: str) -> str:
    """Save a note (idempotent by key)."""
    record("save_note", key=ctx.idempotency_key, attempt=ctx.attempt)
    return f"saved {ctx.idempotency_key[:8]}"


def _sent(ctx: ToolContext, to: str, body: str) -> Reconciliation:
    for row in executions("send_message"):
        if row["key"] == ctx.idempotency_key:
            return Reconciliation.done({"message_id": f"m-{row['key'][:12]}"})
    return Reconciliation.not_done()


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_sent)
def send_message(ctx: ToolContext, to: str, body: str) -> dict:
    """Send a message (non-idempotent, with a reconcile check)."""
    record("send_message", key=ctx.idempotency_key, attempt=ctx.attempt, to=to)
    return {"message_id": f"m-{ctx.idempotency_key[:12]}"}


@tool(side_effect=SideEffect.NON_IDEMPOTENT)
def charge_card(ctx: ToolContext, amount_cents: int) -> str:
    """Charge a card (non-idempotent, no reconcile check)."""
    record("charge_card", key=ctx.idempotency_key, attempt=ctx.attempt)
    return f"charged {amount_cents}"


@tool(side_effect=SideEffect.NON_IDEMPOTENT, requires_approval=True)
def delete_account(ctx: ToolContext, user: str) -> str:
    """Delete an account (needs a person's approval)."""
    record("delete_account", key=ctx.idempotency_key, user=user)
    return f"deleted {user}"


@tool(side_effect=SideEffect.READ_ONLY)
def fail_always(reason: str) -> str:
    """A tool that raises."""
    raise ToolError(f"failed on purpose: {reason}")


@tool(side_effect=SideEffect.READ_ONLY)
def explode() -> str:
    """A tool with a bug."""
    raise RuntimeError("secret-token-123 leaked?")


@tool(side_effect=SideEffect.READ_ONLY)
def slow(ctx: ToolContext, seconds: float) -> str:
    """Sleep cooperatively."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.raise_if_cancelled()
        time.sleep(0.05)
    return "slept"


@tool(side_effect=SideEffect.READ_ONLY)
def shell_sleep(ctx: ToolContext, seconds: int) -> str:
    """Run `sleep` as a child process."""
    record("shell_sleep", key=ctx.idempotency_key)
    result = ctx.run_subprocess(["sleep", str(seconds)])
    return f"exit {result.returncode}"


ALL_TOOLS = [
    lookup,
    save_note,
    send_message,
    charge_card,
    delete_account,
    fail_always,
    explode,
    slow,
    shell_sleep,
]

Agent(
    name="test-agent",
    model="claude-sonnet-4-6",
    system="You are a test agent.",
    tools=ALL_TOOLS,
    max_turns=10,
)
Agent(
    name="tiny-budget",
    model="claude-sonnet-4-6",
    tools=ALL_TOOLS,
    budget=Budget(max_output_tokens=5000),
    max_tokens=2000,
)
# The default model (AGENTRUN_DEFAULT_MODEL, claude-sonnet-5-5) with its default options, and
# with thinking on: the crash matrix runs on both.
Agent(name="default-model", system="You are a test agent.", tools=ALL_TOOLS, max_turns=10)
Agent(
    name="default-thinking",
    system="You are a test agent.",
    tools=ALL_TOOLS,
    max_turns=10,
    thinking="adaptive",
)
Agent(name="two-turns", model="claude-sonnet-4-6", tools=ALL_TOOLS, max_turns=2)
Agent(name="capped", model="claude-sonnet-4-6", tools=ALL_TOOLS, max_tool_calls_per_turn=2)
Agent(
    name="budgeted",
    model="claude-sonnet-4-6",
    tools=ALL_TOOLS,
    max_tokens=1000,
    budget=Budget(max_output_tokens=2500),
)
Agent(
    name="cache-budget",
    model="claude-sonnet-4-6",
    tools=ALL_TOOLS,
    max_tokens=500,
    budget=Budget(max_cache_read_tokens=6000),
)
Agent(
    name="cost-budget",
    model="claude-sonnet-4-6",
    tools=ALL_TOOLS,
    max_tokens=500,
    budget=Budget(max_cost_usd=0.05),
)


def _big_refund(arguments: dict, run) -> bool:
    return arguments["amount_cents"] > 10_000


@tool(side_effect=SideEffect.NON_IDEMPOTENT, requires_approval=_big_refund)
def refund(ctx: ToolContext, amount_cents: int) -> str:
    """Refund money; large refunds need a person's approval."""
    record("refund", key=ctx.idempotency_key, amount=amount_cents)
    return f"refunded {amount_cents}"


@tool(side_effect=SideEffect.ATOMIC)
def bump_counter(ctx: ToolContext, name: str) -> int:
    """Increment a counter row (ORM only, inside the result's transaction)."""
    from django.contrib.auth.models import Group

    group, _ = Group.objects.get_or_create(name=f"counter-{name}")
    record("bump_counter", key=ctx.idempotency_key)
    return group.pk


Agent(
    name="approvals",
    model="claude-sonnet-4-6",
    tools=[*ALL_TOOLS, refund, bump_counter],
    approval_timeout=timedelta(hours=1),
)


# Results of every kind: JSON values, rich content, and handler bugs.


@tool(side_effect=SideEffect.READ_ONLY)
def list_accounts(owner: str) -> list:
    """List an owner's accounts (plain records that happen to have a "type" key)."""
    return [{"type": "checking", "balance": 10}, {"type": "savings", "balance": 250}]


@tool(side_effect=SideEffect.READ_ONLY)
def chart(quarter: str) -> ToolResult:
    """Draw the revenue chart of a quarter."""
    return ToolResult(f"Revenue, {quarter}:", image_block(png(64, 48)))


@tool(side_effect=SideEffect.READ_ONLY)
def linked_chart(url: str) -> ToolResult:
    """Show a chart stored elsewhere, by URL."""
    return ToolResult("The chart:", {"type": "image", "source": {"type": "url", "url": url}})


@tool(side_effect=SideEffect.READ_ONLY)
def broken_chart() -> ToolResult:
    """A tool with a bug: it builds a block the Messages API does not accept."""
    return ToolResult({"type": "image", "source": {"type": "base64", "media_type": "image/bmp"}})


@tool(side_effect=SideEffect.READ_ONLY)
def ratio() -> dict:
    """A tool with a bug: its result is not JSON."""
    return {"ratio": float("nan")}


RESULT_TOOLS = [lookup, list_accounts, chart, linked_chart, broken_chart, ratio]
Agent(name="results", model="claude-sonnet-4-6", tools=RESULT_TOOLS, max_turns=6)


# Conversations: a tool that runs the test's hook while it runs (to send a message then).
DURING: dict[str, Any] = {}


@tool(side_effect=SideEffect.READ_ONLY)
def during(ctx: ToolContext, name: str) -> str:
    """Run the test's hook `name` while this tool runs (say, a message sent meanwhile)."""
    record("during", key=ctx.idempotency_key, name=name)
    hook = DURING.get(name)
    if hook is not None:
        hook()
    return f"ran {name}"


Agent(
    name="chat",
    model="claude-sonnet-4-6",
    system="You are a chat agent.",
    tools=[lookup, delete_account, slow, shell_sleep, during],
    max_turns=6,
)


# Server tools: the API runs web search itself, next to this app's own tools (one that may
# need approval: the cache lives an hour), with adaptive thinking. The crash matrix's
# scenario with both uses it.
Agent(
    name="researcher",
    model="claude-sonnet-5-5",
    thinking="adaptive",
    thinking_display="summarized",
    system="You are a research agent. " * 300,  # a prefix long enough to be cached
    tools=[lookup, save_note, send_message, delete_account],
    server_tools=[server_tool("web_search_20250305", max_uses=3)],
    max_turns=30,
)


# A payment whose outcome recovery cannot know (no reconcile check), running the test's hook
# (tests/db/test_late_result.py: the run is recovered while it runs).
@tool(side_effect=SideEffect.NON_IDEMPOTENT)
def pay_during(ctx: ToolContext, name: str) -> str:
    """Pay, running the test's hook `name` meanwhile."""
    record("pay_during", key=ctx.idempotency_key, name=name)
    hook = DURING.get(name)
    if hook is not None:
        hook()
    return f"paid {name}"


Agent(name="late-payments", model="claude-sonnet-4-6", tools=[pay_during], max_turns=4)


def tenant_of(run):
    """A host's AGENTRUN_FAIR_SHARE_KEY (tests/db/test_governor.py)."""
    return f"host:{run.metadata.get('tenant', '-')}"


# Tools from a real MCP server (tests/testapp/mcp_server.py, written with the mcp SDK): over
# stdio, started by each process that lists or calls its tools; over streamable HTTP at the
# URL a test names (AGENTRUN_TEST_MCP_URL), with the run owner's own credentials.
ROOT = Path(__file__).resolve().parents[2]


def _mcp_env() -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "AGENTRUN_TEST_MCP_LOG": os.environ.get("AGENTRUN_TEST_MCP_LOG", ""),
        "AGENTRUN_TEST_MCP_VERSION": os.environ.get("AGENTRUN_TEST_MCP_VERSION", "1"),
        # The protocol it speaks and whether its tools are annotated (mcp_server.py).
        "AGENTRUN_TEST_MCP_PROTOCOL": os.environ.get("AGENTRUN_TEST_MCP_PROTOCOL", ""),
        "AGENTRUN_TEST_MCP_ANNOTATIONS": os.environ.get("AGENTRUN_TEST_MCP_ANNOTATIONS", "1"),
    }


def _refunded(ctx: ToolContext, order: str, amount_cents: int) -> Reconciliation:
    """Whether the MCP server refunded under this call's idempotency key (its own log)."""
    from tests.testapp.mcp_server import calls

    for row in calls("refund"):
        if row["key"] == ctx.idempotency_key:
            return Reconciliation.done(f"refunded {amount_cents} on {order}")
    return Reconciliation.not_done()


def shop(name: str = "shop", **options) -> MCPServer:
    return MCPServer.stdio(
        name,
        sys.executable,
        args=["-m", "tests.testapp.mcp_server"],
        env=_mcp_env,
        cwd=str(ROOT),
        **{"trusted": True, "timeout": 20, **options},
    )


def _owner_token(owner) -> dict[str, str]:
    return {"Authorization": f"Bearer token-of-{getattr(owner, 'username', None) or 'nobody'}"}


# Refunds need a person (the server marks refund destructive).
Agent(name="mcp-shop", model="claude-sonnet-4-6", mcp_servers=[shop()], max_turns=6)
# The crash matrix: refunds without approval, reconciled from the server's own log.
Agent(
    name="mcp-crash",
    model="claude-sonnet-4-6",
    mcp_servers=[shop(tools={"refund": {"requires_approval": False, "reconcile": _refunded}})],
    max_turns=6,
)
# Refunds without approval or a reconcile check: an unknown outcome goes to a person.
Agent(
    name="mcp-unchecked",
    model="claude-sonnet-4-6",
    mcp_servers=[shop(tools={"refund": {"requires_approval": False}})],
    max_turns=6,
)
# Calls answered within half a second, or not at all.
Agent(name="mcp-impatient", model="claude-sonnet-4-6", mcp_servers=[shop(timeout=0.5)])
# An untrusted server, filtered and renamed: its tools are non_idempotent and wait for a
# person, but for the one the host vouches for (shop_stock: read-only, nobody asked).
Agent(
    name="mcp-untrusted",
    model="claude-sonnet-4-6",
    mcp_servers=[
        MCPServer.stdio(
            "shop",
            sys.executable,
            args=["-m", "tests.testapp.mcp_server"],
            env=_mcp_env,
            cwd=str(ROOT),
            include=["stock", "refund", "chart", "broken"],
            rename={"stock": "shop_stock"},
            tools={"shop_stock": {"side_effect": "read_only", "requires_approval": False}},
        )
    ],
    max_turns=6,
)
# An untrusted server as it is (no host settings): every tool non_idempotent, asked first.
Agent(name="mcp-stranger", model="claude-sonnet-4-6", mcp_servers=[shop(trusted=False)])
Agent(
    name="mcp-http",
    model="claude-sonnet-4-6",
    mcp_servers=[
        MCPServer.http(
            "shop",
            lambda: os.environ.get("AGENTRUN_TEST_MCP_URL", "http://127.0.0.1:9/mcp"),
            headers=_owner_token,
            trusted=True,
            timeout=20,
            tools={"refund": {"requires_approval": False}},
        )
    ],
    max_turns=6,
)
