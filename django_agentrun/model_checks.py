"""System checks of the model table (catalog.py) and of each agent's model and options:
the agentrun.E020 / W020 / E021 / W021 / W022 / E004 / W040 messages of checks.check_agents."""

from __future__ import annotations

from typing import Any

from django.core import checks

from . import catalog
from .clients import caching
from .conf import agentrun_settings


def request_params(agent: Any) -> dict[str, Any]:
    """The Messages API params a run of `agent` sends (agents.agent_request_params where
    the app has it; else the options every agent has: model, max_tokens, system, tools)."""
    from . import agents

    build = getattr(agents, "agent_request_params", None)
    if build is not None:
        return dict(build(agent))
    config = agent.run_config()
    return {
        "model": config.model,
        "max_tokens": config.max_tokens,
        "system": config.system,
        "tools": config.tools,
    }


def table_messages() -> list[checks.CheckMessage]:
    """AGENTRUN_MODELS / AGENTRUN_MODELS_FILE errors, and the AGENTRUN_PRICES deprecation."""
    found: list[checks.CheckMessage] = [
        checks.Error(
            message,
            hint="AGENTRUN_MODELS = {model id: {field: value}} merges over the shipped "
            "entry; a new id names every field or 'like' a shipped model (docs/reference/models.md).",
            id="agentrun.E020",
        )
        for message in catalog.catalog_errors()
    ]
    if agentrun_settings.PRICES:
        found.append(
            checks.Warning(
                "AGENTRUN_PRICES is deprecated: its prices are read as AGENTRUN_MODELS "
                "entries, its cache_write as the 5-minute cache-write price.",
                hint="Move each entry to AGENTRUN_MODELS = {model: {'prices': {'input': ..., "
                "'output': ..., 'cache_write_5m': ..., 'cache_write_1h': ..., "
                "'cache_read': ...}}}.",
                id="agentrun.W021",
            )
        )
    return found


def agent_messages(agent: Any) -> list[checks.CheckMessage]:
    """An unknown model warns (and a cost budget on it is an error); each option the
    model refuses is an error naming the option and the model."""
    params = request_params(agent)
    model = params.get("model") or agentrun_settings.DEFAULT_MODEL
    if catalog.model_info(model) is None:
        found: list[checks.CheckMessage] = [
            checks.Warning(
                f"Agent {agent.name!r} uses model {model!r}, which the model table does "
                "not know: its options are not checked and its runs cost nothing in budgets.",
                hint="Check the spelling (manage.py agentrun_models lists the table), or "
                "add it: AGENTRUN_MODELS = {model: {'like': 'claude-sonnet-5-5', ...}}.",
                id="agentrun.W020",
            )
        ]
        if agent.budget.max_cost_usd is not None:
            found.append(
                checks.Error(
                    f"Agent {agent.name!r} has a cost budget but model {model!r} has no price.",
                    hint="Add it to AGENTRUN_MODELS = {model: {'like': ..., 'prices': "
                    "{'input': ..., 'output': ..., ...}}} (USD per million tokens).",
                    id="agentrun.E004",
                )
            )
        return found
    return deprecation_messages(agent, model) + [
        checks.Error(
            f"Agent {agent.name!r}: {refusal}; its runs would fail with a 400.",
            hint="Change the option or the model (manage.py agentrun_models shows what each "
            "model accepts), or correct the table with AGENTRUN_MODELS.",
            id="agentrun.E021",
        )
        for refusal in catalog.refusals(model, params)
    ]


def deprecation_messages(agent: Any, model: str) -> list[checks.CheckMessage]:
    """A deprecated model warns with its retirement date and replacement (a retired one is
    an E021 refusal: catalog RULES model_retired)."""
    info = catalog.model_info(model)
    if info is None or info.lifecycle() != "deprecated" or info.deprecated is None:
        return []
    instead = f" ({info.replacement} is the recommended replacement)" if info.replacement else ""
    return [
        checks.Warning(
            f"Agent {agent.name!r} uses model {model!r}, which is deprecated and retires on "
            f"{info.deprecated.isoformat()}{instead}; from that day its runs are refused.",
            hint="Move the agent to another model before then; test it on the replacement "
            "first (https://platform.claude.com/docs/en/about-claude/model-deprecations).",
            obj=agent.name,
            id="agentrun.W022",
        )
    ]


def breakpoint_messages(agent: Any) -> list:
    """An agent whose own cache breakpoints (on its system blocks and server tools) leave
    the app none of the API's 4 a request: never more are sent, so the app's are left out
    and a run whose input marks a block too is refused."""
    system = agent.system if isinstance(agent.system, list | tuple) else []
    tools = [dict(t) for t in agent.server_tools]
    held = caching.host_markers(tools, [dict(b) for b in system])
    if held < caching.MAX_CACHE_BREAKPOINTS:
        return []
    return [
        checks.Warning(
            f"Agent {agent.name!r} marks {held} blocks of its system prompt and tools with "
            f"cache_control; the Messages API takes at most {caching.MAX_CACHE_BREAKPOINTS} "
            "breakpoints a request, so the app places none of its own (the cache no longer "
            "follows the conversation)"
            + (", and every request is refused." if held > caching.MAX_CACHE_BREAKPOINTS else "."),
            hint="Keep at most 2 markers in system and tools (the app adds one on the last "
            "tool, the last system block and the conversation's end when there is room), or "
            "set prompt_caching=False and place them all yourself.",
            obj=agent.name,
            id="agentrun.W040",
        )
    ]
