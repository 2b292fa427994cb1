"""Django's own connection pool (OPTIONS "pool", Django 5.1+, psycopg 3) in a real worker:
the lease heartbeat's connection is its own, never one that a batch of tool handlers
touching the ORM can take from the pool (issue #35: with max_size 4, three such handlers
took every pooled connection right after the claim, the heartbeat could not renew, the
watchdog stopped the batch, and recovery re-ran it until recovery_exhausted)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from django_agentrun import start_run
from django_agentrun.models import RunEvent
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_resting
from tests.testapp.agents import executions

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        bool(os.environ.get("AGENTRUN_TEST_PSYCOPG2"))
        or importlib.util.find_spec("psycopg_pool") is None,
        reason="Django's pool needs psycopg 3 and psycopg_pool",
    ),
]

CALLS = 6


def test_django_pool__a_batch_of_orm_touching_calls_leaves_the_heartbeat_its_connection(
    workers, messages_api
):
    """Six read-only calls at once, each writing its heartbeat through the ORM every 0.1 s
    for 2 s, under a pool of at most 4: the task's connection and three handlers' take the
    pool, the other handlers wait their turn for one; the lease (3 s) is renewed meanwhile
    over the heartbeat's own connection. Each call runs once, nothing is recovered."""
    messages_api.script = by_step(
        [
            Reply(
                [
                    text("Reading six things."),
                    *[tool_use("busy_read", {"seconds": 2, "label": str(i)}) for i in range(CALLS)],
                ]
            ),
            Reply([text("Done.")]),
        ]
    )
    worker = workers.start(
        AGENTRUN_TEST_DJANGO_POOL=json.dumps({"max_size": 4}),
        AGENTRUN_LEASE_SECONDS="3",
        AGENTRUN_TOOL_CONCURRENCY=str(CALLS),
    )
    run = start_run("hardening", "Read six things.")
    wait_resting(run, timeout=45)
    log = worker.log_path.read_text(errors="replace")
    assert run.state == "completed", (run.state, run.error_code, log[-3000:])
    starts = [r for r in executions("busy_read") if r["phase"] == "start"]
    assert len(starts) == CALLS and len({r["key"] for r in starts}) == CALLS, starts
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert "could not be renewed" not in log, log[-3000:]
    assert worker.poll() is None  # it never ended itself
    assert_projection_matches(run)
