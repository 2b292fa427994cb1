"""Chaos: runs with slow tools proceed while workers, pool children, the reaper, database
backends and the broker are killed at random, the network between the workers and
Postgres or Redis is slowed, reset and partitioned, and a worker's wall clock (and the
reaper's) jumps forward and back. Every run must complete, no message may be delivered
twice, and the Messages API stand-in must accept every history it is sent.

The broker is a Redis of the test's own (killed with SIGKILL, restarted empty, as a
broker without persistence comes back); the workers and the reaper reach it and Postgres
through TCP proxies of the test's own (tests/netproxy.py); the first worker slot and the
reaper run with tests/wallclock.c preloaded, whose offset the test rewrites (the wall
clock only: a jump leaves the monotonic clock alone, as a real one does; why not
libfaketime is said there). Everything else is the usual real thing. The seed is printed;
set AGENTRUN_CHAOS_SEED to replay a sequence of actions. AGENTRUN_CHAOS_SECONDS and
AGENTRUN_CHAOS_RUNS make a soak longer (`make soak`, docs/how-to/development.md).
"""

from __future__ import annotations

import os
import random
import shutil
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
from tests.netproxy import Proxy
from tests.processes import Workers, wait_for
from tests.testapp.agents import executions

RUNS = int(os.environ.get("AGENTRUN_CHAOS_RUNS", "12"))
CHAOS_SECONDS = float(os.environ.get("AGENTRUN_CHAOS_SECONDS", "30"))
# 240 s for the default soak; a longer one (make soak) gets its faults' time more.
pytestmark = pytest.mark.timeout(240 + max(0, CHAOS_SECONDS - 30) + max(0, RUNS - 12) * 5)
LEASE = "3"
# Wall-clock offsets a jump sets (seconds): a little, past a lease, past kombu's visibility
# timeout (an hour: a worker that far ahead restores every unacknowledged message).
CLOCK_OFFSETS = (-7200, -600, -90, -5, 0, 5, 90, 600, 7200)


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


@pytest.fixture
def network(broker) -> Iterator[dict[str, Proxy]]:
    """TCP proxies in front of Postgres and the chaos broker, for the workers and the
    reaper (the test process itself connects directly)."""
    settings_dict = connection.settings_dict
    proxies = {
        "db": Proxy(settings_dict["HOST"] or "127.0.0.1", int(settings_dict["PORT"] or 5432)),
        "redis": Proxy("127.0.0.1", broker.port),
    }
    for proxy in proxies.values():
        proxy.start()
    yield proxies
    for proxy in proxies.values():
        proxy.stop()


class Clock:
    """The wall clock of every process started with `env()`: tests/wallclock.c, built here
    with the system's C compiler, preloaded; its offset (seconds) in a file the processes
    read again at most every 0.2 s. None of it without a compiler (the test says so)."""

    def __init__(self, tmp: Path) -> None:
        self.file = tmp / "wallclock-offset"
        self.file.write_text("0\n")
        self.offset = 0
        self.library: Path | None = tmp / "libwallclock.so"
        source = Path(__file__).resolve().parents[1] / "wallclock.c"
        built = (
            subprocess.run(
                ["cc", "-shared", "-fPIC", "-O2", "-o", str(self.library), str(source), "-ldl"],
                capture_output=True,
                text=True,
            )
            if shutil.which("cc")
            else None
        )
        if built is None or built.returncode != 0:
            print(
                "no C compiler could build tests/wallclock.c: no clock jumps",
                built and built.stderr,
            )
            self.library = None

    def env(self) -> dict[str, str]:
        if self.library is None:
            return {}
        return {"LD_PRELOAD": str(self.library), "AGENTRUN_WALLCLOCK_FILE": str(self.file)}

    def jump(self, offset: int) -> None:
        self.offset = offset
        self.file.write_text(f"{offset}\n")


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

    def __init__(self, workers: Workers, clock: dict[str, str], **env: str) -> None:
        self.workers = workers
        self.extra = {**env, **clock}
        self.prefix = ["env"] if clock else []  # a cold start: LD_PRELOAD at exec
        self.proc: Process | None = None
        self.log = workers.tmp / "reaper.log"

    def start(self) -> None:
        self.proc = self.workers.group.start(
            [*self.prefix, sys.executable, "-m", "tests.workers.reaper_loop", "1"],
            name=f"reaper{len(self.workers.procs) + 1}",
            env=self.workers.env(**self.extra),
        )
        self.log = self.proc.log_path

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None


