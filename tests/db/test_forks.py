"""Forking a run from a turn: a new queued run with a copy of the turns before it, closed
calls with their recorded results (nothing re-executed), picked up by the engine at that turn."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from django_agentrun import fork_run, services
from django_agentrun.agents import owner_user_id
from django_agentrun.engine import Outcome
from django_agentrun.events import public_payload
from django_agentrun.exceptions import InvalidInput, InvalidTransition
from django_agentrun.models import RunEvent
from django_agentrun.states import ResultSource, RunState, ToolCallState, TurnState
from django_agentrun.testing import reply, text, tool_use
from tests import factories
from tests.conftest import assert_projection_matches, drive
from tests.testapp.agents import executions

pytestmark = pytest.mark.django_db


@pytest.fixture
def original(test_log):
    owner = User.objects.create_user("carol")
    run, model = factories.conversation(owner=owner)
    return run, model


def test_fork__copies_the_turns_before_and_reexecutes_nothing(
    original, no_broker, django_capture_on_commit_callbacks
):
    run, model = original
    operator = User.objects.create_user("oscar")
    before = {kind: len(executions(kind)) for kind in ("lookup", "save_note", "send_message")}
    with django_capture_on_commit_callbacks(execute=True):
        fork = fork_run(run, at_turn=2, by=operator)

    assert no_broker == [str(fork.pk)]  # woken after commit
    assert (fork.state, fork.forked_from, fork.forked_at_turn) == (RunState.QUEUED, run, 2)
    assert (fork.agent, fork.input, fork.metadata) == (run.agent, run.input, run.metadata)
    # The operator's run, acting with the operator's credentials: the model provider's
    # end-user id is theirs too; the rest of the snapshot is the original's.
    assert fork.owner == operator
    assert fork.config == {**run.config, "metadata": {"user_id": owner_user_id(operator)}}
    assert fork.config["metadata"] != run.config["metadata"]
    assert list(run.forks.all()) == [fork]
    assert [t.index for t in fork.turns.order_by("index")] == [0, 1]
    assert all(t.state == TurnState.COMPLETED for t in fork.turns.all())
    copied = {(c.turn_index, c.tool_call_id): c for c in fork.tool_calls.all()}
    originals = {(c.turn_index, c.tool_call_id): c for c in run.tool_calls.filter(turn_index__lt=2)}
    assert set(copied) == set(originals) and len(copied) == 3
    for key, call in copied.items():
        source = originals[key]
        assert (call.state, call.result, call.result_source, call.arguments) == (
            source.state,
            source.result,
            source.result_source,
            source.arguments,
        )
        assert call.idempotency_key != source.idempotency_key  # keyed by the new run
    # The usage of the copied turns is the fork's (its budget sees its whole conversation).
    turns = list(run.turns.filter(index__lt=2))
    assert fork.input_tokens == sum(t.input_tokens for t in turns)
    assert fork.turn_count == 2
    created = RunEvent.objects.get(run=fork, seq=1)
    assert created.payload["forked_from"] == str(run.pk)
    assert (created.payload["forked_at_turn"], created.payload["forked_by"]) == (2, operator.pk)
    assert public_payload(created.type, created.payload)["forked_from"] == str(run.pk)
    assert_projection_matches(fork)

    # The engine picks it up at turn 2 and asks the model with the same history as before.
    second = factories.conversation_script(
        then=[
            reply(
                text("Telling Bob."),
                tool_use("send_message", {"to": "bob@example.com", "body": "x"}),
            ),
            reply(text("Told Bob.")),
        ]
    )
    assert drive(fork, second)[-1] == Outcome.FINISHED
    assert fork.state == RunState.COMPLETED
    assert [r.messages for r in second.requests][0] == model.requests[2].messages
    assert {kind: len(executions(kind)) for kind in before} == {
        **before,
        "send_message": before["send_message"] + 1,
    }
    sent = fork.tool_calls.get(turn_index=2)
    assert (sent.arguments["to"], sent.result_source) == ("bob@example.com", ResultSource.EXECUTED)
    assert_projection_matches(fork)
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.turns.count() == 4  # untouched


def test_fork__at_turn_zero_starts_over_with_the_input(original):
    run, _ = original
    fork = fork_run(run, at_turn=0)
    assert (fork.turns.count(), fork.tool_calls.count(), fork.input_tokens) == (0, 0, 0)
    model = factories.conversation_script()
    assert drive(fork, model)[-1] == Outcome.FINISHED
    assert model.requests[0].messages == [{"role": "user", "content": run.input}]


def test_fork__refused_where_a_call_has_no_result(monkeypatch):
    run, call, _ = factories.parked()
    with pytest.raises(services.ForkRefused, match="not closed.*delete_account"):
        fork_run(run, at_turn=1)
    assert isinstance(services.ForkRefused(), InvalidTransition)  # the API's 409
    assert [p.allowed for p in services.fork_points(run)] == [True, False]
    fork = fork_run(run, at_turn=0)  # before the open call: allowed
    assert fork.turns.count() == 0
    call.refresh_from_db()
    assert call.state == ToolCallState.AWAITING_APPROVAL  # the original is untouched


def test_fork__unknown_outcome_blocks_the_turns_after_it(monkeypatch):
    run, _, _ = factories.unknown(monkeypatch)
    points = services.fork_points(run)
    assert [p.allowed for p in points] == [True, False]
    assert "unknown" in points[1].reason


@pytest.mark.parametrize("turn", [5, 99, -1, "2", True, None])
def test_fork__a_turn_the_run_does_not_have_is_invalid_input(original, turn):
    run, _ = original
    events = RunEvent.objects.count()
    with pytest.raises(InvalidInput):
        fork_run(run, at_turn=turn)
    assert RunEvent.objects.count() == events


def test_fork__after_the_final_answer_is_refused(original):
    run, _ = original
    points = services.fork_points(run)
    assert [p.allowed for p in points] == [True, True, True, True, False]
    assert "end_turn" in points[4].reason
    with pytest.raises(services.ForkRefused, match="conversation ended"):
        fork_run(run, at_turn=4)


def test_fork__of_a_fork(original):
    run, _ = original
    first = fork_run(run, at_turn=3)
    second = fork_run(first, at_turn=2)
    assert (second.forked_from, second.turns.count()) == (first, 2)
    assert_projection_matches(second)


def test_fork__a_cancelled_turn_is_copied_with_its_synthetic_results(monkeypatch):
    run, call, _ = factories.parked()
    services.cancel_run(run, reason="stop")
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    fork = fork_run(run, at_turn=1)
    copy = fork.tool_calls.get()
    assert (copy.state, copy.is_error, copy.result_source) == (
        ToolCallState.CANCELLED,
        True,
        ResultSource.SYNTHETIC,
    )
    assert fork.turns.get().state == TurnState.CANCELLED
    assert_projection_matches(fork)
