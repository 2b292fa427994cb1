"""Parallel tool calls (engine/execution.py): the calls the model asks for together that are
safe to run again (read-only, idempotent writes) go in flight in one commit, run at once,
and their results commit together; any other call keeps its own commit and runs alone, in
the model's order. A crash before the batch's results commit re-runs only the calls with
no recorded result; a cancel reaches every handler of the batch."""

from __future__ import annotations

import threading
import time

import pytest

from django_agentrun import start_run
from django_agentrun import store as store_module
from django_agentrun.abort import CANCEL_REQUESTED, AbortSignal
from django_agentrun.engine import Outcome, advance
from django_agentrun.failpoints import FailpointError
from django_agentrun.models import Run, RunEvent
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.testapp.agents import executions

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _log(test_log):
    """The test tools log their executions to a file of the test's own."""


@pytest.fixture
def writes(monkeypatch):
    """The writes the engine sends, as the lists of (tool_call_id, new state) each changes."""
    sent: list[list[tuple[str, str]]] = []
    store = type(store_module.chosen())  # the engine sends through its step's store
    send = store.send

    def counting(self, write):
        calls = [
            (c.obj.tool_call_id, c.fields.get("state"))
            for c in write.changed
            if hasattr(c.obj, "tool_call_id")
        ]
        calls += [(o.tool_call_id, o.state) for o in write.added if hasattr(o, "tool_call_id")]
        sent.append(calls)
        return send(self, write)

    monkeypatch.setattr(store, "send", counting)
    return sent


def _started_and_finished(run):
    """(type, tool_call_id) of the run's call events, in seq order."""
    kinds = ("tool_call_started", "tool_call_finished")
    return [
        (e.type, e.payload.get("tool_call_id"))
        for e in RunEvent.objects.filter(run=run).order_by("seq")
        if e.type in kinds
    ]


MIXED = [
    tool_use("lookup", {"query": "a"}, id="toolu_a"),
    tool_use("save_note", {"text": "b"}, id="toolu_b"),
    tool_use("send_message", {"to": "ann@example.com", "body": "Hi"}, id="toolu_send"),
    tool_use("lookup", {"query": "c"}, id="toolu_c"),
    tool_use("lookup", {"query": "d"}, id="toolu_d"),
]


def test_batch__safe_calls_group_around_a_non_idempotent_one_in_the_models_order(writes):
    client = ScriptedClient([reply(*MIXED), reply(text("Done."))])
    run = start_run("test-agent", "hello")
    drive(run, client)

    assert run.state == "completed", (run.error_code, run.error_message)
    assert_projection_matches(run)
    flight = [
        [cid for cid, state in w if state == "in_flight"] for w in writes if w
    ]  # what each write put in flight
    # The answer puts the first batch in flight; its results (together) put send_message in
    # flight alone; its result puts the second batch in flight; its results close the turn.
    assert [f for f in flight if f] == [
        ["toolu_a", "toolu_b"],
        ["toolu_send"],
        ["toolu_c", "toolu_d"],
    ]
    closed = [
        sorted(cid for cid, state in w if state == "succeeded")
        for w in writes
        if any(state == "succeeded" for _, state in w)
    ]
    assert closed == [["toolu_a", "toolu_b"], ["toolu_send"], ["toolu_c", "toolu_d"]]
    events = _started_and_finished(run)
    assert events[:2] == [("tool_call_started", "toolu_a"), ("tool_call_started", "toolu_b")]
    # The non-idempotent call starts only once both results of the batch before it are in.
    started_send = events.index(("tool_call_started", "toolu_send"))
    assert {cid for kind, cid in events[:started_send] if kind == "tool_call_finished"} == {
        "toolu_a",
        "toolu_b",
    }
    # The results reach the model in the order it asked for the calls.
    last = client.requests[-1].messages[-1]["content"]
    assert [b["tool_use_id"] for b in last] == [t["id"] for t in MIXED]
    assert [r["query"] for r in executions("lookup")] == ["a", "c", "d"]


