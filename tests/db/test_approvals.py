"""Approvals through the services: tokens, edits, decisions, deadlines, signals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from django_agentrun import approve_tool_call, reject_tool_call, start_run
from django_agentrun.engine import Outcome, advance
from django_agentrun.exceptions import ApprovalError, InvalidToken
from django_agentrun.models import RunEvent, ToolCall
from django_agentrun.recovery import reap
from django_agentrun.services import approval_token, check_approval_token
from django_agentrun.signals import approval_requested
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive_last

pytestmark = pytest.mark.django_db


@pytest.fixture
def person():
    return get_user_model().objects.create_user("pat", password="x")


def parked_beside_lookup(args=None, name="delete_account", agent="approvals"):
    client = ScriptedClient(
        [
            reply(
                tool_use(name, args or {"user": "bob"}, id="toolu_a"),
                tool_use("lookup", {"query": "q"}, id="toolu_b"),
            ),
            reply(text("Done.")),
        ]
    )
    run = start_run(agent, "Do it")
    assert drive_last(run, client) == Outcome.PARKED
    return run, client, run.tool_calls.get(tool_call_id="toolu_a")


def test_approval__parks_with_payload_and_deadline__the_signal_carries_a_token(
    django_capture_on_commit_callbacks,
):
    seen = []
    approval_requested.connect(lambda sender, **kw: seen.append(kw), weak=False, dispatch_uid="t1")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            run, _, call = parked_beside_lookup()
    finally:
        approval_requested.disconnect(dispatch_uid="t1")
    assert run.state == "awaiting_approval" and call.state == "awaiting_approval"
    assert call.approval_payload["arguments"] == {"user": "bob"}
    assert "token" not in call.approval_payload  # never stored: minted for who decides
    assert call.approval_deadline is not None
    assert len(seen) == 1 and seen[0]["tool_call"].pk == call.pk
    check_approval_token(call, seen[0]["token"])  # the signal's receivers get one
    assert RunEvent.objects.filter(run=run, type="approval_requested").count() == 1


def test_approval__approve_then_the_run_finishes_and_twice_is_a_noop(person):
    run, client, call = parked_beside_lookup()
    approve_tool_call(call, by=person, note="ok", token=approval_token(call))
    run.refresh_from_db()
    assert run.state == "awaiting_tool"
    events = run.last_seq
    approve_tool_call(call, by=person)  # no-op
    run.refresh_from_db()
    assert run.last_seq == events
    drive_last(run, client)
    assert run.state == "completed"
    call.refresh_from_db()
    assert call.state == "succeeded" and call.decided_by == person and call.decision_note == "ok"
    assert_projection_matches(run)


def test_approval__forged_or_stale_token_is_refused(person):
    run, _, call = parked_beside_lookup()
    with pytest.raises(InvalidToken):
        approve_tool_call(call, by=person, token=approval_token(call) + "x")
    stale = approval_token(call)
    ToolCall.objects.filter(pk=call.pk).update(arguments_hash="0" * 64)
    with pytest.raises(InvalidToken):
        approve_tool_call(call, by=person, token=stale)
    call.refresh_from_db()
    assert call.state == "awaiting_approval"


def test_approval__edited_arguments_are_revalidated_and_recorded(person):
    run, client, call = parked_beside_lookup()
    with pytest.raises(ApprovalError, match="user"):
        approve_tool_call(call, by=person, arguments={"user": 5, "extra": 1})
    call.refresh_from_db()
    assert call.state == "awaiting_approval" and call.arguments == {"user": "bob"}
    approve_tool_call(call, by=person, arguments={"user": "carol"})
    call.refresh_from_db()
    assert call.arguments == {"user": "carol"} and call.original_arguments == {"user": "bob"}
    drive_last(run, client)
    call.refresh_from_db()
    assert call.result == "deleted carol"
    assert_projection_matches(run)


def test_approval__rejection_tells_the_model_and_the_run_goes_on(person):
    run, client, call = parked_beside_lookup()
    reject_tool_call(call, by=person, reason="not allowed on Fridays")
    call.refresh_from_db()
    assert call.state == "rejected" and call.is_error and "not allowed on Fridays" in call.result
    drive_last(run, client)
    assert run.state == "completed"
    # The model saw the rejection as the first tool_result, in order, then the lookup's.
    results = client.requests[-1].messages[-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_a", "toolu_b"]
    assert results[0]["is_error"] is True
    with pytest.raises(ApprovalError, match="not awaiting approval"):
        approve_tool_call(call, by=person)
    assert_projection_matches(run)


def test_approval__callable_policy(person):
    client = ScriptedClient([reply(tool_use("refund", {"amount_cents": 500})), reply(text("ok"))])
    run = start_run("approvals", "small refund")
    assert drive_last(run, client) == Outcome.FINISHED
    assert run.state == "completed"
    run, _, call = parked_beside_lookup({"amount_cents": 50_000}, name="refund")
    assert call.state == "awaiting_approval"


def test_approval__deadline_times_the_run_out():
    run, _, call = parked_beside_lookup()
    ToolCall.objects.filter(pk=call.pk).update(
        approval_deadline=timezone.now() - timedelta(seconds=1)
    )
    report = reap()
    assert [f.kind for f in report.findings] == ["approval_deadline"]
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.state == "timed_out"
    assert call.state == "cancelled" and "Timed out" in call.result
    assert_projection_matches(run)


def test_deadline__run_times_out_at_the_next_step_keeping_partial_outputs(settings):
    settings.AGENTRUN_TURNS_PER_TASK = 1  # a task per turn: the deadline passes in between
    client = ScriptedClient([reply(tool_use("lookup", {"query": "a"})), reply(text("never sent"))])
    run = start_run("test-agent", "go", deadline=timedelta(hours=1))
    assert advance(run.pk, client=client) == Outcome.CONTINUED  # turn 0 with its tool result
    run.refresh_from_db()
    type(run).objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert advance(run.pk, client=client) == Outcome.FINISHED
    run.refresh_from_db()
    assert run.state == "timed_out"
    assert len(client.requests) == 1
    assert run.tool_calls.get().state == "succeeded"  # the partial output is kept
    assert_projection_matches(run)


def test_deadline__reaper_times_out_a_queued_run():
    run = start_run("test-agent", "go", deadline=timezone.now() - timedelta(seconds=1))
    reap()
    run.refresh_from_db()
    assert run.state == "timed_out"
    assert_projection_matches(run)


def test_atomic_tool__runs_inside_the_result_transaction():
    client = ScriptedClient([reply(tool_use("bump_counter", {"name": "x"})), reply(text("ok"))])
    run = start_run("approvals", "count")
    drive_last(run, client)
    assert run.state == "completed"
    call = run.tool_calls.get()
    assert call.state == "succeeded" and call.attempt == 0
    # No in_flight was ever committed for it.
    assert not RunEvent.objects.filter(run=run, type="tool_call_started").exists()
    assert_projection_matches(run)
