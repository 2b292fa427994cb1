"""A poison step (the worker dies every time) ends as recovery_exhausted, never loops."""

from __future__ import annotations

import pytest

from django_agentrun import start_run
from django_agentrun.engine import advance
from django_agentrun.failpoints import FailpointError
from django_agentrun.models import RunEvent
from django_agentrun.recovery import reap
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.factories import expire
from tests.testapp.agents import executions

pytestmark = pytest.mark.django_db


def _poisoned_run(monkeypatch, test_log):
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_handler@lookup=raise")
    client = ScriptedClient([reply(tool_use("lookup", {"query": "x"})), reply(text("never"))])
    run = start_run("test-agent", "go")
    with pytest.raises(FailpointError):
        advance(run.pk, client=client)  # dies after the handler: the lease is left to lapse
    return run, client


def test_recovery__capped_in_the_engine(monkeypatch, settings, test_log):
    settings.AGENTRUN_MAX_RECOVERY_ATTEMPTS = 2
    run, client = _poisoned_run(monkeypatch, test_log)
    for _ in range(2):  # each recovery re-runs the read_only call, which dies again
        expire(run)
        with pytest.raises(FailpointError):
            advance(run.pk, client=client)
    expire(run)
    assert advance(run.pk, client=client) == "finished"
    run.refresh_from_db()
    assert (run.state, run.error_code, run.failure_phase) == (
        "failed",
        "recovery_exhausted",
        "recovery",
    )
    assert len(executions("lookup")) == 3  # never more than the cap allows
    call = run.tool_calls.get()
    assert call.state == "cancelled" and call.is_error  # the transcript stays valid
    assert len(client.requests) == 1


def test_recovery__capped_by_the_reaper(monkeypatch, settings, test_log):
    settings.AGENTRUN_MAX_RECOVERY_ATTEMPTS = 1
    run, client = _poisoned_run(monkeypatch, test_log)
    expire(run)
    with pytest.raises(FailpointError):
        advance(run.pk, client=client)  # recovery 1, dies again
    expire(run)
    report = reap()
    assert [f.kind for f in report.findings] == ["recovery_exhausted"]
    run.refresh_from_db()
    assert (run.state, run.error_code) == ("failed", "recovery_exhausted")
    assert RunEvent.objects.filter(run=run, type="run_failed").count() == 1


def test_recovery__the_reapers_step_starts_no_further_call(monkeypatch, test_log):
    """settle_in_flight reconciles the dead call but leaves the next one requested
    (it may not go in_flight early: that step runs no handler)."""
    from django_agentrun.engine import settle_in_flight

    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_handler@send_message=raise")
    client = ScriptedClient(
        [
            reply(
                tool_use("send_message", {"to": "ann@example.com", "body": "hi"}),
                tool_use("lookup", {"query": "x"}),
            ),
            reply(text("done")),
        ]
    )
    run = start_run("test-agent", "go")
    with pytest.raises(FailpointError):
        advance(run.pk, client=client)
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    expire(run)
    settle_in_flight(run.pk)
    send, look = run.tool_calls.order_by("position")
    assert (send.state, send.result_source) == ("succeeded", "reconciled")
    assert (look.state, look.attempt) == ("requested", 0)
    assert executions("lookup") == []
    run.refresh_from_db()
    assert (run.state, run.lease_owner) == ("awaiting_tool", "")  # released for a worker
