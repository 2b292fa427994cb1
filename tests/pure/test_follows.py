"""The one decision of what follows a step (engine/follows.py's FOLLOWS) is complete and
consistent: every (where, ended-with) pair the engine can produce has a row, every row is
one the engine can produce, every chain of rows ends in what happens after the commit, and
every transition a row names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from django_agentrun.engine import step
from django_agentrun.engine.follows import ACTIONS, CLASSIFY, FOLLOWS, At, Ended
from django_agentrun.engine.step import Then

ENGINE = Path(step.__file__).parent

# The functions that say what a point ended with, by the point they read.
CLASSIFIERS = {
    "next_call": At.NEXT_CALL,
    "turn_closed": At.TURN_CLOSED,
    "interrupted": At.INTERRUPTED,
    "_open_call": At.OPEN_CALL,
    "may_start": At.OPEN_CALL,  # next_call names the two of its answers it goes on with
    "_answered": At.ANSWER,
}
PAIR = re.compile(r"At\.(\w+),\s*Ended\.(\w+)")


def _table_source() -> str:
    source = (ENGINE / "follows.py").read_text()
    start = source.index("FOLLOWS: dict")
    return source[start : source.index("\n}\n", start) + 2]


def produced() -> set[tuple[At, Ended]]:
    """The pairs the engine's code names (outside the table) or its classifiers return."""
    pairs = set()
    for path in sorted(ENGINE.glob("*.py")):
        source = path.read_text()
        if path.name == "follows.py":
            source = source.replace(_table_source(), "")
        pairs |= {(At[a], Ended[e]) for a, e in PAIR.findall(source)}
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name in CLASSIFIERS:
                at = CLASSIFIERS[node.name]
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "Ended"
                    ):
                        pairs.add((at, Ended[sub.attr]))
    return pairs


def test_follows__every_pair_the_engine_produces_has_a_row_and_every_row_is_produced():
    made = produced()
    assert made - set(FOLLOWS) == set(), "pairs with no row"
    assert set(FOLLOWS) - made == set(), "rows the engine never reaches"


def test_follows__every_ending_and_point_is_used():
    assert {ended for _, ended in FOLLOWS} == set(Ended)
    assert {at for at, _ in FOLLOWS} == set(At)


def test_follows__every_chain_ends_in_what_happens_after_the_commit():
    for (at, ended), row in FOLLOWS.items():
        if row.carries[:1] and row.carries[0].startswith("phase:"):
            # The work comes first (a handler, the policy, the model): its commit is the
            # next, from the point the phase reaches.
            continue
        seen = {at}
        then = row.then
        while isinstance(then, At):
            assert then in CLASSIFY, f"{at}, {ended}: nothing says what {then} ended with"
            assert then not in seen, f"{at}, {ended}: a cycle through {then}"
            seen.add(then)
            # Any row of that point may follow: each must end too.
            nexts = [r.then for (a, _), r in FOLLOWS.items() if a is then]
            assert nexts, then
            then = next((n for n in nexts if isinstance(n, At) and n not in seen), Then.GO_ON)


def test_follows__every_row_names_transitions_that_exist():
    for key, row in FOLLOWS.items():
        for action in row.carries:
            assert action.startswith("phase:") or action in ACTIONS, (key, action)


def test_follows__a_step_that_stops_without_writing_carries_nothing():
    for key, row in FOLLOWS.items():
        if row.then in (Then.LEAVE, Then.EXPIRE):
            assert row.carries == (), key


def test_follows__the_turn_closes_and_the_run_moves_in_one_write():
    # A turn that closes always moves its run in the same write (ARCHITECTURE.md §5).
    for at in (At.TURN_CLOSED,):
        for (a, _), row in FOLLOWS.items():
            if a is at:
                assert row.carries and isinstance(row.then, Then), row
