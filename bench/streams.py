"""Live streams under load: 200 concurrent SSE clients on one uvicorn process, watching runs
that a real worker advances while its model streams.

    python bench/streams.py [--clients 200] [--runs 4] [--turns 4] [--deltas 50]

Prints (figures, not a test):
- the delay of a delta from its arrival at the worker (the moment the model client hands
  it on) to a client (median, p99): each delta's text is the time it was handed on;
- the uvicorn process's memory per client (RSS with the clients connected, less before)
  and its threads (before, with the clients connected);
- the worker's turn time (Turn.started_at to finished_at) without clients and with them,
  and their ratio (the publisher must not slow a turn down: within noise).

Needs Postgres (DATABASE_URL, default the bench database) and Redis (BENCH_BROKER_URL,
default db 12; the streams use the same db under a key prefix of this invocation).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RUN_ID, pct, setup_django, wait_until  # noqa: E402
from bench.workers import LOG_DIR, Workers, cleanup  # noqa: E402
from django_agentrun.abort import AbortSignal  # noqa: E402
from django_agentrun.clients import ModelRequest, ModelResponse, StreamAborted, Usage  # noqa: E402

USER, PASSWORD = "bench-streams", "bench-pw"
SESSION: list[str] = []  # the session cookie of the bench's user (logged in once)


class TimestampClient:
    """A model that writes `BENCH_DELTAS` deltas `BENCH_DELTA_SECONDS` apart, each the time
    it was handed on (`time.time()`); a tool call per turn until the last."""

    def create(self, request: ModelRequest, *, abort: AbortSignal) -> ModelResponse:
        count = int(os.environ.get("BENCH_DELTAS", "50"))
        pause = float(os.environ.get("BENCH_DELTA_SECONDS", "0.02"))
        turns = int(os.environ.get("BENCH_TURNS", "4"))
        step = sum(1 for m in request.messages if m["role"] == "assistant")
        sink = request.on_event or (lambda delta: None)
        sink({"kind": "block_start", "index": 0, "block": "text"})
        pieces = []
        for _ in range(count):
            if abort.wait(pause):
                raise StreamAborted(abort.reason)
            piece = f"{time.time():.6f};"
            pieces.append(piece)
            sink({"kind": "text", "index": 0, "text": piece})
        sink({"kind": "block_stop", "index": 0})
        content: list[dict[str, Any]] = [{"type": "text", "text": "".join(pieces)}]
        if step < turns - 1:
            tool_id = f"toolu_bench_{request.messages[0]['content'][:8]}_{step}"
            content.append(
                {"type": "tool_use", "id": tool_id, "name": "lookup", "input": {"query": "q"}}
            )
        return ModelResponse(
            message_id=f"msg_bench_{step}",
            content=content,
            stop_reason="tool_use" if len(content) > 1 else "end_turn",
            usage=Usage(input_tokens=100, output_tokens=count),
            model=request.model,
        )


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def client(port: int, run_id: str, latencies: list[float]) -> int:
    """One SSE client (a browser's session): read the run's stream to its end; the deltas'
    delays."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /api/agentrun/runs/{run_id}/stream/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Cookie: sessionid={SESSION[0]}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    status = (await reader.readline()).split()[1]
    event = ""
    while True:
        line = await reader.readline()
        if not line:
            break
        text = line.decode().rstrip("\r\n")
        if text.startswith("event: "):
            event = text[7:]
        elif text.startswith("data: ") and event == "delta":
            arrived = time.time()
            delta = json.loads(text[6:])
            if delta.get("kind") == "text":
                latencies.extend(arrived - float(t) for t in delta["text"].split(";") if t)
        elif text.startswith("data: ") and event == "end":
            break
    writer.close()
    return int(status)


async def _warm_up(port: int, run_id: str) -> None:
    await asyncio.gather(*(client(port, run_id, []) for _ in range(10)))


def turn_times(run_ids: list[str]) -> list[float]:
    from django_agentrun.models import Turn

    return [
        (t.finished_at - t.started_at).total_seconds()
        for t in Turn.objects.filter(run_id__in=run_ids)
        if t.finished_at and t.started_at
    ]


def start_runs(count: int, pool: Workers) -> list[str]:
    from django.conf import settings
    from django.contrib.auth.models import User

    from django_agentrun import start_run

    owner = User.objects.get(username=USER)
    settings.AGENTRUN_QUEUE = pool.queue
    return [str(start_run("bench-engine", f"s{n:07d} go", owner=owner).pk) for n in range(count)]


def wait_done(run_ids: list[str], timeout: float = 300) -> None:
    from django_agentrun.models import Run

    done = wait_until(
        lambda: Run.objects.filter(pk__in=run_ids, state="completed").count() == len(run_ids),
        timeout,
        0.2,
    )
    if not done:
        raise SystemExit(f"runs did not complete in {timeout}s (logs in {LOG_DIR})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--deltas", type=int, default=50)
    args = parser.parse_args()

    setup_django()
    from django.contrib.auth.models import User
    from django.test import Client

    User.objects.filter(username=USER).delete()
    browser = Client()
    browser.force_login(User.objects.create_user(USER, password=PASSWORD))
    SESSION.append(browser.cookies["sessionid"].value)
    broker = os.environ["BENCH_BROKER_URL"]
    env = {
        "AGENTRUN_MODEL_CLIENT": "bench.streams.TimestampClient",
        "AGENTRUN_STREAM_URL": broker,
        "AGENTRUN_STREAM_PREFIX": f"agentrun-bench-{RUN_ID}:stream",
        "BENCH_DELTAS": str(args.deltas),
        "BENCH_TURNS": str(args.turns),
        "AGENTRUN_LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    pool = Workers("streams", **env)
    uvicorn = pool.group.uvicorn(
        "example_project.asgi:application",
        args=("--log-level", "warning", "--backlog", "1024"),
        ready_path="/admin/login/",
    )
    port = uvicorn.port
    try:
        # Without clients.
        worker = pool.start()
        quiet = start_runs(args.runs, pool)
        wait_done(quiet)
        pool.kill(worker)
        # With them: runs queued, clients connected, then the worker.
        loud = start_runs(args.runs, pool)
        latencies: list[float] = []
        # Warm up (imports, the thread pool, the Redis pool): a few clients of a finished run.
        asyncio.run(_warm_up(port, quiet[0]))
        before = rss_kib(uvicorn.pid)
        threads_before = threads(uvicorn.pid)

        async def watch() -> tuple[list[int], int]:
            tasks = [
                asyncio.create_task(client(port, loud[n % len(loud)], latencies))
                for n in range(args.clients)
            ]
            await asyncio.sleep(3)  # every client connected and waiting
            connected = rss_kib(uvicorn.pid)
            # While the views' first reads wait for the shared pool, each request still holds
            # the thread Django gave it; a stream lets it go once its body starts.
            threads_connected.append(threads(uvicorn.pid))
            for _ in range(20):
                await asyncio.sleep(0.5)
                threads_connected.append(threads(uvicorn.pid))
            await asyncio.to_thread(pool.start)
            statuses = await asyncio.gather(*tasks)
            return statuses, connected

        threads_connected: list[int] = []
        statuses, connected = asyncio.run(watch())
        wait_done(loud)
    finally:
        uvicorn.stop(grace=10)
        cleanup()
    ok = sum(1 for s in statuses if s == 200)
    quiet_t, loud_t = turn_times(quiet), turn_times(loud)
    ms = [x * 1000 for x in latencies]
    print(f"live streams: {args.clients} SSE clients ({ok} answered 200) on one uvicorn process,")
    print(f"  {args.runs} runs x {args.turns} turns x {args.deltas} deltas 20 ms apart")
    print(
        f"  delta delay worker -> client: median {statistics.median(ms):.1f} ms, "
        f"p99 {pct(ms, 99):.1f} ms ({len(ms)} deltas received)"
    )
    print(
        f"  memory per client: {(connected - before) / args.clients:.1f} KiB "
        f"(uvicorn RSS {before / 1024:.0f} -> {connected / 1024:.0f} MiB)"
    )
    print(
        f"  uvicorn threads: {threads_before} -> {threads_connected[0]} with the clients connected"
    )
    ratio = statistics.median(loud_t) / statistics.median(quiet_t)
    print(
        f"  worker turn time: {statistics.median(quiet_t) * 1000:.0f} ms without clients, "
        f"{statistics.median(loud_t) * 1000:.0f} ms with them (ratio {ratio:.3f})"
    )


if __name__ == "__main__":
    main()
