"""store.unit on Postgres: a unit whose only statement is its run write sends it alone in
autocommit mode, and that statement is all or nothing by itself; any other statement
begins a real transaction first; on-commit callbacks wait for the unit.

These need real commits (transaction=True) and Postgres; elsewhere a unit is
transaction.atomic(), which every other test exercises."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_agentrun import services, start_run, store, transitions
from django_agentrun.exceptions import ConcurrentUpdate, LeaseLost
from django_agentrun.models import Run, RunEvent, ToolCall, Turn
from django_agentrun.states import ToolCallState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.no_projection_check]


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("write units send lone writes on Postgres only")


@pytest.fixture
def leased():
    """A run leased by worker "w", with one turn and one requested tool call."""
    run = start_run("test-agent", "hello")
    lease = store.claim(run.pk, "w", history=False).lease
    Run.objects.filter(pk=run.pk).update(state="running")  # as the engine's claim leaves it
    run = Run.objects.get(pk=run.pk)
    turn = Turn.objects.create(run=run, index=0)
    call = ToolCall.objects.create(
        run=run,
        turn=turn,
        turn_index=0,
        tool_call_id="toolu_1",
        position=0,
        name="lookup",
        arguments={"query": "q"},
        arguments_hash="0" * 64,
        idempotency_key="0" * 64,
    )
    return run, lease, turn, call


def _start(call, work):
    """Defer call -> in_flight with the event that goes with it."""
    old = transitions.move(call, ToolCallState.IN_FLIGHT)
    work.update(call, old, attempt=1)
    work.record(("tool_call_started", {"tool_call_id": call.tool_call_id}))


def _state(run, call):
    row = Run.objects.values("last_seq", "lease_epoch").get(pk=run.pk)
    return (
        row["last_seq"],
        RunEvent.objects.filter(run_id=run.pk).count(),
        ToolCall.objects.values_list("state", "attempt").get(pk=call.pk),
    )


def test_lone_write__one_statement_in_autocommit(leased, monkeypatch):
    run, lease, _turn, call = leased
    before = _state(run, call)
    commits = []
    monkeypatch.setattr(connection, "commit", lambda: commits.append(1))
    with CaptureQueriesContext(connection) as ctx, store.unit() as unit:
        _start(call, unit)
        unit.write_run(run, lease=lease)
        assert ctx.captured_queries == []  # held until the unit ends
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == ["WITH"]
    assert commits == []  # no BEGIN/COMMIT: the statement committed itself
    assert unit.cancel_requested is False
    assert run.last_seq == before[0] + 1
    assert _state(run, call) == (before[0] + 1, before[1] + 1, ("in_flight", 1))


def test_lone_write__superseded_lease_writes_nothing(leased):
    run, lease, _turn, call = leased
    Run.objects.filter(pk=run.pk).update(lease_epoch=lease.epoch + 1, lease_owner="thief")
    before = _state(run, call)
    with pytest.raises(LeaseLost), store.unit() as unit:
        (_start(call, unit), unit.write_run(run, lease=lease))
    assert _state(run, call) == before  # the tool call update in the same statement too


def test_lone_write__a_missed_row_update_undoes_the_others(leased):
    run, lease, turn, call = leased
    ToolCall.objects.filter(pk=call.pk).update(state=ToolCallState.SUCCEEDED)  # a concurrent close
    before = _state(run, call)
    with pytest.raises(ConcurrentUpdate), store.unit() as unit:
        unit.update(turn, None, model="changed")
        _start(call, unit)  # CAS requested -> in_flight misses
        unit.write_run(run, lease=lease)
    assert _state(run, call) == (before[0], before[1], ("succeeded", 0))
    assert Turn.objects.get(pk=turn.pk).model == ""  # the matching update was undone


def test_lone_write__deferred_insert_gets_its_ids(leased):
    run, lease, turn, _call = leased
    new = [
        ToolCall(
            run=run,
            turn=turn,
            turn_index=0,
            tool_call_id=f"toolu_n{i}",
            position=i + 1,
            name="lookup",
            arguments_hash="0" * 64,
            idempotency_key="0" * 64,
        )
        for i in range(3)
    ]
    with CaptureQueriesContext(connection) as ctx, store.unit() as unit:
        unit.insert(new)
        unit.write_run(run, [("calls", {})], lease=lease)
    assert len(ctx.captured_queries) == 1
    assert all(c.pk is not None and not c._state.adding for c in new)
    stored = dict(ToolCall.objects.filter(pk__in=[c.pk for c in new]).values_list("pk", "position"))
    assert stored == {c.pk: c.position for c in new}


def test_unit__another_statement_begins_a_transaction_for_both(leased):
    run, lease, _turn, call = leased
    before = _state(run, call)
    with pytest.raises(RuntimeError, match="boom"), store.unit() as unit:
        (_start(call, unit), unit.write_run(run, lease=lease))
        Run.objects.filter(pk=run.pk).update(correlation_id="second")  # sends the held write first
        assert connection.in_atomic_block
        raise RuntimeError("boom")
    assert _state(run, call) == before  # both rolled back
    assert Run.objects.get(pk=run.pk).correlation_id != "second"

    call.refresh_from_db()
    run.refresh_from_db()
    with CaptureQueriesContext(connection) as ctx, store.unit() as unit:
        (_start(call, unit), unit.write_run(run, lease=lease))
        Run.objects.filter(pk=run.pk).update(correlation_id="second")
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == [
        "BEGIN",
        "WITH",
        "UPDATE",
        "COMMIT",
    ]
    assert _state(run, call)[2] == ("in_flight", 1)
    assert Run.objects.get(pk=run.pk).correlation_id == "second"


def test_unit__two_run_writes_share_one_transaction(leased):
    run, lease, _turn, call = leased
    before = _state(run, call)
    with CaptureQueriesContext(connection) as ctx, store.unit() as unit:
        (_start(call, unit), unit.write_run(run, lease=lease))
        unit.write_run(run, [("more", {})], lease=lease)
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == [
        "BEGIN",
        "WITH",
        "WITH",
        "COMMIT",
    ]
    assert _state(run, call)[:2] == (before[0] + 2, before[1] + 2)


def test_unit__callbacks_run_after_the_commit_and_not_on_error(leased):
    run, lease, _turn, call = leased
    seen = []

    def callback():
        seen.append(_state(run, call)[2])  # reads what committed

    with store.unit() as unit:
        (_start(call, unit), unit.write_run(run, lease=lease))
        unit.on_commit(callback)
        assert seen == []
    assert seen == [("in_flight", 1)]

    with pytest.raises(RuntimeError), store.unit() as unit:
        unit.on_commit(callback)
        unit.write_run(run, [("more", {})], lease=lease)
        raise RuntimeError
    assert len(seen) == 1


def test_unit__inside_a_transaction_is_plain_atomic(leased):
    run, lease, _turn, call = leased
    with transaction.atomic():
        with store.unit() as unit:
            with CaptureQueriesContext(connection) as ctx:
                (_start(call, unit), unit.write_run(run, lease=lease))
            assert len(ctx.captured_queries) == 1  # sent at once, inside the caller's transaction
    assert _state(run, call)[2] == ("in_flight", 1)


def test_unit__cancel_request_seen_by_a_lone_write(leased):
    run, lease, _turn, call = leased
    services.cancel_run(run)  # the lease is live: only the request is recorded
    run.refresh_from_db()
    with store.unit() as unit:
        (_start(call, unit), unit.write_run(run, lease=lease))
    assert unit.cancel_requested is True


def test_fence__refusal_rides_on_the_named_unique_constraint():
    """A refused lone write fails on store.FENCE_CONSTRAINT (composed_write in queries.sql):
    the schema must still have it, unique on (run, seq)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, RunEvent._meta.db_table)
    fence = constraints[store.FENCE_CONSTRAINT]
    assert fence["unique"] and fence["columns"] == ["run_id", "seq"]
