"""A killed prefork pool child: the message comes back (reject_on_worker_lost) and the
new child takes over the dead process's lease at once, without waiting for it to expire."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from django_agentrun import start_run
from django_agentrun.models import Run, RunEvent
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.processes import wait_for


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_pool_child_killed__redelivered_and_lease_taken_over(
    workers, messages_api, settings, figures
):
    settings.AGENTRUN_LEASE_SECONDS = 30  # the default: recovery must not wait for it
    messages_api.script = by_step(
        [
            Reply([tool_use("lookup", {"query": "x"})], latency=3.0),  # slow first answer
            Reply([text("done")]),
        ]
    )
    worker = workers.start(pool="prefork", concurrency=1)
    run = start_run("test-agent", "go")
    wait_for(lambda: messages_api.requests, timeout=30, message="the first model request")
    child = wait_for(lambda: _children(worker.pid), timeout=5, message="the pool child")[0]
    killed = time.monotonic()
    os.kill(child, signal.SIGKILL)

    def done():
        run.refresh_from_db()
        return run.state == "completed"

    wait_for(done, timeout=25, interval=0.1, message="completed after the child was killed")
    took = time.monotonic() - killed
    figures(f"[recovery] run completed {took:.2f}s after its pool child was killed")
    assert took < settings.AGENTRUN_LEASE_SECONDS, took
    assert Run.objects.get(pk=run.pk).recovery_attempts == 0  # reset when the turn completed
    assert RunEvent.objects.filter(run=run, type="recovery").count() == 1
    # Step 0 was asked twice (its answer never committed), step 1 once.
    assert messages_api.steps() == {0: 2, 1: 1}
