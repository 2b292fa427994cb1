"""Live streams as they are served: uvicorn (one process) and a real Celery worker on
Postgres and Redis, the real `anthropic` SDK streaming from the Messages API stand-in.

A client that drops its connection at random points and reconnects with `Last-Event-ID`
receives every durable event exactly once and in order, and the deltas of a turn it
watched to its answer add up to the committed text; the server holds no database
connection between reads; a worker whose Redis is gone completes its turns as fast."""

from __future__ import annotations

import os
import random
import time

from django.db import connection

from django_agentrun import start_run
from django_agentrun.models import RunEvent
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests import factories
from tests.processes import wait_resting
from tests.streams import LiveStream, read_with_drops
from tests.workers.conftest import APP_NAME

AUTH = ("alice", "pw")
LONG = "Otters hold hands while they sleep, so that they do not drift apart. " * 5


def slow(*blocks, **options) -> Reply:
    """A reply the stand-in streams slowly: 8 characters a delta, 15 ms apart."""
    return Reply(list(blocks), chunk_size=8, delay=0.015, **options)


def path(run) -> str:
    return f"/api/agentrun/runs/{run.pk}/stream/"


def test_streams__reconnects_at_random_miss_nothing_and_repeat_nothing(
    workers, messages_api, asgi_server, figures
):
    server = asgi_server
    alice = factories.user("alice")
    messages_api.script = by_step(
        [
            slow(text(LONG), tool_use("lookup", {"query": "otters"})),
            slow(text(LONG[::-1]), tool_use("lookup", {"query": "sea otters"})),
            slow(text("Otters: " + LONG)),
        ]
    )
    run = start_run("test-agent", "Tell me about otters.", owner=alice)
    connections = read_with_drops(server, path(run), random.Random(18))
    wait_resting(run)
    # Ten dropped connections cancelled nothing: a disconnect is not a stop.
    assert (run.state, run.cancel_requested_at) == ("completed", None)

    durable = [
        (int(f.id), f.json["type"]) for c in connections for f in c if f.event == "run_event"
    ]
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type"))
    assert durable == stored  # every event, once, in order

    # Deltas: a turn's text, from its attempt marker to its answer within one connection.
    committed = {
        t.index: "".join(b["text"] for b in t.content if b["type"] == "text")
        for t in run.turns.all()
    }
    watched, replays = {}, 0
    for frames in connections:
        texts: dict[int, str] = {}
        for position, frame in enumerate(frames):
            data = frame.json
            if frame.event == "delta" and data["kind"] == "attempt":
                texts[data["turn"]] = ""
                replays += position <= 1  # the current turn's deltas again, from the start
            elif frame.event == "delta" and data["kind"] == "text" and data["turn"] in texts:
                texts[data["turn"]] += data["text"]
            elif frame.event == "run_event" and data["type"] == "model_response":
                turn = data["payload"]["turn_index"]
                if turn in texts:
                    watched[turn] = texts.pop(turn)
    assert watched, "no turn was watched from its start to its answer"
    assert all(watched[turn] == committed[turn] for turn in watched), (watched, committed)
    assert replays >= 1, "no reconnect came mid-turn"
    figures(
        f"[streams] {len(connections)} connections with random drops: {len(durable)} events "
        f"once each; {len(watched)} of 3 turns watched whole, {replays} mid-turn replays"
    )


def _uvicorn_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [APP_NAME],
        )
        return cursor.fetchone()[0]


def test_streams__hold_no_database_connection_between_reads(workers, asgi_server, settings, queue):
    server = asgi_server
    alice = factories.user("alice")
    settings.AGENTRUN_QUEUE = f"{queue}-nobody"  # nobody works on it: it stays queued, active
    run = start_run("test-agent", "wait", owner=alice)
    streams = [LiveStream(server.url, path(run), auth=AUTH) for _ in range(10)]
    readers = [s.frames() for s in streams]
    for reader in readers:  # each stream sent its event and is now waiting
        assert next(reader).json["type"] == "run_created"
    samples = []
    for _ in range(20):
        samples.append(_uvicorn_connections())
        time.sleep(0.05)
    for reader in readers:  # still open: the keep-alives (0.5 s) come
        assert next(reader).event == "comment"
    for s in streams:
        s.close()
    # Ten streams open, and mostly no connection at all: only a read in progress holds one.
    assert min(samples) == 0 and max(samples) < 10, samples


def test_streams__a_worker_whose_redis_is_gone_is_as_fast(workers, messages_api, tmp_path):
    """The publisher drops what it cannot send: the run completes, the turns no slower."""
    alice = factories.user("alice")
    messages_api.script = by_step([[tool_use("lookup", {"query": "x"})], "Done."])
    timings = {}
    for label, url in (("no streams", ""), ("redis gone", "redis://127.0.0.1:1/0")):
        worker = workers.start(AGENTRUN_STREAM_URL=url)
        run = start_run("test-agent", "go", owner=alice)
        wait_resting(run)
        assert run.state == "completed", (label, run.error_code)
        workers.kill(worker)
        turns = list(run.turns.order_by("index"))
        timings[label] = (turns[-1].finished_at - run.started_at).total_seconds()
    assert timings["redis gone"] < max(3 * timings["no streams"], timings["no streams"] + 0.5), (
        timings
    )


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_streams__an_idle_stream_holds_no_thread(workers, asgi_server, settings, queue):
    """Under uvicorn, 30 open streams waiting for their runs hold no thread each: Django's
    thread for the request's synchronous parts is let go when the body starts; the reads
    share the loop's small pool (issue #25: 300 streams held 308 threads)."""
    server = asgi_server
    settings.AGENTRUN_QUEUE = f"{queue}-nobody"  # nobody works on it: it stays queued, active
    owners = [factories.user(name) for name in ("alice", "bob", "carol")]
    runs = [start_run("test-agent", "wait", owner=owner) for owner in owners]
    warm = LiveStream(server.url, path(runs[0]), auth=AUTH)
    next(warm.frames())
    warm.close()
    time.sleep(0.5)
    before = _threads(server.proc.pid)
    streams = [
        LiveStream(server.url, path(run), auth=(run.owner.username, "pw"))
        for run in runs
        for _ in range(10)
    ]
    readers = [s.frames() for s in streams]
    for reader in readers:
        assert next(reader).json["type"] == "run_created"
    time.sleep(1)
    for reader in readers:  # all still open: keep-alives come
        assert next(reader).event == "comment"
    during = _threads(server.proc.pid)
    for s in streams:
        s.close()
    # The loop's default pool (at most min(32, cores + 4)) may grow; nothing per stream.
    assert during - before <= min(32, (os.cpu_count() or 1) + 4), (before, during)