def _database_url(port: int) -> str:
    settings_dict = connection.settings_dict
    user = settings_dict["USER"] or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict["PASSWORD"] else ""
    return f"postgres://{user}{password}@127.0.0.1:{port}/{settings_dict['NAME']}"


def test_chaos__every_run_completes_each_message_delivered_once(
    workers, messages_api, broker, network, settings, tmp_path
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
        # Through the proxies: the network between them and Postgres, Redis is the test's.
        "DATABASE_URL": _database_url(network["db"].port),
        "AGENTRUN_TEST_BROKER_URL": f"redis://127.0.0.1:{network['redis'].port}/0",
    }
    clock = Clock(tmp_path)

    def start_worker(slot: int) -> Process:
        """Slot 0's worker lives by the jumping clock (a cold start: LD_PRELOAD at exec)."""
        faked = clock.env() if slot == 0 else {}
        prefix = ("env",) if faked else ()
        return workers.start(pool="prefork", concurrency=2, prefix=prefix, **env, **faked)

    live = [start_worker(slot) for slot in range(2)]
    reaper = Reaper(workers, clock.env(), **env)
    reaper.start()
    # Half at once, the rest one after each action: runs are in flight all through the chaos.
    runs = [start_run("hardening", f"customer-{i}@example.com") for i in range(RUNS // 2)]

    actions: list[str] = []

    def supervise() -> None:
        """What a process manager does: a worker that ended (Celery ends a prefork worker
        whose pool child dies while the pool starts; a broker restart can end one too) is
        started again. The claim is about the runs, not about Celery's processes."""
        for i, worker in enumerate(live):
            if not worker.alive():
                live[i] = start_worker(i)
                actions.append("restarted")
        if reaper.proc is not None and not reaper.proc.alive():
            reaper.start()
            actions.append("restarted")

    def net(proxy: Proxy, name: str) -> str:
        fault = rng.choice(["delay", "reset", "partition"])
        if fault == "delay":  # until the next action
            proxy.delay = rng.uniform(0.02, 0.3)
            return f"net {name} delay {proxy.delay:.2f}s"
        if fault == "reset":
            return f"net {name} reset x{proxy.reset()}"
        seconds = rng.uniform(0.3, 4.0)
        proxy.partition()
        time.sleep(seconds)
        proxy.heal()
        return f"net {name} partition {seconds:.1f}s"

    try:
        end = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.8, 2.0))
            for proxy in network.values():
                proxy.delay = 0.0
            action = rng.choice(
                ["worker", "child", "child", "backends", "backends", "broker", "reaper"]
                + ["net", "net", "net", "clock"]
            )
            if action == "worker":
                i = rng.randrange(len(live))
                workers.kill(live[i])
                live[i] = start_worker(i)
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
            elif action == "net":
                name = rng.choice(sorted(network))
                action = net(network[name], name)
            elif action == "clock":
                clock.jump(rng.choice(CLOCK_OFFSETS))
                action = f"clock {clock.offset:+d}s" + ("" if clock.library else " (not built)")
            actions.append(action)
            supervise()
            if len(runs) < RUNS:
                runs.append(start_run("hardening", f"customer-{len(runs)}@example.com"))
        while len(runs) < RUNS:  # a short soak with a long action or two
            runs.append(start_run("hardening", f"customer-{len(runs)}@example.com"))
        for proxy in network.values():
            proxy.delay = 0.0
            proxy.heal()
        kinds = {"net": 3, "clock": 2}  # the words of an action's label that name its kind
        print(
            "chaos actions:",
            Counter(" ".join(a.split()[: kinds.get(a.split()[0], 1)]) for a in actions),
        )
        print("clock offset at the end:", clock.offset)

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
