"""Live streams under load: many SSE watchers on one uvicorn process, watching runs that a
real worker advances while its model streams (issue #40).

    python bench/streams.py [--clients 2000] [--runs 4] [--turns 4] [--deltas 50]
                            [--stream run|conversation|ai-sdk] [--idle 10000]

Prints (figures, not a test):
- deltas delivered out of those sent: every watcher of a run should receive each of the
  run's `turns x deltas` deltas (a watcher that was let go is counted as such);
- the delay of a delta from its arrival at the worker (the moment the model client hands
  it on) to a watcher (median, p99, over every delta received; and the p99 of the worst
  watcher's median): each delta's text is the time it was handed on;
- the uvicorn process's threads (before; the most seen while watchers connect and read)
  and memory per watcher (RSS with the watchers connected, less before);
- the worker's turn time (Turn.started_at to finished_at) without watchers and with them,
  and their ratio (the publisher must not slow a turn down: within noise);
- with `--idle N`, a second scenario: N watchers connected to runs nobody works on
  (nothing written), for memory per watcher and threads.

The watchers are one asyncio process (raw sockets, no thread per watcher; this process
raises its open-files limit for them, and uvicorn inherits it); a chunk's arrival time
is taken once per socket read, the deltas found in it by a regular expression.

Needs Postgres (DATABASE_URL, default the bench database) and Redis (BENCH_BROKER_URL,
default db 12; the streams use the same db under a key prefix of this invocation).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
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
CONNECTING = 200  # watchers connecting at once (uvicorn's backlog is 1024)

# A delta's frame, per format, and the timestamps in it ("1765000000.123456;").
DELTA_FRAMES = {
    "events": re.compile(rb"event: delta\ndata: ([^\n]*)"),
    "ai-sdk": re.compile(rb'data: (\{"type":"text-delta"[^\n]*)'),
}
STAMP = re.compile(rb"(\d{10}\.\d{6});")
# The committed answers (what supersedes the deltas a watcher had not been sent yet).
ANSWERS = re.compile(
    rb'(?:event: run_event\nid: [^\n]*\ndata: |data: \{"type":"text-start")([^\n]*)'
)
ENDS = {"events": b"event: end\n", "ai-sdk": b"data: [DONE]"}


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
            first = request.messages[0]["content"]
            key = first[:8] if isinstance(first, str) else "c"
            tool_id = f"toolu_bench_{key}_{step}"
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


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_open_files(wanted: int) -> int:
    """This process's open-files limit raised to `wanted` (at most the hard limit); the
    processes it starts inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


@dataclass
class Watcher:
    path: str
    fmt: str
    status: int = 0
    stamps: set[bytes] = field(default_factory=set)
    recorded: set[bytes] = field(default_factory=set)  # in the committed answers
    delays: list[float] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)  # each received delta's stamp
    ended: bool = False  # read to the stream's end
    connected: asyncio.Event = field(default_factory=asyncio.Event)