def test_batch__a_turn_with_four_lookups_takes_two_writes(writes):
    calls = [tool_use("lookup", {"query": q}, id=f"toolu_{q}") for q in "wxyz"]
    client = ScriptedClient([reply(*calls), reply(text("Done."))])
    run = start_run("test-agent", "hello")
    drive(run, client)

    assert run.state == "completed"
    with_calls = [w for w in writes if w]
    # The claim's write changes no call: the answer (the four in flight) and their results.
    assert len(with_calls) == 2
    assert sorted(cid for cid, state in with_calls[1] if state == "succeeded") == [
        "toolu_w",
        "toolu_x",
        "toolu_y",
        "toolu_z",
    ]
    assert all(c.attempt == 1 for c in run.tool_calls.all())


def test_batch__a_call_needing_approval_ends_the_batch_before_it(settings):
    client = ScriptedClient(
        [
            reply(
                tool_use("lookup", {"query": "a"}, id="toolu_a"),
                tool_use("lookup", {"query": "b"}, id="toolu_b"),
                tool_use("refund", {"amount_cents": 50_000}, id="toolu_refund"),
                tool_use("lookup", {"query": "c"}, id="toolu_c"),
            ),
            reply(text("ok")),
        ]
    )
    run = start_run("approvals", "hello")
    drive(run, client)

    assert run.state == "awaiting_approval"
    states = dict(run.tool_calls.values_list("tool_call_id", "state"))
    assert states == {
        "toolu_a": "succeeded",
        "toolu_b": "succeeded",
        "toolu_refund": "awaiting_approval",
        "toolu_c": "requested",
    }
    assert_projection_matches(run)


def test_batch__concurrency_one_runs_each_call_alone(settings, writes):
    settings.AGENTRUN_TOOL_CONCURRENCY = 1
    calls = [tool_use("lookup", {"query": q}, id=f"toolu_{q}") for q in "xy"]
    run = start_run("test-agent", "hello")
    drive(run, ScriptedClient([reply(*calls), reply(text("Done."))]))

    assert run.state == "completed"
    flight = [[cid for cid, s in w if s == "in_flight"] for w in writes]
    assert [f for f in flight if f] == [["toolu_x"], ["toolu_y"]]


@pytest.mark.parametrize(
    "point", ["tool.after_batch", "tool.after_handler@save_note", "tool.before_handler@save_note"]
)
def test_batch__a_crash_before_its_results_commit_reruns_every_call_of_it(
    monkeypatch, point, writes
):
    """Killed (here: raising) inside the batch: no result of it is recorded, so the next
    claim (the lease lapsed) applies the policy (re-run) to each, and runs them again; the
    calls recorded before the batch are replayed, never run again."""
    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "first"}, id="toolu_first")),
            reply(
                tool_use("lookup", {"query": "a"}, id="toolu_a"),
                tool_use("save_note", {"text": "b"}, id="toolu_b"),
            ),
            reply(text("ok")),
        ]
    )
    run = start_run("test-agent", "hello")
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", f"{point}=raise")
    with pytest.raises(FailpointError):
        advance(run.pk, client=client)
    states = dict(run.tool_calls.values_list("tool_call_id", "state"))
    assert states == {"toolu_first": "succeeded", "toolu_a": "in_flight", "toolu_b": "in_flight"}
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    Run.objects.filter(pk=run.pk).update(lease_owner="")  # as if the lease had lapsed
    writes.clear()
    drive(run, client)

    assert run.state == "completed", (run.error_code, run.error_message)
    # Recovery requeues the batch in one write; it goes in flight again as one batch.
    by_state = [
        {s: sorted(c for c, x in w if x == s) for s in ("requested", "in_flight")} for w in writes
    ]
    assert {"requested": ["toolu_a", "toolu_b"], "in_flight": []} in by_state
    assert any(w["in_flight"] == ["toolu_a", "toolu_b"] for w in by_state)
    assert_projection_matches(run)
    assert [r["query"] for r in executions("lookup")] == ["first", "a", "a"]
    ran_b = len(executions("save_note"))
    assert ran_b == (1 if point == "tool.before_handler@save_note" else 2)
    attempts = dict(run.tool_calls.values_list("tool_call_id", "attempt"))
    assert attempts == {"toolu_first": 1, "toolu_a": 2, "toolu_b": 2}


