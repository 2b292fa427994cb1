"""Who may begin a run of an agent on a person's behalf, and whose run it then is.

One rule (the agent's `api_start`, else AGENTRUN_API_START: `access.may_start_agent`)
for every way a run begins for a person: a start, a conversation and its messages, a
fork, a resume; the API and the admin both ask here before they call a service. Server-side
code calling the services directly is not limited (as `start_run` is not).

A run acts with its owner's credentials (an MCP server's headers, `metadata.user_id`). A
fork asked for by someone else is theirs, so it acts with theirs; a resume cannot change
whose run it is, so another user's run is not resumed by them: they fork it. An agent with
`run_as="owner"` keeps both its owner's (an operator repairs a run for its user), and then
the owner must still be allowed to start it too.
"""

from __future__ import annotations

import logging
from typing import Any

from ..access import acts_for_owner, may_start_agent, start_refusal, unknown_or_refused
from ..agents import Agent, get_agent, registered_agents
from ..exceptions import StartRefused

logger = logging.getLogger(__name__)


def startable(user: Any, name: str) -> Agent:
    """The agent `name`, if `user` may start it; StartRefused, in the same words, when it
    does not exist or `user` may not start it (a name is not confirmed to whoever may not
    start it)."""
    agent = registered_agents().get(name)
    if agent is None or not may_start_agent(user, agent):
        why = "no such agent" if agent is None else start_refusal(agent)
        logger.info("Start refused agent=%r user=%s: %s", name, getattr(user, "pk", None), why)
        raise StartRefused(unknown_or_refused(name))
    return agent


def check_begin(user: Any, obj: Any, verb: str) -> Agent:
    """The agent of `obj` (a run or a conversation, which `user` may see), if `user` may
    `verb` it ("send a message to", "fork", "resume"): StartRefused when the agent's rule
    does not let `user` start it, when a resume would act with another user's credentials,
    or, for an agent whose runs act for their owner, when the owner may no longer start it;
    UnknownAgent when the agent is no longer defined."""
    agent = get_agent(obj.agent)
    if not may_start_agent(user, agent):
        raise StartRefused(start_refusal(agent))
    owner_id = getattr(obj, "owner_id", None)
    if owner_id is None or owner_id == user.pk:
        return agent
    if acts_for_owner(agent):
        if not may_start_agent(obj.owner, agent):
            raise StartRefused(
                f"You may not {verb} it: it would act for its owner, who may no longer start "
                f"agent {agent.name!r}."
            )
    elif verb == "resume":
        raise StartRefused(
            f"Run {obj.pk} is another user's: resumed, it would act with their credentials. "
            "Fork it instead (the fork is yours and acts with yours), or let runs of this "
            "agent act for their owners (Agent(run_as='owner'))."
        )
    return agent


def fork_owner(original: Any, by: Any) -> Any:
    """Whose run a fork of `original` asked for by `by` is: `by`'s (it acts with their
    credentials), unless nobody asked (server-side code) or the agent's runs act for their
    owner (`run_as="owner"`)."""
    if getattr(by, "pk", None) is None or not getattr(by, "is_authenticated", True):
        return original.owner
    if acts_for_owner(registered_agents().get(original.agent)):
        return original.owner
    return by
