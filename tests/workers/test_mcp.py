"""Tools from real MCP servers (tests/testapp/mcp_server.py, written with the mcp SDK) called
by real Celery workers, killed with SIGKILL at the failpoints of an MCP call: before it,
during it (the server reported progress: it runs there), after it returned and before its
result was written. Then the server's own log is counted: a read-only call is retried, a
destructive one runs at most once and is settled by its reconcile check or by a person.
Also: a cancel mid-call reaches the server as MCP's cancellation; a stdio server killed
mid-run is started again; a streamable HTTP server gets each owner's own credentials and
its sessions are opened again after it restarts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model

from django_agentrun import approve_tool_call, cancel_run, start_run
from django_agentrun.mcp import connections
from django_agentrun.recovery import reap
from django_agentrun.services import resolve_tool_call
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from django_agentrun.testing.processes import http_answers
from tests.processes import ROOT, free_port, wait_for, wait_resting
from tests.testapp.mcp_server import calls

pytest.importorskip("mcp")

REFUND = {"order": "o1", "amount_cents": 500}


@pytest.fixture(autouse=True)
def mcp_log(tmp_path, monkeypatch):
    """The test MCP server's log for this test (every server process, every worker)."""
    path = tmp_path / "mcp.jsonl"
    monkeypatch.setenv("AGENTRUN_TEST_MCP_LOG", str(path))
    # This process only lists the server's tools (with a server of its own, kept across
    # tests): every call is a worker's, on the worker's server.
    yield path
    if os.environ.get("AGENTRUN_TEST_MCP_PROTOCOL"):  # a server of another kind (speaking)
        connections.close_all()


def finish(run, timeout=60):
    wait_resting(run, timeout=timeout, interval=0.3, before=lambda: reap(stale_after=1))


def crash_then_finish(workers, point, agent, first=None):
    """A worker that dies at `point` while it works a run of `agent`; a fresh worker and the
    reaper take it from there. The run, at rest."""
    dying = workers.start(failpoints=f"{point}=crash", AGENTRUN_LEASE_SECONDS="2")
    run = start_run(agent, "Refund o1 and check the stock.")
    assert workers.wait_exit(dying, timeout=60) != 0, f"no crash at {point}\n{workers.logs()}"
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    finish(run)
    return run


def refund_then_stock():
    """Turn 0: a destructive call, then a read-only and an idempotent one (run together, a
    batch: both may run again); turn 1 answers."""
    return by_step(
        [
            Reply(
                [
                    tool_use("refund", REFUND, id="toolu_refund"),
                    tool_use("stock", {"item": "hat"}, id="toolu_stock"),
                    tool_use("set_flag", {"order": "o1", "flag": "refunded"}, id="toolu_flag"),
                ]
            ),
            Reply([text("Refunded; 3 hats left.")]),
        ]
    )


# The destructive call (refund, with a reconcile check that reads the server's log by the
# call's idempotency key) at each failpoint of its call; the read-only one (stock) during its
# call, the idempotent one (set_flag) after it returned.
POINTS = {
    "tool.before_handler@refund": "executed",
    "mcp.progress@refund": None,  # the server may or may not have got to it
    "tool.after_handler@refund": "reconciled",
    "mcp.progress@stock": "executed",
    "tool.after_handler@set_flag": "executed",
}
# The MCP matrix (docs/how-to/mcp.md, "The MCP matrix"): a server that speaks only the
# 2026-07-28 protocol (no initialize, no ping) and one that speaks only the earlier
# handshake. The refund's points on both; the batch's on the new protocol.
MATRIX = [
    *((point, protocol) for point in POINTS if point.endswith("@refund")
      for protocol in ("modern", "legacy")),
    *((point, "modern") for point in POINTS if not point.endswith("@refund")),
]  # fmt: skip


def speaking(monkeypatch, protocol: str, annotated: bool = True) -> None:
    """Every server from here on (the workers' and this process's) speaks `protocol`."""
    monkeypatch.setenv("AGENTRUN_TEST_MCP_PROTOCOL", protocol)
    monkeypatch.setenv("AGENTRUN_TEST_MCP_ANNOTATIONS", "1" if annotated else "0")
    connections.close_all()  # this process lists the tools: from such a server too