async def watch(port: int, watcher: Watcher, gate: asyncio.Semaphore, stop: asyncio.Event):
    """One SSE client (a browser's session): read the stream to its end (or until `stop`),
    noting each delta's delay."""
    async with gate:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
        writer.write(
            f"GET {watcher.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Cookie: sessionid={SESSION[0]}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    watcher.status = int(head.split(None, 2)[1])
    watcher.connected.set()
    frames, end = DELTA_FRAMES[watcher.fmt], ENDS[watcher.fmt]
    rest = b""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while watcher.status == 200:
            reading = asyncio.ensure_future(reader.read(65536))
            await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                reading.cancel()
                break
            chunk = reading.result()
            if not chunk:
                break
            arrived = time.time()
            data = rest + chunk
            cut = data.rfind(b"\n\n")  # whole frames only (chunked framing aside)
            cut = 0 if cut < 0 else cut + 2
            whole, rest = data[:cut], data[cut:]
            for found in frames.finditer(whole):
                for stamp in STAMP.findall(found.group(1)):
                    if stamp not in watcher.stamps:
                        watcher.stamps.add(stamp)
                        watcher.sent_at.append(float(stamp))
                        watcher.delays.append(arrived - watcher.sent_at[-1])
            for found in ANSWERS.finditer(whole):
                watcher.recorded.update(STAMP.findall(found.group(1)))
            if end in whole:
                watcher.ended = True
                break
    finally:
        stopping.cancel()
        writer.close()


def turn_times(run_ids: list[str]) -> list[float]:
    from django_agentrun.models import Turn

    return [
        (t.finished_at - t.started_at).total_seconds()
        for t in Turn.objects.filter(run_id__in=run_ids)
        if t.finished_at and t.started_at
    ]


def start_runs(count: int, pool: Workers | None, stream: str) -> tuple[list[str], list[str]]:
    """(run ids, the paths to watch): runs of their own, or each the first of a conversation."""
    from django.conf import settings
    from django.contrib.auth.models import User

    from django_agentrun import send_message, start_conversation, start_run

    owner = User.objects.get(username=USER)
    settings.AGENTRUN_QUEUE = pool.queue if pool is not None else f"bench-idle-{RUN_ID}"
    runs, paths = [], []
    fmt = "?format=ai-sdk" if stream == "ai-sdk" else ""
    for n in range(count):
        if stream == "conversation":
            conversation = start_conversation("bench-engine", owner=owner)
            run = send_message(conversation, f"s{n:07d} go")
            paths.append(f"/api/agentrun/conversations/{conversation.pk}/stream/")
        else:
            run = start_run("bench-engine", f"s{n:07d} go", owner=owner)
            paths.append(f"/api/agentrun/runs/{run.pk}/stream/{fmt}")
        runs.append(str(run.pk))
    return runs, paths


def wait_done(run_ids: list[str], timeout: float = 600) -> None:
    from django_agentrun.models import Run

    done = wait_until(
        lambda: Run.objects.filter(pk__in=run_ids, state="completed").count() == len(run_ids),
        timeout,
        0.2,
    )
    if not done:
        raise SystemExit(f"runs did not complete in {timeout}s (logs in {LOG_DIR})")


class Sampler:
    """The uvicorn process's threads, sampled every 0.2 s while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: list[int] = []

    async def run(self) -> None:
        while True:
            self.seen.append(threads(self.pid))
            await asyncio.sleep(0.2)


async def connect_all(port: int, paths: list[str], fmt: str, count: int, stop: asyncio.Event):
    gate = asyncio.Semaphore(CONNECTING)
    watchers = [Watcher(paths[n % len(paths)], fmt) for n in range(count)]
    tasks = [asyncio.create_task(watch(port, w, gate, stop)) for w in watchers]
    return watchers, tasks


async def _all_connected(watchers: list[Watcher], timeout: float) -> float:
    """Seconds until every watcher had its answer's head (or `timeout`: the bench goes on
    with those that had, and says how many)."""
    started = time.monotonic()
    waiting = [asyncio.ensure_future(w.connected.wait()) for w in watchers]
    _, late = await asyncio.wait(waiting, timeout=timeout)
    for task in late:
        task.cancel()
    return time.monotonic() - started


def live_scenario(args: Any, pool: Workers, port: int, pid: int, fmt: str) -> dict[str, Any]:
    worker = pool.start()
    quiet, _ = start_runs(args.runs, pool, args.stream)
    wait_done(quiet)
    pool.kill(worker)
    loud, paths = start_runs(args.runs, pool, args.stream)
    before, threads_before = rss_kib(pid), threads(pid)
    sampler = Sampler(pid)
    cpu: list[float] = []

    async def go() -> dict[str, Any]:
        sampling = asyncio.create_task(sampler.run())
        stop = asyncio.Event()
        watchers, tasks = await connect_all(port, paths, fmt, args.clients, stop)
        took = await _all_connected(watchers, 120)
        await asyncio.sleep(2)  # every stream past its first read, waiting
        connected = rss_kib(pid)
        cpu_before = cpu_seconds(pid)
        await asyncio.to_thread(pool.start)
        await asyncio.to_thread(wait_done, loud)
        await asyncio.wait(tasks, timeout=30)  # the streams' ends
        cpu.append(cpu_seconds(pid) - cpu_before)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        sampling.cancel()
        return {"watchers": watchers, "connected": connected, "connect_s": took}

    out = asyncio.run(go())
    watchers = out["watchers"]
    delays = [d * 1000 for w in watchers for d in w.delays]
    medians = [statistics.median(w.delays) * 1000 for w in watchers if w.delays]
    quiet_t, loud_t = turn_times(quiet), turn_times(loud)
    per_source = args.turns * args.deltas
    # The first deltas of a turn wait for the read of the commit before them (its events
    # go first): their delays apart from the others'.
    firsts, rest = [], []
    for w in watchers:
        previous = None
        index = 0
        for sent, delay in sorted(zip(w.sent_at, w.delays, strict=True)):
            index = 0 if previous is None or sent - previous > 0.1 else index + 1
            previous = sent
            (firsts if index < 3 else rest).append(delay * 1000)
    return {
        "ok": sum(1 for w in watchers if w.status == 200),
        "connected_n": sum(1 for w in watchers if w.connected.is_set()),
        "ended": sum(1 for w in watchers if w.ended),
        "sent": per_source * len(watchers),
        "delivered": sum(len(w.stamps) for w in watchers),
        "superseded": sum(len(w.recorded - w.stamps) for w in watchers),
        "per_watcher": sorted(len(w.stamps) for w in watchers),
        "median": statistics.median(delays) if delays else float("nan"),
        "p99": pct(delays, 99),
        "worst_median": max(medians) if medians else float("nan"),
        "firsts": (statistics.median(firsts) if firsts else float("nan"), pct(firsts, 99)),
        "rest": (statistics.median(rest) if rest else float("nan"), pct(rest, 99)),
        "threads": (threads_before, max(sampler.seen or [0])),
        "kib": (out["connected"] - before) / len(watchers),
        "rss": (before / 1024, out["connected"] / 1024),
        "connect_s": out["connect_s"],
        "turn": (statistics.median(quiet_t), statistics.median(loud_t)),
        "cpu": cpu[0],
    }


def idle_scenario(args: Any, pool: Workers, port: int, pid: int, fmt: str) -> dict[str, Any]:
    # Runs nobody works on (queued on a queue no worker reads): nothing is ever written.
    _, paths = start_runs(args.runs, None, args.stream)
    before, threads_before = rss_kib(pid), threads(pid)
    sampler = Sampler(pid)

    async def go() -> dict[str, Any]:
        sampling = asyncio.create_task(sampler.run())
        stop = asyncio.Event()
        watchers, tasks = await connect_all(port, paths, fmt, args.idle, stop)
        took = await _all_connected(watchers, 300)
        await asyncio.sleep(3)
        connected, steady = rss_kib(pid), threads(pid)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        sampling.cancel()
        return {"watchers": watchers, "connected": connected, "steady": steady, "took": took}

    out = asyncio.run(go())
    return {
        "ok": sum(1 for w in out["watchers"] if w.status == 200),
        "connected_n": sum(1 for w in out["watchers"] if w.connected.is_set()),
        "threads": (threads_before, max(sampler.seen or [0]), out["steady"]),
        "kib": (out["connected"] - before) / args.idle,
        "rss": (before / 1024, out["connected"] / 1024),
        "connect_s": out["took"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--deltas", type=int, default=50)
    parser.add_argument("--stream", choices=("run", "conversation", "ai-sdk"), default="run")
    parser.add_argument("--idle", type=int, default=0, help="watchers of the idle scenario")
    args = parser.parse_args()
    fmt = "ai-sdk" if args.stream == "ai-sdk" else "events"
    raise_open_files(max(args.clients, args.idle) * 2 + 1024)

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
    port, pid = uvicorn.port, uvicorn.pid
    live = idle = None
    try:
        # Warm up (imports, the thread pool, the Redis pool): a few watchers of a run that
        # ended.
        warm = pool.start()
        _, paths = start_runs(1, pool, args.stream)
        time.sleep(1)

        async def warm_up() -> None:
            stop = asyncio.Event()
            watchers, tasks = await connect_all(port, paths, fmt, 10, stop)
            await asyncio.wait(tasks, timeout=60)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(warm_up())
        pool.kill(warm)
        if args.clients:
            live = live_scenario(args, pool, port, pid, fmt)
        if args.idle:
            idle = idle_scenario(args, pool, port, pid, fmt)
    finally:
        uvicorn.stop(grace=10)
        cleanup()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2-core machine)")
    if live is not None:
        quiet_t, loud_t = live["turn"]
        print(
            f"live {args.stream} streams: {args.clients} watchers ({live['ok']} answered 200, "
            f"{live['ended']} read to the end; {live['connected_n']} connected within "
            f"{live['connect_s']:.1f} s) on one "
            f"uvicorn process, {args.runs} runs x {args.turns} turns x {args.deltas} deltas "
            "20 ms apart"
        )
        print(
            f"  deltas delivered: {live['delivered']:,} of {live['sent']:,} "
            f"({100 * live['delivered'] / max(1, live['sent']):.2f} %); "
            f"{live['superseded']:,} more only in the committed answers (a watcher behind by "
            "more than a turn gets the answer, not its deltas); per watcher min "
            f"{live['per_watcher'][0]}, median {live['per_watcher'][len(live['per_watcher']) // 2]}"
            f" of {args.turns * args.deltas}"
        )
        print(
            f"  delay worker -> watcher: median {live['median']:.1f} ms, p99 {live['p99']:.1f} ms"
            f" (worst watcher's median {live['worst_median']:.1f} ms); a turn's first three "
            f"deltas {live['firsts'][0]:.1f} / {live['firsts'][1]:.1f} ms, the others "
            f"{live['rest'][0]:.1f} / {live['rest'][1]:.1f} ms"
        )
        print(
            f"  uvicorn threads: {live['threads'][0]} before, at most {live['threads'][1]} "
            "while the watchers connected and read"
        )
        received = live["delivered"] + live["superseded"]
        print(
            f"  uvicorn CPU while the runs streamed: {live['cpu']:.1f} s "
            f"({live['cpu'] * 1e6 / max(1, received):.1f} us per delta received)"
        )
        print(
            f"  memory per watcher: {live['kib']:.1f} KiB (uvicorn RSS "
            f"{live['rss'][0]:.0f} -> {live['rss'][1]:.0f} MiB)"
        )
        print(
            f"  worker turn time: {quiet_t * 1000:.0f} ms without watchers, "
            f"{loud_t * 1000:.0f} ms with them (ratio {loud_t / quiet_t:.3f})"
        )
    if idle is not None:
        print(
            f"idle {args.stream} streams: {args.idle} watchers ({idle['ok']} answered 200, "
            f"{idle['connected_n']} connected within {idle['connect_s']:.1f} s), nothing written"
        )
        print(
            f"  uvicorn threads: {idle['threads'][0]} before, at most {idle['threads'][1]} "
            f"while connecting, {idle['threads'][2]} once connected"
        )
        print(
            f"  memory per watcher: {idle['kib']:.1f} KiB (uvicorn RSS "
            f"{idle['rss'][0]:.0f} -> {idle['rss'][1]:.0f} MiB)"
        )


if __name__ == "__main__":
    main()
