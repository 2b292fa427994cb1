"""How a tool call ended, as one value (`CallEnding`), and what names a call before its row
exists. (What `advance` returns is the engine's `Outcome`.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .states import ResultSource


@dataclass(frozen=True)
class CallEnding:
    """How a tool call ended: its closed state, result (a StoredResult or a JSON value, such
    as a synthetic result's text), whether it is an error, and where it came from."""

    state: str
    result: Any
    is_error: bool
    source: str

    @classmethod
    def synthetic(cls, state: str, text: str) -> CallEnding:
        return cls(state, text, True, ResultSource.SYNTHETIC)


def call_key(call: Any) -> tuple[int, str]:
    """What names a call before and after its row is written: (turn index, tool_use id)."""
    return call.turn_index, call.tool_call_id