@pytest.mark.parametrize(("point", "protocol"), MATRIX)
def test_crash_at__an_mcp_call(point, protocol, workers, messages_api, settings, monkeypatch):
    settings.AGENTRUN_LEASE_SECONDS = 2
    speaking(monkeypatch, protocol)
    messages_api.script = refund_then_stock()
    run = crash_then_finish(workers, point, "mcp-crash")

    assert run.state == "completed", (run.state, run.error_code, workers.logs())
    assert not messages_api.script_errors
    refund = run.tool_calls.get(tool_call_id="toolu_refund")
    # The destructive call had its effect exactly once: never re-run blindly, a crash
    # before the server got it re-run after the check found nothing.
    done = calls("refund")
    assert len(done) == 1, done
    assert done[0]["key"] == refund.idempotency_key
    expected = POINTS[point]
    if expected is not None and point.endswith("@refund"):
        assert refund.result_source == expected
    for name, tool_call_id in (("stock", "toolu_stock"), ("set_flag", "toolu_flag")):
        call = run.tool_calls.get(tool_call_id=tool_call_id)
        ran = calls(name)
        # Every attempt with the call's one key (an idempotent server de-duplicates by it).
        assert {r["key"] for r in ran} == {call.idempotency_key}, (name, ran)
        assert call.result_source == "executed" and not call.is_error
        if point.endswith(f"@{name}"):
            # Cut during or after its call: re-run, on the next worker's own server.
            assert call.attempt == 2 and 1 <= len(ran) <= 2, (name, ran)
            assert len({r["pid"] for r in ran}) == len(ran)
        elif point.endswith("@refund"):
            assert len(ran) == 1, (name, ran)  # the crash came before the batch


# An untrusted server's tool (no annotations, no host settings): non_idempotent, asked
# first, no reconcile check. Approved, then cut at each point: once committed in flight,
# whether it ran is unknown to the app; nobody runs it again, a person settles it. The
# server's own log says how many times it ran (by the call's one key).
UNTRUSTED = {
    "tool.before_handler@refund": 0,
    "mcp.progress@refund": None,  # the server may or may not have got to it
    "tool.after_handler@refund": 1,
}


@pytest.mark.parametrize("point", list(UNTRUSTED))
def test_crash_at__an_untrusted_servers_call__approved_first__a_person_settles_it(
    point, workers, messages_api, settings, monkeypatch
):
    settings.AGENTRUN_LEASE_SECONDS = 2
    speaking(monkeypatch, "legacy", annotated=False)
    messages_api.script = by_step(
        [Reply([tool_use("refund", REFUND, id="toolu_refund")]), Reply([text("Refunded.")])]
    )
    dying = workers.start(failpoints=f"{point}=crash", AGENTRUN_LEASE_SECONDS="2")
    run = start_run("mcp-stranger", "Refund o1.")
    wait_resting(run, timeout=60)
    assert run.state == "awaiting_approval", (run.state, workers.logs())
    assert calls("refund") == []
    person = get_user_model().objects.create_user("pat", password="x")
    approve_tool_call(run.tool_calls.get(), by=person)
    assert workers.wait_exit(dying, timeout=60) != 0, f"no crash at {point}\n{workers.logs()}"
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    finish(run)

    assert run.state == "awaiting_approval", (run.state, run.error_code, workers.logs())
    refund = run.tool_calls.get()
    assert refund.state == "unknown"
    done = calls("refund")
    assert {r["key"] for r in done} <= {refund.idempotency_key}
    assert len(done) == UNTRUSTED[point] if UNTRUSTED[point] is not None else len(done) <= 1
    resolve_tool_call(refund, by=person, action="done", result="refunded 500 on o1")
    finish(run)
    assert run.state == "completed", (run.state, workers.logs())
    assert calls("refund") == done  # nobody ran it again


def test_cancel__mid_call__reaches_the_server_as_a_cancellation(workers, messages_api, settings):
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step(
        [Reply([tool_use("wait", {"seconds": 20}, id="toolu_wait")]), Reply([text("never")])]
    )
    workers.start()
    run = start_run("mcp-crash", "Wait.")
    wait_for(lambda: calls("wait_started"), timeout=30, message="the call to reach the server")
    cancel_run(run, reason="enough")
    wait_resting(run, timeout=20)
    assert run.state == "cancelled"
    call = run.tool_calls.get()
    assert call.state == "cancelled" and call.is_error
    cancelled = wait_for(lambda: calls("cancelled"), timeout=10, message="the server's cancel")
    assert cancelled[0]["key"] == call.idempotency_key
    assert calls("wait") == []  # the server stopped the handler


def test_server_killed__mid_call_and_between_calls__started_again(workers, messages_api, settings):
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step(
        [
            Reply([tool_use("wait", {"seconds": 1.5}, id="toolu_wait")]),
            Reply([tool_use("stock", {"item": "hat"}, id="toolu_stock")]),
            Reply([text("Done.")]),
        ]
    )
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    run = start_run("mcp-crash", "Wait, then count.")
    first = wait_for(lambda: calls("wait_started"), timeout=30, message="the call")[0]
    os.kill(first["pid"], signal.SIGKILL)  # the worker's stdio server dies mid-call
    finish(run)
    assert run.state == "completed", (run.state, workers.logs())
    started = calls("wait_started")
    # The outcome of the cut call was unknown: read-only, so re-run on a new server.
    assert len({r["pid"] for r in started}) == 2
    assert len(calls("wait")) == 1
    assert calls("stock")[0]["pid"] == started[-1]["pid"]
    assert run.tool_calls.get(tool_call_id="toolu_wait").attempt == 2


