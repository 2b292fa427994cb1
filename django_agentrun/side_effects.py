"""What a tool call's side-effect class means, in one table (`MEANINGS`): what recovery does
with a call a dead worker left in flight, whether the call may run at once with the turn's
other calls (a batch), whether it runs inside the commit that records its result, what an
MCP call's timeout means, what a person is asked to decide, and what the admin says of it.
Recovery (engine/policy.py), batching (tools.batch), execution (the atomic path), MCP
(mcp/tools.py, mcp/servers.py) and the admin read this table; docs/how-to/tools.md shows it
(`table()`, generated: tests/pure/test_side_effects.py keeps them equal)."""

from __future__ import annotations

from dataclasses import dataclass

from .states import SideEffect


@dataclass(frozen=True)
class Meaning:
    """One class's row of the table."""

    # After a crash with the call in flight and no result (ARCHITECTURE.md §5).
    after_crash: str
    # Recovery runs it again without asking its reconcile check or a person.
    rerun_after_crash: bool
    # It may run at once with the turn's other such calls (a batch): safe to run again.
    batches: bool
    # Its handler runs inside the transaction that records its result (ORM writes only).
    in_transaction: bool
    # An MCP call of it that timed out is an error result the model handles (safe to call
    # again), not an unknown outcome a person settles.
    timeout_is_an_answer: bool
    # An MCP server's tool may have it (an MCP call never writes through this database).
    for_mcp: bool
    # What a person is asked about it, beyond an approval the tool asks for.
    person: str
    # What the admin shows beside the class.
    admin: str


MEANINGS: dict[SideEffect, Meaning] = {
    SideEffect.READ_ONLY: Meaning(
        after_crash="re-run",
        rerun_after_crash=True,
        batches=True,
        in_transaction=False,
        timeout_is_an_answer=True,
        for_mcp=True,
        person="nothing: it is run again",
        admin="Safe to run again: recovery re-runs it.",
    ),
    SideEffect.IDEMPOTENT_WRITE: Meaning(
        after_crash="re-run with the same ctx.idempotency_key (sha256(run_id + tool_call_id))",
        rerun_after_crash=True,
        batches=True,
        in_transaction=False,
        timeout_is_an_answer=True,
        for_mcp=True,
        person="nothing: it is run again with the same idempotency key",
        admin="Run again with the same idempotency key after a crash.",
    ),
    SideEffect.NON_IDEMPOTENT: Meaning(
        after_crash="never re-run blindly: its reconcile check (done, not_done, unknown), "
        "or a person",
        rerun_after_crash=False,
        batches=False,
        in_transaction=False,
        timeout_is_an_answer=False,
        for_mcp=True,
        person="an unknown outcome: mark it done (with its result), retry it, or fail it",
        admin="Never run again blindly: an unknown outcome waits for its check or a person.",
    ),
    SideEffect.ATOMIC: Meaning(
        after_crash="nothing to recover: its ORM writes and its result commit together "
        "(rolled back with a lost lease, then run again)",
        rerun_after_crash=True,
        batches=False,
        in_transaction=True,
        timeout_is_an_answer=False,
        for_mcp=False,
        person="nothing: it ran exactly once or not at all",
        admin="Runs inside the commit that records its result: exactly once.",
    ),
}


def meaning(side_effect: SideEffect | str) -> Meaning:
    """The row of `side_effect` (a SideEffect or its value)."""
    return MEANINGS[SideEffect(side_effect)]


def rerunnable() -> tuple[SideEffect, ...]:
    """The classes recovery runs again without a check or a person."""
    return tuple(se for se, m in MEANINGS.items() if m.rerun_after_crash)


def table() -> str:
    """The table as the docs show it (docs/how-to/tools.md)."""
    yes = {True: "yes", False: "no"}
    rows = [
        "| `side_effect` | after a crash with the call in flight | in a batch | "
        "in the result's transaction | an MCP timeout | a person decides |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for side_effect, m in MEANINGS.items():
        timeout = (
            "n/a (not for MCP tools)"
            if not m.for_mcp
            else "an error result for the model"
            if m.timeout_is_an_answer
            else "an unknown outcome"
        )
        rows.append(
            f"| `{side_effect.value}` | {m.after_crash} | {yes[m.batches]} | "
            f"{yes[m.in_transaction]} | {timeout} | {m.person} |"
        )
    return "\n".join(rows) + "\n"
