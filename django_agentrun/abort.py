"""Cooperative cancellation: one AbortSignal per advance of a run.

The heartbeat thread aborts it when a cancel request (or a lost lease) is seen;
the model stream and every tool execution context listen to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# Why an advance was aborted (AbortSignal.reason).
CANCEL_REQUESTED = "cancel requested"
"""The run's cancel request was seen: close cleanly, keeping what is recorded."""
LEASE_LOST = "lease lost"
"""Another worker holds the run now: stop and write nothing."""
LEASE_UNRENEWED = "lease could not be renewed"
"""The heartbeat could not renew the lease: stop executing before it can expire."""


class AbortSignal:
    """A thread-safe abort flag with callbacks (like the web's AbortSignal). It fires once
    (`reason` is the first reason); a later reason is still kept (`reasons`), so a cancel
    request seen after another abort is not lost. `aborted` is a plain attribute: the
    engine reads it between every piece of work."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []
        self.reason: str = ""
        self.reasons: set[str] = set()
        self.aborted = False  # set once, with the event, under the lock
        # The lease holder's look before an effect (the heartbeat's `gate`), if any.
        self.gate: Callable[[], object] | None = None

    @property
    def cancel_requested(self) -> bool:
        """Whether a cancel request is among the reasons (whichever came first)."""
        return CANCEL_REQUESTED in self.reasons

    def before_effect(self) -> bool:
        """Whether to stop before an effect (a model request, a tool's handler): aborted,
        or found so by the gate first. The heartbeat's gate makes a process that was
        stopped or starved past its lease's renewal take it back before it acts (or end,
        if another holder took the run): its watchdog may not have woken yet."""
        gate = self.gate
        if gate is not None and not self.aborted:
            gate()
        return self.aborted

    def abort(self, reason: str = "cancelled") -> None:
        with self._lock:
            self.reasons.add(reason)
            if self._event.is_set():
                return
            self.reason = reason
            self.aborted = True
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - a failing listener must not stop the others
                pass

    def add_callback(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` on abort (at once if already aborted); returns a remover."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return remove
        callback()
        return lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds, waking early on abort; True if aborted."""
        return self._event.wait(timeout)
