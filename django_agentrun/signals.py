"""Signals for host apps. All are sent after the transaction that caused them commits."""

from __future__ import annotations

from django.dispatch import Signal

# kwargs: run, state — the run reached completed, failed, cancelled or timed_out.
run_finished = Signal()
# kwargs: run, tool_call, token (minted for the receivers, never stored) — a tool call
# waits for a person.
approval_requested = Signal()
# kwargs: run, tool_call, reason — a call's outcome is unknown after a crash.
reconciliation_needed = Signal()
