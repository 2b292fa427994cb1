"""A tool without a declared side effect is never re-run blindly (it counts as
non_idempotent) and `manage.py check` names it; SQLite without RETURNING is an error."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_agentrun import Agent, SideEffect, start_run, tool
from django_agentrun.agents import unregister_agent
from django_agentrun.checks import check_sqlite_version, check_tool_side_effects
from django_agentrun.failpoints import FailpointError
from django_agentrun.models import Run, ToolCall
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive

RAN: list[str] = []


@tool
def undeclared(note: str) -> str:
    """Does something; nobody said what."""
    RAN.append(note)
    return "done"


@tool(side_effect=SideEffect.READ_ONLY)
def declared(note: str) -> str:
    """Reads something."""
    return note


UNDECLARED_AGENT = Agent(
    name="undeclared-side-effect", tools=[undeclared, declared], register=False
)


@pytest.fixture
def undeclared_agent():
    """UNDECLARED_AGENT's twin, registered for one test."""
    agent = Agent(name=UNDECLARED_AGENT.name, tools=[undeclared, declared])
    yield agent
    unregister_agent(agent.name)


def test_tool__undeclared_side_effect_is_non_idempotent_and_says_so():
    assert undeclared.side_effect == SideEffect.NON_IDEMPOTENT
    assert undeclared.side_effect_declared is False
    assert declared.side_effect_declared is True
    assert UNDECLARED_AGENT.snapshot()["side_effects"]["undeclared"] == "non_idempotent"


@pytest.mark.django_db
def test_tool__undeclared_is_not_re_run_after_a_crash(monkeypatch, undeclared_agent):
    """In flight when its worker died: a read_only tool would run again; this one waits."""
    RAN.clear()
    client = ScriptedClient([reply(tool_use("undeclared", {"note": "x"})), reply(text("ok"))])
    run = start_run("undeclared-side-effect", "go")
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_handler=raise")
    with pytest.raises(FailpointError):
        drive(run, client)  # the handler ran; its result was never recorded
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    drive(run, client)
    call = ToolCall.objects.get(run=run)
    assert (run.state, call.state, call.side_effect) == (
        "awaiting_approval",
        "unknown",
        "non_idempotent",
    )
    assert RAN == ["x"]  # once, not again


def test_tool__a_blank_side_effect_is_a_configuration_error():
    from django_agentrun.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="side_effect must be one of"):
        tool(side_effect="")(lambda: None)


def test_check__lists_tools_relying_on_the_default(monkeypatch):
    monkeypatch.setattr("django_agentrun.agents.registered_agents", lambda: {"a": UNDECLARED_AGENT})
    (found,) = check_tool_side_effects()
    assert found.id == "agentrun.W005"
    assert "undeclared" in found.msg and "declared," not in found.msg
    assert "side_effect=SideEffect." in found.hint


def test_check__clean_when_every_tool_declares_it():
    assert check_tool_side_effects() == []  # the test app and example project declare all


@pytest.mark.skipif(connection.vendor != "sqlite", reason="an SQLite database is configured")
def test_check__sqlite_without_returning_is_an_error(monkeypatch):
    monkeypatch.setattr(sqlite3.dbapi2, "sqlite_version_info", (3, 31, 1))
    (found,) = check_sqlite_version()
    assert found.id == "agentrun.E005"
    assert "3.31.1" in found.msg and "RETURNING" in found.msg
    assert found.hint


def test_check__current_sqlite_is_fine():
    assert sqlite3.sqlite_version_info >= (3, 35)
    assert check_sqlite_version() == []
