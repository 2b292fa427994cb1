"""store.send on Postgres: a write is one statement (queries.sql `write`). Alone, in
autocommit, it is its own transaction and all or nothing by construction: a refusal of
any part (the lease, the run's state, a row's state) changes nothing. Inside a caller's
transaction it is one more statement of it; its callbacks wait for the commit.

These need real commits (transaction=True) and Postgres; elsewhere a write is a few ORM
statements in transaction.atomic(), which every other test exercises."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_agentrun import services, start_run, store, transitions
from django_agentrun.exceptions import ConcurrentUpdate, LeaseLost
from django_agentrun.models import Run, RunEvent, RunEventRow, ToolCall, Turn
from django_agentrun.states import ToolCallState
from django_agentrun.store.sql import sql

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.no_projection_check]


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("one statement per write on Postgres only")


@pytest.fixture
def leased():
    """A run leased by worker "w", with one turn and one requested tool call."""
    run = start_run("test-agent", "hello")
    lease = store.claim(run.pk, "w", history=False).lease
    Run.objects.filter(pk=run.pk).update(state="awaiting_tool")
    run = Run.objects.get(pk=run.pk)
    turn = Turn.objects.create(run=run, index=0, state="awaiting_tool")
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


def _state(run, call):
    row = Run.objects.values("last_seq").get(pk=run.pk)
    return (
        row["last_seq"],
        RunEvent.objects.filter(run_id=run.pk).count(),
        ToolCall.objects.values_list("state", "attempt").get(pk=call.pk),
    )


def _name(statement: str) -> str:
    """`write` for queries.sql's write statement (the call of agentrun_write), else the SQL."""
    return "write" if statement.startswith("SELECT * FROM agentrun_write(") else statement


def _sent(ctx) -> list[str]:
    return [_name(q["sql"]) for q in ctx.captured_queries]


def _start(run, lease, call) -> store.Write:
    write = store.Write(run, lease)
    transitions.start_call(write, call)
    return write


def test_lone_write__one_statement_in_autocommit(leased, monkeypatch):
    run, lease, _turn, call = leased
    before = _state(run, call)
    commits = []
    monkeypatch.setattr(connection, "commit", lambda: commits.append(1))
    write = _start(run, lease, call)
    with CaptureQueriesContext(connection) as ctx:
        store.send(write)
    assert _sent(ctx) == ["write"]
    assert commits == []  # no BEGIN/COMMIT: the statement committed itself
    assert write.cancel_requested is False
    assert run.last_seq == before[0] + 1
    assert _state(run, call) == (before[0] + 1, before[1] + 1, ("in_flight", 1))


def test_lone_write__superseded_lease_writes_nothing(leased):
    run, lease, _turn, call = leased
    Run.objects.filter(pk=run.pk).update(lease_epoch=lease.epoch + 1, lease_owner="thief")
    before = _state(run, call)
    with pytest.raises(LeaseLost):
        store.send(_start(run, lease, call))
    assert _state(run, call) == before  # the tool call update in the same statement too


def test_lone_write__a_missed_row_update_undoes_the_others(leased):
    run, lease, turn, call = leased
    ToolCall.objects.filter(pk=call.pk).update(state=ToolCallState.SUCCEEDED)  # a concurrent close
    before = _state(run, call)
    write = store.Write(run, lease)
    write.change(turn, None, model="changed")
    transitions.start_call(write, call)  # its compare-and-set requested -> in_flight misses
    with pytest.raises(ConcurrentUpdate):
        store.send(write)
    assert _state(run, call) == (before[0], before[1], ("succeeded", 0))
    assert Turn.objects.get(pk=turn.pk).model == ""  # the matching update was undone


def test_lone_write__added_rows_get_their_ids_with_a_new_turn(leased):
    run, lease, _turn, _call = leased
    turn = Turn(run=run, index=1, state="awaiting_tool", content=[{"type": "text", "text": "x"}])
    calls = [
        ToolCall(
            run=run,
            turn=turn,
            turn_index=1,
            tool_call_id=f"toolu_n{i}",
            position=i,
            name="lookup",
            arguments={"query": str(i)},
            arguments_hash="0" * 64,
            idempotency_key="0" * 64,
        )
        for i in range(3)
    ]
    write = store.Write(run, lease)
    write.add(turn, *calls)
    write.record(("calls", {}))
    with CaptureQueriesContext(connection) as ctx:
        store.send(write)
    assert _sent(ctx) == ["write"]
    assert turn.pk is not None and all(c.pk and not c._state.adding for c in calls)
    stored = ToolCall.objects.filter(pk__in=[c.pk for c in calls])
    assert {(c.pk, c.position, c.turn_id) for c in stored} == {
        (c.pk, c.position, turn.pk) for c in calls
    }
    assert Turn.objects.get(pk=turn.pk).content == [{"type": "text", "text": "x"}]


