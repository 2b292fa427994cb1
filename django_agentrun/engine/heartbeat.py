"""The lease heartbeat: renews the lease, notices cancel requests within a second, and
makes sure an expired lease always means its executor is gone.

Fencing stops a zombie's writes, not its side effects: a worker that cannot renew its
lease (a broken database connection, a network partition) must stop executing before
the lease can expire, or the reaper recovers a call that is still running and its
reconcile check may run before the first attempt has had its effect. So, counting from
the last renewal the database confirmed (the time taken *before* it was sent):

- every poll: a cheap read for cancel requests; every third of the lease: a renewal;
- after an error: the connection is dropped and the attempt made again at once, on a
  new connection (then, if that fails too, at the next poll);
- at `lease - min(grace + margin, lease / 2)` without a renewal: abort (handlers see
  `ctx.cancelled`, the model stream is cut), and nothing more is recorded as done;
- at `lease - margin` the step is still running: the process ends itself (`os._exit`),
  as a crash would; the message is redelivered or the reaper recovers the run.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time

from django.db import connection

from .. import children, store
from ..abort import CANCEL_REQUESTED, LEASE_LOST, LEASE_UNRENEWED, AbortSignal
from ..conf import agentrun_settings

logger = logging.getLogger(__name__)

EXIT_CODE = 75  # EX_TEMPFAIL


def margin_seconds(lease_seconds: float) -> float:
    """How long before the lease runs out the process must be gone."""
    return min(1.0, lease_seconds / 10)


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


class Heartbeat:
    """Two daemon threads beside the engine while it holds a lease: the beat (its own DB
    connection) renews the lease and polls for cancel requests; the watchdog (no I/O)
    enforces the deadlines above even while a renewal hangs on a dead connection."""

    def __init__(self, lease: store.Lease, abort: AbortSignal) -> None:
        self.lease = lease
        self.abort = abort
        self.valid_until = lease.valid_until
        self._stop = threading.Event()
        self._renewed = threading.Event()  # wakes the watchdog to recompute its deadlines
        self._beat = threading.Thread(
            target=self._beat_loop, name=f"agentrun-heartbeat-{lease.run_id}", daemon=True
        )
        self._watchdog = threading.Thread(
            target=self._watch, name=f"agentrun-watchdog-{lease.run_id}", daemon=True
        )

    def start(self) -> None:
        self._beat.start()
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        self._renewed.set()
        self._watchdog.join(timeout=5)
        self._beat.join(timeout=5)

    def _beat_loop(self) -> None:
        lease_seconds = agentrun_settings.LEASE_SECONDS
        poll = agentrun_settings.HEARTBEAT_SECONDS
        renew_every, _ = renewal_timing(lease_seconds, poll, agentrun_settings.CANCEL_GRACE_SECONDS)
        renew_every -= poll / 10  # a poll's wait ends a little late or early, never a poll's worth
        last_renew = time.monotonic()
        retry_now = False
        try:
            # After an error, one attempt at once on a new connection (a terminated backend
            # or a failover costs a reconnect, not a poll period); then the usual period.
            while retry_now or not self._stop.wait(poll):
                try:
                    if time.monotonic() - last_renew >= renew_every:
                        sent = time.monotonic()
                        held, cancel = store.renew_lease(self.lease)
                        last_renew = sent
                        if held:
                            self.valid_until = sent + lease_seconds
                            self._renewed.set()
                    else:
                        held, cancel = store.poll_cancel(self.lease)
                except Exception:  # noqa: BLE001 - a DB hiccup must not kill the heartbeat
                    logger.warning("Heartbeat failed run_id=%s", self.lease.run_id, exc_info=True)
                    connection.close()  # a broken connection stays broken: reconnect next time
                    retry_now = not retry_now
                    continue
                retry_now = False
                if not held:
                    self.abort.abort(LEASE_LOST)
                    return
                if cancel and not self.abort.cancel_requested:
                    logger.info("Cancel request seen run_id=%s", self.lease.run_id)
                    self.abort.abort(CANCEL_REQUESTED)
        finally:
            connection.close()

    def _watch(self) -> None:
        lease_seconds = agentrun_settings.LEASE_SECONDS
        margin = margin_seconds(lease_seconds)
        stop_before = min(agentrun_settings.CANCEL_GRACE_SECONDS + margin, lease_seconds / 2)
        while not self._stop.is_set():
            self._renewed.clear()
            valid_until = self.valid_until
            if valid_until == float("inf"):
                return
            abort_at, exit_at = valid_until - stop_before, valid_until - margin
            now = time.monotonic()
            if now >= exit_at:
                self._exit()
                return
            if now >= abort_at and not self.abort.aborted:
                logger.error(
                    "Lease of run_id=%s could not be renewed; stopping its execution",
                    self.lease.run_id,
                )
                self.abort.abort(LEASE_UNRENEWED)
            wake = exit_at if now >= abort_at else abort_at
            self._renewed.wait(max(0.0, wake - now))

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
