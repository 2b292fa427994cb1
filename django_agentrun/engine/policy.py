"""The recovery policy: what to do with a call found `in_flight` (its executor died before
its result was recorded), by the tool's side-effect class. A pure decision (the tool's
reconcile check runs here); execution.py applies it.

| class | decision |
| --- | --- |
| read_only, idempotent_write, atomic | run it again (`Rerun`) |
| non_idempotent | the tool's reconcile check: `done(result)` records that result, `not_done()` allows a new attempt, `unknown(reason)` or no check goes to a person |
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..content import stored_result
from ..exceptions import InvalidContent, stopping_cause
from ..models import ToolCall
from ..side_effects import rerunnable
from ..tools import Tool, ToolContext
from .step import Step

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rerun:
    """A new attempt is allowed; `policy` says why (stored in the recovery event)."""

    policy: str


@dataclass(frozen=True)
class Reconciled:
    """The reconcile check found the effect: record `result` (source reconciled)."""

    result: Any


@dataclass(frozen=True)
class Unknown:
    """Nobody can tell: a person decides."""

    reason: str


Decision = Rerun | Reconciled | Unknown

RERUNNABLE = rerunnable()  # the classes the table (side_effects.MEANINGS) says recovery re-runs


def decide(step: Step, call: ToolCall, tool: Tool | None, context: ToolContext) -> Decision:
    """The policy for one in_flight call (a reconcile check runs here, with `context`)."""
    if call.side_effect in RERUNNABLE and tool is not None:
        return Rerun("rerun")
    if tool is None:
        return Unknown("The tool is no longer defined; its outcome is unknown.")
    if tool.reconcile is None:
        return Unknown(
            "The call was in flight when its worker died and the tool has no reconcile check."
        )
    try:
        found = tool.invoke_reconcile(context, call.arguments)
    except Exception as exc:  # noqa: BLE001 - a failing check: a person decides
        stopping = stopping_cause(exc)
        if stopping is not None:
            raise stopping from exc  # the process is being stopped: not the check's answer
        logger.exception("Reconcile check of %s failed run_id=%s", call.name, step.run_id)
        return Unknown(f"The reconcile check failed with {type(exc).__name__}.")
    if found.status == "done":
        try:
            return Reconciled(stored_result(found.result))
        except InvalidContent as exc:
            return Unknown(f"The reconcile check's result cannot be recorded: {exc}")
    if found.status == "not_done":
        # Evidence that it never happened: a new attempt, which (should it be interrupted
        # too) is checked again; the run's recovery cap bounds the loop.
        return Rerun("reconciled_not_done")
    return Unknown(found.reason or "The reconcile check could not tell.")
