"""What the surfaces show a person about a tool call they decide on, read from the run's
configuration snapshot (what the model was told), not from the agent as it is now."""

from __future__ import annotations

from typing import Any

from ..agents import run_tool
from ..runconfig import RunConfig


def tool_definition(run: Any, name: str) -> dict[str, Any]:
    """The tool `name` as the run's configuration snapshot declares it (name, description,
    input schema); from the agent as registered now for runs without one; {} if neither."""
    for definition in RunConfig.of(run.config).tools:
        if isinstance(definition, dict) and definition.get("name") == name:
            return definition
    tool = run_tool(run, name)
    return tool.definition() if tool is not None else {}


def tool_description(call: Any) -> str:
    """The description of the call's tool, as the model read it."""
    description = tool_definition(call.run, call.name).get("description")
    return description if isinstance(description, str) else ""
