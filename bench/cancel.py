"""5. Cancellation latency: `cancel_run(run)` while the lease holder is busy.

(a) during a slow streamed model response: a solo worker with the real Anthropic
    client (AGENTRUN_MODEL_CLIENT=django_agentrun.clients.anthropic.AnthropicModelClient)
    against the local fake Messages API (django_agentrun/testing/messages_api), which sends one SSE
    event every few seconds. Measured: cancel_run -> run.state == "cancelled", and
    whether the server saw the client hang up (`server.disconnects`).
(b) during a tool that runs `ctx.run_subprocess(["sleep", ...])`: measured cancel_run
    -> "cancelled" and cancel_run -> the `sleep` child is gone (a /proc scan for its
    exact command line, unique per trial).
Target (ARCHITECTURE.md section 9): within 2 s.
"""

from __future__ import annotations

import random
import time

from .common import check, figure, median, section, table, wait_until
from .workers import Workers, find_processes, register_child

NAME = "cancel"
TARGET_SECONDS = 2.0
STREAM_DELAY = 3.0  # seconds between SSE events


def _state(run_id) -> str:
    from django_agentrun.models import Run

    return Run.objects.filter(pk=run_id).values_list("state", flat=True).first() or ""


def _wait_cancelled(run_id, started: float, timeout: float = 15) -> float:
    if not wait_until(lambda: _state(run_id) == "cancelled", timeout=timeout, interval=0.005):
        raise RuntimeError(
            f"cancel: run {run_id} is {_state(run_id)!r} {timeout} s after cancel_run"
        )
    return time.monotonic() - started


def stream_trials(n: int) -> list[dict]:
    from django_agentrun import cancel_run, start_run
    from django_agentrun.testing.messages_api import MessagesAPIServer, Reply

    reply = Reply("A long answer. " * 200, delay=STREAM_DELAY, chunk_size=10)
    results = []
    with MessagesAPIServer(lambda body: reply) as server:
        pool = Workers(
            "cancel-stream",
            AGENTRUN_MODEL_CLIENT="django_agentrun.clients.anthropic.AnthropicModelClient",
            ANTHROPIC_BASE_URL=server.base_url,
            ANTHROPIC_API_KEY="bench-key",
        )
        with pool.active():
            pool.start()
            for i in range(n):
                before_requests = len(server.requests)
                before_disconnects = server.disconnects
                run = start_run("bench-cancel-stream", f"stream id=cs-{i}")
                if not server.wait_for(
                    lambda b=before_requests: len(server.requests) > b, timeout=30
                ):
                    raise RuntimeError(f"cancel: the model was never called\n{pool.logs()}")
                time.sleep(random.uniform(0.3, 1.0))  # mid-stream (events every 3 s)
                started = time.monotonic()
                returned = cancel_run(run, reason="bench")
                if returned.state == "cancelled":
                    raise RuntimeError(
                        "cancel: applied at once (no live lease?): not the path measured"
                    )
                cancelled = _wait_cancelled(run.pk, started)
                seen = server.wait_for(
                    lambda b=before_disconnects: server.disconnects > b, timeout=2
                )
                results.append({"cancelled": cancelled, "disconnect": bool(seen)})
    return results


def tool_trials(n: int) -> list[dict]:
    from django_agentrun import cancel_run, start_run
    from django_agentrun.models import ToolCall

    results = []
    pool = Workers("cancel-tool")
    with pool.active():
        pool.start()
        for i in range(n):
            seconds = f"60.{random.randrange(10**6):06d}"
            marker = register_child(["sleep", seconds])
            run = start_run("bench-cancel-tool", f"tool sleep={seconds} id=ct-{i}")
            if not wait_until(lambda m=marker: find_processes(m), timeout=30):
                raise RuntimeError(f"cancel: the sleep child never started\n{pool.logs()}")
            time.sleep(random.uniform(0.2, 1.0))
            started = time.monotonic()
            if cancel_run(run, reason="bench").state == "cancelled":
                raise RuntimeError(
                    "cancel: applied at once (no live lease?): not the path measured"
                )
            gone_at = None
            cancelled_at = None
            deadline = started + 15
            while time.monotonic() < deadline and (gone_at is None or cancelled_at is None):
                now = time.monotonic()
                if gone_at is None and not find_processes(marker):
                    gone_at = now - started
                if cancelled_at is None and _state(run.pk) == "cancelled":
                    cancelled_at = now - started
                time.sleep(0.005)
            if gone_at is None or cancelled_at is None:
                raise RuntimeError(
                    f"cancel: not cancelled / child alive 15 s after cancel_run\n{pool.logs()}"
                )
            call = ToolCall.objects.filter(run_id=run.pk).values_list("state", "result").first()
            results.append({"cancelled": cancelled_at, "child_gone": gone_at, "call": call[0]})
    return results


def run(quick: bool) -> None:
    section("5. Cancellation latency (cancel_run -> cancelled)")
    n = 2 if quick else 5
    stream = stream_trials(n)
    tool = tool_trials(n)
    rows = []
    for i in range(n):
        rows.append(
            [
                i + 1,
                stream[i]["cancelled"],
                "yes" if stream[i]["disconnect"] else "NO",
                tool[i]["cancelled"],
                tool[i]["child_gone"],
                tool[i]["call"],
            ]
        )
    print(
        table(
            [
                "trial",
                "(a) stream: cancelled s",
                "server saw disconnect",
                "(b) tool: cancelled s",
                "sleep child gone s",
                "tool call state",
            ],
            rows,
        )
    )
    a = [r["cancelled"] for r in stream]
    b = [r["cancelled"] for r in tool]
    g = [r["child_gone"] for r in tool]
    disconnects = sum(r["disconnect"] for r in stream)
    print(
        f"  (a) median {median(a):.3f} s, worst {max(a):.3f} s; server saw {disconnects}/{n} disconnects\n"
        f"  (b) cancelled: median {median(b):.3f} s, worst {max(b):.3f} s; child gone: median "
        f"{median(g):.3f} s, worst {max(g):.3f} s"
    )
    check(
        NAME,
        "(a) cancel during a model stream within 2 s",
        max(a) <= TARGET_SECONDS,
        f"worst {max(a):.3f} s, median {median(a):.3f} s",
    )
    check(
        NAME,
        "(a) the stream is closed (server saw the disconnect)",
        disconnects == n,
        f"{disconnects}/{n}",
    )
    check(
        NAME,
        "(b) cancel during a subprocess tool within 2 s",
        max(b) <= TARGET_SECONDS,
        f"worst {max(b):.3f} s, median {median(b):.3f} s",
    )
    check(
        NAME,
        "(b) the subprocess is gone within 2 s",
        max(g) <= TARGET_SECONDS,
        f"worst {max(g):.3f} s, median {median(g):.3f} s",
    )
    figure(NAME, "(a) stream cancel (median / worst)", f"{median(a):.3f} / {max(a):.3f} s")
    figure(NAME, "(b) tool cancel (median / worst)", f"{median(b):.3f} / {max(b):.3f} s")
    figure(NAME, "(b) child gone (median / worst)", f"{median(g):.3f} / {max(g):.3f} s")
