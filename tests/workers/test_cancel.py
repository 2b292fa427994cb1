"""Cooperative cancellation with real workers: a slow model stream, a child process.

After either, resume_run finishes the run and the server accepts the history.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from django_agentrun import cancel_run, resume_run, start_run
from django_agentrun.models import Run
from django_agentrun.testing.messages_api import Reply, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_for
from tests.testapp.agents import executions


def _state(run: Run) -> str:
    run.refresh_from_db()
    return run.state


def _descendants(pid: int) -> list[int]:
    """pids of the processes below `pid` (children, their children...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _sleepers(worker: subprocess.Popen) -> list[int]:
    """pids of the `sleep 60` processes the tool started under this test's worker (not any
    other `sleep 60` on a shared machine)."""
    found = []
    for pid in _descendants(worker.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[:2] == [b"sleep", b"60"]:
            found.append(pid)
    return found


def test_cancel__during_a_slow_stream(workers, messages_api):
    calls = {"n": 0}

    def script(body):
        calls["n"] += 1
        if calls["n"] == 1:  # a long answer, one SSE event every 0.5 s
            return Reply([text("word " * 400)], delay=0.5, chunk_size=5)
        return Reply([text("Quick answer after resume.")])

    messages_api.script = script
    workers.start()
    run = start_run("test-agent", "Write a long essay")
    wait_for(lambda: messages_api.requests, timeout=30, message="the stream to start")
    time.sleep(1.0)
    asked = time.monotonic()
    cancel_run(run, reason="user pressed stop")
    wait_for(lambda: _state(run) == "cancelled", timeout=5, interval=0.05, message="cancelled")
    latency = time.monotonic() - asked
    assert latency < 2.0, latency
    assert messages_api.wait_for(lambda: messages_api.disconnects >= 1, timeout=2)
    assert run.cancel_reason == "user pressed stop"
    turn = run.turns.get()
    assert turn.state == "cancelled" and turn.content is None

    resume_run(run)
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed after resume")
    assert run.output["text"] == "Quick answer after resume."
    assert all(r["status"] == 200 for r in messages_api.requests)
    assert_projection_matches(run)


def test_cancel__kills_the_tool_child_process(workers, messages_api):
    def script(body):
        last = body["messages"][-1]
        if body["messages"][0] is last:
            return Reply([tool_use("shell_sleep", {"seconds": 60}, id="toolu_sleep")])
        return Reply([text("Resumed after the cancelled sleep.")])

    messages_api.script = script
    worker = workers.start(AGENTRUN_CANCEL_GRACE_SECONDS="1")
    run = start_run("test-agent", "Sleep a minute")
    child = wait_for(
        lambda: executions("shell_sleep") and _sleepers(worker), timeout=30, message="the child"
    )
    asked = time.monotonic()
    cancel_run(run, reason="too slow")
    wait_for(lambda: _state(run) == "cancelled", timeout=5, interval=0.05, message="cancelled")
    assert time.monotonic() - asked < 2.0
    wait_for(
        lambda: not any(p in _sleepers(worker) for p in child),
        timeout=1 + 1,
        interval=0.05,
        message="child gone",
    )
    call = run.tool_calls.get()
    assert call.state == "cancelled" and call.is_error
    assert "Cancelled" in call.result

    resume_run(run)
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed after resume")
    # The history sent after resume answers the cancelled tool_use with its result.
    last = messages_api.bodies[-1]["messages"]
    assert last[-1]["content"][0]["tool_use_id"] == "toolu_sleep"
    assert all(r["status"] == 200 for r in messages_api.requests)
    assert len(executions("shell_sleep")) == 1
    assert_projection_matches(run)
    assert os.environ.get("AGENTRUN_FAILPOINTS") is None