@pytest.fixture
def http_server(mcp_log, monkeypatch, tmp_path):
    """The test MCP server over streamable HTTP (uvicorn), at AGENTRUN_TEST_MCP_URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    monkeypatch.setenv("AGENTRUN_TEST_MCP_URL", url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []

    def start() -> None:
        argv = [sys.executable, "-m", "tests.testapp.mcp_server", "--http", str(port)]
        with open(tmp_path / f"mcp-http-{len(procs)}.log", "w") as log:
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log))
        wait_for(lambda: http_answers(url), timeout=30, message="the MCP HTTP server")

    def restart() -> None:
        procs[-1].kill()
        procs[-1].wait()
        start()

    start()
    yield restart
    for proc in procs:
        proc.kill()
        proc.wait()


def test_http__each_owner_with_their_credentials__sessions_reopened(
    workers, messages_api, http_server, settings
):
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step(
        [
            Reply([tool_use("set_flag", {"order": "o1", "flag": "gift"}, id="toolu_flag")]),
            Reply([text("Flagged.")]),
        ]
    )
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    users = get_user_model().objects
    ann, bob = users.create_user("ann", password="x"), users.create_user("bob", password="x")
    first = start_run("mcp-http", "Flag o1", owner=ann)
    wait_resting(first)
    http_server()  # the server restarts: its sessions are gone
    second = start_run("mcp-http", "Flag o1", owner=bob)
    wait_resting(second)
    assert (first.state, second.state) == ("completed", "completed"), workers.logs()
    flagged = calls("set_flag")
    assert [r["auth"] for r in flagged] == ["Bearer token-of-ann", "Bearer token-of-bob"]
    keys = [first.tool_calls.get().idempotency_key, second.tool_calls.get().idempotency_key]
    assert [r["key"] for r in flagged] == keys
    # A third run of ann's, on the restarted server: her session is opened again.
    third = start_run("mcp-http", "Flag o1", owner=ann)
    wait_resting(third)
    assert third.state == "completed", workers.logs()
    assert calls("set_flag")[-1]["auth"] == "Bearer token-of-ann"


def test_progress__on_the_runs_live_stream(workers, messages_api, asgi_server):
    """The server's progress notifications reach a client of the run's SSE stream (deltas of
    kind tool_progress), while the call runs in a worker."""
    from tests import factories
    from tests.streams import LiveStream

    alice = factories.user("alice")
    messages_api.script = by_step(
        [Reply([tool_use("wait", {"seconds": 1.2}, id="toolu_wait")]), Reply([text("Waited.")])]
    )
    run = start_run("mcp-crash", "Wait.", owner=alice)
    live = LiveStream(asgi_server.url, f"/api/agentrun/runs/{run.pk}/stream/", auth=("alice", "pw"))
    ticks = []
    for frame in live.frames():
        if frame.event == "delta" and frame.json.get("kind") == "tool_progress":
            ticks.append(frame.json)
        if frame.event == "end":
            break
    live.close()
    wait_resting(run)
    assert run.state == "completed"
    assert len(ticks) >= 3, ticks
    assert {t["tool_call_id"] for t in ticks} == {"toolu_wait"}
    assert [t["progress"] for t in ticks] == sorted(t["progress"] for t in ticks)


def test_changed_server__the_run_keeps_its_snapshot__in_a_prefork_pool(workers, messages_api):
    """The run's tools were listed when it began (by this process: version 1); the worker's
    server is version 2 (a new tool, a new description). The model is offered the snapshot's
    tools on every request, and a call of the new tool is refused here, never sent. The
    worker is a prefork pool: its child makes its own event loop and server after the fork."""
    messages_api.script = by_step(
        [
            Reply(
                [
                    tool_use("stock", {"item": "hat"}, id="toolu_stock"),
                    tool_use("discount", {"order": "o1"}, id="toolu_discount"),
                ]
            ),
            Reply([text("3 hats.")]),
        ]
    )
    run = start_run("mcp-crash", "How many hats?")
    assert "discount" not in {t["name"] for t in run.config["tools"]}
    workers.start(pool="prefork", concurrency=1, AGENTRUN_TEST_MCP_VERSION="2")
    wait_resting(run)
    assert run.state == "completed", workers.logs()
    bodies = messages_api.bodies
    assert len(bodies) == 2 and bodies[0]["tools"] == bodies[1]["tools"]
    stock = next(t for t in bodies[1]["tools"] if t["name"] == "stock")
    assert not stock["description"].endswith("(v2)")
    discount = run.tool_calls.get(tool_call_id="toolu_discount")
    assert discount.state == "errored" and "Unknown tool" in str(discount.result)
    looked = calls("stock")
    assert [r["key"] for r in looked] == [run.tool_calls.get(name="stock").idempotency_key]
    assert looked[0]["version"] == "2"  # the server had changed
