"""Chaos: runs with slow tools proceed while workers, pool children, the reaper, database
backends and the broker are killed at random. Every run must complete, no message may be
delivered twice, and the Messages API stand-in must accept every history it is sent.

The broker is a Redis of the test's own (killed with SIGKILL, restarted empty, as a
broker without persistence comes back); everything else is the usual real thing. The
seed is printed; set AGENTRUN_CHAOS_SEED to replay a sequence of actions.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import current_app
from django.db import connection

from django_agentrun import start_run
from django_agentrun.models import Run
from django_agentrun.testing.messages_api import Reply, step_of, text, tool_use
from django_agentrun.testing.processes import Process
from tests.conftest import assert_projection_matches
from tests.processes import Workers, wait_for
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(240)

RUNS = int(os.environ.get("AGENTRUN_CHAOS_RUNS", "12"))
CHAOS_SECONDS = float(os.environ.get("AGENTRUN_CHAOS_SECONDS", "30"))
LEASE = "3"


class Broker:
    """A redis-server of this test's own, killed and restarted at will."""

    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, timeout=10, interval=0.05, message="redis to answer")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def broker(tmp_path) -> Iterator[Broker]:
    """The test process publishes to the chaos broker too (start_run's wake-ups)."""
    server = Broker(tmp_path)
    server.start()
    conf = current_app.conf
    saved = conf.broker_url
    conf.broker_url = server.url
    current_app._pool = None
    current_app.amqp._producer_pool = None
    try:
        yield server
    finally:
        conf.broker_url = saved
        current_app._pool = None
        current_app.amqp._producer_pool = None
        server.kill()


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _terminate_backends(rng: random.Random) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        pids = [row[0] for row in cursor.fetchall()]
        chosen = rng.sample(pids, k=min(len(pids), rng.randint(1, 3)))
        for pid in chosen:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    return len(chosen)


def _script(body: dict) -> Reply:
    step = step_of(body)
    if step == 0:
        first = body["messages"][0]["content"]
        return Reply(
            [
                text("Sending, and reading meanwhile."),
                tool_use("deliver", {"to": first, "body": "Hello", "seconds": 0.4}),
                tool_use("slow_read", {"seconds": 0.6, "label": "a"}),
            ]
        )
    if step == 1:
        return Reply([tool_use("slow_read", {"seconds": 0.8, "label": "b"})])
    return Reply([text("All done.")])


class Reaper:
    """`reaper_loop` (a reap every second) in a process of its own, killed and restarted."""

    def __init__(self, workers: Workers, **env: str) -> None:
        self.workers = workers
        self.extra = env
        self.proc: Process | None = None
        self.log = workers.tmp / "reaper.log"

    def start(self) -> None:
        self.proc = self.workers.group.start(
            [sys.executable, "-m", "tests.workers.reaper_loop", "1"],
            name=f"reaper{len(self.workers.procs) + 1}",
            env=self.workers.env(**self.extra),
        )
        self.log = self.proc.log_path

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None


def test_chaos__every_run_completes_each_message_delivered_once(
    workers, messages_api, broker, settings
):
    seed = int(os.environ.get("AGENTRUN_CHAOS_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    print(f"chaos seed {seed}")
    settings.AGENTRUN_LEASE_SECONDS = int(LEASE)
    settings.AGENTRUN_MAX_RECOVERY_ATTEMPTS = 100
    messages_api.script = _script
    env = {
        "AGENTRUN_LEASE_SECONDS": LEASE,
        "AGENTRUN_MAX_RECOVERY_ATTEMPTS": "100",
        "AGENTRUN_TEST_BROKER_URL": broker.url,
    }
    live = [workers.start(pool="prefork", concurrency=2, **env) for _ in range(2)]
    reaper = Reaper(workers, **env)
    reaper.start()
    runs = [start_run("hardening", f"customer-{i}@example.com") for i in range(RUNS)]

    actions: list[str] = []

    def supervise() -> None:
        """What a process manager does: a worker that ended (Celery ends a prefork worker
        whose pool child dies while the pool starts; a broker restart can end one too) is
        started again. The claim is about the runs, not about Celery's processes."""
        for i, worker in enumerate(live):
            if not worker.alive():
                live[i] = workers.start(pool="prefork", concurrency=2, **env)
                actions.append("restarted")
        if reaper.proc is not None and not reaper.proc.alive():
            reaper.start()
            actions.append("restarted")

    try:
        end = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.8, 2.0))
            action = rng.choice(
                ["worker", "child", "child", "backends", "backends", "broker", "reaper"]
            )
            if action == "worker":
                victim = live.pop(rng.randrange(len(live)))
                workers.kill(victim)
                live.append(workers.start(pool="prefork", concurrency=2, **env))
            elif action == "child":
                children = [c for w in live for c in _children(w.pid)]
                if children:
                    os.kill(rng.choice(children), signal.SIGKILL)
            elif action == "backends":
                action += f" x{_terminate_backends(rng)}"
            elif action == "broker":
                broker.kill()
                time.sleep(rng.uniform(0.2, 1.5))
                broker.start()
            elif action == "reaper":
                reaper.kill()
                reaper.start()
            actions.append(action)
            supervise()
        print("chaos actions:", Counter(a.split()[0] for a in actions))

        def all_done() -> bool:
            supervise()
            return (
                not Run.objects.filter(pk__in=[r.pk for r in runs])
                .exclude(state="completed")
                .exists()
            )

        wait_for(all_done, timeout=150, interval=0.5, message="every run to complete")
    except BaseException:
        print("seed", seed, "actions", actions)
        print(workers.logs())
        print("--- reaper ---\n", reaper.log.read_text(errors="replace")[-3000:])
        for run in Run.objects.filter(pk__in=[r.pk for r in runs]).exclude(state="completed"):
            print(run.pk, run.state, run.error_code, run.error_message, run.lease_owner)
        raise
    finally:
        reaper.kill()

    delivered = Counter(
        row["key"] for row in executions("deliver") if row.get("phase") == "delivered"
    )
    calls = {run.pk: run.tool_calls.get(name="deliver") for run in runs}
    for run in runs:
        key = calls[run.pk].idempotency_key
        assert delivered[key] == 1, (run.pk, delivered[key], seed, actions)
        assert calls[run.pk].state == "succeeded"
        assert_projection_matches(run)
    assert not messages_api.script_errors
    rejected = [r for r in messages_api.requests if (r["status"] or 200) >= 400]
    assert not rejected, rejected[:3]
