"""The lock order (store/locks.py) and what a deadlock that can still happen does: a rival
connection that takes a tool call's row and then its run's (the wrong order, as a host's own
code might) deadlocks with the worker's result write or with a decision. Postgres rolls
one side back; that side is retried, and nothing is lost or answered with a server error."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import close_old_connections, connection, transaction

from django_agentrun import approve_tool_call, start_run
from django_agentrun.models import Run, ToolCall
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive
from tests.factories import parked
from tests.testapp.agents import DURING

pytestmark = pytest.mark.timeout(60)


def _wrong_order(call_id, run_id, locked: threading.Event, hold: float = 0.3) -> threading.Thread:
    """A thread that locks the call's row, says so, waits `hold` s, then locks the run's."""

    def rival() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        'SELECT 1 FROM "agentrun_toolcall" WHERE id = %s FOR UPDATE', [call_id]
                    )
                    locked.set()
                    time.sleep(hold)
                    cursor.execute(
                        'SELECT 1 FROM "agentrun_run" WHERE id = %s FOR UPDATE', [run_id]
                    )
        except Exception:  # noqa: BLE001 - the deadlock's victim may be this side
            pass
        finally:
            locked.set()
            close_old_connections()
            connection.close()

    return threading.Thread(target=rival)


def test_lock_order__a_result_write_that_deadlocks_is_sent_again(postgres, caplog):
    threads: list[threading.Thread] = []

    def while_the_tool_runs() -> None:
        # The call is committed in flight: lock it, then (while the result's write waits for
        # it, holding the run) ask for the run: a deadlock, detected on the writer's side.
        call = ToolCall.objects.get(name="during")
        locked = threading.Event()
        thread = _wrong_order(call.pk, call.run_id, locked)
        threads.append(thread)
        thread.start()
        locked.wait(5)

    DURING["deadlock"] = while_the_tool_runs
    model = ScriptedClient(
        [reply(tool_use("during", {"name": "deadlock"})), reply(text("All done."))]
    )
    run = start_run("chat", "Run the tool")
    try:
        drive(run, model)
    finally:
        DURING.pop("deadlock", None)
        for thread in threads:
            thread.join(10)
    call = ToolCall.objects.get(run=run)
    assert (run.state, call.state, call.result) == ("completed", "succeeded", "ran deadlock")
    assert any("Commit not written (40P01)" in r.getMessage() for r in caplog.records)


def test_lock_order__a_decision_that_deadlocks_is_retried(postgres, caplog):
    run, call, _ = parked()
    locked = threading.Event()
    # The rival locks the call first, then (0.3 s later) the run, which approve holds while
    # it waits for the call: Postgres rolls one of them back (here the approval, which
    # waited first) and approve_tool_call tries again.
    thread = _wrong_order(call.pk, run.pk, locked, hold=0.3)
    thread.start()
    locked.wait(5)
    try:
        approve_tool_call(call, by=None)
    finally:
        thread.join(10)
    call.refresh_from_db()
    assert call.approved and call.state == "requested"
    assert Run.objects.get(pk=run.pk).state == "awaiting_tool"
    assert any("Retrying approve_tool_call" in r.getMessage() for r in caplog.records)


def _lose_a_race(code: str = "40P01") -> None:
    """A real error from Postgres with the SQLSTATE of a lost race."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'lost' USING ERRCODE = '{code}'; END $$"  # noqa: S608
        )


@pytest.mark.parametrize("code", ["40P01", "40001"])
def test_lost_race__retried_then_a_conflict_never_a_server_error(postgres, code):
    from django_agentrun.exceptions import ConcurrentUpdate
    from django_agentrun.services.retrying import ATTEMPTS, retry_lost_race

    tries: list[int] = []

    @retry_lost_race
    def loses_twice() -> str:
        tries.append(1)
        if len(tries) <= 2:
            _lose_a_race(code)
        return "done"

    assert loses_twice() == "done" and len(tries) == 3

    @retry_lost_race
    def always_loses() -> None:
        tries.append(1)
        _lose_a_race(code)

    tries.clear()
    with pytest.raises(ConcurrentUpdate):
        always_loses()
    assert len(tries) == ATTEMPTS


def test_lost_race__in_a_view_is_a_409(postgres):
    from django.db import DatabaseError

    from django_agentrun.api.errors import exception_handler

    try:
        _lose_a_race()
    except DatabaseError as exc:
        response = exception_handler(exc, {})
    assert response is not None and response.status_code == 409
    assert response.data["code"] == "concurrent_update"
