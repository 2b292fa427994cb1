"""Behind a connection pooler, with the app's settings at their defaults: prefork workers
and the reaper on PgBouncer (Debian's, started here as a child, two server connections)
in transaction and in session mode. Each transaction may land on another server
connection: nothing the engine sends may rely on what an earlier one left there (issue
#25: a SQL-level PREPARE made every run stay `queued`). Skipped, saying so, where
pgbouncer is not installed (`make pgbouncer` installs it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.db import connection

from django_agentrun import approve_tool_call, start_run
from django_agentrun.models import Run
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests import pgbouncer as bouncer
from tests.conftest import assert_projection_matches
from tests.processes import ROOT, wait_for
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(150)

RUNS = 8


@pytest.fixture(params=["transaction", "session"])
def pooler(request, postgres) -> Iterator[bouncer.PgBouncer]:
    """A PgBouncer of this test's own in front of the test database's server (its direct
    port, also when the test process itself runs behind one: `make test-pgbouncer`)."""
    if bouncer.executable() is None:
        pytest.skip(bouncer.SKIPPED)
    direct = getattr(django_settings, "AGENTRUN_TEST_SETUP_PORT", None)
    started = bouncer.PgBouncer(
        host=connection.settings_dict["HOST"] or "127.0.0.1",
        port=int(direct or connection.settings_dict["PORT"] or 5432),
        user=connection.settings_dict["USER"] or "postgres",
        mode=request.param,
        pool_size=2,
    ).start()
    yield started
    started.stop()  # its server connections close before the test database is dropped


def _states() -> dict[str, int]:
    found: dict[str, int] = {}
    for state in Run.objects.values_list("state", flat=True):
        found[state] = found.get(state, 0) + 1
    return found


def test_pooler__runs_approvals_and_the_reaper_through_pgbouncer(pooler, workers, messages_api):
    messages_api.script = by_step(
        [
            Reply(
                [
                    text("Looking."),
                    tool_use("lookup", {"query": "q"}),
                    tool_use("save_note", {"text": "n"}),
                ]
            ),
            Reply([text("Deleting."), tool_use("delete_account", {"user": "bob"})]),
            Reply([text("Done.")]),
        ]
    )
    # Three pool processes and their heartbeats share two server connections.
    workers.start(pool="prefork", concurrency=3, **pooler.env())
    runs = [start_run("test-agent", f"Task {i}.") for i in range(RUNS)]

    wait_for(
        lambda: _states() == {"awaiting_approval": RUNS},
        timeout=90,
        message=f"every run waiting for its approval ({pooler.mode} mode): {_states()}",
    )
    for run in runs:
        call = run.tool_calls.get(name="delete_account")
        approve_tool_call(call, by=None)
    wait_for(
        lambda: _states() == {"completed": RUNS},
        timeout=90,
        message=f"every run completed ({pooler.mode} mode): {_states()}",
    )

    # The reaper through the pooler too (the command runs the same recovery code).
    reaper = subprocess.run(
        [sys.executable, "manage.py", "reconcile_runs"],
        cwd=ROOT,
        env=workers.env(**pooler.env()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reaper.returncode == 0, reaper.stdout + reaper.stderr
    assert len(executions("delete_account")) == RUNS
    assert len(executions("lookup")) == RUNS
    logs = workers.logs()
    assert "prepared statement" not in logs, logs
    for run in runs:
        run.refresh_from_db()
        assert run.turn_count == 3, run.pk
        assert_projection_matches(run)
