"""services.py as the only writer: refused operations write nothing, start_run validates its
input, idempotency keys, the append-only event log, and the query/commit budget of a turn."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, connections, transaction

from django_agentrun import approve_tool_call, cancel_run, reject_tool_call, resume_run, start_run
from django_agentrun.engine import Outcome, advance
from django_agentrun.exceptions import (
    AppendOnlyError,
    ApprovalError,
    IdempotencyConflict,
    InvalidInput,
    InvalidTransition,
    RunNotActive,
    UnknownAgent,
)
from django_agentrun.models import Run, RunEvent, ToolCall, Turn
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.factories import completed_run, failed_run

# --------------------------------------------------------------------------- helpers


def snapshot(run):
    """Everything a refused operation must leave alone: the whole row and every event."""
    row = Run.objects.filter(pk=run.pk).values().get()
    events = list(
        RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("seq", "type", "payload")
    )
    turns = list(Turn.objects.filter(run_id=run.pk).values().order_by("index"))
    calls = list(ToolCall.objects.filter(run_id=run.pk).values().order_by("turn_index", "position"))
    return row, events, turns, calls


def assert_unchanged(run, before):
    after = snapshot(run)
    assert after[0]["state"] == before[0]["state"]
    assert after[0]["last_seq"] == before[0]["last_seq"] == len(before[1])
    assert len(after[1]) == len(before[1])
    assert after == before


# --------------------------------------------------------------------------- refused transitions


@pytest.mark.django_db
def test_resume_run__on_completed_refused_and_nothing_written():
    run = completed_run()
    before = snapshot(run)
    with pytest.raises(InvalidTransition, match=r"(?i)from 'completed' to .*queued"):
        resume_run(run)
    assert_unchanged(run, before)
    assert_projection_matches(run)


@pytest.mark.django_db
def test_cancel_run__on_completed_refused_and_nothing_written():
    run = completed_run()
    before = snapshot(run)
    with pytest.raises(RunNotActive, match="completed: there is nothing to cancel"):
        cancel_run(run, reason="too late")
    assert_unchanged(run, before)
    assert_projection_matches(run)


@pytest.mark.django_db
def test_cancel_run__on_failed_refused():
    run = failed_run()
    before = snapshot(run)
    with pytest.raises(RunNotActive):
        cancel_run(run.pk)
    assert_unchanged(run, before)


@pytest.mark.django_db
def test_resume_run__on_queued_refused():
    run = start_run("test-agent", "hello")
    before = snapshot(run)
    with pytest.raises(InvalidTransition, match=r"(?i)from 'queued' to .*queued"):
        resume_run(run)
    assert_unchanged(run, before)


@pytest.mark.django_db
def test_resume_run__twice_second_refused():
    run = failed_run()
    resume_run(run)
    run.refresh_from_db()
    assert run.state == "queued"
    assert run.error_code == ""
    before = snapshot(run)
    with pytest.raises(InvalidTransition):
        resume_run(run)
    assert_unchanged(run, before)
    assert_projection_matches(run)


@pytest.mark.django_db
def test_cancel_run__on_cancelled_is_a_noop():
    run = start_run("test-agent", "hello")
    cancel_run(run, reason="first")
    run.refresh_from_db()
    assert run.state == "cancelled"
    before = snapshot(run)
    again = cancel_run(run, reason="second")
    assert again.state == "cancelled"
    assert_unchanged(run, before)
    assert_projection_matches(run)


@pytest.mark.django_db
def test_refused_errors__are_agentrun_errors_with_a_code():
    run = completed_run()
    with pytest.raises(InvalidTransition) as exc_info:
        resume_run(run)
    assert exc_info.value.code == "invalid_transition"
    assert str(run.pk) in str(exc_info.value)
    with pytest.raises(RunNotActive) as exc_info:
        cancel_run(run)
    assert exc_info.value.code == "run_not_active"


@pytest.mark.django_db
def test_refused_errors__message_names_both_states_by_value():
    run = completed_run()
    with pytest.raises(InvalidTransition, match=r"cannot go from 'completed' to 'queued'$"):
        resume_run(run)


@pytest.mark.django_db
def test_approve_tool_call__on_a_closed_call_refused():
    run = start_run("test-agent", "hello")
    drive(
        run,
        ScriptedClient([reply(tool_use("lookup", {"query": "x"})), reply(text("done"))]),
    )
    assert run.state == "completed"
    call = run.tool_calls.get()
    before = snapshot(run)
    with pytest.raises(ApprovalError, match="succeeded, not awaiting approval"):
        approve_tool_call(call, by=None)
    with pytest.raises(ApprovalError, match="succeeded, not awaiting approval"):
        reject_tool_call(call, by=None, reason="no")
    assert_unchanged(run, before)


# --------------------------------------------------------------------------- start_run input


def _nothing_created():
    assert Run.objects.count() == 0
    assert RunEvent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   \n\t",
        None,
        42,
        {"type": "text", "text": "a dict, not a list"},
        [],
        ["a string, not a block"],
        [1, 2],
        [{"text": "no type"}],
        [{"type": 3}],
        [{"type": "text", "text": "ok"}, "then junk"],
    ],
    ids=repr,
)
def test_start_run__bad_input_raises_and_creates_nothing(bad):
    with pytest.raises(InvalidInput) as exc_info:
        start_run("test-agent", bad)
    message = str(exc_info.value)
    assert "input" in message.lower()
    assert isinstance(exc_info.value, ValueError)
    _nothing_created()


@pytest.mark.django_db
def test_start_run__bad_block_names_its_index():
    with pytest.raises(InvalidInput, match=r"input\[1\]"):
        start_run("test-agent", [{"type": "text", "text": "ok"}, 7])
    _nothing_created()


@pytest.mark.django_db
def test_start_run__unknown_agent_raises_and_creates_nothing():
    with pytest.raises(UnknownAgent, match="No agent named 'no-such-agent'"):
        start_run("no-such-agent", "hello")
    _nothing_created()


@pytest.mark.django_db
def test_start_run__bad_metadata_raises_and_creates_nothing():
    with pytest.raises(InvalidInput, match="metadata"):
        start_run("test-agent", "hello", metadata=["not", "a", "dict"])
    _nothing_created()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad",
    [
        [{"type": "text"}],
        [{"type": "text", "text": ""}],
        [{"type": "text", "text": 5}],
        [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}],
        [{"type": "tool_use", "id": "toolu_x", "name": "lookup", "input": {}}],
    ],
    ids=repr,
)
def test_start_run__unsendable_block_refused(bad):
    with pytest.raises(InvalidInput):
        start_run("test-agent", bad)
    _nothing_created()


@pytest.mark.django_db
def test_start_run__content_blocks_accepted():
    blocks = [{"type": "text", "text": "hello"}]
    run = start_run("test-agent", blocks)
    assert run.input == blocks
    assert run.state == "queued"
    assert list(run.events.values_list("seq", "type")) == [(1, "run_created")]
    assert_projection_matches(run)


# --------------------------------------------------------------------------- idempotency keys


@pytest.mark.django_db
def test_idempotency_key__same_key_returns_same_run():
    first = start_run("test-agent", "hello", idempotency_key="k-1")
    second = start_run("test-agent", "hello", idempotency_key="k-1")
    assert second.pk == first.pk
    assert Run.objects.count() == 1
    assert RunEvent.objects.count() == 1


@pytest.mark.django_db
def test_idempotency_key__different_input_conflicts():
    first = start_run("test-agent", "hello", idempotency_key="k-1")
    with pytest.raises(IdempotencyConflict, match=str(first.pk)):
        start_run("test-agent", "something else", idempotency_key="k-1")
    assert Run.objects.count() == 1
    assert RunEvent.objects.count() == 1


@pytest.mark.django_db
def test_idempotency_key__different_agent_conflicts():
    start_run("test-agent", "hello", idempotency_key="k-1")
    with pytest.raises(IdempotencyConflict):
        start_run("tiny-budget", "hello", idempotency_key="k-1")
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_idempotency_key__scoped_per_owner():
    user_model = get_user_model()
    ann = user_model.objects.create_user("ann")
    bob = user_model.objects.create_user("bob")
    a1 = start_run("test-agent", "hello", owner=ann, idempotency_key="k")
    b1 = start_run("test-agent", "other input", owner=bob, idempotency_key="k")
    anon = start_run("test-agent", "third input", idempotency_key="k")
    assert len({a1.pk, b1.pk, anon.pk}) == 3
    assert start_run("test-agent", "hello", owner=ann, idempotency_key="k").pk == a1.pk
    assert start_run("test-agent", "third input", idempotency_key="k").pk == anon.pk
    with pytest.raises(IdempotencyConflict):
        start_run("test-agent", "hello", owner=bob, idempotency_key="k")
    assert Run.objects.count() == 3


@pytest.mark.django_db
def test_idempotency_key__without_key_always_new():
    a = start_run("test-agent", "hello")
    b = start_run("test-agent", "hello")
    assert a.pk != b.pk


# --------------------------------------------------------------------------- append-only events


def _event_rows():
    return list(
        RunEvent.objects.order_by("run_id", "seq").values_list("pk", "seq", "type", "payload")
    )


@pytest.fixture
def events_run(db):
    run = start_run("test-agent", "hello")
    cancel_run(run, reason="for events")
    run.refresh_from_db()
    assert run.last_seq == 3
    return run


def test_append_only__save_existing_refused(events_run):
    before = _event_rows()
    event = RunEvent.objects.get(run=events_run, seq=1)
    event.type = "tampered"
    with pytest.raises(AppendOnlyError, match=r"#1 cannot be changed: events are append-only"):
        event.save()
    assert _event_rows() == before


def test_append_only__instance_delete_refused(events_run):
    before = _event_rows()
    event = RunEvent.objects.get(run=events_run, seq=2)
    with pytest.raises(AppendOnlyError, match=r"#2 cannot be deleted"):
        event.delete()
    assert _event_rows() == before


def test_append_only__queryset_update_refused(events_run):
    before = _event_rows()
    with pytest.raises(AppendOnlyError, match=r"QuerySet.update\(\) is refused"):
        RunEvent.objects.filter(run=events_run).update(type="tampered")
    with pytest.raises(AppendOnlyError):
        events_run.events.update(payload={})
    assert _event_rows() == before


def test_append_only__queryset_delete_refused(events_run):
    before = _event_rows()
    with pytest.raises(AppendOnlyError, match=r"QuerySet.delete\(\) is refused"):
        RunEvent.objects.filter(run=events_run).delete()
    with pytest.raises(AppendOnlyError):
        events_run.events.all().delete()
    assert _event_rows() == before


def test_append_only__bulk_update_and_update_or_create_refused(events_run):
    before = _event_rows()
    event = RunEvent.objects.get(run=events_run, seq=1)
    event.type = "tampered"
    with pytest.raises(AppendOnlyError), transaction.atomic():
        RunEvent.objects.bulk_update([event], ["type"])
    with pytest.raises(AppendOnlyError), transaction.atomic():
        RunEvent.objects.update_or_create(run=events_run, seq=1, defaults={"type": "tampered"})
    assert _event_rows() == before


def test_append_only__new_events_still_append(events_run):
    from django_agentrun import store

    before = _event_rows()
    write = store.Write(events_run)
    write.record(("note", {"text": "appended"}))
    store.send(write)
    after = _event_rows()
    assert after[: len(before)] == before
    assert [row[1:3] for row in after[len(before) :]] == [(4, "note")]


def test_append_only__save_new_instance_with_existing_pk_refused(events_run):
    before = _event_rows()
    existing = RunEvent.objects.get(run=events_run, seq=1)
    forged = RunEvent(pk=existing.pk, run=events_run, seq=1, type="forged", payload={})
    with pytest.raises((AppendOnlyError, IntegrityError)), transaction.atomic():
        forged.save()
    assert _event_rows() == before


def test_append_only__bulk_create_upsert_refused(events_run):
    before = _event_rows()
    with pytest.raises(AppendOnlyError), transaction.atomic():
        RunEvent.objects.bulk_create(
            [RunEvent(run=events_run, seq=1, type="forged", payload={})],
            update_conflicts=True,
            unique_fields=["run", "seq"],
            update_fields=["type"],
        )
    assert _event_rows() == before


def test_append_only__base_manager_update_refused(events_run):
    before = _event_rows()
    with pytest.raises(AppendOnlyError), transaction.atomic():
        RunEvent._base_manager.filter(run=events_run).update(type="forged")
    assert _event_rows() == before


# --------------------------------------------------------------------------- query/commit budget

_TX_SQL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE SAVEPOINT)\b", re.I)
# A write: INSERT, UPDATE, DELETE, a data-modifying CTE, or the engine's write (the call of
# its function, queries.sql).
_WRITE_SQL = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE)\b|^\s*WITH\b.*\b(INSERT|UPDATE|DELETE)\b"
    r"|^\s*SELECT \* FROM agentrun_write\(",
    re.I | re.S,
)


class Counter:
    """Counts, from the moment it is installed: queries (BEGIN/COMMIT included, as round
    trips), statements (without them), and durable commits: outermost atomic blocks
    committed (connection.commit) plus writes executed in autocommit mode (each its own
    implicit commit)."""

    def __init__(self, monkeypatch, alias="default"):
        self.conn = connections[alias]
        self.queries = self.statements = self.commits = self.autocommit_writes = 0
        original = self.conn.commit

        def commit():
            self.commits += 1
            self.queries += 1
            return original()

        monkeypatch.setattr(self.conn, "commit", commit)

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        self.queries += 1
        if not _TX_SQL.match(sql):
            self.statements += 1
        if _WRITE_SQL.match(sql) and not self.conn.in_atomic_block:
            self.autocommit_writes += 1
        return result

    @property
    def total(self):
        return self.commits + self.autocommit_writes

    def snapshot(self):
        return (self.queries, self.statements, self.total, self.autocommit_writes)


def _lookups(k, prefix):
    return [tool_use("lookup", {"query": f"{prefix}{i}"}) for i in range(k)]


def _turn(k, prefix):
    """A turn with k tool calls; with none, a `pause_turn` answer (the run goes on)."""
    if k == 0:
        return reply(text(f"{prefix} thinking"), stop_reason="pause_turn")
    return reply(text(prefix), *_lookups(k, prefix))


def _per_turn(monkeypatch, replies):
    """Advance a run through `replies` in one task; what the claim cost, then each turn,
    taken between the model's requests (turn t: its answer's commit, then its results')."""
    run = start_run("test-agent", "hello")
    counter = Counter(monkeypatch)
    marks = [counter.snapshot()]

    def script(request):
        marks.append(counter.snapshot())
        return replies[len(marks) - 2]

    with connections["default"].execute_wrapper(counter):
        outcome = advance(run.pk, client=ScriptedClient(script))
    marks.append(counter.snapshot())
    costs = [
        tuple(b - a for a, b in zip(x, y, strict=True))
        for x, y in zip(marks, marks[1:], strict=False)
    ]
    return run, outcome, costs


