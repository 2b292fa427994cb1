"""What an agent's author lets API clients do with it, declared on the Agent:

- `api_start`: who may start its runs and conversations (and send their messages) through
  the API: a permission name, True (any authenticated user), False (nobody: server-side
  code only) or a callable `(user) -> bool`. Unset: `AGENTRUN_API_START` (by default the
  permission `agentrun.start_run`; superusers hold every permission).
- `client_options`: which run options (`agent_options.RUN_OPTIONS`) a request may set; none
  unless named. Server-side callers of `start_run(options=...)` keep full control.
- A client's deadline never goes past the agent's own time limit (`Agent(deadline=...)`).
- `run_as`: whose run a fork or a resume asked for by someone other than the run's owner
  is. "requester" (the default): a fork is theirs and acts with their credentials, and
  another user's run is not resumed by them (they fork it); "owner": both stay the owner's
  and act with the owner's credentials (for operators who repair runs for their users).

The start rule is one rule for every way a run of an agent begins on a person's behalf:
a start, a conversation and its messages, a fork, a resume (`services.authority`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from .conf import agentrun_settings
from .exceptions import ConfigurationError
from .permissions import may_start


def api_rule(where: str, rule: Any) -> Any:
    """`rule` if it is one an Agent's `api_start` may be (ConfigurationError otherwise)."""
    if rule is None or isinstance(rule, bool) or callable(rule):
        return rule
    if isinstance(rule, str) and rule.count(".") == 1 and all(rule.split(".")):
        return rule
    raise ConfigurationError(
        f"{where}: api_start must be True, False, a permission name ('app_label.codename') "
        "or a callable (user) -> bool"
    )


#: The values of `Agent(run_as=...)`.
RUN_AS = ("requester", "owner")


def run_as_rule(where: str, value: Any) -> str:
    """`value` if an Agent's `run_as` may be it (ConfigurationError otherwise)."""
    if value not in RUN_AS:
        raise ConfigurationError(f"{where}: run_as must be one of {', '.join(RUN_AS)}")
    return value


def acts_for_owner(agent: Any) -> bool:
    """Whether a fork or resume of a run of `agent` by someone else stays its owner's."""
    return getattr(agent, "run_as", "requester") == "owner"


def option_names(where: str, names: Iterable[str], allowed: Iterable[str]) -> frozenset[str]:
    """The run options an Agent lets clients set, each one a run may set at all."""
    if isinstance(names, str):
        names = (names,)
    chosen, known = frozenset(names), tuple(allowed)
    unknown = sorted(chosen - set(known))
    if unknown:
        raise ConfigurationError(
            f"{where}: client_options names {', '.join(unknown)}; a run may set {', '.join(known)}"
        )
    return chosen


def start_rule(agent: Any) -> Any:
    """The agent's own rule, else the project's (`AGENTRUN_API_START`)."""
    rule = getattr(agent, "api_start", None)
    return agentrun_settings.API_START if rule is None else rule


def may_start_agent(user: Any, agent: Any) -> bool:
    """Whether `user` may start runs of `agent` through the API."""
    return may_start(user, start_rule(agent))


def refused_options(agent: Any, options: dict[str, Any] | None, known: Iterable[str]) -> list[str]:
    """The run options (among `known`) of a request that the agent does not let clients
    set, sorted (a name that is no run option at all is start_run's to refuse)."""
    allowed = getattr(agent, "client_options", frozenset())
    return sorted(name for name in options or {} if name in known and name not in allowed)


def capped_deadline(agent: Any, deadline: datetime | None) -> datetime | None:
    """A client's deadline, no later than the agent's time limit from now (none: as given;
    no deadline given: None, and start_run applies the agent's)."""
    limit = getattr(agent, "deadline", None)
    if deadline is None or limit is None:
        return deadline
    return min(deadline, timezone.now() + limit)


def start_refusal(agent: Any) -> str:
    """Why `agent` may not be started by a user `may_start_agent` said no to."""
    rule = start_rule(agent)
    if rule is False or rule is None:
        how = "its runs are started by server-side code only (api_start=False)"
    elif isinstance(rule, str):
        how = f"that needs the {rule} permission"
    elif rule is True:
        how = "that needs a signed-in user"
    else:
        how = "its api_start rule does not allow you"
    return f"You may not start agent {agent.name!r}: {how}."


def unknown_or_refused(name: str) -> str:
    """What a client who named an agent it may not start is told, the same whether or not
    the agent exists (its name is not confirmed to whoever may not start it)."""
    return f"There is no agent {name!r} that you may start."
