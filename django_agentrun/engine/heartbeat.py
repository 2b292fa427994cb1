"""The lease heartbeat: renews the lease, notices cancel requests within a second, takes
back a lease that lapsed while nobody else took the run, and makes sure a lease another
worker took means its former executor is gone.

Fencing stops a zombie's writes, not its side effects: a worker that cannot renew its
lease (a broken database connection, a network partition) must stop executing before
the lease can expire, or the reaper recovers a call that is still running and its
reconcile check may run before the first attempt has had its effect. A worker that was
merely late (its process stopped or starved of CPU: it ran nothing meanwhile) is another
matter: its writes are fenced by the epoch, not by the clock, so if nobody took the run
while it was away it simply takes the lease back. So, counting from the last renewal the
database confirmed (the time taken *before* it was sent):

- every poll: a cheap read for cancel requests; every third of the lease: a renewal (a
  compare-and-set on the epoch: it also takes back a lease that lapsed, if still ours);
- after an error: the connection is dropped and the attempt made again at once, on a
  new connection (then, if that fails too, at the next poll);
- the watchdog, at each deadline below, first looks at how late it (or the beat) woke:
  later than `lateness_tolerance`, the process was stopped or starved, and it asks the
  beat to take the lease back at once (waiting at most `take_back_seconds`). Taken back:
  the step goes on as if nothing happened (an answer that arrived is kept). Another
  holder has it: the process ends itself at once (below). No answer: as if on time:
- at `lease - min(grace + margin, lease / 2)` without a renewal: abort (handlers see
  `ctx.cancelled`, the model stream is cut), and nothing more is recorded as done;
- at `lease - margin` the step is still running: the process ends itself (`os._exit`),
  as a crash would; the message is redelivered or the reaper recovers the run.

Each wake-up's lateness is measured; the largest of the task is logged when it passed the
tolerance (`Heartbeat late`), so a starved machine shows in the logs before it costs.

The beat's connection is its own (`own_connection`): made from the database's settings with
Django's pool option left out, never taken from that pool, where a batch of tool handlers
touching the ORM could hold every connection while the lease runs out.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

from .. import children, store
from ..abort import CANCEL_REQUESTED, LEASE_LOST, LEASE_UNRENEWED, AbortSignal
from ..conf import agentrun_settings

logger = logging.getLogger(__name__)

EXIT_CODE = 75  # EX_TEMPFAIL


def margin_seconds(lease_seconds: float) -> float:
    """How long before the lease runs out the process must be gone."""
    return min(1.0, lease_seconds / 10)


def stop_before_seconds(lease_seconds: float) -> float:
    """How long before the lease runs out a step without a renewal is aborted."""
    return min(
        agentrun_settings.CANCEL_GRACE_SECONDS + margin_seconds(lease_seconds), lease_seconds / 2
    )


def lateness_tolerance(lease_seconds: float, poll_seconds: float) -> float:
    """How late a heartbeat thread may wake before its process counts as stopped or starved
    (rather than merely busy): a poll, at least a tenth of the lease."""
    return max(poll_seconds, lease_seconds / 10)


def take_back_seconds(lease_seconds: float) -> float:
    """How long a watchdog that woke late waits for the beat to take the lease back: a
    renewal's round trip on a starved machine, at most a sixth of the lease."""
    return max(margin_seconds(lease_seconds), lease_seconds / 6)


def renewal_timing(
    lease_seconds: float, poll_seconds: float, grace_seconds: float
) -> tuple[float, float]:
    """When, after a claim, the beat sends its first renewal and the watchdog stops a step
    not yet renewed (as `_beat_loop` and `_watch` time them): a lease whose renewal does not
    come well before the stop is never renewed in time."""
    # The beat renews at the last poll at or before a third of the lease (at the first
    # poll at the least): rounded up instead, a 2 s lease polled every 0.5 s was renewed at
    # 1 s, when the watchdog stops a step not renewed, and a busy machine stopped it.
    renew_every = max(lease_seconds / 3, poll_seconds)
    if poll_seconds > 0:
        renew_every = max(1, math.floor(renew_every / poll_seconds + 1e-9)) * poll_seconds
    stop_before = min(grace_seconds + margin_seconds(lease_seconds), lease_seconds / 2)
    return renew_every, lease_seconds - stop_before


def own_connection(alias: str = DEFAULT_DB_ALIAS) -> BaseDatabaseWrapper:
    """A connection to `alias`'s database that no pool hands out, for the calling thread:
    the alias's settings (a test database's name included) less Django's `pool` option
    (Django 5.1+, psycopg 3). Opened on first use, closed by its user. Through a
    server-side pooler (PgBouncer) it goes where every connection of the alias goes."""
    settings_dict = connections.settings[alias]
    options = {k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if k != "pool"}
    return load_backend(settings_dict["ENGINE"]).DatabaseWrapper(
        {**settings_dict, "OPTIONS": options}, alias
    )


