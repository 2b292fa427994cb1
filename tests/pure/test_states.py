"""Every ordered pair of states, against the transition tables and the models' FSM methods.

The tables in states.py are the single source of truth for the models' transitions; these
tests pin the run table to the seed's (written out literally here) plus the one documented
extension (a deadline moves any active run to `timed_out`), and prove that the django-fsm
methods allow exactly the table's edges and refuse every other pair.
"""

from __future__ import annotations

import itertools

import pytest
from django.db import models
from django_fsm import TransitionNotAllowed, can_proceed

from django_agentrun.models import Run, ToolCall, Turn
from django_agentrun.states import (
    RUN_ACTIVE,
    RUN_TRANSITIONS,
    TOOL_CALL_CLOSED,
    TOOL_CALL_TRANSITIONS,
    TURN_TRANSITIONS,
    ConversationPolicy,
    ConversationStatus,
    ResultSource,
    RunState,
    SideEffect,
    ToolCallState,
    TurnState,
)

# The seed's table (SEED.md / ARCHITECTURE.md section 2), written out literally.
SEED_RUN_TABLE: dict[str, set[str]] = {
    "queued": {"running", "cancelled"},
    "running": {"awaiting_tool", "awaiting_approval", "completed", "failed", "cancelled"},
    "awaiting_tool": {"running", "awaiting_approval", "failed", "cancelled"},
    "awaiting_approval": {"awaiting_tool", "running", "cancelled", "timed_out"},
    "completed": set(),
    "failed": {"queued"},
    "cancelled": {"queued"},
    "timed_out": {"queued"},
}
# The one documented extension: a run deadline ends any active (non-terminal) run.
DEADLINE_EDGES = {
    ("queued", "timed_out"),
    ("running", "timed_out"),
    ("awaiting_tool", "timed_out"),
    ("awaiting_approval", "timed_out"),
}

EXPECTED_TURN_TABLE: dict[str, set[str]] = {
    "running": {"awaiting_tool", "completed", "cancelled", "failed"},
    "awaiting_tool": {"completed", "cancelled", "failed"},
    "completed": set(),
    "cancelled": set(),
    "failed": set(),
}

EXPECTED_TOOL_CALL_TABLE: dict[str, set[str]] = {
    "requested": {"awaiting_approval", "in_flight", "succeeded", "errored", "skipped", "cancelled"},
    "awaiting_approval": {"requested", "rejected", "cancelled"},
    "in_flight": {"requested", "unknown", "succeeded", "errored", "cancelled"},
    "unknown": {"requested", "succeeded", "errored", "cancelled"},
    "succeeded": set(),
    "errored": set(),
    "rejected": set(),
    "skipped": set(),
    "cancelled": set(),
}


def _edges(table: dict[str, frozenset[str] | set[str]]) -> set[tuple[str, str]]:
    return {(str(src), str(dst)) for src, targets in table.items() for dst in targets}


def _instance(model: type[models.Model], state: str) -> models.Model:
    # The constructor may set a protected field once; only later assignment is refused.
    obj = model(state=state)
    assert obj.state == state
    return obj


def _check_all_pairs(model, choices, table) -> int:
    """For every (source, target) pair: allowed iff it is an edge of `table`. Returns #pairs."""
    states = [str(s) for s in choices.values]
    edges = _edges(table)
    checked = 0
    for source, target in itertools.product(states, states):
        method_name = f"to_{target}"
        allowed = (source, target) in edges
        if not hasattr(model, method_name):
            # No method: nothing may lead there (e.g. a turn is born running).
            assert not allowed, f"{model.__name__}: edge {source}->{target} has no method"
            checked += 1
            continue
        obj = _instance(model, source)
        method = getattr(obj, method_name)
        assert can_proceed(method) is allowed, f"{model.__name__} {source}->{target}"
        if allowed:
            method()
            assert obj.state == target, f"{model.__name__} {source}->{target} landed in {obj.state}"
        else:
            with pytest.raises(TransitionNotAllowed):
                method()
            assert obj.state == source, f"{model.__name__} refused {source}->{target} but moved"
        checked += 1
    return checked


# --------------------------------------------------------------------------- tables


def test_run_table__equals_seed_plus_deadline_edges():
    assert set(RUN_TRANSITIONS) == set(SEED_RUN_TABLE)
    assert _edges(RUN_TRANSITIONS) == _edges(SEED_RUN_TABLE) | DEADLINE_EDGES
    # The extension is exactly "from every active state": no terminal state gains it.
    assert {src for src, _ in DEADLINE_EDGES} == {str(s) for s in RUN_ACTIVE}


