"""The scheduler: actors are threads running the real code, each stopped at every
scheduling point until the controller lets it go; one proceeds at a time.

A scheduling point is every failpoint of the engine (`failpoints.set_scheduler`), every
call of the store (the explorer's `ScheduledStore`) and the points the explorer's own
tools and model client name. An actor that waits for a row lock another actor holds is
noticed (Postgres's `pg_stat_activity`) and the schedule moves on; it goes on by itself
once the lock is released, and the controller waits for it to reach its next point
before it chooses again. A crash stops an actor for good at its point: its backend is
terminated (its transaction rolls back, its locks go), and nothing it would have done
next happens.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, connections

from django_agentrun.abort import AbortSignal


class Crashed(BaseException):
    """Raised at its point in an actor that was stopped for good, once the schedule is
    over (a BaseException: no `except Exception` of the code under test catches it)."""


class Hang(AssertionError):
    """An actor neither reached a point nor finished nor waited for a lock in time."""


NEW, PARKED, RUNNING, BLOCKED, DONE, CRASHED = (
    "new",
    "parked",
    "running",
    "blocked",
    "done",
    "crashed",
)


@dataclass(eq=False)
class Actor:
    """One thread of the schedule: a worker's task, a reaper pass, a person's command, a
    heartbeat's renewal."""

    name: str
    kind: str
    fn: Callable[[Actor], Any]
    status: str = NEW
    point: str = "start"
    points: int = 0  # points passed
    pid: int | None = None  # its Postgres backend
    result: Any = None
    error: BaseException | None = None
    trace: str = ""
    # A worker's task or the reaper's recovery step: what its heartbeat renews and aborts.
    lease: Any = None
    abort: AbortSignal | None = None
    slot: Any = None  # what the world keeps about it (a worker slot, a message)
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    crash_pending: bool = False
    ended: bool = False  # its thread has left it (status is final)
    thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.status not in (DONE, CRASHED)

    def __repr__(self) -> str:
        return f"<{self.name} {self.status} at {self.point}>"


def backend_pid() -> int | None:
    """This thread's Postgres backend, if it has a connection (psycopg 3 or psycopg2)."""
    raw = connection.connection
    if raw is None:
        return None
    info = getattr(raw, "info", None)
    if info is not None:
        return info.backend_pid
    return raw.get_backend_pid()