def test_write__inside_a_transaction_is_one_statement_of_it(leased):
    run, lease, _turn, call = leased
    before = _state(run, call)
    with pytest.raises(RuntimeError, match="boom"), transaction.atomic():
        store.send(_start(run, lease, call))
        assert _state(run, call)[2] == ("in_flight", 1)
        raise RuntimeError("boom")
    assert _state(run, call) == before  # rolled back with the caller's transaction


def test_write__without_events_gets_a_transaction_of_its_own(leased):
    """A refusal is all or nothing only through an event (FENCE_CONSTRAINT); a write with
    none is sent inside a transaction, which the refusal rolls back."""
    run, lease, turn, _call = leased
    Run.objects.filter(pk=run.pk).update(lease_epoch=lease.epoch + 1)
    write = store.Write(run, lease)
    write.change(turn, None, model="changed")
    with CaptureQueriesContext(connection) as ctx, pytest.raises(LeaseLost):
        store.send(write)
    assert _sent(ctx)[:2] == ["BEGIN", "write"]
    assert Turn.objects.get(pk=turn.pk).model == ""


def test_write__callbacks_run_after_the_commit_and_not_on_a_refusal(leased):
    run, lease, _turn, call = leased
    seen = []

    def callback():
        seen.append(_state(run, call)[2])  # reads what committed

    write = _start(run, lease, call)
    write.then(callback)
    store.send(write)
    assert seen == [("in_flight", 1)]

    Run.objects.filter(pk=run.pk).update(lease_epoch=lease.epoch + 1)
    write = store.Write(run, lease)
    write.record(("more", {}))
    write.then(callback)
    with pytest.raises(LeaseLost):
        store.send(write)
    assert len(seen) == 1


def test_write__sees_a_cancel_request(leased):
    run, lease, _turn, call = leased
    services.cancel_run(run)  # the lease is live: only the request is recorded
    run.refresh_from_db()
    write = _start(run, lease, call)
    store.send(write)
    assert write.cancel_requested is True


