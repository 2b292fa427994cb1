"""The lease heartbeat: renews the lease and notices cancel requests within a second."""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection

from .. import services
from ..abort import AbortSignal
from ..conf import agentrun_settings

logger = logging.getLogger(__name__)


class Heartbeat:
    """A daemon thread (with its own DB connection) beside the engine while it holds a lease."""

    def __init__(self, lease: services.Lease, abort: AbortSignal) -> None:
        self.lease = lease
        self.abort = abort
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"agentrun-heartbeat-{lease.run_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        poll = agentrun_settings.HEARTBEAT_SECONDS
        renew_every = max(agentrun_settings.LEASE_SECONDS / 3, poll)
        last_renew = time.monotonic()
        try:
            while not self._stop.wait(poll):
                try:
                    if time.monotonic() - last_renew >= renew_every:
                        held, cancel = services.renew_lease(self.lease)
                        last_renew = time.monotonic()
                    else:
                        held, cancel = services.poll_cancel(self.lease)
                except Exception:  # noqa: BLE001 - a DB hiccup must not kill the heartbeat
                    logger.warning("Heartbeat failed run_id=%s", self.lease.run_id, exc_info=True)
                    continue
                if not held:
                    self.abort.abort("lease lost")
                    return
                if cancel and not self.abort.aborted:
                    logger.info("Cancel request seen run_id=%s", self.lease.run_id)
                    self.abort.abort("cancel requested")
        finally:
            connection.close()
