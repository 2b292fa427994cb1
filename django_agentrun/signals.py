"""Signals for host apps. All are sent after the transaction that caused them commits,
robustly (`send`): a receiver that raises is logged and neither stops the others nor the
work that follows the commit (ARCHITECTURE.md, invariant 10)."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

# kwargs: run, state — the run reached completed, failed, cancelled or timed_out.
run_finished = Signal()
# kwargs: run, tool_call, token (minted for the receivers, never stored) — a tool call
# waits for a person.
approval_requested = Signal()
# kwargs: run, tool_call, reason — a call's outcome is unknown after a crash.
reconciliation_needed = Signal()

NAMES = {
    id(run_finished): "run_finished",
    id(approval_requested): "approval_requested",
    id(reconciliation_needed): "reconciliation_needed",
}


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send `signal` to every receiver; one that raises is logged (with the run's id) and
    the others still get it."""
    for receiver, answer in signal.send_robust(sender=sender, **kwargs):
        if isinstance(answer, Exception):
            run = kwargs.get("run")
            logger.error(
                "A receiver of %s raised (%s) run_id=%s",
                NAMES.get(id(signal), "a signal"),
                getattr(receiver, "__qualname__", receiver),
                getattr(run, "pk", None),
                exc_info=answer,
            )
