"""Every admin page renders whatever a run can hold: NUL characters and lone surrogates in
its input, the model's words, arguments and results; HTML, escaped; a 2 MB input, folded
with a link to the whole of it; values nested deeper than a pretty printer goes."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_agentrun import services, start_run
from django_agentrun.admin.display import printable
from django_agentrun.fields import ESCAPE
from django_agentrun.models import Run, ToolCall
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive

# The awkward runs have their input rewritten in the row (as an earlier release stored it),
# not in their events: the projection check does not apply.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver, pytest.mark.no_projection_check]

AWKWARD = "a\x00b \udcff c" + ESCAPE + "0000 \\u0000 \U0001f600 <i>html</i>"
# Tool arguments cannot hold a lone surrogate today: the engine's argument hash encodes them
# as UTF-8 and fails (reported to the engine's maintainers); everything else can.
ARGUMENTS = AWKWARD.replace("\udcff", "")
BIG = "B" * 2_000_000


def deep(levels: int):
    value: object = "bottom"
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture
def awkward_runs():
    """A finished run, a parked call and a 2 MB input, all holding awkward values."""
    model = ScriptedClient(
        [
            reply(
                text(AWKWARD + " <script>alert(1)</script>"),
                tool_use("lookup", {"query": ARGUMENTS}),
            ),
            reply(text("Now " + AWKWARD), tool_use("delete_account", {"user": ARGUMENTS})),
        ]
    )
    run = start_run(
        "test-agent",
        [{"type": "text", "text": ARGUMENTS}],
        metadata={"deep": deep(300), AWKWARD: AWKWARD},
    )
    drive(run, model)
    big = start_run("test-agent", BIG + ARGUMENTS)
    drive(big, ScriptedClient([reply(text("Short answer."))]))
    # Input that start_run refuses today (a lone surrogate cannot be sent) may still be
    # stored by an earlier release: the pages render it too.
    Run.objects.filter(pk=run.pk).update(input=[{"type": "text", "text": AWKWARD}])
    Run.objects.filter(pk=big.pk).update(input=BIG + AWKWARD)
    return run, big


@pytest.fixture
def root(client):
    user = User.objects.create_superuser("root", password="pw")
    client.force_login(user)
    return user


def pages(run: Run) -> list[str]:
    """Every admin page of `run`, its calls and its events."""
    urls = [
        reverse("admin:agentrun_run_changelist"),
        reverse("admin:agentrun_run_changelist") + "?stuck=lease_expired",
        reverse("admin:agentrun_run_changelist") + f"?q={run.pk}",
        reverse("admin:agentrun_run_change", args=[run.pk]),
        reverse("admin:agentrun_run_history", args=[run.pk]),
        reverse("admin:agentrun_run_fork", args=[run.pk]) + "?turn=0",
        reverse("admin:agentrun_toolcall_changelist") + "?decision=all",
        reverse("admin:agentrun_runevent_changelist"),
        *(
            reverse("admin:agentrun_run_value", args=[run.pk, n])
            for n in ("input", "output", "metadata", "config")
        ),
    ]
    for turn in run.turns.all():
        urls.append(reverse("admin:agentrun_run_value", args=[run.pk, f"turn-{turn.index}"]))
    for call in ToolCall.objects.filter(run=run):
        urls.append(reverse("admin:agentrun_toolcall_change", args=[call.pk]))
        for name in ("arguments", "original_arguments", "result", "approval_payload"):
            urls.append(reverse("admin:agentrun_toolcall_value", args=[call.pk, name]))
        if call.state == "awaiting_approval":
            urls.append(reverse("admin:agentrun_toolcall_approve", args=[call.pk]))
            urls.append(reverse("admin:agentrun_toolcall_reject", args=[call.pk]))
    for event in run.events.all():
        urls.append(reverse("admin:agentrun_runevent_change", args=[event.pk]))
        urls.append(reverse("admin:agentrun_runevent_value", args=[event.pk, "payload"]))
    return urls


def test_every_page__renders_awkward_values_escaped(client, root, awkward_runs):
    run, _ = awkward_runs
    assert run.state == "awaiting_approval"
    for url in pages(run):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        body = response.content.decode()  # UTF-8: no lone surrogate reached the page
        assert "\x00" not in body, url
        if response["Content-Type"].startswith("text/plain"):  # a value view: never HTML
            assert response["X-Content-Type-Options"] == "nosniff", url
        else:
            assert "<script>alert(1)</script>" not in body, url
    page = client.get(reverse("admin:agentrun_run_change", args=[run.pk])).content.decode()
    assert printable(AWKWARD).replace("<", "&lt;").replace(">", "&gt;") in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the model's words, escaped


def test_bulk_confirmation__renders_awkward_arguments(client, root, awkward_runs):
    run, _ = awkward_runs
    call = run.tool_calls.get(state="awaiting_approval")
    response = client.post(
        reverse("admin:agentrun_toolcall_changelist"),
        {"action": "approve_selected", "_selected_action": [call.pk], "index": "0"},
    )
    assert response.status_code == 200
    assert "a\\u0000b" in response.content.decode()  # the arguments, as JSON writes NUL


def test_large_values__folded_with_a_link_to_the_whole(client, root, awkward_runs):
    _, big = awkward_runs
    page = client.get(reverse("admin:agentrun_run_change", args=[big.pk]))
    assert page.status_code == 200
    assert len(page.content) < 200_000  # not 2 MB in the page: twice folded at most
    assert "Show all" in page.text and "1,99" in page.text  # how much more there is
    whole = client.get(reverse("admin:agentrun_run_value", args=[big.pk, "input"]))
    assert whole["Content-Type"] == "text/plain; charset=utf-8"
    assert whole.content.decode().startswith(BIG)
    assert "\\x00" in whole.content.decode() and "\\udcff" in whole.content.decode()
    listing = client.get(reverse("admin:agentrun_run_changelist"))
    assert len(listing.content) < 100_000
    assert re.search(r"B{60}…", listing.text)  # the input column: one short line


def test_value_views__unknown_names_and_ids_are_404(client, root, awkward_runs):
    run, _ = awkward_runs
    for url in (
        reverse("admin:agentrun_run_value", args=[run.pk, "lease_owner"]),
        reverse("admin:agentrun_run_value", args=[run.pk, "turn-99"]),
        reverse("admin:agentrun_run_value", args=[run.pk, "turn-x"]),
        reverse("admin:agentrun_run_value", args=["not-a-uuid", "input"]),
        reverse("admin:agentrun_toolcall_value", args=["abc", "result"]),
    ):
        assert client.get(url).status_code == 404, url


def test_deep_values__shown_compact_not_a_server_error(client, root, awkward_runs):
    run, _ = awkward_runs
    response = client.get(reverse("admin:agentrun_run_value", args=[run.pk, "metadata"]))
    assert response.status_code == 200
    assert '"bottom"' in response.content.decode()


def test_bad_input_anywhere__a_message_not_a_server_error(client, root, awkward_runs):
    run, _ = awkward_runs
    call = run.tool_calls.get(state="awaiting_approval")
    changelist = reverse("admin:agentrun_toolcall_changelist")
    for url, data in (
        (changelist, {"action": "approve_selected", "_selected_action": ["abc"], "index": "0"}),
        (changelist, {"action": "approve_selected", "_selected_action": ["99999999999999999999"]}),
        (
            reverse("admin:agentrun_run_changelist"),
            {"action": "cancel_selected", "_selected_action": ["x"]},
        ),
        (reverse("admin:agentrun_run_fork", args=[run.pk]), {"turn": "x"}),
        (reverse("admin:agentrun_run_fork", args=[run.pk]), {"turn": "99"}),
        (reverse("admin:agentrun_toolcall_approve", args=[call.pk]), {"approve-token": "\x00"}),
        (
            reverse("admin:agentrun_toolcall_reject", args=[call.pk]),
            {"reject-token": "t", "reject-reason": "\x00"},
        ),
        (reverse("admin:agentrun_toolcall_resolve", args=[call.pk]), {"resolve-action": "nope"}),
    ):
        response = client.post(url, data, follow=True)
        assert response.status_code == 200, (url, data, response.status_code)
    for query in (
        "?q=%00",
        "?q=%ED%B3%BF",
        "?stuck=nope",
        "?state__exact=nope",
        "?created_at__gte=x",
    ):
        response = client.get(reverse("admin:agentrun_run_changelist") + query, follow=True)
        assert response.status_code == 200, query
    call.refresh_from_db()
    assert call.state == "awaiting_approval"
    assert services.approval_token(call)