class Heartbeat:
    """Two daemon threads beside the engine while it holds a lease: the beat (a database
    connection of its own, outside any pool: `own_connection`) renews the lease, takes it
    back after a lapse, and polls for cancel requests; the watchdog (no I/O) enforces the
    deadlines above even while a renewal hangs on a dead connection."""

    def __init__(self, lease: store.Lease, abort: AbortSignal) -> None:
        self.lease = lease
        self.abort = abort
        self.valid_until = lease.valid_until
        self.taken_back = 0  # leases taken back after the process was late
        self.lateness = 0.0  # the largest lateness measured (seconds), either thread
        self._stop = threading.Event()
        self._renewed = threading.Event()  # wakes the watchdog to recompute its deadlines
        self._poke = threading.Event()  # wakes the beat: stop, or renew at once
        self._answered = threading.Event()  # the beat's renewal got an answer
        self._sending_since: float | None = None  # a renewal sent, not yet answered
        self._beat_due = time.monotonic() + agentrun_settings.HEARTBEAT_SECONDS
        self._lost = False
        self._beat = threading.Thread(
            target=self._beat_loop, name=f"agentrun-heartbeat-{lease.run_id}", daemon=True
        )
        self._watchdog = threading.Thread(
            target=self._watch, name=f"agentrun-watchdog-{lease.run_id}", daemon=True
        )

    def start(self) -> None:
        self._beat.start()
        self._watchdog.start()
        self.abort.gate = self.gate

    def stop(self) -> None:
        if self._stop.is_set():
            return  # stopped already (give_up)
        self.abort.gate = None
        self._stop.set()
        self._renewed.set()
        self._poke.set()
        self._watchdog.join(timeout=5)
        self._beat.join(timeout=5)
        lease_seconds = agentrun_settings.LEASE_SECONDS
        tolerance = lateness_tolerance(lease_seconds, agentrun_settings.HEARTBEAT_SECONDS)
        if self.lateness > tolerance:
            logger.warning(
                "Heartbeat late by up to %.2fs (tolerance %.2fs, lease %gs); lease taken "
                "back %s times run_id=%s",
                self.lateness,
                tolerance,
                lease_seconds,
                self.taken_back,
                self.lease.run_id,
            )

    def give_up(self) -> bool:
        """Let the lease run out now (a step stopped because its lease could not be renewed:
        the next claim takes it over and counts a recovery); False if it was not ours any
        more. The beat stops first, and a renewal it was sending is answered before the
        expiry is sent: a renewal after it would make the lease live again for a whole
        lease, and the wake-up sent for the take-over would find it held (the run then
        waits for the reaper; the test suite's load found it: a renewal held up by a row
        lock, answered once the lock was let go, and followed at once by another). One
        still on its way after the stop's wait finds the epoch moved on
        (store.expire_lease), and, the beat stopped, ends nothing."""
        self.stop()
        return store.expire_lease(self.lease)

    def gate(self) -> None:
        """The step's own look at its lease before an effect (AbortSignal.before_effect): on
        time (the usual case), nothing, not even a query. Past the point where the watchdog
        aborts a step without a renewal (the process was stopped or starved, and the
        watchdog, late too, may not have woken before this thread), the lease is taken back
        first: if nobody took the run the step goes on; if somebody did, the beat ends the
        process (it lapsed) before the effect starts; with no answer, the step is aborted.
        Without it, a late worker resumed after the reaper had recovered its run could ask
        the model again for the turn its successor had answered, or start a tool's handler
        under the new holder's recovery (the schedule explorer's long run found the
        first)."""
        lease_seconds = agentrun_settings.LEASE_SECONDS
        abort_at = self.valid_until - stop_before_seconds(lease_seconds)
        now = time.monotonic()
        if now < abort_at or self._stop.is_set():
            return
        if not self._lost and self._take_back(now - abort_at, lease_seconds):
            return
        self.abort.abort(LEASE_LOST if self._lost else LEASE_UNRENEWED)

    def _late(self, late: float) -> None:
        if late > self.lateness:
            self.lateness = late

    def _beat_loop(self) -> None:
        # The store sends through the default alias's connection of the calling thread:
        # in this thread, the beat's own.
        own = connections[DEFAULT_DB_ALIAS] = own_connection()
        lease_seconds = agentrun_settings.LEASE_SECONDS
        poll = agentrun_settings.HEARTBEAT_SECONDS
        renew_every, _ = renewal_timing(lease_seconds, poll, agentrun_settings.CANCEL_GRACE_SECONDS)
        renew_every -= poll / 10  # a poll's wait ends a little late or early, never a poll's worth
        last_renew = time.monotonic()
        retry_now = False
        try:
            # After an error, one attempt at once on a new connection (a terminated backend
            # or a failover costs a reconnect, not a poll period); then the usual period.
            while True:
                if not retry_now:
                    self._poke.wait(max(0.0, self._beat_due - time.monotonic()))
                if self._stop.is_set():
                    return
                now = time.monotonic()
                urgent = self._poke.is_set()  # the watchdog asks for a take-back
                self._poke.clear()
                if not urgent and not retry_now:
                    self._late(now - self._beat_due)
                self._beat_due = now + poll
                try:
                    if urgent or now - last_renew >= renew_every:
                        self._sending_since = sent = time.monotonic()
                        held, cancel = store.renew_lease(self.lease)
                        last_renew = sent
                        if held:
                            self.valid_until = sent + lease_seconds
                            self._renewed.set()
                    else:
                        held, cancel = store.poll_cancel(self.lease)
                except Exception:  # noqa: BLE001 - a DB hiccup must not kill the heartbeat
                    logger.warning("Heartbeat failed run_id=%s", self.lease.run_id, exc_info=True)
                    own.close()  # a broken connection stays broken: reconnect next time
                    retry_now = not retry_now
                    continue
                finally:
                    self._sending_since = None
                    self._answered.set()
                retry_now = False
                if not held:
                    self._lease_lost()
                    return
                if cancel and not self.abort.cancel_requested:
                    logger.info("Cancel request seen run_id=%s", self.lease.run_id)
                    self.abort.abort(CANCEL_REQUESTED)
        finally:
            own.close()

    def _lease_lost(self) -> None:
        """Another worker holds the run now. Had this lease run out meanwhile (the process
        was late), the new holder may already be recovering the call this step runs: end
        the process at once, as the watchdog would have before the lease ran out."""
        self._lost = True
        self.abort.abort(LEASE_LOST)
        lapsed = time.monotonic() >= self.valid_until - margin_seconds(
            agentrun_settings.LEASE_SECONDS
        )
        if lapsed:
            self._exit()

    def _watch(self) -> None:
        lease_seconds = agentrun_settings.LEASE_SECONDS
        poll = agentrun_settings.HEARTBEAT_SECONDS
        margin = margin_seconds(lease_seconds)
        stop_before = stop_before_seconds(lease_seconds)
        tolerance = lateness_tolerance(lease_seconds, poll)
        due = None
        while not self._stop.is_set():
            self._renewed.clear()
            valid_until = self.valid_until
            if valid_until == float("inf"):
                return
            abort_at, exit_at = valid_until - stop_before, valid_until - margin
            now = time.monotonic()
            if due is not None and now >= abort_at:
                late = max(now - due, self._beat_overdue(now))
                self._late(now - due)
                if late > tolerance and not self._lost and self._take_back(late, lease_seconds):
                    due = None
                    continue
            if now >= exit_at:
                self._exit()
                return
            if now >= abort_at and not self.abort.aborted:
                logger.error(
                    "Lease of run_id=%s could not be renewed; stopping its execution",
                    self.lease.run_id,
                )
                self.abort.abort(LEASE_UNRENEWED)
            due = exit_at if now >= abort_at else abort_at
            self._renewed.wait(max(0.0, due - now))

    def _beat_overdue(self, now: float) -> float:
        """How late the beat is to wake (0 while a renewal of its is in flight: then it is
        waiting on the database, not starved)."""
        if self._sending_since is not None:
            return 0.0
        return max(0.0, now - self._beat_due)

    def _take_back(self, late: float, lease_seconds: float) -> bool:
        """The process was stopped or starved past a deadline: ask the beat to renew at
        once, which takes the lease back if nobody else took the run meanwhile (the beat
        ends the process if somebody did). Whether the lease is ours again."""
        before = self.valid_until
        deadline = time.monotonic() + take_back_seconds(lease_seconds)
        while self.valid_until == before and not (self._lost or self._stop.is_set()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._answered.clear()
            if self.valid_until != before:
                break
            self._poke.set()  # a poll the beat was sending is answered first: ask again
            self._answered.wait(remaining)
        if self.valid_until == before:
            return False
        self.taken_back += 1
        logger.warning(
            "Lease of run_id=%s taken back: this process was %.2fs late (stopped or starved "
            "of CPU) and nobody took the run meanwhile",
            self.lease.run_id,
            late,
        )
        return True

    def _exit(self) -> None:
        if self._stop.is_set():
            return  # the step finished meanwhile: nothing runs under the lease any more
        children.kill_started()  # nothing this process started may outlive its lease
        message = (
            f"agentrun: the lease of run {self.lease.run_id} runs out and its step has not "
            "stopped; ending the process so that no one else's recovery runs beside it\n"
        )
        logger.critical(message.strip())
        sys.stderr.write(message)
        sys.stderr.flush()
        os._exit(EXIT_CODE)
