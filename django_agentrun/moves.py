"""The one way a state field changes: the django-fsm transition to a target, in memory.

Only transitions.py imports this module (an import-linter contract in pyproject.toml
says so): every state move is one of its named changes, with its row change and event.
"""

from __future__ import annotations

from typing import Any

from django_fsm import TransitionNotAllowed

from .exceptions import InvalidTransition


def move(obj: Any, target: str) -> str:
    """Apply the django-fsm transition to `target` in memory; the previous state.
    InvalidTransition (nothing changed) if the table has no such edge."""
    old = obj.state
    try:
        getattr(obj, f"to_{target}")()
    except TransitionNotAllowed as exc:
        raise InvalidTransition(
            f"{type(obj).__name__} {obj.pk}: cannot go from '{old}' to '{target}'"
        ) from exc
    return old