class Threads:
    """The actors' threads, kept from one schedule to the next with their database
    connections (a new connection for each actor costs more than the actor's work)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[tuple[threading.Thread, Any]] = []

    def run(self, job: Callable[[], None]) -> threading.Thread:
        import queue

        with self.lock:
            if self.idle:
                thread, jobs = self.idle.pop()
                jobs.put(job)
                return thread
        jobs: Any = queue.SimpleQueue()
        thread = threading.Thread(target=self._loop, args=(jobs,), daemon=True)
        jobs.put(job)
        thread.start()
        return thread

    def close_connections(self) -> None:
        """Each idle thread closes its database connections (before the test database is
        dropped)."""
        with self.lock:
            idle, self.idle = self.idle, []
        done = threading.Barrier(len(idle) + 1, timeout=10)

        def close() -> None:
            connections.close_all()
            done.wait()

        for _, jobs in idle:
            jobs.put(close)
        done.wait()

    def _loop(self, jobs: Any) -> None:
        me = threading.current_thread()
        while True:
            job = jobs.get()
            job()
            with self.lock:
                self.idle.append((me, jobs))


THREADS = Threads()


class Controller:
    """Runs actors one at a time (see the module's docstring)."""

    def __init__(
        self, *, step_timeout: float = 20.0, ignored: frozenset[str] = frozenset()
    ) -> None:
        self.ignored = ignored  # points that add nothing (another follows with no I/O between)
        self.actors: list[Actor] = []
        self.cv = threading.Condition()
        self.local = threading.local()
        self.step_timeout = step_timeout
        self.counter = 0

    # -- in the actors' threads -----------------------------------------------------------

    def current(self) -> Actor | None:
        return getattr(self.local, "actor", None)

    def point(self, name: str, qualifier: str | None = None) -> None:
        """A scheduling point: the calling actor stops here until it is let go (threads
        that are not actors, such as a batch's pool threads, pass)."""
        actor = self.current()
        if actor is None or name in self.ignored:
            return
        pid = backend_pid()
        with self.cv:
            if pid is not None:
                actor.pid = pid
            actor.point = f"{name}@{qualifier}" if qualifier else name
            actor.points += 1
            if actor.status != CRASHED:  # crashed while it waited for a lock: stays so
                actor.status = PARKED
            self.cv.notify_all()
        actor.go.acquire()
        if actor.crash_pending:
            raise Crashed(actor.name)

    def _run(self, actor: Actor) -> None:
        self.local.actor = actor
        try:
            connection.ensure_connection()
            self.point("start")
            actor.result = actor.fn(actor)
            final = DONE
        except Crashed:
            final = CRASHED
        except BaseException as exc:  # noqa: BLE001 - reported as the actor's error
            actor.error = exc
            actor.trace = traceback.format_exc()
            final = DONE
        finally:
            self.local.actor = None
            if final is not DONE or actor.error is not None or actor.status == CRASHED:
                try:
                    connections.close_all()  # its backend was terminated, or may be broken
                except Exception:  # noqa: BLE001 - a terminated backend
                    pass
        with self.cv:
            if actor.status != CRASHED:
                actor.status = final
            actor.ended = True
            self.cv.notify_all()

    # -- in the controller's thread -------------------------------------------------------

    def spawn(self, name: str, kind: str, fn: Callable[[Actor], Any], **extra: Any) -> Actor:
        """A new actor, stopped at its first point ("start") until it is let go."""
        self.counter += 1
        actor = Actor(f"{name}#{self.counter}", kind, fn, **extra)
        self.actors.append(actor)
        actor.thread = THREADS.run(lambda: self._run(actor))
        self._wait(lambda: actor.status != NEW)
        return actor

    def parked(self) -> list[Actor]:
        return [a for a in self.actors if a.status == PARKED]

    def busy(self) -> list[Actor]:
        """Actors that have not finished (parked, or blocked on a lock)."""
        return [a for a in self.actors if a.alive]

    def grant(self, actor: Actor) -> None:
        """Let a parked actor go until it reaches its next point, finishes, or waits for a
        lock; then wait for any actor that lock waits let go meanwhile."""
        assert actor.status == PARKED, actor
        with self.cv:
            actor.status = RUNNING
        actor.go.release()
        self.settle()

    def crash(self, actor: Actor) -> None:
        """Stop a parked actor (or one waiting for a lock) for good: its backend is
        terminated now (its transaction rolls back, its locks are released); its thread
        stops at its next point until `release_crashed`."""
        assert actor.status in (PARKED, BLOCKED), actor
        with self.cv:
            actor.status = CRASHED
        if actor.pid is not None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [actor.pid])
            self._wait_gone(actor.pid)

    def _wait_gone(self, pid: int) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
                if cursor.fetchone() is None:
                    return
            time.sleep(0.002)

    def settle(self) -> None:
        """Wait until no actor runs: each has reached a point, finished, or waits for a lock
        another holds (a lock wait that ends lets its actor run again)."""
        deadline = time.monotonic() + self.step_timeout
        while True:
            with self.cv:
                if not self._running():
                    if not self._blocked():
                        return
                else:
                    self.cv.wait(0.005)  # most segments end at their next point by then
                running, blocked = self._running(), self._blocked()
            if not running and not blocked:
                return
            waiting = self._lock_waits([a.pid for a in running + blocked if a.pid])
            with self.cv:
                for actor in blocked:
                    if actor.pid not in waiting and actor.status == BLOCKED:
                        actor.status = RUNNING
                for actor in running:
                    if actor.pid in waiting and actor.status == RUNNING:
                        actor.status = BLOCKED
                if not self._running():
                    return  # every other actor is parked, finished or waits for a lock
            if time.monotonic() > deadline:
                raise Hang(f"actors still running after {self.step_timeout}s: {self._running()}")

    def _running(self) -> list[Actor]:
        return [a for a in self.actors if a.status == RUNNING]

    def _blocked(self) -> list[Actor]:
        return [a for a in self.actors if a.status == BLOCKED]

    def _lock_waits(self, pids: list[int]) -> set[int]:
        if not pids:
            return set()
        # Waiting for a lock that somebody still holds (pg_blocking_pids): a backend whose
        # lock was just released shows the wait for a moment longer, with nobody blocking it.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND pid = ANY(%s) AND cardinality(pg_blocking_pids(pid)) > 0",
                [pids],
            )
            return {row[0] for row in cursor.fetchall()}

    def _wait(self, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.step_timeout
        with self.cv:
            while not condition():
                if time.monotonic() > deadline:
                    raise Hang("an actor did not start")
                self.cv.wait(0.05)

    def release_crashed(self) -> None:
        """End the threads of crashed actors (each raises Crashed at its point); actors left
        parked (a schedule stopped at a violation) are crashed first."""
        for actor in self.actors:
            if actor.status in (PARKED, BLOCKED):
                self.crash(actor)
        for actor in self.actors:
            if actor.status == CRASHED and not actor.crash_pending:
                actor.crash_pending = True
                actor.go.release()
        self._wait(lambda: all(a.ended for a in self.actors))
