"""The REST API: bodies validated, everything through services, object-level visibility."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from django_agentrun import exceptions, services, start_run
from django_agentrun.api.views import ERROR_STATUS, status_for
from django_agentrun.engine import Outcome
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.states import RunState, ToolCallState
from django_agentrun.testing import ScriptedClient, reply, text
from tests import factories
from tests.conftest import drive_last

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

RUNS = reverse("agentrun:run-list")
PENDING = reverse("agentrun:toolcall-pending")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def make_user(db):
    return factories.user


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def api():
    def client(user: User | None) -> APIClient:
        c = APIClient()
        if user is not None:
            c.force_authenticate(user=user)
        return c

    return client


@pytest.fixture
def park():
    """A test-agent run of an owner parked on a delete_account approval."""
    return factories.parked


@pytest.fixture
def unknown(monkeypatch):
    """A charge_card call (non_idempotent, no reconcile) found in flight: its outcome unknown."""
    return lambda owner: factories.unknown(monkeypatch, owner)


def run_url(run, kind=None):
    return reverse(f"agentrun:run-{kind or 'detail'}", args=[run.pk])


def call_url(call, kind):
    return reverse(f"agentrun:toolcall-{kind}", args=[call.pk])


def snapshot(call):
    call.refresh_from_db()
    return call.state, call.arguments, call.result, RunEvent.objects.filter(run=call.run).count()


# --------------------------------------------------------------------------- create


def test_create__201_with_the_run_owned_by_the_caller(api, alice):
    deadline = timezone.now() + timedelta(hours=1)
    response = api(alice).post(
        RUNS,
        {
            "agent": "test-agent",
            "input": "hello",
            "metadata": {"ticket": 7},
            "correlation_id": "corr-1",
            "deadline": deadline.isoformat(),
        },
        format="json",
    )
    assert response.status_code == 201, response.data
    body = response.data
    run = Run.objects.get()
    assert body["id"] == str(run.pk)
    assert (body["state"], body["owner"], body["agent"]) == ("queued", alice.pk, "test-agent")
    assert (body["metadata"], body["correlation_id"]) == ({"ticket": 7}, "corr-1")
    assert body["input"] == "hello" and body["turns"] == [] and body["pending_decisions"] == []
    assert run.owner == alice and run.deadline == deadline
    assert "config" not in body and "lease_owner" not in body


def test_create__content_blocks(api, alice):
    blocks = [{"type": "text", "text": "hi"}]
    response = api(alice).post(RUNS, {"agent": "test-agent", "input": blocks}, format="json")
    assert response.status_code == 201
    assert Run.objects.get().input == blocks


def test_create__idempotency_key_in_body_or_header(api, alice, bob):
    client = api(alice)
    body = {"agent": "test-agent", "input": "once", "idempotency_key": "k1"}
    first = client.post(RUNS, body, format="json")
    again = client.post(RUNS, body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.data["id"] == again.data["id"]

    plain = {"agent": "test-agent", "input": "once"}
    by_header = client.post(RUNS, plain, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    header_again = client.post(RUNS, plain, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    both = client.post(
        RUNS, {**plain, "idempotency_key": "k2"}, format="json", HTTP_IDEMPOTENCY_KEY="k2"
    )
    assert (by_header.status_code, header_again.status_code, both.status_code) == (201, 200, 200)
    assert by_header.data["id"] == header_again.data["id"] == both.data["id"] != first.data["id"]

    differ = client.post(
        RUNS, {**plain, "idempotency_key": "k3"}, format="json", HTTP_IDEMPOTENCY_KEY="k2"
    )
    assert differ.status_code == 400 and "idempotency_key" in differ.data["errors"]
    # Keys are per owner: bob's k1 is another run.
    assert api(bob).post(RUNS, body, format="json").status_code == 201
    assert Run.objects.count() == 3


def test_create__same_key_other_input_is_422(api, alice):
    client = api(alice)
    client.post(RUNS, {"agent": "test-agent", "input": "a", "idempotency_key": "k"}, format="json")
    response = client.post(
        RUNS, {"agent": "test-agent", "input": "b", "idempotency_key": "k"}, format="json"
    )
    assert response.status_code == 422
    assert response.data["code"] == "idempotency_key_reused" and "k" in response.data["detail"]
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({}, "agent", "required"),
        ({"input": "x"}, "agent", "required"),
        ({"agent": "test-agent"}, "input", "required"),
        ({"agent": "test-agent", "input": ""}, "input", "must not be empty"),
        ({"agent": "test-agent", "input": "   "}, "input", "must not be empty"),
        ({"agent": "test-agent", "input": []}, "input", "non-empty"),
        ({"agent": "test-agent", "input": 5}, "input", "non-empty"),
        ({"agent": "test-agent", "input": {"type": "text"}}, "input", "non-empty"),
        ({"agent": "test-agent", "input": [{"text": "x"}]}, "input", "'type'"),
        ({"agent": "test-agent", "input": [{"type": "text"}]}, "input", "without text"),
        (
            {"agent": "test-agent", "input": [{"type": "tool_result", "tool_use_id": "x"}]},
            "input",
            "cannot start a run",
        ),
        ({"agent": "test-agent", "input": "x", "metadata": [1]}, "metadata", "JSON object"),
        ({"agent": "test-agent", "input": "x", "deadline": "soon"}, "deadline", "format"),
        (
            {"agent": "test-agent", "input": "x", "deadline": "2001-01-01T00:00:00Z"},
            "deadline",
            "future",
        ),
        ({"agent": "test-agent", "input": "x", "idempotency_key": ""}, "idempotency_key", "blank"),
        (
            {"agent": "test-agent", "input": "x", "correlation_id": "c" * 201},
            "correlation_id",
            "200",
        ),
    ],
)
def test_create__bad_body_is_400_with_a_field_error(api, alice, body, field, message):
    response = api(alice).post(RUNS, body, format="json")
    assert response.status_code == 400, response.data
    assert response.data["code"] == "invalid", response.data
    assert message in " ".join(response.data["errors"][field]), response.data
    assert not Run.objects.exists()


def test_create__bad_json_and_blank_header_are_400(api, alice):
    client = api(alice)
    broken = client.post(RUNS, '{"agent": ', content_type="application/json")
    assert broken.status_code == 400
    blank = client.post(
        RUNS, {"agent": "test-agent", "input": "x"}, format="json", HTTP_IDEMPOTENCY_KEY=" "
    )
    assert blank.status_code == 400 and "idempotency_key" in blank.data["errors"]
    assert not Run.objects.exists()


def test_unauthenticated__refused_everywhere(api, alice, park):
    run, call, _ = park(alice)
    client = api(None)
    responses = [
        client.get(RUNS),
        client.post(RUNS, {"agent": "test-agent", "input": "x"}, format="json"),
        client.get(run_url(run)),
        client.get(run_url(run, "events")),
        client.post(run_url(run, "cancel")),
        client.get(PENDING),
        client.post(call_url(call, "approve"), {"token": "t"}, format="json"),
    ]
    assert {r.status_code for r in responses} <= {401, 403}
    assert Run.objects.count() == 1


# --------------------------------------------------------------------------- list and detail


def test_list__only_own_runs_newest_first_with_filters(
    api, alice, bob, django_assert_max_num_queries
):
    mine = [start_run("test-agent", f"a{i}", owner=alice) for i in range(3)]
    start_run("two-turns", "other agent", owner=alice)
    start_run("test-agent", "bob's", owner=bob)
    start_run("test-agent", "nobody's")
    services.cancel_run(mine[0], reason="test")
    client = api(alice)

    with django_assert_max_num_queries(3):  # permissions (user, group) and one page
        listing = client.get(RUNS)
    assert listing.status_code == 200
    assert len(listing.data["results"]) == 4
    assert {r["owner"] for r in listing.data["results"]} == {alice.pk}
    created = [r["created_at"] for r in listing.data["results"]]
    assert created == sorted(created, reverse=True)
    assert "turns" not in listing.data["results"][0]

    by_agent = client.get(RUNS, {"agent": "test-agent"}).data["results"]
    assert {r["id"] for r in by_agent} == {str(r.pk) for r in mine}
    cancelled = client.get(RUNS, {"state": "cancelled"}).data["results"]
    assert [r["id"] for r in cancelled] == [str(mine[0].pk)]
    several = client.get(RUNS, {"state": "cancelled,queued", "agent": "test-agent"}).data["results"]
    assert len(several) == 3
    bad = client.get(RUNS, {"state": "exploded"})
    assert bad.status_code == 400 and "exploded" in str(bad.data["errors"]["state"])


def test_list__cursor_pages(api, alice):
    for i in range(3):
        start_run("test-agent", f"a{i}", owner=alice)
    client = api(alice)
    first = client.get(RUNS, {"page_size": 2}).data
    assert len(first["results"]) == 2 and first["next"]
    second = client.get(first["next"]).data
    assert len(second["results"]) == 1 and second["next"] is None
    ids = [r["id"] for r in first["results"] + second["results"]]
    assert len(set(ids)) == 3


def test_view_all_runs__sees_every_run(api, alice, bob, make_user, park):
    run, _, _ = park(alice)
    start_run("test-agent", "bob's", owner=bob)
    watcher = make_user("watcher", "view_all_runs")
    client = api(watcher)
    assert len(client.get(RUNS).data["results"]) == 2
    detail = client.get(run_url(run))
    assert detail.status_code == 200 and detail.data["owner"] == alice.pk
    assert client.get(run_url(run, "events")).status_code == 200
    # Seeing is not deciding: no token without agentrun.approve_toolcall.
    assert detail.data["pending_decisions"][0]["token"] is None


def test_other_users_run__is_404_everywhere(api, alice, bob, make_user, park, unknown):
    run, call, _ = park(alice)
    _, unknown_call, _ = unknown(alice)
    # Even with every action permission: not seeing the run means it does not exist.
    mallory = make_user("mallory", "cancel_run", "approve_toolcall", is_staff=True)
    client = api(mallory)
    token = services.approval_token(call)
    responses = {
        "detail": client.get(run_url(run)),
        "events": client.get(run_url(run, "events")),
        "cancel": client.post(run_url(run, "cancel"), {}, format="json"),
        "resume": client.post(run_url(run, "resume")),
        "approve": client.post(call_url(call, "approve"), {"token": token}, format="json"),
        "reject": client.post(call_url(call, "reject"), {"reason": "no"}, format="json"),
        "resolve": client.post(
            call_url(unknown_call, "resolve"), {"action": "fail"}, format="json"
        ),
    }
    assert {name: r.status_code for name, r in responses.items()} == dict.fromkeys(responses, 404)
    assert client.get(RUNS).data["results"] == []
    assert client.get(PENDING).data["results"] == []
    run.refresh_from_db()
    assert run.state == RunState.AWAITING_APPROVAL
    assert call.state == ToolCall.objects.get(pk=call.pk).state == ToolCallState.AWAITING_APPROVAL
    assert api(bob).get(reverse("agentrun:run-detail", args=["0" * 32])).status_code == 404


def test_detail__turns_tool_calls_and_pending_decision_with_token(
    api, make_user, park, django_assert_max_num_queries
):
    owner = make_user("olga", "approve_toolcall")
    run, call, _ = park(owner)
    client = api(owner)
    # Permissions (user, group), the run, its turns, their tool calls: no query per call.
    with django_assert_max_num_queries(5):
        response = client.get(run_url(run))
    assert response.status_code == 200
    body = response.data
    assert body["state"] == "awaiting_approval" and body["model"] == "claude-sonnet-4-5"
    assert set(body["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }
    assert body["cancel"] == {"requested_at": None, "reason": "", "requested_by": None}
    [turn] = body["turns"]
    assert turn["state"] == "awaiting_tool" and turn["content"][0]["text"] == "Deleting."
    [tc] = turn["tool_calls"]
    assert (tc["name"], tc["state"], tc["arguments"], tc["source"]) == (
        "delete_account",
        "awaiting_approval",
        {"user": "bob"},
        "",
    )
    assert "approval_payload" not in tc and "idempotency_key" not in tc
    [pending] = body["pending_decisions"]
    assert pending["id"] == call.pk and pending["agent"] == "test-agent"
    services.check_approval_token(call, pending["token"])  # a valid token


def test_events__after_cursor_pages_and_no_tokens(api, alice, park):
    run, _, _ = park(alice)
    client = api(alice)
    page = client.get(run_url(run, "events")).data
    seqs = [e["seq"] for e in page["results"]]
    assert seqs == list(range(1, run.last_seq + 1))
    assert page["last_seq"] == run.last_seq and page["next"] is None
    assert page["run_state"] == "awaiting_approval"
    requested = next(e for e in page["results"] if e["type"] == "approval_requested")
    assert "token" not in requested["payload"] and "token" not in requested["payload"]["payload"]
    stored = RunEvent.objects.get(run=run, type="approval_requested").payload
    assert "token" not in stored and "token" not in stored["payload"]  # never stored

    first = client.get(run_url(run, "events"), {"after": 1, "limit": 2}).data
    assert [e["seq"] for e in first["results"]] == [2, 3] and first["last_seq"] == 3
    rest = client.get(first["next"]).data
    assert rest["results"][0]["seq"] == 4
    tail = client.get(run_url(run, "events"), {"after": run.last_seq}).data
    assert tail["results"] == [] and tail["last_seq"] == run.last_seq
    for bad in ({"after": "x"}, {"after": -1}, {"limit": 0}):
        assert client.get(run_url(run, "events"), bad).status_code == 400


# --------------------------------------------------------------------------- cancel and resume


def test_cancel_and_resume__by_the_owner(api, alice, park):
    run, call, _ = park(alice)
    client = api(alice)
    response = client.post(run_url(run, "cancel"), {"reason": "changed my mind"}, format="json")
    assert response.status_code == 200, response.data
    assert response.data["state"] == "cancelled"
    assert response.data["cancel"]["reason"] == "changed my mind"
    assert response.data["cancel"]["requested_by"] == alice.pk
    assert response.data["turns"][0]["tool_calls"][0]["state"] == "cancelled"
    assert response.data["pending_decisions"] == []
    again = client.post(run_url(run, "cancel"), format="json")
    assert again.status_code == 200  # cancelling twice is a no-op

    resumed = client.post(run_url(run, "resume"))
    assert resumed.status_code == 200 and resumed.data["state"] == "queued"
    conflict = client.post(run_url(run, "resume"))
    assert conflict.status_code == 409
    assert conflict.data["code"] == "invalid_transition" and "queued" in conflict.data["detail"]


def test_cancel__with_cancel_permission_or_refused(api, alice, make_user, park):
    run, _, _ = park(alice)
    watcher = make_user("watcher", "view_all_runs")
    refused = api(watcher).post(run_url(run, "cancel"), format="json")
    assert refused.status_code == 403  # sees it, may not cancel it
    assert Run.objects.get(pk=run.pk).state == RunState.AWAITING_APPROVAL

    operator = make_user("operator", "view_all_runs", "cancel_run")
    response = api(operator).post(run_url(run, "cancel"), {"reason": "ops"}, format="json")
    assert response.status_code == 200 and response.data["state"] == "cancelled"
    assert response.data["cancel"]["requested_by"] == operator.pk
    # Resumed, alice's run would act with her credentials on the operator's request.
    refused = api(operator).post(run_url(run, "resume"))
    assert refused.status_code == 403 and "Fork it instead" in refused.data["detail"]
    assert api(watcher).post(run_url(run, "resume")).status_code == 403
    assert api(alice).post(run_url(run, "resume")).data["state"] == "queued"


def test_cancel__a_completed_run_is_409_with_its_code(api, alice):
    run = start_run("test-agent", "hi", owner=alice)
    drive_last(run, ScriptedClient([reply(text("Hello."))]))
    assert run.state == RunState.COMPLETED
    response = api(alice).post(run_url(run, "cancel"), format="json")
    assert response.status_code == 409
    assert response.data == {
        "code": "run_not_active",
        "detail": f"Run {run.pk} is completed: there is nothing to cancel.",
    }
    assert api(alice).post(run_url(run, "resume")).status_code == 409


# --------------------------------------------------------------------------- decisions


def test_decisions__need_the_approve_permission(api, make_user, park, unknown):
    # The owner, even staff, without agentrun.approve_toolcall: 403 (the run is visible).
    owner = make_user("staffer", "view_all_runs", "cancel_run", is_staff=True)
    run, call, _ = park(owner)
    _, unknown_call, _ = unknown(owner)
    before = snapshot(call)
    client = api(owner)
    token = services.approval_token(call)
    responses = [
        client.get(PENDING),
        client.post(call_url(call, "approve"), {"token": token}, format="json"),
        client.post(call_url(call, "reject"), {"reason": "no", "token": token}, format="json"),
        client.post(call_url(unknown_call, "resolve"), {"action": "fail"}, format="json"),
    ]
    assert [r.status_code for r in responses] == [403] * 4
    assert "approve_toolcall" in str(responses[0].data["detail"])
    assert snapshot(call) == before
    assert client.get(run_url(run)).data["pending_decisions"][0]["token"] is None


def test_pending__lists_visible_calls_with_tokens(
    api, alice, make_user, park, unknown, django_assert_max_num_queries
):
    approver = make_user("approver", "approve_toolcall", "view_all_runs")
    _, call, _ = park(alice)
    _, unknown_call, _ = unknown(None)
    with django_assert_max_num_queries(3):
        response = api(approver).get(PENDING)
    assert response.status_code == 200
    rows = response.data["results"]
    assert [r["id"] for r in rows] == [call.pk, unknown_call.pk]  # oldest first
    assert [r["state"] for r in rows] == ["awaiting_approval", "unknown"]
    assert rows[0]["description"] == "Delete an account (needs a person's approval)."
    services.check_approval_token(call, rows[0]["token"])
    # An approver who sees only their own runs sees none of these.
    assert api(make_user("limited", "approve_toolcall")).get(PENDING).data["results"] == []


@pytest.fixture
def decider(make_user):
    return make_user("decider", "approve_toolcall")


def test_approve__then_the_run_continues_and_finishes(api, decider, park):
    run, call, model = park(decider)
    client = api(decider)
    token = client.get(run_url(run)).data["pending_decisions"][0]["token"]
    response = client.post(call_url(call, "approve"), {"token": token, "note": "ok"}, format="json")
    assert response.status_code == 200, response.data
    assert (response.data["state"], response.data["run_state"]) == ("requested", "awaiting_tool")
    assert (response.data["decided_by"], response.data["decision_note"]) == (decider.pk, "ok")
    assert drive_last(run, model) == Outcome.FINISHED
    assert run.state == RunState.COMPLETED
    call.refresh_from_db()
    assert (call.state, call.result) == (ToolCallState.SUCCEEDED, "deleted bob")
    # Approving a call that moved on: 409, not waiting.
    late = client.post(call_url(call, "reject"), {"reason": "late", "token": token}, format="json")
    assert late.status_code == 409 and late.data["code"] == "approval_error"


def test_approve__token_is_required_and_checked(api, decider, park):
    _, call, _ = park(decider)
    client = api(decider)
    before = snapshot(call)
    missing = client.post(call_url(call, "approve"), {}, format="json")
    assert missing.status_code == 400 and "token" in missing.data["errors"]
    token = services.approval_token(call)
    stale = services.approval_token(ToolCall(pk=call.pk, arguments_hash="0" * 64))
    for bad in (token[:-2] + ("AA" if not token.endswith("AA") else "BB"), stale, "junk"):
        for kind, data in (("approve", {"token": bad}), ("reject", {"token": bad, "reason": "x"})):
            response = client.post(call_url(call, kind), data, format="json")
            assert response.status_code == 409, response.data
            assert response.data["code"] == "invalid_token"
    assert snapshot(call) == before


@pytest.mark.parametrize(
    ("arguments", "status", "message"),
    [
        ({"user": 5}, 400, "user"),
        ({"user": "bob", "force": True}, 400, "force"),
        ({}, 400, "user"),
        (["bob"], 400, "JSON object"),
    ],
)
def test_approve__invalid_edited_arguments_are_400_and_nothing_changes(
    api, decider, park, arguments, status, message
):
    _, call, _ = park(decider)
    before = snapshot(call)
    response = api(decider).post(
        call_url(call, "approve"),
        {"token": services.approval_token(call), "arguments": arguments},
        format="json",
    )
    assert response.status_code == status, response.data
    assert message in str(response.data), response.data
    assert snapshot(call) == before


def test_approve__edited_arguments_are_recorded(api, decider, park):
    run, call, model = park(decider)
    response = api(decider).post(
        call_url(call, "approve"),
        {"token": services.approval_token(call), "arguments": {"user": "alice"}},
        format="json",
    )
    assert response.status_code == 200
    assert response.data["arguments"] == {"user": "alice"}
    assert response.data["original_arguments"] == {"user": "bob"}
    drive_last(run, model)
    call.refresh_from_db()
    assert call.result == "deleted alice"


def test_reject__with_a_reason_then_the_run_finishes(api, decider, park):
    run, call, model = park(decider)
    client = api(decider)
    no_token = client.post(call_url(call, "reject"), {"reason": "no"}, format="json")
    assert no_token.status_code == 400 and "token" in no_token.data["errors"]
    assert client.post(call_url(call, "reject"), {}, format="json").status_code == 400
    response = client.post(
        call_url(call, "reject"),
        {"reason": "bob is a VIP", "token": services.approval_token(call)},
        format="json",
    )
    assert response.status_code == 200
    assert (response.data["state"], response.data["is_error"]) == ("rejected", True)
    assert "bob is a VIP" in response.data["result"] and response.data["source"] == "person"
    assert drive_last(run, model) == Outcome.FINISHED
    assert run.state == RunState.COMPLETED


def test_resolve__unknown_call_marked_done(api, decider, unknown):
    run, call, model = unknown(decider)
    client = api(decider)
    before = snapshot(call)
    token = services.approval_token(call)
    no_result = client.post(
        call_url(call, "resolve"), {"action": "done", "token": token}, format="json"
    )
    assert no_result.status_code == 400 and "result" in no_result.data["errors"]
    bad_action = client.post(
        call_url(call, "resolve"), {"action": "maybe", "token": token}, format="json"
    )
    assert bad_action.status_code == 400 and "action" in bad_action.data["errors"]
    assert snapshot(call) == before

    response = client.post(
        call_url(call, "resolve"),
        {
            "action": "done",
            "result": {"charge_id": "ch_1"},
            "note": "seen in Stripe",
            "token": token,
        },
        format="json",
    )
    assert response.status_code == 200, response.data
    assert (response.data["state"], response.data["source"]) == ("succeeded", "person")
    assert response.data["run_state"] == "awaiting_tool"
    assert drive_last(run, model) == Outcome.FINISHED
    assert run.state == RunState.COMPLETED
    again = client.post(
        call_url(call, "resolve"), {"action": "fail", "token": token}, format="json"
    )
    assert again.status_code == 409 and "not unknown" in again.data["detail"]


def test_resolve__token_is_required_and_checked(api, decider, unknown):
    _, call, _ = unknown(decider)
    client = api(decider)
    before = snapshot(call)
    missing = client.post(call_url(call, "resolve"), {"action": "fail"}, format="json")
    assert missing.status_code == 400 and "token" in missing.data["errors"]
    stale = services.approval_token(ToolCall(pk=call.pk, arguments_hash="0" * 64))
    for bad in (stale, "junk"):
        response = client.post(
            call_url(call, "resolve"), {"action": "fail", "token": bad}, format="json"
        )
        assert response.status_code == 409 and response.data["code"] == "invalid_token"
    assert snapshot(call) == before


def test_resolve__retry_runs_the_tool_once_more(api, decider, unknown):
    run, call, model = unknown(decider)
    response = api(decider).post(
        call_url(call, "resolve"),
        {"action": "retry", "token": services.approval_token(call)},
        format="json",
    )
    assert response.status_code == 200 and response.data["state"] == "requested"
    assert drive_last(run, model) == Outcome.FINISHED
    call.refresh_from_db()
    assert (call.state, call.result) == (ToolCallState.SUCCEEDED, "charged 500")


# --------------------------------------------------------------------------- errors and schema


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (exceptions.InvalidInput, 400),
        (exceptions.UnknownAgent, 400),
        (exceptions.InvalidArguments, 400),
        (exceptions.InvalidToken, 409),
        (exceptions.ApprovalError, 409),
        (exceptions.InvalidTransition, 409),
        (exceptions.RunNotActive, 409),
        (exceptions.ConcurrentUpdate, 409),
        (exceptions.IdempotencyConflict, 422),
        (exceptions.LeaseLost, None),  # a server fault, not the client's
    ],
)
def test_error_status__by_class(exc, status):
    assert status_for(exc()) == status


def test_error_status__covers_every_error_the_api_services_raise():
    refusals = {
        exceptions.InvalidInput,
        exceptions.UnknownAgent,
        exceptions.IdempotencyConflict,
        exceptions.InvalidTransition,
        exceptions.RunNotActive,
        exceptions.ApprovalError,
        exceptions.InvalidArguments,
        exceptions.InvalidToken,
        exceptions.ConcurrentUpdate,
        exceptions.MCPUnavailable,
        exceptions.StartRefused,
    }
    assert all(status_for(e()) is not None for e in refusals)
    assert set(ERROR_STATUS) <= refusals


def test_schema__renders_a_valid_openapi_document(client, tmp_path):
    client.force_login(User.objects.create_user("reader"))  # signed-in users only
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = set(schema["paths"])
    assert {
        "/api/agentrun/runs/",
        "/api/agentrun/runs/{id}/",
        "/api/agentrun/runs/{id}/events/",
        "/api/agentrun/runs/{id}/cancel/",
        "/api/agentrun/runs/{id}/resume/",
        "/api/agentrun/tool-calls/pending/",
        "/api/agentrun/tool-calls/{id}/approve/",
        "/api/agentrun/tool-calls/{id}/reject/",
        "/api/agentrun/tool-calls/{id}/resolve/",
    } <= paths
    # No generator warnings, and the document validates against the OpenAPI schema.
    call_command(
        "spectacular", "--fail-on-warn", "--validate", "--file", str(tmp_path / "schema.yml")
    )
