"""What the database cannot store (NUL, lone surrogates, NaN) behaves the same on SQLite and
Postgres: JSON values are stored faithfully, text that cannot be stored is refused, and a
result that cannot be stored never looks like a crash (which would re-run the tool)."""

from __future__ import annotations

import json
import math

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from rest_framework.test import APIClient

from django_agentrun import Agent, SideEffect, services, start_run, tool
from django_agentrun.exceptions import InvalidInput
from django_agentrun.fields import ESCAPE, storable_text
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive

pytestmark = pytest.mark.django_db

# NUL, a lone surrogate (what surrogateescape makes of an undecodable byte), the escape
# character itself, text that looks like an escape, and an ordinary emoji.
AWKWARD = "a\x00b \udcff c" + ESCAPE + "0000 \\u0000 \U0001f600"
CALLS: list[str] = []


@tool(side_effect=SideEffect.READ_ONLY)
def binary_output(path: str) -> dict:
    """Read a file (returns undecodable and NUL characters)."""
    CALLS.append("binary_output")
    return {"path": path, "content": AWKWARD, AWKWARD: [AWKWARD]}


@tool(side_effect=SideEffect.NON_IDEMPOTENT)
def not_a_number() -> list:
    """Return a value JSON cannot hold."""
    CALLS.append("not_a_number")
    return [{"type": "text", "text": "measured", "value": math.nan}]


Agent(
    name="storage-agent",
    model="claude-sonnet-4-6",
    tools=[binary_output, not_a_number],
    max_turns=5,
)


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()


def _raw(table: str, column: str, pk) -> object:
    """The stored JSON as the database returns it, decoded with no escaping rule."""
    qn = connection.ops.quote_name
    cast = "::text" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {qn(column)}{cast} FROM {qn(table)} WHERE id = %s", [pk])
        return json.loads(cursor.fetchone()[0])


def test_json__awkward_text_round_trips_and_is_stored_by_one_rule():
    value = {"k" + AWKWARD: [AWKWARD, 1, None, {"x": AWKWARD}]}
    sendable = AWKWARD.replace("\udcff", "")  # input must travel as UTF-8: no lone surrogate
    run = start_run("storage-agent", [{"type": "text", "text": sendable}], metadata=value)
    fresh = Run.objects.get(pk=run.pk)
    assert fresh.metadata == value
    assert fresh.input == [{"type": "text", "text": sendable}]
    # The same stored form on SQLite and Postgres: every NUL, lone surrogate and escape
    # character as U+FDD0 + four hex digits; nothing else changes.
    stored = _raw(Run._meta.db_table, "metadata", run.pk.hex)
    escaped = "a\ufdd00000b \ufdd0dcff c\ufdd0fdd00000 \\u0000 \U0001f600"
    assert stored == {"k" + escaped: [escaped, 1, None, {"x": escaped}]}
    created = RunEvent.objects.get(run=run, seq=1)
    assert created.payload["metadata"] == value


def test_json__plain_values_are_stored_unchanged():
    run = start_run("storage-agent", "plain", metadata={"emoji": "\U0001f600", "n": 1.5})
    assert _raw(Run._meta.db_table, "metadata", run.pk.hex) == {"emoji": "\U0001f600", "n": 1.5}


def test_tool_output_with_nul__recorded_faithfully_and_run_once():
    client = ScriptedClient(
        [reply(tool_use("binary_output", {"path": "/bin/ls"})), reply(text("ok"))]
    )
    run = start_run("storage-agent", "read it")
    drive(run, client)
    assert run.state == "completed", (run.error_code, run.error_message)
    assert CALLS == ["binary_output"]
    call = ToolCall.objects.get(run=run)
    assert call.state == "succeeded"
    result = call.result if isinstance(call.result, dict) else json.loads(call.result)
    assert result["content"] == AWKWARD
    # The model got it back in the next request, the undecodable byte (a lone surrogate,
    # which UTF-8 cannot carry) as U+FFFD, the rest as it was.
    sent = client.requests[1].messages[-1]["content"][0]["content"]
    assert json.loads(sent)["content"] == AWKWARD.replace("\udcff", "\ufffd")


def test_unstorable_result__becomes_an_error_result_not_a_rerun():
    client = ScriptedClient([reply(tool_use("not_a_number", {})), reply(text("noted"))])
    run = start_run("storage-agent", "go")
    drive(run, client)
    assert run.state == "completed", (run.error_code, run.error_message)
    assert CALLS == ["not_a_number"]  # executed once, never re-run
    call = ToolCall.objects.get(run=run)
    assert call.state == "errored" and call.is_error
    assert "ran, but its result cannot be recorded" in str(call.result)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input": [{"type": "text", "text": "x", "n": math.nan}]}, "input"),
        ({"metadata": {"n": math.inf}}, "metadata"),
        ({"correlation_id": "a\x00b"}, "correlation_id"),
        ({"idempotency_key": "k\x00"}, "idempotency key"),
    ],
)
def test_start_run__what_cannot_be_stored_is_refused(kwargs, message):
    kwargs.setdefault("input", "hello")
    with pytest.raises(InvalidInput, match=message):
        start_run("storage-agent", **kwargs)
    assert not Run.objects.exists()


def test_text_columns__people_are_refused_runtime_text_is_replaced():
    run = start_run("storage-agent", "x")
    with pytest.raises(InvalidInput, match="reason"):
        services.cancel_run(run, reason="stop\x00")
    assert storable_text("bad\x00 \udcff end") == "bad\ufffd \ufffd end"


def test_api__nul_and_surrogates_refused_in_every_field_400():
    """What people send holds no NUL or unpaired surrogate, in JSON values (keys included)
    as in text fields; tool output may (stored faithfully, above)."""
    user = User.objects.create_user("nul", password="pw")
    api = APIClient()
    api.force_authenticate(user)
    runs = reverse("agentrun:run-list")
    for field, value in (
        ("input", '"a\\u0000b"'),
        ("metadata", '{"k\\u0000": "v"}'),
        ("metadata", '{"k": "\\udcff"}'),
        ("metadata", '{"k": [{"deep": "x\\u0000"}]}'),
        ("options", '{"stop_sequences": ["\\ud800"]}'),
    ):
        body = f'{{"agent": "storage-agent", "input": "x", "{field}": {value}}}'
        response = api.post(runs, body, content_type="application/json")
        assert response.status_code == 400, (field, value, response.content)
        assert list(response.json()["errors"]) == [field], response.content
    run = start_run("storage-agent", "x", owner=user)
    # Input the model could not be sent (a lone surrogate): refused.
    body = '{"agent": "storage-agent", "input": "a \\udcff"}'
    response = api.post(runs, body, content_type="application/json")
    assert response.status_code == 400 and list(response.json()["errors"]) == ["input"]
    for field, value in (("correlation_id", "c\\u0000"), ("correlation_id", "\\udcff")):
        body = f'{{"agent": "storage-agent", "input": "x", "{field}": "{value}"}}'
        response = api.post(runs, body, content_type="application/json")
        assert response.status_code == 400, response.content
        assert list(response.json()["errors"]) == [field]
    cancel = reverse("agentrun:run-cancel", args=[run.pk])
    response = api.post(cancel, '{"reason": "stop\\udcff"}', content_type="application/json")
    assert response.status_code == 400 and list(response.json()["errors"]) == ["reason"]
    assert Run.objects.count() == 1