# Measured on SQLite (Django 5.2), a turn in the middle of a task: queries incl.
# BEGIN/COMMIT, statements without them. On Postgres every commit is one statement.
BUDGET = {
    0: {"queries": 9, "statements": 7},
    1: {"queries": 18, "statements": 14},
    4: {"queries": 45, "statements": 35},
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_turn_budget__queries_and_commits(
    k, concurrency, monkeypatch, no_broker, figures, settings
):
    """One call at a time (AGENTRUN_TOOL_CONCURRENCY = 1), or the k lookups as one batch."""
    settings.AGENTRUN_TOOL_CONCURRENCY = concurrency
    replies = [_turn(1, "a"), _turn(k, "b"), _turn(k, "c"), reply(text("answer"))]
    run, outcome, (_claim, _first, *turns) = _per_turn(monkeypatch, replies)
    queries, statements, commits, lone = turns[0]  # turn 1: a turn in the middle
    figures(
        f"[budget] turn with {k} tool calls (concurrency {concurrency}): {queries} queries "
        f"({statements} statements), {commits} commits ({lone} of them single statements in "
        "autocommit)"
    )
    assert outcome == Outcome.FINISHED
    assert turns[1] == turns[0]  # the next one costs the same: nothing re-read per turn
    # k + 1 durable commits: the answer with the first call in flight, then each result
    # with what follows it (the next call in flight, or the turn closed and the next begun);
    # as a batch, 2: the answer with every call in flight, then every result.
    expected = k + 1 if concurrency == 1 else min(k, 1) + 1
    assert commits == expected
    if connection.vendor == "postgresql":
        assert queries == statements == lone == expected
    else:
        assert queries <= BUDGET[k]["queries"]
        assert statements <= BUDGET[k]["statements"]
    run.refresh_from_db()
    assert run.tool_calls.filter(turn_index=1).count() == k
    assert all(c.state == "succeeded" for c in run.tool_calls.all())
    assert_projection_matches(run)


@pytest.mark.django_db(transaction=True)
def test_turn_budget__marginal_cost_per_tool_call_is_constant(monkeypatch, no_broker, settings):
    """Each extra tool call costs the same (one commit: its result with what follows), one
    call at a time; in a batch, no commit at all (test_turn_budget__a_batch_costs_two)."""
    settings.AGENTRUN_TOOL_CONCURRENCY = 1
    per_k = {}
    for k in (1, 2, 4):
        _, _, costs = _per_turn(monkeypatch, [_turn(k, f"k{k}-"), reply(text("done"))])
        per_k[k] = costs[1]  # the first turn (after the claim)
    marginal = per_k[2][1] - per_k[1][1]
    assert per_k[4][1] - per_k[2][1] == 2 * marginal
    assert marginal <= (1 if connection.vendor == "postgresql" else 6)
    assert [per_k[k][2] for k in (1, 2, 4)] == [2, 3, 5]


@pytest.mark.django_db(transaction=True)
def test_turn_budget__a_batch_costs_two_commits_whatever_its_size(monkeypatch, no_broker):
    per_k = {}
    for k in (1, 2, 4):
        _, _, costs = _per_turn(monkeypatch, [_turn(k, f"k{k}-"), reply(text("done"))])
        per_k[k] = costs[1]  # the first turn (after the claim)
    assert [per_k[k][2] for k in (1, 2, 4)] == [2, 2, 2]
    if connection.vendor == "postgresql":
        assert [per_k[k][1] for k in (1, 2, 4)] == [2, 2, 2]  # one statement each


@pytest.mark.django_db(transaction=True)
def test_turn_budget__first_turn(monkeypatch, no_broker):
    run, outcome, (claim, answer) = _per_turn(monkeypatch, [reply(text("only answer"))])
    assert outcome == Outcome.FINISHED
    # The claim (with run_started) is one commit, the answer that completes the run another.
    assert (claim[2], answer[2]) == (1, 1)
    assert_projection_matches(run)


# --------------------------------------------------------------------------- claim loads


@pytest.mark.django_db
def test_claim_and_load__rows_equal_what_the_orm_loads(settings):
    """The claim's own row builder (one round trip, no queryset) gives the same values as
    the ORM, timestamps aware and equal included."""
    from django_agentrun import store

    settings.AGENTRUN_TURNS_PER_TASK = 1  # the first task hands the run back after a turn
    client = ScriptedClient(
        [reply(text("a"), tool_use("lookup", {"query": "x"})), reply(text("done"))]
    )
    run = start_run("test-agent", "hello")
    advance(run.pk, client=client)
    claimed = store.claim(run.pk, "someone")
    assert claimed is not None and claimed.turns and claimed.calls

    def values(obj):
        return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}

    assert values(claimed.run) == values(Run.objects.get(pk=run.pk))
    assert [values(t) for t in claimed.turns] == [
        values(t) for t in Turn.objects.filter(run_id=run.pk).order_by("index")
    ]
    assert [values(c) for c in claimed.calls] == [
        values(c) for c in ToolCall.objects.filter(run_id=run.pk).order_by("turn_index", "position")
    ]
    stamps = [claimed.run.created_at, claimed.turns[0].started_at, claimed.calls[0].finished_at]
    assert all(s is not None and s.utcoffset() is not None for s in stamps)
    assert not claimed.run._state.adding and claimed.calls[0]._state.db == "default"
