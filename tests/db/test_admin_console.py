"""The admin as an operator's console: bulk decisions only through a confirmation page
(tokens per call, long arguments left out), tokens on every decision, what the decision
page shows, labels and dates, no delete for active runs, the stuck filters, forks."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from django_agentrun import services, start_run
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.states import RunState, ToolCallState
from django_agentrun.testing import ScriptedClient, reply, tool_use
from tests import factories
from tests.conftest import drive

pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

TOOLCALLS = reverse("admin:agentrun_toolcall_changelist")
RUNS = reverse("admin:agentrun_run_changelist")
VIEW = ("view_run", "view_toolcall", "view_runevent")


def texts(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def errors(response) -> list[str]:
    return [text for level, text in texts(response) if level == "error"]


@pytest.fixture
def olga(client):
    user = factories.user(
        "olga", *VIEW, "approve_toolcall", "view_all_runs", "cancel_run", is_staff=True
    )
    client.force_login(user)
    return user


def confirmation(client, name: str, calls) -> tuple[object, dict]:
    page = client.post(
        TOOLCALLS, {"action": name, "_selected_action": [c.pk for c in calls], "index": "0"}
    )
    assert page.status_code == 200
    return page, dict(re.findall(r'name="(token-\d+)" value="([^"]+)"', page.text))


def apply(client, name: str, calls, tokens: dict, **data):
    body = {
        "action": name,
        "_selected_action": [c.pk for c in calls],
        "apply": "1",
        **tokens,
        **data,
    }
    return client.post(TOOLCALLS, body, follow=True)


# --------------------------------------------------------------------------- bulk


def test_bulk__nothing_is_decided_before_the_confirmation(client, olga):
    calls = [factories.parked()[1] for _ in range(2)]
    events = RunEvent.objects.count()
    page, tokens = confirmation(client, "approve_selected", calls)
    assert len(tokens) == 2 and RunEvent.objects.count() == events
    for call in calls:
        assert f"agentrun-bulk-{call.pk}" in page.text and str(call.run_id) in page.text
    assert "non_idempotent" in page.text and "&quot;user&quot;: &quot;bob&quot;" in page.text
    response = apply(client, "approve_selected", calls, tokens, note="both fine")
    assert ("success", "Approved 2 tool calls.") in texts(response)
    assert {c.state for c in ToolCall.objects.filter(pk__in=[c.pk for c in calls])} == {
        ToolCallState.REQUESTED
    }


def test_bulk__without_the_pages_tokens_nothing_is_decided(client, olga):
    call = factories.parked()[1]
    response = apply(client, "approve_selected", [call], {})
    assert errors(response) and "no token" in errors(response)[0]
    forged = {f"token-{call.pk}": services.approval_token(call)[:-3] + "xyz"}
    response = apply(client, "reject_selected", [call], forged, reason="no")
    assert errors(response) and "approval token" in errors(response)[0]
    call.refresh_from_db()
    assert call.state == ToolCallState.AWAITING_APPROVAL


def test_bulk__a_call_decided_meanwhile_is_not_decided_again(client, olga):
    calls = [factories.parked()[1] for _ in range(2)]
    _, tokens = confirmation(client, "reject_selected", calls)
    services.approve_tool_call(calls[0], by=olga)  # someone else, on another page
    response = apply(client, "reject_selected", calls, tokens, reason="no")
    assert ("success", "Rejected 1 tool call.") in texts(response)
    assert any("no longer listed" in e for e in errors(response))  # the default filter: pending
    assert ToolCall.objects.get(pk=calls[0].pk).state == ToolCallState.REQUESTED


def test_bulk__arguments_too_long_to_show_are_left_out(client, olga):
    long = factories.parked()[1]
    model = ScriptedClient([reply(tool_use("delete_account", {"user": "x" * 5000}))])
    run = start_run("test-agent", "delete a long name")
    drive(run, model)
    too_long = run.tool_calls.get()
    page, tokens = confirmation(client, "approve_selected", [long, too_long])
    assert list(tokens) == [f"token-{long.pk}"]
    assert "too long to show here" in page.text and "x" * 5000 not in page.text
    response = apply(client, "approve_selected", [long, too_long], tokens)
    assert errors(response)  # the long one, posted anyway without its token
    too_long.refresh_from_db()
    assert too_long.state == ToolCallState.AWAITING_APPROVAL
    # On its own page it can be approved.
    token = services.approval_token(too_long)
    response = client.post(
        reverse("admin:agentrun_toolcall_approve", args=[too_long.pk]),
        {"approve-token": token},
        follow=True,
    )
    assert not errors(response)
    too_long.refresh_from_db()
    assert too_long.state == ToolCallState.REQUESTED


def test_bulk__the_reject_reason_starts_empty_and_is_required(client, olga):
    call = factories.parked()[1]
    page, tokens = confirmation(client, "reject_selected", [call])
    assert re.search(r'<textarea name="reason"[^>]*>\s*</textarea>', page.text)
    response = apply(client, "reject_selected", [call], tokens, reason="")
    assert "This field is required" in response.text
    assert ToolCall.objects.get(pk=call.pk).state == ToolCallState.AWAITING_APPROVAL


# --------------------------------------------------------------------------- one call


def test_decision_page__shows_what_the_decision_is_about(client, olga, settings):
    run, call, _ = factories.parked()
    page = client.get(reverse("admin:agentrun_toolcall_change", args=[call.pk])).text
    assert 'id="agentrun-conversation"' in page and "delete bob" in page  # the input
    assert "Deleting." in page  # the model's words
    assert "Delete an account" in page  # the tool's description
    assert call.idempotency_key in page and "non_idempotent" in page
    assert re.search(r'<textarea name="reject-reason"[^>]*>\s*</textarea>', page)
    assert "icon-no" not in page  # a waiting call is not a red cross
    assert "pending: waits for a decision" in page


def test_decision_page__an_edit_shows_as_a_diff(client, olga):
    _, call, _ = factories.parked()
    services.approve_tool_call(call, by=olga, arguments={"user": "alice"})
    page = client.get(reverse("admin:agentrun_toolcall_change", args=[call.pk])).text
    assert 'id="agentrun-diff"' in page
    assert '<span class="del">-  &quot;user&quot;: &quot;bob&quot;</span>' in page
    assert '<span class="add">+  &quot;user&quot;: &quot;alice&quot;</span>' in page


def test_decision_page__an_expired_token_is_refused(client, olga, settings):
    _, call, _ = factories.parked()
    page = client.get(reverse("admin:agentrun_toolcall_change", args=[call.pk])).text
    token = re.search(r'name="approve-token" value="([^"]+)"', page).group(1)
    settings.AGENTRUN_APPROVAL_TOKEN_MAX_AGE = -1  # the page was shown too long ago
    response = client.post(
        reverse("admin:agentrun_toolcall_approve", args=[call.pk]),
        {"approve-token": token},
        follow=True,
    )
    assert errors(response) and "expired" in errors(response)[0]
    assert ToolCall.objects.get(pk=call.pk).state == ToolCallState.AWAITING_APPROVAL


def test_resolve__needs_the_pages_token(client, olga, monkeypatch):
    _, call, _ = factories.unknown(monkeypatch)
    url = reverse("admin:agentrun_toolcall_resolve", args=[call.pk])
    response = client.post(url, {"resolve-action": "fail"})
    assert response.status_code == 200 and "token" in response.context["form"].errors
    stale = services.approval_token(ToolCall(pk=call.pk, arguments_hash=call.arguments_hash))
    response = client.post(url, {"resolve-action": "fail", "resolve-token": stale}, follow=True)
    assert errors(response) and "before this call's outcome became unknown" in errors(response)[0]
    assert ToolCall.objects.get(pk=call.pk).state == ToolCallState.UNKNOWN


# --------------------------------------------------------------------------- labels, dates, delete


def test_labels_and_dates__as_the_api_spells_them_in_one_format(client, olga):
    run, call, _ = factories.parked()
    for url in (
        RUNS,
        TOOLCALLS,
        reverse("admin:agentrun_runevent_changelist"),
        reverse("admin:agentrun_run_change", args=[run.pk]),
        reverse("admin:agentrun_toolcall_change", args=[call.pk]),
    ):
        page = client.get(url).text
        assert not re.search(
            r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d", page
        ), url
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page), url
    listing = client.get(RUNS).text
    assert ">awaiting_approval</span>" in listing and ">Awaiting approval<" not in listing
    assert 'href="?state__exact=awaiting_approval"' in listing


def test_delete__never_an_active_run(client, olga, django_user_model):
    root = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(root)
    active, _, _ = factories.parked()
    done = factories.completed_run()
    assert client.get(reverse("admin:agentrun_run_delete", args=[active.pk])).status_code == 403
    response = client.post(
        RUNS, {"action": "delete_selected", "_selected_action": [active.pk, done.pk]}, follow=True
    )
    assert errors(response) and "cancel it before deleting" in errors(response)[0]
    assert Run.objects.filter(pk__in=[active.pk, done.pk]).count() == 2
    confirm = client.post(RUNS, {"action": "delete_selected", "_selected_action": [done.pk]})
    assert "Are you sure" in confirm.text
    client.post(RUNS, {"action": "delete_selected", "_selected_action": [done.pk], "post": "yes"})
    assert not Run.objects.filter(pk=done.pk).exists()


# --------------------------------------------------------------------------- stuck runs


def test_stuck_filter__counts_and_finds_each_kind(client, olga, monkeypatch):
    parked, _, _ = factories.parked()
    script = [reply(tool_use("lookup", {"query": "q"}))]
    leased = factories.crashed_at(monkeypatch, "tool.before_handler", script)  # its worker died
    recovered = factories.completed_run()
    Run.objects.filter(pk=recovered.pk).update(recovery_attempts=3)
    Run.objects.filter(pk=parked.pk).update(updated_at=timezone.now() - timedelta(hours=2))
    listing = client.get(RUNS).text
    assert "Lease expired (its worker died?) (1)" in listing
    assert "Recovered more than once (1)" in listing
    assert "Waiting over 1 hour (1)" in listing and "Waiting over 1 day (0)" in listing
    for key, run in (("lease_expired", leased), ("recovered", recovered), ("waiting_1h", parked)):
        found = client.get(RUNS, {"stuck": key}).context["cl"].result_list
        assert [r.pk for r in found] == [run.pk], key


# --------------------------------------------------------------------------- forks


def test_fork__from_the_run_page_with_a_confirmation(client, olga):
    run, _ = factories.conversation()
    page = client.get(reverse("admin:agentrun_run_change", args=[run.pk])).text
    assert [int(t) for t in re.findall(r'id="agentrun-fork-(\d+)"', page)] == [0, 1, 2, 3]
    url = reverse("admin:agentrun_run_fork", args=[run.pk])
    confirm = client.get(url, {"turn": 2})
    assert confirm.status_code == 200 and "3 tool calls" in confirm.text
    assert Run.objects.count() == 1  # a GET forks nothing
    response = client.post(url, {"turn": "2"}, follow=True)
    fork = Run.objects.get(forked_from=run)
    assert response.redirect_chain[-1][0] == reverse("admin:agentrun_run_change", args=[fork.pk])
    assert 'id="agentrun-forked-from"' in response.text and str(run.pk) in response.text
    original = client.get(reverse("admin:agentrun_run_change", args=[run.pk])).text
    assert 'id="agentrun-forks"' in original and str(fork.pk)[:8] in original


def test_fork__refused_with_a_message(client, olga):
    run, _, _ = factories.parked()
    page = client.get(reverse("admin:agentrun_run_change", args=[run.pk])).text
    assert re.findall(r'id="agentrun-fork-(\d+)"', page) == ["0"]  # not past the open call
    url = reverse("admin:agentrun_run_fork", args=[run.pk])
    response = client.post(url, {"turn": "1"}, follow=True)
    assert errors(response) and "not closed" in errors(response)[0]
    assert Run.objects.count() == 1


def test_fork__needs_to_own_the_run_or_cancel_run(client, db):
    viewer = factories.user("vera", *VIEW, "view_all_runs", is_staff=True)
    theirs, _ = factories.conversation()
    mine, _ = factories.conversation(owner=viewer)
    client.force_login(viewer)
    page = client.get(reverse("admin:agentrun_run_change", args=[theirs.pk])).text
    assert "agentrun-fork-" not in page
    response = client.post(
        reverse("admin:agentrun_run_fork", args=[theirs.pk]), {"turn": "1"}, follow=True
    )
    assert errors(response) and "permission" in errors(response)[0]
    response = client.post(
        reverse("admin:agentrun_run_fork", args=[mine.pk]), {"turn": "1"}, follow=True
    )
    assert not errors(response)
    assert Run.objects.filter(forked_from=mine, owner=viewer).count() == 1
    assert not Run.objects.filter(forked_from=theirs).exists()


def test_owner__cancels_their_own_run_without_cancel_run(client, db):
    user = factories.user("sam", *VIEW, is_staff=True)
    run, _, _ = factories.parked(user)
    client.force_login(user)
    response = client.post(
        reverse("admin:agentrun_run_cancel", args=[run.pk]), {"reason": "mine"}, follow=True
    )
    assert not errors(response)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED


def test_every_event_of_a_note_is_in_the_conversation(client, olga, monkeypatch):
    run, call, model = factories.unknown(monkeypatch)
    services.resolve_tool_call(call, by=olga, action="retry", note="checked the provider")
    drive(run, model)
    page = client.get(reverse("admin:agentrun_run_change", args=[run.pk])).text
    assert "A worker took the run over" in page  # the recovery
    assert "outcome unknown after a crash" in page
    assert "resolved (retry) by olga: checked the provider" in page
    assert "Retried" not in page or "settled" not in page
    other, _, _ = factories.parked()
    services.cancel_run(other, by=olga, reason="wrong customer")
    page = client.get(reverse("admin:agentrun_run_change", args=[other.pk])).text
    assert "Cancel requested by olga: wrong customer" in page
    assert "This run is cancelled: wrong customer" in page


def test_run_page__a_long_conversation_shows_its_last_turns(client, olga, monkeypatch):
    from django_agentrun.admin import runs

    monkeypatch.setattr(runs, "MAX_CONVERSATION_TURNS", 2)
    run, _ = factories.conversation()
    url = reverse("admin:agentrun_run_change", args=[run.pk])
    page = client.get(url).text
    assert re.findall(r'id="turn-(\d+)"', page) == ["2", "3"]
    assert "Showing the last 2 of 4 turns." in page
    every = client.get(url, {"turns": "all"}).text
    assert re.findall(r'id="turn-(\d+)"', every) == ["0", "1", "2", "3"]