@pytest.mark.django_db(transaction=True)
def test_batch__four_slow_lookups_run_at_once():
    """Out of any transaction (as in a worker), the batch's handlers run on threads."""
    # Different arguments: the same call thrice is refused (the repeat guard).
    calls = [tool_use("slow", {"seconds": 0.2 + i / 100}, id=f"toolu_{i}") for i in range(4)]
    run = start_run("test-agent", "hello")
    client = ScriptedClient([reply(*calls), reply(text("Done."))])
    began = time.monotonic()
    drive(run, client)
    took = time.monotonic() - began

    assert run.state == "completed", (run.error_code, run.error_message)
    assert [c.result for c in run.tool_calls.order_by("position")] == ["slept"] * 4
    assert took < 0.6, took  # not one after another (the benchmark measures the time)


@pytest.mark.django_db(transaction=True)
def test_batch__a_cancel_reaches_every_handler_of_the_batch():
    calls = [tool_use("slow", {"seconds": 30 + i}, id=f"toolu_{i}") for i in range(3)]
    run = start_run("test-agent", "hello")
    abort = AbortSignal()
    threading.Timer(0.3, abort.abort, args=(CANCEL_REQUESTED,)).start()
    began = time.monotonic()
    outcome = advance(run.pk, client=ScriptedClient([reply(*calls)]), abort=abort)
    run.refresh_from_db()

    assert time.monotonic() - began < 10
    assert outcome == Outcome.FINISHED
    assert run.state == "cancelled"
    assert set(run.tool_calls.values_list("state", flat=True)) == {"cancelled"}
    assert_projection_matches(run)


@pytest.mark.django_db(transaction=True)
def test_batch__handlers_on_other_threads_see_the_callers_context_variables(monkeypatch):
    """A handler on a pool thread runs in a copy of the worker's context (a tracer's
    current span is a context variable)."""
    import contextvars

    from django_agentrun.engine import execution

    marker = contextvars.ContextVar("marker", default="unset")
    seen = []
    invoke = execution.invoke

    def spying(step, tool, call):
        seen.append(marker.get())
        return invoke(step, tool, call)

    monkeypatch.setattr(execution, "invoke", spying)
    marker.set("the worker's")
    calls = [tool_use("lookup", {"query": q}, id=f"toolu_{q}") for q in "abc"]
    run = start_run("test-agent", "hello")
    drive(run, ScriptedClient([reply(*calls), reply(text("Done."))]))

    assert run.state == "completed"
    assert seen == ["the worker's"] * 3


@pytest.mark.django_db(transaction=True)
def test_batch__the_heartbeat_keeps_the_lease_while_a_long_batch_runs(settings):
    """Three calls of 2.5 s at once, a lease of 2 s: the heartbeat renews it meanwhile, so
    the batch's results commit under the same lease (no recovery)."""
    settings.AGENTRUN_LEASE_SECONDS = 2
    settings.AGENTRUN_HEARTBEAT_SECONDS = 0.2
    calls = [tool_use("slow", {"seconds": 2.5 + i / 100}, id=f"toolu_{i}") for i in range(3)]
    run = start_run("test-agent", "hello")
    client = ScriptedClient([reply(*calls), reply(text("Done."))])
    outcome = advance(run.pk, client=client, heartbeat=True)
    run.refresh_from_db()

    assert outcome == Outcome.FINISHED, outcome
    assert run.state == "completed"
    assert (run.lease_epoch, run.recovery_attempts) == (1, 0)
    assert {c.attempt for c in run.tool_calls.all()} == {1}