def test_write__leaves_nothing_on_the_connection(leased):
    """Behind PgBouncer in transaction mode the next transaction may run on another server
    connection: a write must not need anything the last one left on its own (a SQL-level
    prepared statement, a session setting). Each write is the one call of agentrun_write."""
    run, lease, _turn, _call = leased
    for i in range(3):
        write = store.Write(Run.objects.get(pk=run.pk), lease)
        write.record(("note", {}))
        with CaptureQueriesContext(connection) as ctx:
            store.send(write)
        assert _sent(ctx) == ["write"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE from_sql")
            assert cursor.fetchone()[0] == 0
            if i == 1:
                cursor.execute("DISCARD ALL")  # what PgBouncer sends when a session ends
    assert RunEvent.objects.filter(run_id=run.pk, type="note").count() == 3
    assert sql("write").startswith("SELECT * FROM agentrun_write(")


def test_write__the_database_has_the_function_of_queries_sql():
    """queries.sql's `write_function` is what the migrations installed: a change to it needs a
    migration of its own (0012_pooler_write_function holds a frozen copy)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('agentrun_write'::regproc)")
        installed = cursor.fetchone()[0]
    body = sql("write_function").split("$agentrun_write$")[1]
    assert body in installed
    assert _signature(installed) == _signature(sql("write_function"))


def _signature(text: str) -> list[tuple[str, str]]:
    found = re.search(r"agentrun_write\((.*?)\)\s*RETURNS", text, re.S).group(1)
    return [tuple(p.strip().split(None, 1)) for p in found.split(",")]


def test_fence__refusal_rides_on_the_named_unique_constraint():
    """A refused lone write fails on store.FENCE_CONSTRAINT (`write` in queries.sql): the
    schema must still have it, unique on (run, seq) of the events' rows (one per commit)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, RunEventRow._meta.db_table)
    fence = constraints[store.FENCE_CONSTRAINT]
    assert fence["unique"] and fence["columns"] == ["run_id", "seq"]


# Columns no write changes after the row is added (a new column must be named in `write`
# or here, or this test fails: the statement lists its columns one by one).
UNCHANGING = {
    Turn: {"id", "run_id", "index", "is_final", "started_at"},
    ToolCall: {
        "id",
        "run_id",
        "turn_id",
        "turn_index",
        "tool_call_id",
        "position",
        "name",
        "side_effect",
        "idempotency_key",
        "created_at",
    },
    Run: {
        "id",
        "agent",
        "input",
        "config",
        "correlation_id",
        "trace_context",  # written once, at the run's creation (telemetry.run_created)
        "owner_id",
        "metadata",
        "idempotency_key",
        "request_hash",
        "share_key",  # named once, at the run's creation (agents.share_key)
        "lease_epoch",
        "created_at",
        "forked_from_id",
        "forked_at_turn",
        "conversation_id",
        "conversation_position",
        "context",
        # Never written: a trigger sets it from the state (migration 0019_run_phase).
        "phase",
    },
}


def test_write__names_every_column_it_may_change():
    text = sql("write_function")
    for model, unchanging in UNCHANGING.items():
        block = {
            Turn: r"turns_changed AS \((.*?)\),\nturns_added",
            ToolCall: r"calls_changed AS \((.*?)\),\ncalls_added",
            Run: r"r AS \((.*?)\),\nevents",
        }[model]
        changed = re.search(block, text, re.S).group(1)
        named = set(re.findall(r'^\s*"(\w+)" = ', changed, re.M))
        columns = {f.column for f in model._meta.concrete_fields}
        assert named | unchanging == columns, (model.__name__, columns - named - unchanging)
        assert not named & unchanging, (model.__name__, named & unchanging)
    for table, model in (("turns_added", Turn), ("calls_added", ToolCall)):
        inserted = re.search(rf'{table} AS \(\s*INSERT INTO "\w+" \((.*?)\)', text, re.S).group(1)
        columns = {f.column for f in model._meta.concrete_fields if not f.primary_key}
        assert set(re.findall(r'"(\w+)"', inserted)) == columns, table


def test_write__finds_the_rows_it_changes_by_primary_key(leased):
    """The planner takes a JSON list for 100 rows, for which a hash join over a scan of the
    whole turn or tool-call table (which grows with every run there ever was) looks cheaper
    than primary-key lookups. Read through LIMIT <count>, the rows are looked up, also in
    the generic plan PL/pgSQL keeps for the function's statement after a few calls (its
    statement, prepared here with $n for its parameters, explained with that plan)."""
    run, _lease, turn, call = leased
    with connection.cursor() as cursor:
        for table, vary in (("agentrun_turn", "index"), ("agentrun_toolcall", "tool_call_id")):
            cursor.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = %s AND column_name <> 'id'",
                [table],
            )
            columns = [f'"{c}"' for (c,) in cursor.fetchall()]
            shifted = {
                "index": '"index" + g',
                "tool_call_id": "\"tool_call_id\" || '-' || g",
            }[vary]
            values = [shifted if c == f'"{vary}"' else c for c in columns]
            row = turn if table == "agentrun_turn" else call
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)}"
                f" FROM {table}, generate_series(1, 5000) AS g WHERE id = %s",
                [row.pk],
            )
            cursor.execute(f"ANALYZE {table}")
        text, names = _body_with_placeholders()
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        types = ", ".join(n.split(None, 1)[1] for n in names)
        cursor.execute(f"PREPARE agentrun_plan_test({types}) AS {text}")
        try:
            # One row to change of each kind, as in a tool call's commit.
            values = ", ".join("1" if n.split()[0].endswith("_count") else "NULL" for n in names)
            cursor.execute(f"EXPLAIN EXECUTE agentrun_plan_test({values})")
            plan = "\n".join(line for (line,) in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE agentrun_plan_test")
    assert "Seq Scan on agentrun_turn" not in plan, plan
    assert "Seq Scan on agentrun_toolcall" not in plan, plan
    assert "Index Scan using agentrun_turn_pkey" in plan, plan
    assert "Index Scan using agentrun_toolcall_pkey" in plan, plan


def _body_with_placeholders() -> tuple[str, list[str]]:
    """The statement of agentrun_write with $1, $2... for its parameters, and their names
    with their types ("turns_changed jsonb")."""
    body = sql("write_function").split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"\bp_(\w+)", number, body)
    types = dict(_signature(sql("write_function")))
    return text, [f"{name} {types['p_' + name]}" for name in names]


def test_write__function_migration_is_reversible():
    """0012_pooler_write_function drops the function when unapplied and installs it again."""
    from django.db.migrations.executor import MigrationExecutor

    def installed() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regproc('agentrun_write') IS NOT NULL")
            return cursor.fetchone()[0]

    executor = MigrationExecutor(connection)
    leaf = executor.loader.graph.leaf_nodes("agentrun")
    try:
        executor.migrate([("agentrun", "0009_turn_usage_details")])
        assert not installed()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaf)
    assert installed()
