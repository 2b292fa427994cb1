"""Kill a real worker at every failpoint; a fresh worker and the reaper finish the run.

Each run: turn 0 sends a message (non_idempotent, with a reconcile check), turn 1
looks something up (read_only) and saves a note (idempotent_write), turn 2 answers.
The failpoint fires the first time it is reached, in the first worker, which dies
at once (os._exit, solo pool: the whole worker). Then the counters must hold. A forked
run (services.fork_run, from turn 1 of a finished run) goes through the same matrix: it
starts with turn 0 copied, so its message is never sent again.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from django_agentrun import fork_run, send_message, start_conversation, start_run
from django_agentrun.failpoints import RUN_POINTS
from django_agentrun.recovery import reap
from django_agentrun.testing import ScriptedClient, reply
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use, web_search
from tests.conftest import (
    assert_conversation_projection_matches,
    assert_projection_matches,
    drive,
    purge_queue,
)
from tests.processes import wait_resting
from tests.testapp.agents import executions


def script():
    return by_step(replies())


def replies() -> list[Reply]:
    return [
        Reply(
            [
                text("Sending."),
                tool_use("send_message", {"to": "ann@example.com", "body": "Hi"}, id="toolu_send"),
            ]
        ),
        Reply(
            [
                tool_use("lookup", {"query": "order"}, id="toolu_look"),
                tool_use("save_note", {"text": "n"}, id="toolu_note"),
            ]
        ),
        Reply([text("All done.")]),
    ]


def scripted() -> ScriptedClient:
    """The same three turns, for a run driven in this process."""
    send = {"to": "ann@example.com", "body": "Hi"}
    return ScriptedClient(
        [
            reply(text("Sending."), tool_use("send_message", send, id="toolu_send")),
            reply(
                tool_use("lookup", {"query": "order"}, id="toolu_look"),
                tool_use("save_note", {"text": "n"}, id="toolu_note"),
            ),
            reply(text("All done.")),
        ]
    )


def finish(run):
    """Reap until the run rests (the reaper re-enqueues after the lease expires)."""
    wait_resting(run, timeout=60, interval=0.3, before=lambda: reap(stale_after=1))


def crash_then_finish(workers, point, start):
    """A worker that crashes at `point` while it advances the run `start()` creates, then a
    fresh worker and the reaper finish it; the run, at rest."""
    first = workers.start(failpoints=f"{point}=crash", AGENTRUN_LEASE_SECONDS="2")
    run = start()
    code = workers.wait_exit(first, timeout=60)
    assert code != 0, f"worker 1 should have crashed at {point}\n{workers.logs()}"
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    finish(run)
    return run


# save_note is the second call of its turn: it goes in_flight in the commit that records
# lookup's result, so these kill the worker inside and around that shared commit.
SECOND_CALL = [
    "tool.after_commit@lookup",
    "tool.before_handler@save_note",
    "tool.after_handler@save_note",
]


@pytest.mark.parametrize("point", sorted(RUN_POINTS) + SECOND_CALL)
def test_crash_at__every_failpoint(point, workers, messages_api, settings):
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = script()
    run = crash_then_finish(
        workers, point, lambda: start_run("test-agent", "Tell Ann her order shipped.")
    )

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert_projection_matches(run)
    assert not messages_api.script_errors
    steps = messages_api.steps()
    # Each model step requested once; twice only when the crash came before the answer committed.
    assert set(steps) == {0, 1, 2}
    twice = {s for s, n in steps.items() if n > 1}
    assert all(steps[s] == 2 for s in twice)
    if point == "model.before_commit":
        assert twice == {0}
    else:
        assert twice == set()
    sent = executions("send_message")
    assert len(sent) == 1, sent
    call = run.tool_calls.get(tool_call_id="toolu_send")
    # Killed after the provider accepted it, before the result was checkpointed: the
    # reconcile check finds it by its idempotency key and records its message id.
    expected = "reconciled" if point == "tool.after_handler" else "executed"
    assert call.result_source == expected
    assert f"m-{call.idempotency_key[:12]}" in str(call.result)
    for kind in ("lookup", "save_note"):
        rows = executions(kind)
        assert 1 <= len(rows) <= 2, (kind, rows)
        assert len({r["key"] for r in rows}) == 1
    # The usage of every recorded response is counted once.
    assert run.turn_count == 3


# With thinking on, the default model's matrix is test_crash_at__every_failpoint__
# thinking_and_server_tool's (the researcher: claude-sonnet-5-5, adaptive thinking, and a
# server tool and a cached prefix besides).
@pytest.mark.parametrize("point", sorted(RUN_POINTS))
def test_crash_at__every_failpoint__default_model(point, workers, messages_api, settings):
    """The matrix on the default model (claude-sonnet-5-5) with its default options: every
    request the workers send after a crash is one the stand-in (the API's rules for that
    model: its options, what its defaults leave out) accepts."""
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step(replies())
    run = crash_then_finish(
        workers, point, lambda: start_run("default-model", "Tell Ann her order shipped.")
    )

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert_projection_matches(run)
    assert not messages_api.script_errors
    assert all(r["status"] == 200 for r in messages_api.requests), messages_api.requests
    assert {b["model"] for b in messages_api.bodies} == {"claude-sonnet-5-5"}
    steps = messages_api.steps()
    assert set(steps) == {0, 1, 2}
    twice = {s for s, n in steps.items() if n > 1}
    assert twice == ({0} if point == "model.before_commit" else set())
    assert len(executions("send_message")) == 1
    assert run.turn_count == 3


def test_non_idempotent_without_check__waits_for_a_person(workers, messages_api, settings):
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step(
        [
            Reply([tool_use("charge_card", {"amount_cents": 500}, id="toolu_charge")]),
            Reply([text("Charged.")]),
        ]
    )
    first = workers.start(failpoints="tool.after_handler=crash", AGENTRUN_LEASE_SECONDS="2")
    run = start_run("test-agent", "Charge 5 dollars.")
    workers.wait_exit(first, timeout=60)
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    finish(run)
    assert run.state == "awaiting_approval"
    call = run.tool_calls.get()
    assert call.state == "unknown"
    time.sleep(1)
    assert len(executions("charge_card")) == 1
    assert_projection_matches(run)


# A forked run is a run like another once it is created: the crash points of its first
# claim, its first answer (asked twice when the crash comes before the commit), inside its
# first turn's tool calls and between its turns (the whole matrix runs above).
FORKED_POINTS = [
    "claim.after_commit",
    "model.before_commit",
    "tool.after_commit@lookup",
    "turn.before_enqueue",
]


@pytest.mark.parametrize("point", FORKED_POINTS)
def test_crash_at__failpoints__forked_run(point, workers, messages_api, settings, queue):
    settings.AGENTRUN_LEASE_SECONDS = 2
    original = start_run("test-agent", "Tell Ann her order shipped.")
    drive(original, scripted())  # in this process: the message is sent once, here
    assert original.state == "completed" and len(executions("send_message")) == 1
    purge_queue(queue)  # its own wake-ups, which no worker needs
    messages_api.script = script()
    run = crash_then_finish(workers, point, lambda: fork_run(original, at_turn=1))

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert_projection_matches(run)
    assert not messages_api.script_errors
    steps = messages_api.steps()
    # Turn 0 is the original's: the model is asked from step 1 on, each step once (twice
    # only when the crash came before its answer committed).
    assert set(steps) == {1, 2}
    twice = {s for s, n in steps.items() if n > 1}
    assert twice == ({1} if point == "model.before_commit" else set())
    sent = executions("send_message")
    assert len(sent) == 1, sent  # never sent again by the fork
    copied = run.tool_calls.get(tool_call_id="toolu_send")
    assert copied.result == original.tool_calls.get(tool_call_id="toolu_send").result
    assert copied.result_source == "executed" and sent[0]["key"] != copied.idempotency_key
    for kind in ("lookup", "save_note"):
        rows = [
            r for r in executions(kind) if r["key"] == run.tool_calls.get(name=kind).idempotency_key
        ]
        assert 1 <= len(rows) <= 2, (kind, rows)
    assert (run.turn_count, run.forked_from_id) == (3, original.pk)


@pytest.mark.parametrize("point", sorted(RUN_POINTS) + SECOND_CALL)
def test_crash_at__every_failpoint__follow_up(point, workers, messages_api, settings, queue):
    """A run of a conversation, after a first one: its history (read at every claim, a
    take-over's too) starts with the first run's, and the crash changes nothing of that."""
    settings.AGENTRUN_LEASE_SECONDS = 2
    conversation = start_conversation("test-agent")
    drive(send_message(conversation, "Hello."), ScriptedClient([reply(text("Hi."))]))
    purge_queue(queue)  # its own wake-ups, which no worker needs
    messages_api.script = by_step([Reply([text("Hi.")]), *replies()])
    run = crash_then_finish(
        workers, point, lambda: send_message(conversation, "Tell Ann her order shipped.")
    )

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert_projection_matches(run)
    assert_conversation_projection_matches(conversation)
    assert not messages_api.script_errors
    assert all(r["status"] == 200 for r in messages_api.requests)
    steps = messages_api.steps()
    # Step 0 is the first run's answer: the follow-up asks from step 1 on, each once
    # (twice only when the crash came before its answer committed).
    assert set(steps) == {1, 2, 3}
    twice = {s for s, n in steps.items() if n > 1}
    assert twice == ({1} if point == "model.before_commit" else set())
    for body in messages_api.bodies:
        assert body["messages"][:2] == [
            {"role": "user", "content": "Hello."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
        ]
    assert len(executions("send_message")) == 1
    assert run.turn_count == 3


def thinking_and_server_tool() -> list[Reply]:
    """The three turns above with adaptive thinking on and web search (a server tool) in the
    conversation: the first answer searches, the third pauses its own loop mid-search
    (`pause_turn`) and a fourth continues it."""
    send = {"to": "ann@example.com", "body": "Hi"}
    search = web_search("ann's order", [("https://shop.example/ann", "Order 42")])
    more, found = web_search("delivery date", [("https://shop.example/eta", "ETA")])
    return [
        Reply(
            [
                {"type": "thinking", "thinking": "Check the order, then tell Ann."},
                *search,
                text("Sending."),
                tool_use("send_message", send, id="toolu_send"),
            ]
        ),
        Reply(
            [
                {"type": "thinking", "thinking": "Note it."},
                tool_use("lookup", {"query": "order"}, id="toolu_look"),
                tool_use("save_note", {"text": "n"}, id="toolu_note"),
            ]
        ),
        Reply([{**more, "id": "srvtoolu_01more"}], stop_reason="pause_turn"),
        Reply([{**found, "tool_use_id": "srvtoolu_01more"}, text("All done.")]),
    ]


@pytest.mark.parametrize("point", sorted(RUN_POINTS))
def test_crash_at__every_failpoint__thinking_and_server_tool(
    point, workers, messages_api, settings
):
    """One scenario, every failpoint: adaptive thinking and a server tool change nothing of
    the promise (each step asked at most twice, transcripts the stand-in accepts, usage
    and cost counted once, server tools never executed here)."""
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step(thinking_and_server_tool())
    run = crash_then_finish(
        workers, point, lambda: start_run("researcher", "Tell Ann her order shipped.")
    )

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert_projection_matches(run)
    assert not messages_api.script_errors
    # The stand-in validated every request: paired server-tool blocks, signed thinking
    # blocks under an unchanged prefix, the paused turn sent back last, 4 breakpoints at most.
    assert all(r["status"] == 200 for r in messages_api.requests), messages_api.requests
    for body in messages_api.bodies:
        assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    steps = messages_api.steps()
    assert set(steps) == {0, 1, 2, 3}
    twice = {s for s, n in steps.items() if n > 1}
    assert all(steps[s] == 2 for s in twice)
    assert twice == ({0} if point == "model.before_commit" else set())
    assert len(executions("send_message")) == 1
    assert sorted(run.tool_calls.values_list("name", flat=True)) == [
        "lookup",
        "save_note",
        "send_message",
    ]
    # Usage and cost counted once: one recorded answer per turn, and the run's counters
    # are their sums.
    turns = list(run.turns.order_by("index"))
    assert run.turn_count == len(turns) == 4
    assert [t.stop_reason for t in turns] == ["tool_use", "tool_use", "pause_turn", "end_turn"]
    answers = list(run.events.filter(type="model_response").order_by("seq"))
    assert [a.payload["turn_index"] for a in answers] == [0, 1, 2, 3]
    for key in ("input_tokens", "output_tokens", "cache_read_input_tokens"):
        assert getattr(run, key) == sum(getattr(t, key) for t in turns), key
    assert run.cost_usd == sum(Decimal(a.payload["cost_usd"]) for a in answers)
    searches = [
        t.usage_details.get("server_tool_use", {}).get("web_search_requests", 0) for t in turns
    ]
    assert searches == [1, 0, 1, 0]
