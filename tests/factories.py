"""Builders of the runs tests start from, driven in this process by the scripted client:
one copy each instead of one per test module.

Each returns what the tests then act on and asserts the state it promises, so a builder
that stops building what it says fails where it is used, not three asserts later.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from django_agentrun import start_run
from django_agentrun.engine import advance
from django_agentrun.failpoints import FailpointError
from django_agentrun.models import Run, ToolCall
from django_agentrun.states import RunState, ToolCallState
from django_agentrun.testing import ScriptedClient, error, reply, text, tool_use
from tests.conftest import drive

# A lease holder on another host: never taken for "a dead local process", so only the
# lease's expiry lets anyone take over.
ELSEWHERE = "deadhost:999999:deadbeef"


def user(username: str, *codenames: str, **extra) -> User:
    """A user (password "pw") holding the app's permissions named by `codenames`, loaded
    afresh so its permission cache sees them; `extra` goes to `create_user` (is_staff)."""
    created = User.objects.create_user(username, password="pw", **extra)
    created.user_permissions.set(
        Permission.objects.filter(content_type__app_label="agentrun", codename__in=codenames)
    )
    return User.objects.get(pk=created.pk)


def expire(run: Run, *, owner: str | None = None, ago: timedelta = timedelta(seconds=1)) -> None:
    """End the lease on `run` as a worker that stopped renewing it would: expired `ago`,
    held by `owner` if given (as a killed worker would leave it)."""
    fields: dict = {"lease_expires_at": timezone.now() - ago}
    if owner is not None:
        fields["lease_owner"] = owner
    Run.objects.filter(pk=run.pk).update(**fields)


def completed_run(owner=None) -> Run:
    run = start_run("test-agent", "hello", owner=owner)
    drive(run, ScriptedClient([reply(text("Hello."))]))
    assert run.state == RunState.COMPLETED
    return run


def failed_run(owner=None) -> Run:
    """A run the model refused with a non-retryable 400."""
    run = start_run("test-agent", "hello", owner=owner)
    drive(run, ScriptedClient([error("bad request", retryable=False, status=400)]))
    assert run.state == RunState.FAILED, (run.state, run.error_code)
    return run


def parked(owner=None) -> tuple[Run, ToolCall, ScriptedClient]:
    """A test-agent run parked on a delete_account call that needs approval; the model's
    second reply ("Done.") ends the run once the call is decided."""
    model = ScriptedClient(
        [
            reply(text("Deleting."), tool_use("delete_account", {"user": "bob"})),
            reply(text("Done.")),
        ]
    )
    run = start_run("test-agent", "delete bob", owner=owner)
    drive(run, model)
    call = ToolCall.objects.get(run=run)
    assert (run.state, call.state) == (RunState.AWAITING_APPROVAL, ToolCallState.AWAITING_APPROVAL)
    return run, call, model


def crashed_at(monkeypatch, point: str, script, *, agent: str = "test-agent", run=None) -> Run:
    """A run whose worker died at failpoint `point`: the failpoint raises, then the lease
    is expired in the name of a holder elsewhere, as a killed worker would leave it."""
    run = run or start_run(agent, "hello")
    client = script if isinstance(script, ScriptedClient) else ScriptedClient(script)
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", f"{point}=raise")
    try:
        with pytest.raises(FailpointError):
            for _ in range(5):
                advance(run.pk, client=client)
    finally:
        monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    expire(run, owner=ELSEWHERE, ago=timedelta(minutes=5))
    return run


def unknown(monkeypatch, owner=None) -> tuple[Run, ToolCall, ScriptedClient]:
    """A charge_card call (non_idempotent, no reconcile check) whose worker died before
    its handler: recovered as unknown and parked for a person; the model's second reply
    ("Charged.") ends the run once a person settles it."""
    model = ScriptedClient(
        [reply(tool_use("charge_card", {"amount_cents": 500})), reply(text("Charged."))]
    )
    run = start_run("test-agent", "charge", owner=owner)
    crashed_at(monkeypatch, "tool.before_handler", model, run=run)
    drive(run, model)
    call = ToolCall.objects.get(run=run)
    assert (run.state, call.state) == (RunState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)
    return run, call, model


def conversation_script(*, then=None) -> ScriptedClient:
    """Four turns: 0 looks the order up, 1 saves a note and looks again, 2 sends a message
    (non_idempotent), 3 answers. `then` replaces the reply at step 2 (a fork's new turn)."""
    steps = [
        reply(text("Looking it up."), tool_use("lookup", {"query": "order 42"})),
        reply(
            text("Noting it."),
            tool_use("save_note", {"text": "order 42 shipped"}),
            tool_use("lookup", {"query": "ann"}),
        ),
        reply(
            text("Telling Ann."),
            tool_use("send_message", {"to": "ann@example.com", "body": "Shipped."}),
        ),
        reply(text("All done.")),
    ]
    if then is not None:
        steps[2:] = then
    return ScriptedClient(steps)


def conversation(owner=None) -> tuple[Run, ScriptedClient]:
    """A completed test-agent run of four turns (`conversation_script`)."""
    model = conversation_script()
    run = start_run("test-agent", "Tell Ann about order 42.", owner=owner)
    drive(run, model)
    assert (run.state, run.turns.count()) == (RunState.COMPLETED, 4)
    return run, model


def by_message(replies: dict[str, list]):
    """A Messages API stand-in script for conversations: the replies to each message (by its
    input text), one per turn of the run that answers it. A request is for the newest user
    message holding one of those texts, and for the turn counted by the assistant messages
    after it (step counts of the whole history move when a rollback removes turns)."""

    def script(body: dict):
        messages = body["messages"]
        for i in range(len(messages) - 1, -1, -1):
            content = messages[i]["content"]
            if messages[i]["role"] != "user":
                continue
            texts = [content] if isinstance(content, str) else [b.get("text") for b in content]
            key = next((t for t in reversed(texts) if t in replies), None)
            if key is not None:
                turn = sum(1 for m in messages[i + 1 :] if m["role"] == "assistant")
                return replies[key][turn]
        raise AssertionError(f"no scripted message in {messages!r}")

    return script
