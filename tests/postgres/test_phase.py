"""Run.phase on Postgres (migration 0019_run_phase): a trigger keeps it, whatever writes the
run (the ORM, the store's statements and its write function, bulk updates, the reaper, the
admin); and because a turn changes no indexed column of the run, the run's updates during
a turn are HOT (no index entry written). tests/conftest.py checks the phase of every run
every test leaves; these check each path by name, and that the check can fail."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_agentrun import start_run
from django_agentrun.admin import overview_data
from django_agentrun.models import Run
from django_agentrun.reaper import reap
from django_agentrun.states import RUN_PHASE, RunState
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests import factories
from tests.conftest import assert_phases_match, drive

# Some rows are moved by hand (as any statement could), without events.
pytestmark = [pytest.mark.django_db, pytest.mark.no_projection_check]


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the phase's trigger is Postgres's (a generated column elsewhere)")


def _phase(run) -> str:
    return Run.objects.values_list("phase", flat=True).get(pk=run.pk)


def _stats() -> tuple[int, int]:
    """(updates, HOT updates) of agentrun_run in this transaction so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
            "WHERE relname = 'agentrun_run'"
        )
        upd, hot = cursor.fetchone()
    return int(upd), int(hot)


def test_phase__the_trigger_maps_every_state_as_the_model_does():
    run = start_run("test-agent", "hello")
    assert _phase(run) == "queued"
    for state, phase in RUN_PHASE.items():
        with connection.cursor() as cursor:  # by hand, as any statement would
            cursor.execute(
                'UPDATE "agentrun_run" SET "state" = %s WHERE "id" = %s RETURNING "phase"',
                [state, run.pk],
            )
            assert cursor.fetchone()[0] == phase, state
        # The GeneratedField's own expression (what SQLite stores) says the same.
        assert Run.objects.filter(pk=run.pk, phase=phase).exists()
    assert set(RUN_PHASE) == set(RunState.values)


def test_phase__inserted_rows_get_theirs_and_a_forged_one_is_put_right():
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO "agentrun_run" ("id", "agent", "state", "input", "config", '
            '"correlation_id", "trace_context", "metadata", "share_key", "request_hash", '
            '"cost_usd", "turn_count", "input_tokens", "output_tokens", '
            '"cache_creation_input_tokens", "cache_read_input_tokens", "stop_reason", '
            '"error_code", "error_message", "failure_phase", "cancel_reason", "lease_owner", '
            '"lease_epoch", "recovery_attempts", "last_seq", "context", "rolled_back", '
            '"created_at", "updated_at", "queued_at") '
            "VALUES (gen_random_uuid(), 'test-agent', 'awaiting_approval', '\"x\"', '{}', '', "
            "'{}', '{}', '', '', 0, 0, 0, 0, 0, 0, '', '', '', '', '', '', 0, 0, 0, '', false, "
            'now(), now(), now()) RETURNING "id", "phase"'
        )
        pk, phase = cursor.fetchone()
        assert phase == "parked"
        cursor.execute('UPDATE "agentrun_run" SET "phase" = %s WHERE "id" = %s', ["queued", pk])
    assert Run.objects.get(pk=pk).phase == "parked"


def test_phase__every_path_that_moves_a_run_keeps_it(client, monkeypatch):
    # The ORM: a django-fsm transition saved, and a bulk update.
    run = start_run("test-agent", "hello")
    run.to_running()
    run.save(update_fields=["state"])
    assert _phase(run) == "leased"
    Run.objects.filter(pk=run.pk).update(state=RunState.AWAITING_APPROVAL)
    assert _phase(run) == "parked"
    # The engine: the claim's statement and the write function (a turn with a tool call,
    # then the answer).
    engine_run = start_run("test-agent", "hello")
    client_ = ScriptedClient(
        [reply(text("Looking."), tool_use("lookup", {"query": "q"})), reply(text("Done."))]
    )
    drive(engine_run, client_)
    assert (engine_run.state, _phase(engine_run)) == (RunState.COMPLETED, "finished")
    # The reaper: a run past its deadline, timed out.
    late = start_run("test-agent", "hello", deadline=timedelta(seconds=-1))
    assert _phase(late) == "queued"
    reap(now=timezone.now() + timedelta(seconds=1))
    late.refresh_from_db()
    assert (late.state, _phase(late)) == (RunState.TIMED_OUT, "finished")
    # The admin's bulk action: a run parked for a person cancelled from the run list.
    parked, _call, _model = factories.parked()
    assert _phase(parked) == "parked"
    operator = factories.user(
        "op",
        "view_run",
        "view_toolcall",
        "view_runevent",
        "view_all_runs",
        "cancel_run",
        is_staff=True,
    )
    client.force_login(operator)
    response = client.post(
        reverse("admin:agentrun_run_changelist"),
        {"action": "cancel_selected", "_selected_action": [str(parked.pk)], "index": "0"},
        follow=True,
    )
    assert response.status_code == 200
    parked.refresh_from_db()
    assert (parked.state, _phase(parked)) == (RunState.CANCELLED, "finished")
    assert_phases_match()


def test_phase__the_check_fails_without_the_trigger():
    run = start_run("test-agent", "hello")
    with connection.cursor() as cursor:  # rolled back with the test's transaction
        cursor.execute('DROP TRIGGER agentrun_run_phase_update ON "agentrun_run"')
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    assert _phase(run) == "queued"
    with pytest.raises(AssertionError, match="phase is not their state's"):
        assert_phases_match()
    Run.objects.filter(pk=run.pk).delete()  # the suite's own check runs after this test


def test_hot__a_turn_updates_the_run_in_place():
    """A run of three turns (two with a tool call each, then the answer): of its row's
    updates only those that change its phase are not HOT (queued -> leased at the first
    turn, leased -> finished at the end); every turn's commits are, so they write no index
    entry. (Before 0019_run_phase none was: the state and the overview's token and cost
    keys are indexed.)"""
    run = start_run("test-agent", "hello")
    client = ScriptedClient(
        [
            reply(text("One."), tool_use("lookup", {"query": "a"})),
            reply(text("Two."), tool_use("lookup", {"query": "b"})),
            reply(text("Done.")),
        ]
    )
    before = _stats()
    drive(run, client)
    after = _stats()
    assert run.state == RunState.COMPLETED
    updates, hot = after[0] - before[0], after[1] - before[1]
    assert updates >= 6, (updates, hot)
    assert updates - hot == 2, (updates, hot)


def test_indexes__the_overview_reads_finished_runs_through_their_index():
    now = timezone.now()
    Run.objects.bulk_create(
        [
            Run(
                agent=f"agent-{i % 5}",
                state=RunState.COMPLETED,
                input="x",
                finished_at=now - timedelta(hours=i % 5000),
            )
            for i in range(5000)
        ],
        batch_size=1000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agentrun_run")
    w = overview_data.window("24h", now)
    queries = [
        overview_data.runs_by_state.__name__,
        overview_data.cost_by_day.__name__,
        overview_data.cache_share.__name__,
        overview_data.failure_codes.__name__,
    ]

    runs = Run.objects.all()
    with CaptureQueriesContext(connection) as ctx:
        for name in queries:
            getattr(overview_data, name)(runs, w)
    assert len(ctx.captured_queries) == 5  # the cache share: the total and the agents
    for query in ctx.captured_queries:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + query["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "agentrun_run_finished_at_idx" in plan, plan
        assert "Seq Scan" not in plan, plan
