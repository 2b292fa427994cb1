"""A side-effect class's meaning in one table (side_effects.MEANINGS, issue #36), read by
recovery, batching, execution, MCP and the admin; and `Tool`, one interface with two
implementations (the function tool, the MCP tool), both made through `Tool.__init__`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_agentrun import SideEffect, tool
from django_agentrun.engine.policy import RERUNNABLE
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.mcp import MCPServer
from django_agentrun.mcp.tools import MCPTool
from django_agentrun.side_effects import MEANINGS, meaning, table
from django_agentrun.tools import FunctionTool, Tool

ROOT = Path(__file__).resolve().parents[2]


def test_table__one_row_per_class_and_the_docs_show_it():
    assert set(MEANINGS) == set(SideEffect)
    page = (ROOT / "docs" / "how-to" / "tools.md").read_text()
    found = re.search(
        r"<!-- side-effects-table:[^\n]*-->\n(.*?)<!-- /side-effects-table -->", page, re.S
    )
    assert found and found.group(1) == table(), "paste side_effects.table() into the page"


def test_table__is_what_recovery_batching_and_mcp_read():
    assert set(RERUNNABLE) == {s for s, m in MEANINGS.items() if m.rerun_after_crash}
    assert SideEffect.NON_IDEMPOTENT not in RERUNNABLE

    def look(query: str) -> str:
        """Look."""
        return query

    for side_effect, row in MEANINGS.items():
        made = tool(side_effect=side_effect)(look)
        assert made.runs_together({"query": "q"}, None, approved=False) is row.batches
        assert made.in_transaction is row.in_transaction
    with pytest.raises(ConfigurationError, match="cannot be atomic"):
        MCPServer.stdio("s", "x", tools={"t": {"side_effect": "atomic"}})  # not for_mcp
    assert not meaning("atomic").for_mcp


def _record(**changes):
    record = {
        "server": "shop",
        "remote": "refund",
        "definition": {"name": "refund", "description": "Refund.", "input_schema": {}},
        "side_effect": "non_idempotent",
        "requires_approval": True,
        "annotations": {},
    }
    record.update(changes)
    return record


def test_tool__one_interface_two_implementations():
    def look(query: str) -> str:
        """Look."""
        return query

    function = Tool(look, side_effect="read_only")  # as it always did: a function tool
    assert type(function) is FunctionTool and isinstance(function, Tool)
    server = MCPServer.stdio("shop", "x")
    remote = MCPTool(server, _record())
    assert isinstance(remote, Tool) and not isinstance(remote, FunctionTool)
    # Both made by Tool.__init__: the same attributes, the same checks.
    shared = ("name", "description", "side_effect", "side_effect_declared", "reconcile")
    shared += ("requires_approval", "approval_timeout")
    for made in (function, remote):
        assert all(hasattr(made, attribute) for attribute in shared)
    assert remote.needs_approval({}, None) is True and not remote.in_transaction
    assert remote.definition()["name"] == "refund"
    with pytest.raises(ConfigurationError, match="side_effect must be one of"):
        MCPTool(server, _record(side_effect="sometimes"))
    with pytest.raises(ConfigurationError, match="1 to 64"):
        MCPTool(server, _record(definition={"name": "r" * 65, "input_schema": {}}))
