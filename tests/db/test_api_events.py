"""What events show: in the API only what the run detail shows (an allowlist per type,
failing closed); in the admin everything but approval tokens."""

from __future__ import annotations

import ast
import inspect
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from django_agentrun import services, start_run
from django_agentrun.events import (
    ALLOWLIST,
    REDACTED,
    SAFE_KEYS,
    EventType,
    public_payload,
    redact_secrets,
)
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.recovery import reap
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from django_agentrun.testing.scripted import error
from tests import factories
from tests.conftest import drive
from tests.factories import crashed_at

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

# Never in the API: the config snapshot and its parts, worker identities, lease
# epochs, approval tokens, idempotency keys, argument hashes, provider request ids.
HIDDEN = {
    "config",
    "system",
    "tools",
    "budget",
    "worker",
    "epoch",
    "token",
    "idempotency_key",
    "arguments_hash",
    "message_id",
    "request_id",
}


def all_keys(value) -> set[str]:
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.update(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def spec_keys(spec) -> set[str]:
    return set(spec) | {k for nested in spec.values() if nested for k in spec_keys(nested)}


# --------------------------------------------------------------------------- the allowlist


def test_every_event_type__has_an_allowlist_entry():
    assert set(ALLOWLIST) == set(EventType.values)


def test_every_event_type__has_its_own_docstring():
    tree = ast.parse(inspect.getsource(EventType))
    body = tree.body[0].body
    documented = {
        node.targets[0].id
        for node, following in zip(body, body[1:], strict=False)
        if isinstance(node, ast.Assign)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and str(following.value.value).strip()
    }
    assert documented == set(EventType.names)


def test_allowlist__names_no_hidden_key_at_any_depth():
    for event_type, spec in ALLOWLIST.items():
        assert not spec_keys(spec) & HIDDEN, event_type
        assert set(SAFE_KEYS) <= set(spec), event_type


def test_public_payload__unknown_type_fails_closed():
    payload = {"run_state": "running", "turn_index": 2, "secret": "s", "worker": "h:1"}
    assert public_payload("brand_new_event", payload) == {"run_state": "running", "turn_index": 2}
    assert public_payload("run_started", ["not", "a", "dict"]) == {}


def test_public_payload__nested_allowlist_and_whole_values():
    payload = {
        "turn_index": 0,
        "tool_call_id": "toolu_1",
        "token": "t0k",
        "deadline": None,
        "payload": {"tool": "x", "arguments": {"token": "kept: an argument"}, "token": "t0k"},
    }
    shown = public_payload("approval_requested", payload)
    assert shown == {
        "turn_index": 0,
        "tool_call_id": "toolu_1",
        "deadline": None,
        # Allowed values are shown whole: a tool argument named token is the tool's data.
        "payload": {"tool": "x", "arguments": {"token": "kept: an argument"}},
    }


def test_redact_secrets__every_depth_in_order_without_recursion_limit():
    value = {"a": [{"token": "x", "b": 1}], "token": {"nested": True}, "c": "token"}
    assert redact_secrets(value) == {
        "a": [{"token": REDACTED, "b": 1}],
        "token": REDACTED,
        "c": "token",
    }
    assert list(redact_secrets({"z": 1, "a": 2, "m": 3})) == ["z", "a", "m"]
    deep: object = {"token": "x"}
    for _ in range(5000):
        deep = [deep]
    out = redact_secrets(deep)
    for _ in range(5000):
        out = out[0]
    assert out == {"token": REDACTED}
    assert value["token"] == {"nested": True}  # the stored payload is not changed


# --------------------------------------------------------------------------- runs through every path


@pytest.fixture
def owner(db) -> User:
    return factories.user("olga", "approve_toolcall")


@pytest.fixture
def history(owner, monkeypatch, tmp_path, settings) -> list[Run]:
    """Runs of `owner` that between them write every event type."""
    monkeypatch.setenv("AGENTRUN_TEST_LOG", str(tmp_path / "log.jsonl"))
    runs = []

    def approval(then: str) -> None:
        model = ScriptedClient(
            [
                reply(text("Deleting."), tool_use("delete_account", {"user": "bob"})),
                reply(text("Ok.")),
            ]
        )
        run = start_run("test-agent", "delete bob", owner=owner)
        drive(run, model)
        call = ToolCall.objects.get(run=run)
        token = services.approval_token(call)
        if then == "approve":
            services.approve_tool_call(call, by=owner, token=token, arguments={"user": "eve"})
        elif then == "reject":
            services.reject_tool_call(call, by=owner, reason="no", token=token)
        else:
            services.cancel_run(run, by=owner, reason="stop")
            services.resume_run(run, by=owner)
        drive(run, model)
        runs.append(run)

    approval("approve")
    approval("reject")
    approval("cancel")

    # A person repairs a stopped run's history.
    model = ScriptedClient([reply(tool_use("lookup", {"query": "x"}))])  # then a model error
    run = start_run("test-agent", "repair", owner=owner)
    drive(run, model)
    call = ToolCall.objects.get(run=run)
    services.replace_tool_result(call, by=owner, result="fixed", note="dead link")
    runs.append(run)

    # Unknown outcome after a crash (recovery, epoch), settled by a person.
    model = ScriptedClient([reply(tool_use("charge_card", {"amount_cents": 5})), reply(text("ok"))])
    run = start_run("test-agent", "charge", owner=owner)
    crashed_at(monkeypatch, "tool.before_handler", model, run=run)
    drive(run, model)
    call = ToolCall.objects.get(run=run)
    services.resolve_tool_call(
        call, by=owner, action="done", result={"id": 1}, token=services.approval_token(call)
    )
    drive(run, model)
    runs.append(run)

    # A read-only call re-run after a crash; then the same call twice more: a loop.
    same = [reply(tool_use("lookup", {"query": "q"})) for _ in range(3)]
    model = ScriptedClient([*same, reply(text("ok"))])
    run = start_run("test-agent", "look", owner=owner)
    crashed_at(monkeypatch, "tool.after_handler", model, run=run)
    drive(run, model)
    runs.append(run)

    # The API refused a turn for a rate limit (parked, model_rate_limited), then answered.
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    model = ScriptedClient(
        [error("429 rate_limit_error: slow down", status=429), reply(text("ok"))]
    )
    run = start_run("test-agent", "busy", owner=owner)
    drive(run, model)
    runs.append(run)

    # A budget breach before the second turn; a model error inside a turn.
    usage = {"input_tokens": 10, "output_tokens": 4000}
    model = ScriptedClient([reply(tool_use("lookup", {"query": "a"}), usage=usage)])
    run = start_run("tiny-budget", "spend", owner=owner)
    drive(run, model)
    runs.append(run)
    run = start_run("test-agent", "fail", owner=owner)
    drive(run, ScriptedClient([]))
    runs.append(run)

    # The reaper: a queued run nobody started, and one past its deadline.
    run = start_run("test-agent", "lost", owner=owner)
    reap(now=timezone.now() + timedelta(seconds=1), stale_after=0, run_ids=[run.pk])
    runs.append(run)
    run = start_run("test-agent", "late", owner=owner, deadline=timedelta(seconds=-1))
    reap(run_ids=[run.pk])
    runs.append(run)

    # A conversation: a message rolls back the one before it (run_rolled_back).
    conversation = services.start_conversation("chat", owner=owner)
    first = services.send_message(conversation, "first", context="Monday")
    second = services.send_message(conversation, "second", policy="rollback", by=owner)
    runs += [first, second]
    return runs


def test_events_endpoint__shows_only_what_the_run_detail_shows(owner, history):
    seen: set[str] = set()
    client = APIClient()
    client.force_authenticate(owner)
    for run in history:
        response = client.get(reverse("agentrun:run-events", args=[run.pk]), {"limit": 500})
        assert response.status_code == 200
        raw = response.content.decode()
        assert "You are a test agent." not in raw  # the system prompt of the config
        for started in RunEvent.objects.filter(run=run, type="run_started"):
            assert started.payload["worker"] not in raw  # host:pid or the like
        for event in response.json()["results"]:
            seen.add(event["type"])
            assert not all_keys(event["payload"]) & HIDDEN, event
            assert set(event["payload"]) <= set(ALLOWLIST[event["type"]]), event
        stored = RunEvent.objects.filter(run=run)
        for event in stored:
            assert event.type in EventType.values, event.type  # every type the code writes
    # The scenarios wrote every type there is (a new type needs a scenario here too).
    assert seen == set(EventType.values), sorted(set(EventType.values) - seen)


def test_events_endpoint__keeps_what_people_need(owner, history, django_assert_max_num_queries):
    client = APIClient()
    client.force_authenticate(owner)
    run = history[0]  # approved with edited arguments
    with django_assert_max_num_queries(4):  # permissions (user, group), the run, its events
        events = client.get(reverse("agentrun:run-events", args=[run.pk])).json()["results"]
    by_type: dict[str, dict] = {}
    for event in events:
        by_type.setdefault(event["type"], event["payload"])  # the first of each type
    assert by_type["run_created"]["input"] == "delete bob"
    assert by_type["run_created"]["owner"] == owner.pk
    assert by_type["approval_requested"]["payload"]["arguments"] == {"user": "bob"}
    assert by_type["approval_decided"]["arguments"] == {"user": "eve"}
    assert by_type["approval_decided"]["decision"] == "approved"
    assert by_type["model_response"]["content"][0]["text"] == "Deleting."
    assert by_type["run_completed"]["stop_reason"] == "end_turn"
    # The configuration snapshot is stored once, on the run (not in run_created).
    created = RunEvent.objects.get(run=run, type="run_created").payload
    assert "config" not in created
    assert run.config["system"] == "You are a test agent."


# --------------------------------------------------------------------------- the admin


@pytest.fixture
def staff(db) -> User:
    return factories.user(
        "staff", "view_run", "view_toolcall", "view_runevent", "view_all_runs", is_staff=True
    )


@pytest.fixture
def parked():
    run, call, _ = factories.parked()
    event = RunEvent.objects.get(run=run, type="approval_requested")
    assert "token" not in event.payload and "token" not in event.payload["payload"]
    return run, event, services.approval_token(call)


def test_admin_event_pages__no_tokens_but_the_config(client, staff, parked):
    run, event, token = parked
    client.force_login(staff)
    pages = {
        "list": client.get(reverse("admin:agentrun_runevent_changelist")),
        "event": client.get(reverse("admin:agentrun_runevent_change", args=[event.pk])),
        "run timeline": client.get(reverse("admin:agentrun_run_change", args=[run.pk])),
    }
    for name, page in pages.items():
        assert page.status_code == 200, name
        assert token.split(":")[-1] not in page.content.decode(), name  # not even its signature
    # Admins may read the config (the run's snapshot, on its page).
    assert "You are a test agent." in pages["run timeline"].content.decode()


@pytest.mark.no_projection_check
def test_admin_event_summaries__redact_tokens(client, staff):
    # A short payload, so the token falls within the summaries' length.
    run = start_run("test-agent", "x")
    event = RunEvent.objects.create(
        run=run, seq=2, type="approval_requested", payload={"a": {"token": "SECRET-tok"}}
    )
    client.force_login(staff)
    for url in (
        reverse("admin:agentrun_runevent_changelist"),
        reverse("admin:agentrun_run_change", args=[run.pk]),
        reverse("admin:agentrun_runevent_change", args=[event.pk]),
    ):
        html = client.get(url).content.decode()
        assert "SECRET-tok" not in html and REDACTED in html, url
