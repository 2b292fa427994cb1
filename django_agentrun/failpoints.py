"""Named fault points in the engine, for crash testing with real processes.

Set AGENTRUN_FAILPOINTS="model.after_commit=crash,tool.before_handler=sleep:2" in a
worker's environment; `tool.after_handler@send_message=crash` fires only for that tool. Actions: `crash` ends the process at once (os._exit, as a
power cut would: no cleanup, no ack), `raise` raises FailpointError, `sleep:N`
sleeps N seconds. The engine reads what is armed once per advance of a run (`armed`, at
its start) and fires a failpoint only when something is: unset, a failpoint costs an
attribute check.

Every failpoint is also a scheduling point: the schedule explorer of the project's tests
(tests/explorer) installs a scheduler (`set_scheduler`) that each failpoint, and each
`point` (a commit boundary that is not a crash point of its own: a lock taken), calls
first, so that it can stop the thread there and let another actor move.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from .exceptions import AgentRunError

ENV = "AGENTRUN_FAILPOINTS"

# The write-ahead windows of a run's advance: every run passes each (the crash matrix in
# tests/workers and bench/failpoints.py crash a worker at each).
RUN_POINTS: dict[str, str] = {
    "claim.after_commit": "the lease is claimed (a queued run started), nothing else done",
    "model.before_commit": "the model response arrived, not yet committed",
    "model.after_commit": "the answer, its tool calls (the first in flight) are committed",
    "tool.before_handler": "the call is committed in_flight, the handler has not started",
    "tool.after_handler": "the handler returned, its result is not committed",
    "tool.after_batch": "a batch's handlers all returned, their results are not committed",
    "tool.after_commit": "the tool result (and what follows it) is committed",
    "turn.before_enqueue": "the turn is closed and committed, the next not begun nor enqueued",
}
# Every name, those of the webhook deliveries too (only a run someone subscribed to has one).
POINTS: dict[str, str] = {
    **RUN_POINTS,
    "webhook.before_send": "a worker took a committed webhook delivery, nothing sent yet",
    "mcp.progress": "an MCP tool call is out and its server reported progress (it runs there)",
}

_parsed: tuple[str, dict[str, str]] = ("", {})
_scheduler: Callable[[str, str | None], None] | None = None


class FailpointError(AgentRunError):
    """A failpoint set to `raise` fired."""

    code = "failpoint"


def _actions() -> dict[str, str]:
    global _parsed
    raw = os.environ.get(ENV, "")
    if raw != _parsed[0]:
        actions: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, _, action = item.partition("=")
            if name.partition("@")[0] not in POINTS:
                raise ValueError(f"{ENV}: unknown failpoint {name!r}; known: {', '.join(POINTS)}")
            actions[name] = action or "crash"
        _parsed = (raw, actions)
    return _parsed[1]


def set_scheduler(scheduler: Callable[[str, str | None], None] | None) -> None:
    """Call `scheduler(name, qualifier)` at every failpoint and `point` (None: stop)."""
    global _scheduler
    _scheduler = scheduler


def armed() -> dict[str, str]:
    """What the environment arms now (name or name@qualifier -> action); {} when unset (a
    scheduler installed counts as armed: every failpoint is its scheduling point)."""
    if _scheduler is not None:
        return {"*": "schedule", **(_actions() if os.environ.get(ENV) else {})}
    return _actions() if os.environ.get(ENV) else {}


def point(name: str) -> None:
    """A scheduling point that is no failpoint (a lock about to be taken): free unless a
    scheduler is installed."""
    if _scheduler is not None:
        _scheduler(name, None)


def failpoint(name: str, qualifier: str | None = None) -> None:
    """Fire the failpoint `name` (or `name@qualifier`, e.g. a tool name) if the environment arms it."""
    if _scheduler is not None:
        _scheduler(name, qualifier)
    if not os.environ.get(ENV):
        return
    actions = _actions()
    action = actions.get(f"{name}@{qualifier}") if qualifier else None
    if action is None:
        action = actions.get(name)
    if action is None:
        return
    if action == "crash":
        sys.stderr.write(f"agentrun failpoint {name}: crash\n")
        sys.stderr.flush()
        os._exit(137)
    if action == "raise":
        raise FailpointError(f"failpoint {name} fired")
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
        return
    raise ValueError(f"{ENV}: unknown action {action!r} for {name}")