def test_run_table__keys_are_every_state():
    assert {str(s) for s in RunState.values} == set(RUN_TRANSITIONS)
    assert RUN_TRANSITIONS[RunState.COMPLETED] == frozenset()


def test_turn_table__is_as_documented():
    assert set(TURN_TRANSITIONS) == {str(s) for s in TurnState.values}
    assert _edges(TURN_TRANSITIONS) == _edges(EXPECTED_TURN_TABLE)


def test_tool_call_table__is_as_documented():
    assert set(TOOL_CALL_TRANSITIONS) == {str(s) for s in ToolCallState.values}
    assert _edges(TOOL_CALL_TRANSITIONS) == _edges(EXPECTED_TOOL_CALL_TABLE)
    # Closed states carry their result and are terminal.
    for state in TOOL_CALL_CLOSED:
        assert TOOL_CALL_TRANSITIONS[state] == frozenset()


def test_state_values__are_the_seed_strings():
    assert RunState.values == [
        "queued",
        "running",
        "awaiting_tool",
        "awaiting_approval",
        "completed",
        "failed",
        "cancelled",
        "timed_out",
    ]
    assert set(TurnState.values) == {"running", "awaiting_tool", "completed", "cancelled", "failed"}


# --------------------------------------------------------------------------- FSM methods


def test_run_fsm__allows_exactly_the_table_edges():
    n = _check_all_pairs(Run, RunState, RUN_TRANSITIONS)
    assert n == len(RunState.values) ** 2 == 64


def test_turn_fsm__allows_exactly_the_table_edges():
    n = _check_all_pairs(Turn, TurnState, TURN_TRANSITIONS)
    assert n == len(TurnState.values) ** 2


def test_tool_call_fsm__allows_exactly_the_table_edges():
    n = _check_all_pairs(ToolCall, ToolCallState, TOOL_CALL_TRANSITIONS)
    assert n == len(ToolCallState.values) ** 2


def test_run_fsm__the_seed_table_literally():
    """The same check against the literal expectation (not the module's own table)."""
    expected = _edges(SEED_RUN_TABLE) | DEADLINE_EDGES
    for source, target in itertools.product(RunState.values, RunState.values):
        run = _instance(Run, source)
        assert can_proceed(getattr(run, f"to_{target}")) is ((source, target) in expected), (
            source,
            target,
        )


def test_fsm__every_target_with_an_incoming_edge_has_a_method():
    for model, table in ((Run, RUN_TRANSITIONS), (Turn, TURN_TRANSITIONS)):
        for _, target in _edges(table):
            assert hasattr(model, f"to_{target}"), (model.__name__, target)
    for _, target in _edges(TOOL_CALL_TRANSITIONS):
        assert hasattr(ToolCall, f"to_{target}"), target


# --------------------------------------------------------------------------- protection


@pytest.mark.parametrize(
    ("model", "state", "other"),
    [
        (Run, RunState.QUEUED, RunState.COMPLETED),
        (Turn, TurnState.RUNNING, TurnState.COMPLETED),
        (ToolCall, ToolCallState.REQUESTED, ToolCallState.SUCCEEDED),
    ],
)
def test_protected__assigning_state_raises(model, state, other):
    obj = model()
    assert obj.state == state
    with pytest.raises(AttributeError, match="Direct state modification is not allowed"):
        obj.state = other
    assert obj.state == state


def test_protected__assigning_after_a_transition_raises():
    run = Run()
    run.to_running()
    with pytest.raises(AttributeError):
        run.state = RunState.COMPLETED
    assert run.state == RunState.RUNNING


# --------------------------------------------------------------------------- docstrings


@pytest.mark.parametrize(
    "choices",
    [
        RunState,
        TurnState,
        ToolCallState,
        ResultSource,
        SideEffect,
        ConversationPolicy,
        ConversationStatus,
    ],
    ids=lambda c: c.__name__,
)
def test_docstrings__every_member_documented(choices):
    """Each TextChoices member has its own docstring right under it (not the class's)."""
    import ast
    import inspect

    source = inspect.getsource(choices)
    tree = ast.parse(source)
    (cls,) = tree.body
    documented: dict[str, str] = {}
    body = cls.body
    for node, following in zip(body, body[1:] + [None], strict=True):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = node.targets[0].id
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                documented[name] = following.value.value.strip()
    assert set(documented) == set(choices.names), set(choices.names) - set(documented)
    assert all(documented.values())
