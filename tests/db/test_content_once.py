"""Each byte of a model's answer and of a tool's result is written once (issue #38): the
model_response event holds a turn's content, the event that recorded a call's result holds
it, and the rows name those events (`content_seq`, `result_seq`) and keep no copy. Every
reader shows the same thing whether a row names its event or, as rows written before
migration 0020 do, holds its value inline."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_agentrun import start_run
from django_agentrun.engine.projection import project
from django_agentrun.models import Run, RunEvent, ToolCall, Turn
from django_agentrun.services import approve_tool_call, fork_run, replace_tool_result
from django_agentrun.states import RunState
from django_agentrun.testing import ScriptedClient, error, reply, text, tool_use
from tests.conftest import drive
from tests.streams import stream

# What differs between two renderings of the same page: a form's CSRF token, the UI-message
# stream's part ids (each connection's own suffix).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]

_VOLATILE = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"|(?<=-r-\d)-[0-9a-f]{8}"')


@pytest.fixture
def root():
    return User.objects.create_superuser("root", password="pw")


def _runs() -> tuple[Run, Run]:
    """A completed run (answers, a tool call, one a person approved with edited arguments)
    and a failed one whose call's result a person replaced."""
    model = ScriptedClient(
        [
            reply(text("Looking."), tool_use("lookup", {"query": "bob"}, id="toolu_a1")),
            reply(text("Deleting."), tool_use("delete_account", {"user": "bob"}, id="toolu_a2")),
            reply(text("Done.")),
        ]
    )
    run = start_run("test-agent", "delete bob")
    drive(run, model)
    approve_tool_call(
        ToolCall.objects.get(run=run, tool_call_id="toolu_a2"), by=None, arguments={"user": "bo"}
    )
    drive(run, model)
    failed = start_run("test-agent", "look")
    drive(
        failed,
        ScriptedClient(
            [
                reply(text("Looking."), tool_use("lookup", {"query": "x"}, id="toolu_b1")),
                error("bad request", retryable=False, status=400),
            ]
        ),
    )
    assert (run.state, failed.state) == (RunState.COMPLETED, RunState.FAILED)
    replace_tool_result(ToolCall.objects.get(run=failed), by=None, result={"fixed": True})
    return run, failed


def _again() -> ScriptedClient:
    """The model of a fork at turn 2 (its replies go by the turn asked)."""
    return ScriptedClient([reply(text("Unused.")), reply(text("Unused.")), reply(text("Again."))])


def _inline(run: Run) -> int:
    """Rewrite `run`'s turns and calls as rows written before 0020 hold them: their values
    inline. How many rows named an event."""
    turns = [t for t in Turn.objects.filter(run=run) if t.content_seq is not None]
    for turn in turns:
        Turn.objects.filter(pk=turn.pk).update(content=turn.content, content_seq=None)
    calls = [c for c in ToolCall.objects.filter(run=run) if c.result_seq is not None]
    for call in calls:
        ToolCall.objects.filter(pk=call.pk).update(result=call.result, result_seq=None)
    return len(turns) + len(calls)


def _render(user: User, run: Run) -> dict[str, str]:
    """What every reader shows of `run`: the API, both streams' replay, the admin's pages,
    the projection."""
    client = Client()
    client.force_login(user)
    calls = ToolCall.objects.filter(run=run)
    pages = {
        "run": reverse("agentrun:run-detail", args=[run.pk]),
        "events": reverse("agentrun:run-events", args=[run.pk]),
        "admin run": reverse("admin:agentrun_run_change", args=[run.pk]),
        "admin runs": reverse("admin:agentrun_run_changelist"),
        **{
            f"admin turn {t.index}": reverse(
                "admin:agentrun_run_value", args=[run.pk, f"turn-{t.index}"]
            )
            for t in Turn.objects.filter(run=run)
        },
        **{
            f"admin call {c.pk}": reverse("admin:agentrun_toolcall_change", args=[c.pk])
            for c in calls
        },
    }
    out = {}
    for name, path in pages.items():
        response = client.get(path)
        assert response.status_code == 200, (name, response.status_code)
        out[name] = _VOLATILE.sub("", response.content.decode())
    stream_path = reverse("agentrun:run-stream", args=[run.pk])
    for fmt in ("events", "ai-sdk"):
        response, body = stream(f"{stream_path}?format={fmt}", user=user)
        assert response.status_code == 200
        out[f"stream {fmt}"] = _VOLATILE.sub("", body)
    out["projection"] = repr(project(list(RunEvent.objects.filter(run=run).order_by("seq"))))
    return out


def test_content_once__rows_name_their_events_and_hold_no_copy():
    run = start_run("test-agent", "hello")
    drive(
        run,
        ScriptedClient(
            [reply(text("Looking."), tool_use("lookup", {"query": "q"})), reply(text("Done."))]
        ),
    )
    turns = list(Turn.objects.filter(run=run).order_by("index"))
    # The columns as stored (values_list reads them, not the events).
    stored = list(
        Turn.objects.filter(run=run).order_by("index").values_list("content", "content_seq")
    )
    assert len(stored) == 2
    for turn, (inline, seq) in zip(turns, stored, strict=True):
        event = RunEvent.objects.get(run=run, seq=seq)
        assert (inline, event.type) == (None, "model_response")
        assert turn.content == event.payload["content"] and turn.content


def test_content_once__every_reader_shows_the_same_either_way(root):
    run, failed = _runs()
    fork = fork_run(run, at_turn=2, by=root)
    drive(fork, _again())  # a live run's stream would not end
    runs = [run, failed, fork]
    after = {r.pk: _render(root, r) for r in runs}
    assert [_inline(r) for r in runs] == [3 + 2, 1 + 1, 3 + 2]
    before = {r.pk: _render(root, r) for r in runs}
    for r in runs:
        for name, shown in after[r.pk].items():
            assert shown == before[r.pk][name], (r.pk, name)
    assert "Deleting." in after[run.pk]["admin turn 1"]


def test_content_once__the_history_is_the_same_either_way():
    """The claim's history (queries.sql select_turns, or the ORM on SQLite) reads what a
    row names: two forks of one run, one rewritten as an old row, ask the same."""
    run, _failed = _runs()
    asked = []
    for old in (False, True):
        fork = fork_run(run, at_turn=2)
        if old:
            assert _inline(fork) == 2 + 2
        client = _again()
        drive(fork, client)
        assert fork.state == RunState.COMPLETED
        asked.append(client.requests[0].messages)
    assert asked[0] == asked[1]
    assert asked[0][1] == {
        "role": "assistant",
        "content": [text("Looking."), *asked[0][1]["content"][1:]],
    }


def test_content_once__a_call_names_the_event_of_the_result_it_holds_now():
    """A replaced result: the call names the replacement's event; the event that closed it
    still says what the result was then."""
    _run, failed = _runs()
    call = ToolCall.objects.get(run=failed)
    inline, seq = ToolCall.objects.filter(pk=call.pk).values_list("result", "result_seq").get()
    events = {e.type: e for e in RunEvent.objects.filter(run=failed)}
    replaced, finished = events["tool_result_replaced"], events["tool_call_finished"]
    assert (inline, seq) == (None, replaced.seq)
    assert call.result == replaced.payload["result"] == {"fixed": True}
    assert finished.payload["result"] != call.result and finished.payload["result"] is not None
