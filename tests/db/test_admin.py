"""The admin: read-only machine fields, decisions and run actions through services only."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.urls import reverse

from django_agentrun import services, start_run
from django_agentrun.admin import (
    RUN_STATE_COLOURS,
    TOOL_CALL_STATE_COLOURS,
    TURN_STATE_COLOURS,
)
from django_agentrun.admin.conversations import STATUS_COLOURS
from django_agentrun.engine import Outcome
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.states import ConversationStatus, RunState, ToolCallState, TurnState
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests import factories
from tests.conftest import drive

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

TOOLCALLS = reverse("admin:agentrun_toolcall_changelist")
ALL_TOOLCALLS = TOOLCALLS + "?decision=all"
RUNS = reverse("admin:agentrun_run_changelist")
EVENTS = reverse("admin:agentrun_runevent_changelist")
# Operators of the console: they see every run (tests/db/test_admin_parity.py walks the
# scoping, users who see only their own runs).
VIEW_PERMS = ["view_run", "view_toolcall", "view_runevent", "view_all_runs"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def make_staff(db):
    def make(username: str, *codenames: str) -> User:
        return factories.user(username, *VIEW_PERMS, *codenames, is_staff=True)

    return make


@pytest.fixture
def viewer(make_staff):
    return make_staff("viewer")


@pytest.fixture
def approver(make_staff):
    return make_staff("approver", "approve_toolcall")


@pytest.fixture
def operator(make_staff):
    return make_staff("operator", "cancel_run")


@pytest.fixture
def parked():
    return factories.parked()


@pytest.fixture
def unknown(monkeypatch):
    return factories.unknown(monkeypatch)


def call_url(call, kind=None):
    if kind is None:
        return reverse("admin:agentrun_toolcall_change", args=[call.pk])
    return reverse(f"admin:agentrun_toolcall_{kind}", args=[call.pk])


def texts(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def errors(response) -> list[str]:
    return [message for level, message in texts(response) if level == "error"]


def action(client, url, name, objs, **extra):
    data = {"action": name, "_selected_action": [str(o.pk) for o in objs], "index": "0", **extra}
    return client.post(url, data, follow=True)


def confirmed(client, url, name, objs, **extra):
    """A decision action through its confirmation page: the page, then its form posted back
    with the tokens it carries (and `extra`, what the person typed)."""
    page = action(client, url, name, objs)
    assert page.status_code == 200 and 'id="agentrun-bulk-form"' in page.text, texts(page)
    tokens = dict(re.findall(r'name="(token-\d+)" value="([^"]+)"', page.text))
    data = {
        "action": name,
        "_selected_action": re.findall(r'name="_selected_action" value="(\d+)"', page.text),
        "apply": "1",
        **tokens,
        **extra,
    }
    return client.post(url, data, follow=True)


def snapshot(call):
    call.refresh_from_db()
    return (
        call.state,
        call.arguments,
        call.result,
        RunEvent.objects.filter(run_id=call.run_id).count(),
    )


# --------------------------------------------------------------------------- permissions


def test_decisions__staff_without_permission_sees_but_cannot_decide(client, viewer, parked):
    run, call, _ = parked
    client.force_login(viewer)
    before = snapshot(call)

    listing = client.get(TOOLCALLS)
    assert listing.status_code == 200
    assert "delete_account" in listing.text
    assert 'value="approve_selected"' not in listing.text  # the action is absent

    page = client.get(call_url(call))
    assert page.status_code == 200
    assert "not decide on it" in page.text
    assert 'id="agentrun-approve-form"' not in page.text
    assert "-token" not in page.text  # no token for who may not decide
    token = services.approval_token(call)
    assert "token" not in call.approval_payload  # never stored

    responses = [
        action(client, TOOLCALLS, "approve_selected", [call]),
        action(client, TOOLCALLS, "reject_selected", [call], apply="1", reason="no"),
        action(client, TOOLCALLS, "fail_selected", [call]),
        client.post(call_url(call, "approve"), {"approve-token": token}, follow=True),
        client.post(
            call_url(call, "reject"), {"reject-token": token, "reject-reason": "no"}, follow=True
        ),
        client.post(
            call_url(call, "resolve"),
            {"resolve-action": "fail", "resolve-token": token},
            follow=True,
        ),
    ]
    for response in responses:
        assert response.status_code == 200
        assert any("permission" in e for e in errors(response)), texts(response)
    assert snapshot(call) == before
    run.refresh_from_db()
    assert run.state == RunState.AWAITING_APPROVAL


def test_run_actions__need_cancel_permission(client, viewer, parked):
    run, _, _ = parked
    client.force_login(viewer)
    events = RunEvent.objects.filter(run=run).count()
    response = action(client, RUNS, "cancel_selected", [run])
    assert any("permission" in e for e in errors(response))
    response = client.post(reverse("admin:agentrun_run_cancel", args=[run.pk]), follow=True)
    assert any("permission" in e for e in errors(response))
    page = client.get(reverse("admin:agentrun_run_change", args=[run.pk]))
    assert 'id="agentrun-cancel-form"' not in page.text
    run.refresh_from_db()
    assert run.state == RunState.AWAITING_APPROVAL
    assert RunEvent.objects.filter(run=run).count() == events


# --------------------------------------------------------------------------- approvals


def test_approve__on_the_page_then_the_run_completes(client, approver, parked):
    run, call, model = parked
    client.force_login(approver)
    page = client.get(call_url(call))
    assert page.status_code == 200
    # The form carries the call's token, signed at render time.
    token = re.search(r'name="approve-token" value="([^"]+)"', page.text).group(1)
    services.check_approval_token(call, token)
    assert "&quot;user&quot;: &quot;bob&quot;" in page.text  # pretty JSON, escaped

    response = client.post(
        call_url(call, "approve"),
        {"approve-token": token, "approve-note": "ok by me", "approve-arguments": ""},
        follow=True,
    )
    assert response.status_code == 200
    assert ("success", f"Approved delete_account ({call.tool_call_id}).") in texts(response)
    call.refresh_from_db()
    run.refresh_from_db()
    assert (call.state, call.approved, call.decided_by, call.decision_note) == (
        ToolCallState.REQUESTED,
        True,
        approver,
        "ok by me",
    )
    assert run.state == RunState.AWAITING_TOOL
    history = client.get(reverse("admin:agentrun_toolcall_history", args=[call.pk]))
    assert "Approved delete_account" in history.text  # the decision is in the admin history

    assert drive(run, model)[-1] == Outcome.FINISHED
    call.refresh_from_db()
    assert run.state == RunState.COMPLETED
    assert (call.state, call.result) == (ToolCallState.SUCCEEDED, "deleted bob")


def test_approve__bulk_action(client, approver, parked):
    run, call, model = parked
    client.force_login(approver)
    confirm = action(client, TOOLCALLS, "approve_selected", [call])
    assert ToolCall.objects.get(pk=call.pk).state == ToolCallState.AWAITING_APPROVAL  # not yet
    response = confirmed(client, TOOLCALLS, "approve_selected", [call])
    assert ("success", "Approved 1 tool call.") in texts(response)
    run.refresh_from_db()
    assert run.state == RunState.AWAITING_TOOL
    # Rejecting it now with the confirmation page's token is refused: a message, not a 500.
    token = re.search(r'name="token-\d+" value="([^"]+)"', confirm.text).group(1)
    events = RunEvent.objects.filter(run=run).count()
    response = client.post(
        ALL_TOOLCALLS,
        {
            "action": "reject_selected",
            "_selected_action": [call.pk],
            "apply": "1",
            f"token-{call.pk}": token,
            "reason": "late",
        },
        follow=True,
    )
    assert response.status_code == 200
    assert errors(response) and "not awaiting approval" in errors(response)[0]
    assert RunEvent.objects.filter(run=run).count() == events
    assert drive(run, model)[-1] == Outcome.FINISHED
    assert run.state == RunState.COMPLETED


def test_reject__with_reason_on_the_page(client, approver, parked):
    run, call, model = parked
    client.force_login(approver)
    token = services.approval_token(call)
    response = client.post(
        call_url(call, "reject"),
        {"reject-token": token, "reject-reason": "bob is a <VIP>"},
        follow=True,
    )
    assert ("success", f"Rejected delete_account ({call.tool_call_id}).") in texts(response)
    call.refresh_from_db()
    assert call.state == ToolCallState.REJECTED
    assert "bob is a <VIP>" in call.result
    assert call.is_error is True
    assert call.decision_note == "bob is a <VIP>"
    assert "bob is a &lt;VIP&gt;" in response.text  # shown escaped on the call page
    # The model gets the rejection as the tool result and finishes.
    assert drive(run, model)[-1] == Outcome.FINISHED
    assert run.state == RunState.COMPLETED


def test_reject__bulk_action_asks_for_a_reason(client, approver, parked):
    _, call, _ = parked
    client.force_login(approver)
    confirm = action(client, TOOLCALLS, "reject_selected", [call])
    assert confirm.status_code == 200
    assert "Rejected in admin by" not in confirm.text  # no reason until the person writes one
    assert ToolCall.objects.get(pk=call.pk).state == ToolCallState.AWAITING_APPROVAL

    response = confirmed(client, TOOLCALLS, "reject_selected", [call], reason="too risky")
    assert ("success", "Rejected 1 tool call.") in texts(response)
    call.refresh_from_db()
    assert (call.state, call.is_error, call.decision_note) == (
        ToolCallState.REJECTED,
        True,
        "too risky",
    )
    assert "too risky" in call.result


def test_approve__tampered_or_stale_token_is_refused(client, approver, parked):
    _, call, _ = parked
    client.force_login(approver)
    before = snapshot(call)
    token = services.approval_token(call)
    stale = services.approval_token(ToolCall(pk=call.pk, arguments_hash="0" * 64))
    for bad in (token[:-2] + ("AA" if not token.endswith("AA") else "BB"), stale):
        for kind, data in (
            ("approve", {"approve-token": bad}),
            ("reject", {"reject-token": bad, "reject-reason": "no"}),
        ):
            response = client.post(call_url(call, kind), data, follow=True)
            assert response.status_code == 200
            assert errors(response) and "approval token" in errors(response)[0], texts(response)
    assert snapshot(call) == before


@pytest.mark.parametrize(
    ("edited", "message"),
    [
        ('{"user": ', "Not valid JSON"),
        ('["bob"]', "must be a JSON object"),
        ('{"user": "bob", "force": true}', "force"),
        ("{}", "user"),
    ],
)
def test_approve__invalid_edited_arguments_are_a_form_error(
    client, approver, parked, edited, message
):
    _, call, _ = parked
    client.force_login(approver)
    before = snapshot(call)
    response = client.post(
        call_url(call, "approve"),
        {"approve-token": services.approval_token(call), "approve-arguments": edited},
    )
    assert response.status_code == 200
    form = response.context["form"]
    assert message in " ".join(form.errors["arguments"]), form.errors
    assert "Nothing was changed" in response.text
    assert snapshot(call) == before


def test_approve__valid_edited_arguments_are_recorded(client, approver, parked):
    run, call, model = parked
    client.force_login(approver)
    response = client.post(
        call_url(call, "approve"),
        {"approve-token": services.approval_token(call), "approve-arguments": '{"user": "alice"}'},
        follow=True,
    )
    assert not errors(response), texts(response)
    call.refresh_from_db()
    assert call.arguments == {"user": "alice"}
    assert call.original_arguments == {"user": "bob"}
    assert call.state == ToolCallState.REQUESTED
    assert drive(run, model)[-1] == Outcome.FINISHED
    call.refresh_from_db()
    assert call.result == "deleted alice"


def test_approve__unchanged_arguments_are_no_edit(client, approver, parked):
    _, call, _ = parked
    client.force_login(approver)
    client.post(
        call_url(call, "approve"),
        {
            "approve-token": services.approval_token(call),
            "approve-arguments": '{\n  "user": "bob"\n}',
        },
    )
    call.refresh_from_db()
    assert (call.state, call.original_arguments) == (ToolCallState.REQUESTED, None)


# --------------------------------------------------------------------------- unknown outcomes


def test_resolve_unknown__mark_done_on_the_page(client, approver, unknown):
    run, call, _ = unknown
    client.force_login(approver)
    listing = client.get(TOOLCALLS)
    assert "charge_card" in listing.text  # the default filter lists pending decisions
    page = client.get(call_url(call))
    assert 'id="agentrun-resolve-form"' in page.text
    assert "no reconcile check" in page.text

    # "done" without a result is a form error; nothing changes.
    before = snapshot(call)
    token = services.approval_token(call)
    response = client.post(
        call_url(call, "resolve"), {"resolve-action": "done", "resolve-token": token}
    )
    assert response.status_code == 200
    assert "needs the tool" in " ".join(response.context["form"].errors["result"])
    assert snapshot(call) == before

    response = client.post(
        call_url(call, "resolve"),
        {
            "resolve-action": "done",
            "resolve-result": '{"charge_id": "ch_1"}',
            "resolve-note": "seen in Stripe",
            "resolve-token": token,
        },
        follow=True,
    )
    assert ("success", f"Resolved charge_card ({call.tool_call_id}): done.") in texts(response)
    call.refresh_from_db()
    run.refresh_from_db()
    assert (call.state, call.is_error, call.result_source) == (
        ToolCallState.SUCCEEDED,
        False,
        "person",
    )
    assert call.result == {"charge_id": "ch_1"}  # the JSON value, not JSON in a string
    assert run.state == RunState.AWAITING_TOOL


def test_resolve_unknown__mark_done_then_the_run_completes(client, approver, unknown):
    run, call, model = unknown
    client.force_login(approver)
    client.post(
        call_url(call, "resolve"),
        {
            "resolve-action": "done",
            "resolve-result": "charged 500",
            "resolve-token": services.approval_token(call),
        },
    )
    drive(run, model)
    assert run.state == RunState.COMPLETED


def test_resolve_unknown__retry_runs_it_once_more(client, approver, unknown):
    run, call, model = unknown
    client.force_login(approver)
    response = confirmed(client, TOOLCALLS, "retry_selected", [call])
    assert ("success", "1 tool call will be retried.") in texts(response)
    call.refresh_from_db()
    assert call.state == ToolCallState.REQUESTED
    assert drive(run, model)[-1] == Outcome.FINISHED
    call.refresh_from_db()
    assert (run.state, call.state, call.result) == (
        RunState.COMPLETED,
        ToolCallState.SUCCEEDED,
        "charged 500",
    )


def test_resolve_unknown__bulk_fail_and_done(client, approver, unknown):
    _, call, _ = unknown
    client.force_login(approver)
    confirm = action(client, TOOLCALLS, "mark_done", [call])
    assert confirm.status_code == 200 and 'name="result"' in confirm.text
    response = confirmed(client, TOOLCALLS, "mark_done", [call], result="charged")
    assert ("success", "Marked 1 tool call done.") in texts(response)
    call.refresh_from_db()
    assert (call.state, call.result) == (ToolCallState.SUCCEEDED, "charged")
    # Failing a closed call is left out of the confirmation; posted anyway, a message.
    page = action(client, ALL_TOOLCALLS, "fail_selected", [call])
    assert "it is succeeded, not unknown" in page.text
    response = client.post(
        ALL_TOOLCALLS,
        {
            "action": "fail_selected",
            "_selected_action": [call.pk],
            "apply": "1",
            f"token-{call.pk}": services.approval_token(call),
        },
        follow=True,
    )
    assert response.status_code == 200
    assert errors(response) and "not unknown" in errors(response)[0]


def test_resolve_unknown__fail_on_the_page(client, approver, unknown):
    _, call, _ = unknown
    client.force_login(approver)
    client.post(
        call_url(call, "resolve"),
        {
            "resolve-action": "fail",
            "resolve-note": "declined",
            "resolve-token": services.approval_token(call),
        },
    )
    call.refresh_from_db()
    assert (call.state, call.is_error) == (ToolCallState.ERRORED, True)
    assert "declined" in call.result


# --------------------------------------------------------------------------- runs


@pytest.fixture
def failed_run():
    return factories.failed_run()


@pytest.fixture
def completed_run():
    return factories.completed_run()


def test_cancel__a_finished_run_is_an_error_message(client, operator, completed_run):
    client.force_login(operator)
    events = RunEvent.objects.filter(run=completed_run).count()
    response = action(client, RUNS, "cancel_selected", [completed_run])
    assert response.status_code == 200
    assert [e for e in errors(response) if str(completed_run.pk) in e and "nothing to cancel" in e]
    cancel = reverse("admin:agentrun_run_cancel", args=[completed_run.pk])
    response = client.post(cancel, follow=True)
    assert response.status_code == 200
    assert errors(response) and "nothing to cancel" in errors(response)[0]
    page = client.get(reverse("admin:agentrun_run_change", args=[completed_run.pk]))
    assert 'id="agentrun-cancel-form"' not in page.text
    assert 'id="agentrun-resume-form"' not in page.text
    completed_run.refresh_from_db()
    assert completed_run.state == RunState.COMPLETED
    assert RunEvent.objects.filter(run=completed_run).count() == events


def test_resume__list_action_and_errors(client, operator, failed_run, completed_run):
    client.force_login(operator)
    response = action(client, RUNS, "resume_selected", [failed_run, completed_run])
    assert response.status_code == 200
    assert ("success", "Resumed 1 run.") in texts(response)
    assert [e for e in errors(response) if str(completed_run.pk) in e]
    failed_run.refresh_from_db()
    assert (failed_run.state, failed_run.error_code) == (RunState.QUEUED, "")


def test_resume__page_button(client, operator, failed_run):
    client.force_login(operator)
    url = reverse("admin:agentrun_run_change", args=[failed_run.pk])
    page = client.get(url)
    assert 'id="agentrun-resume-form"' in page.text
    assert 'id="agentrun-cancel-form"' not in page.text
    resume = reverse("admin:agentrun_run_resume", args=[failed_run.pk])
    assert client.get(resume).status_code == 405  # POST only
    response = client.post(resume, follow=True)
    assert response.redirect_chain[-1][0] == url
    assert ("success", "The run was queued again.") in texts(response)
    failed_run.refresh_from_db()
    assert failed_run.state == RunState.QUEUED
    response = client.post(resume, follow=True)
    assert response.status_code == 200
    assert errors(response) and "cannot go from 'queued'" in errors(response)[0]


def test_cancel__list_action(client, operator, parked):
    run, call, _ = parked
    client.force_login(operator)
    response = action(client, RUNS, "cancel_selected", [run])
    assert ("success", "Cancellation requested for 1 run.") in texts(response)
    run.refresh_from_db()
    call.refresh_from_db()
    assert (run.state, run.cancel_reason, run.cancel_requested_by) == (
        RunState.CANCELLED,
        "Cancelled in admin by operator",
        operator,
    )
    assert call.state == ToolCallState.CANCELLED


def test_cancel__page_button(client, operator, parked):
    run, _, _ = parked
    client.force_login(operator)
    url = reverse("admin:agentrun_run_change", args=[run.pk])
    assert 'id="agentrun-cancel-form"' in client.get(url).text
    cancel = reverse("admin:agentrun_run_cancel", args=[run.pk])
    assert client.get(cancel).status_code == 405  # POST only
    response = client.post(cancel, {"reason": "changed my mind"}, follow=True)
    assert response.redirect_chain[-1][0] == url
    run.refresh_from_db()
    assert (run.state, run.cancel_reason) == (RunState.CANCELLED, "changed my mind")
    assert 'id="agentrun-resume-form"' in response.text


def test_run_page__renders_the_timeline(client, viewer):
    model = ScriptedClient(
        [
            reply(text("Let me look."), tool_use("lookup", {"query": "<x>"})),
            reply(text("The answer.")),
        ]
    )
    run = start_run("test-agent", "hello", correlation_id="corr-42")
    assert drive(run, model)[-1] == Outcome.FINISHED
    client.force_login(viewer)
    response = client.get(reverse("admin:agentrun_run_change", args=[run.pk]))
    assert response.status_code == 200
    page = response.text
    assert 'id="agentrun-timeline"' in page
    assert "Turn 0" in page and "Turn 1" in page
    assert "stop_reason: tool_use" in page and "stop_reason: end_turn" in page
    assert "lookup" in page and "&quot;query&quot;: &quot;&lt;x&gt;&quot;" in page
    assert "fact about &lt;x&gt;" in page  # the result, escaped
    for kind in ("run_created", "turn_started", "tool_call_started", "run_completed"):
        assert kind in page
    assert 'name="_save"' not in page  # view only
    assert ">completed</span>" in page  # the state as the API spells it


def test_run_changelist__columns_filters_search(client, viewer):
    owner = User.objects.create_user("carol")
    run = start_run("test-agent", "hi", owner=owner, correlation_id="corr-xyz")
    other = start_run("tiny-budget", "hi")
    client.force_login(viewer)
    listing = client.get(RUNS)
    assert listing.status_code == 200
    assert ">queued</span>" in listing.text and "carol" in listing.text
    for query in (str(run.pk), "corr-xyz", "carol"):
        response = client.get(RUNS, {"q": query})
        assert response.status_code == 200
        assert list(response.context["cl"].result_list) == [run], query
    response = client.get(RUNS, {"agent": "tiny-budget", "state__exact": "queued"})
    assert list(response.context["cl"].result_list) == [other]


def test_run_admin__read_only_and_superuser_delete(client, viewer, parked):
    run, _, _ = parked
    client.force_login(viewer)
    assert client.get(reverse("admin:agentrun_run_add")).status_code == 403
    change = reverse("admin:agentrun_run_change", args=[run.pk])
    assert client.post(change, {"agent": "x"}).status_code == 403
    assert client.get(reverse("admin:agentrun_run_delete", args=[run.pk])).status_code == 403
    assert (
        client.post(
            reverse("admin:agentrun_toolcall_change", args=[run.tool_calls.get().pk]), {}
        ).status_code
        == 403
    )

    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    delete = reverse("admin:agentrun_run_delete", args=[run.pk])
    assert client.get(delete).status_code == 403  # active: cancel it first
    services.cancel_run(run)
    confirm = client.get(delete)
    assert confirm.status_code == 200 and "Are you sure" in confirm.text
    client.post(delete, {"post": "yes"})
    assert not Run.objects.filter(pk=run.pk).exists()
    assert not RunEvent.objects.filter(run_id=run.pk).exists()


def test_runevent_admin__read_only(client, viewer, parked):
    run, _, _ = parked
    other = start_run("test-agent", "other")
    client.force_login(viewer)
    listing = client.get(EVENTS, {"type": "approval_requested"})
    assert listing.status_code == 200
    assert [e.type for e in listing.context["cl"].result_list] == ["approval_requested"]
    found = client.get(EVENTS, {"q": str(other.pk)}).context["cl"].result_list
    assert {e.run_id for e in found} == {other.pk}
    event = RunEvent.objects.filter(run=run).first()
    assert client.get(reverse("admin:agentrun_runevent_change", args=[event.pk])).status_code == 200
    assert client.get(reverse("admin:agentrun_runevent_add")).status_code == 403
    assert (
        client.post(reverse("admin:agentrun_runevent_change", args=[event.pk]), {}).status_code
        == 403
    )
    assert client.get(reverse("admin:agentrun_runevent_delete", args=[event.pk])).status_code == 403


def test_toolcall_changelist__default_filter_is_pending(client, viewer, parked):
    run, call, model = parked
    done = start_run("test-agent", "look")
    drive(done, ScriptedClient([reply(tool_use("lookup", {"query": "q"})), reply(text("ok"))]))
    client.force_login(viewer)
    pending = client.get(TOOLCALLS).context["cl"].result_list
    assert [c.pk for c in pending] == [call.pk]
    assert client.get(TOOLCALLS, {"_facets": "True"}).status_code == 200
    everything = client.get(TOOLCALLS, {"decision": "all"}).context["cl"].result_list
    assert len(everything) == 2
    by_state = client.get(TOOLCALLS, {"state__exact": "succeeded"}).context["cl"].result_list
    assert [c.name for c in by_state] == ["lookup"]
    for_run = client.get(TOOLCALLS, {"decision": "pending", "run__id__exact": str(run.pk)})
    assert [c.pk for c in for_run.context["cl"].result_list] == [call.pk]
    run_page = client.get(reverse("admin:agentrun_run_change", args=[run.pk]))
    assert "1 tool call needs a decision" in run_page.text


# --------------------------------------------------------------------------- guards


@pytest.mark.parametrize(
    ("choices", "colours"),
    [
        (RunState, RUN_STATE_COLOURS),
        (ToolCallState, TOOL_CALL_STATE_COLOURS),
        (TurnState, TURN_STATE_COLOURS),
        (ConversationStatus, STATUS_COLOURS),
    ],
)
def test_badge_colours__cover_every_state(choices, colours):
    assert set(colours) == set(choices.values)
