"""An MCP server as an Agent declares it (`MCPServer.stdio(...)`, `MCPServer.http(...)`), and
what a run keeps of its tools: each tool's snapshot record, made when the run (or its
conversation) starts, from the server's tool list as it was then.

Plain data, no `mcp` import: the SDK is needed only to talk to a server (connections.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from ..states import SideEffect

# The Messages API's tool names: letters, digits, _ and -, at most 128 characters.
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_OVERRIDES = frozenset({"side_effect", "requires_approval", "reconcile", "approval_timeout"})

Headers = Callable[[Any], Mapping[str, str]]


@dataclass(frozen=True)
class MCPServer:
    """An MCP server whose tools an Agent offers the model (`Agent(mcp_servers=[...])`).

    Build one with `MCPServer.stdio(...)` (a command the worker starts and keeps) or
    `MCPServer.http(...)` (a streamable HTTP endpoint). `include`/`exclude` filter the
    server's tools by their names on the server; `rename` maps a server's name to the name
    the model sees; `tools` sets a tool's `side_effect`, `requires_approval`, `reconcile` or
    `approval_timeout` as for a local `@tool` (keyed by the name the model sees).

    Only a `trusted` server's annotations choose a tool's class: `readOnlyHint` is
    read_only, `idempotentHint` an idempotent write, anything else non_idempotent, and a
    `destructiveHint` tool needs approval unless `destructive_needs_approval=False` (or the
    tool's own setting) says otherwise. An untrusted server's tools are non_idempotent.
    """

    name: str
    transport: str  # "stdio" or "http"
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None
    cwd: str | None = None
    url: str | Callable[[], str] = ""
    headers: Headers | Mapping[str, str] | None = None
    trusted: bool = False
    timeout: float = 60.0
    connect_timeout: float = 30.0
    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    rename: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    destructive_needs_approval: bool = True
    # Only public addresses (outbound.py, the webhooks' policy), but for these hosts.
    public_only: bool = False
    allowed_hosts: tuple[str, ...] = ()

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        *,
        args: Iterable[str] = (),
        env: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server the worker starts as a child process (`command args...`), once per
        process, speaking MCP on its stdin/stdout; restarted when it dies. `env` (a dict,
        or a function returning one, read at each start) is added to the few variables the
        SDK passes on (PATH, HOME...): the worker's own environment is not inherited."""
        return cls(
            name=name, transport="stdio", command=command, args=tuple(args), env=env, cwd=cwd,
            **_options(name, options),
        )  # fmt: skip

    @classmethod
    def http(
        cls,
        name: str,
        url: str | Callable[[], str],
        *,
        headers: Headers | Mapping[str, str] | None = None,
        public_only: bool = False,
        allowed_hosts: Iterable[str] = (),
        **options: Any,
    ) -> MCPServer:
        """A streamable HTTP server at `url` (or a function returning it). `headers`: a dict,
        or a function of the run's owner (a user, or None) returning the headers of that
        owner's session (their own credentials): each set of headers has its own session.
        `public_only`: connect only to a public address, as webhooks do (the URL's host
        resolved and checked at each session's start, the connection pinned to a checked
        address, no proxy from the environment), unless the host is in `allowed_hosts`
        (names, addresses or networks): for a URL that a user or a tenant may choose."""
        if isinstance(allowed_hosts, str):
            allowed_hosts = (allowed_hosts,)
        return cls(
            name=name, transport="http", url=url, headers=headers, public_only=bool(public_only),
            allowed_hosts=tuple(allowed_hosts), **_options(name, options),
        )  # fmt: skip

    def __post_init__(self) -> None:
        if not self.name or not _TOOL_NAME.match(self.name):
            raise ConfigurationError(f"MCP server name {self.name!r}: letters, digits, _ and -")
        if self.transport == "stdio" and not self.command:
            raise ConfigurationError(f"MCP server {self.name}: a stdio server needs a command")
        if self.transport == "http" and not self.url:
            raise ConfigurationError(f"MCP server {self.name}: an HTTP server needs a url")
        if self.transport not in ("stdio", "http"):
            raise ConfigurationError(f"MCP server {self.name}: transport is stdio or http")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ConfigurationError(f"MCP server {self.name}: timeouts must be positive")
        for tool_name, override in self.tools.items():
            unknown = set(override) - _OVERRIDES
            if unknown:
                raise ConfigurationError(
                    f"MCP server {self.name}, tool {tool_name}: unknown setting(s) "
                    f"{sorted(unknown)}; a tool may set {sorted(_OVERRIDES)}"
                )
            if "side_effect" in override:
                try:
                    SideEffect(override["side_effect"])
                except ValueError:
                    raise ConfigurationError(
                        f"MCP server {self.name}, tool {tool_name}: side_effect must be one of "
                        f"{', '.join(SideEffect.values)}"
                    ) from None
                if override["side_effect"] == SideEffect.ATOMIC:
                    raise ConfigurationError(
                        f"MCP server {self.name}, tool {tool_name}: an MCP tool cannot be atomic "
                        "(it does not write through this database's transaction)"
                    )

    def env_now(self) -> dict[str, str] | None:
        found = self.env() if callable(self.env) else self.env
        return None if found is None else {str(k): str(v) for k, v in found.items()}

    def url_now(self) -> str:
        return self.url() if callable(self.url) else self.url

    def headers_for(self, owner: Any) -> dict[str, str]:
        """The HTTP headers of `owner`'s session (a user, or None)."""
        found = self.headers(owner) if callable(self.headers) else self.headers
        return {str(k): str(v) for k, v in (found or {}).items()}

    def model_name(self, remote: str) -> str | None:
        """The name the model sees for the server's tool `remote`; None: filtered out."""
        if self.include is not None and remote not in self.include:
            return None
        if remote in self.exclude:
            return None
        return self.rename.get(remote, remote)

    def record(self, listed: Mapping[str, Any]) -> dict[str, Any] | None:
        """What a run keeps of one listed tool (the wire form of MCP's Tool), or None when
        the filters leave it out: the definition the model sees, and its class and approval
        rule as the annotations (of a trusted server) and the host's settings make them."""
        remote = str(listed.get("name") or "")
        name = self.model_name(remote)
        if name is None:
            return None
        if not _TOOL_NAME.match(name):
            raise ConfigurationError(
                f"MCP server {self.name}: tool {remote!r} has a name the Messages API refuses; "
                "rename it (rename={...})"
            )
        override = self.tools.get(name, {})
        annotations = dict(listed.get("annotations") or {})
        side_effect, approval = classify(annotations, self.trusted, self.destructive_needs_approval)
        if "side_effect" in override:
            side_effect = SideEffect(override["side_effect"])
        schema = dict(listed.get("inputSchema") or {"type": "object"})
        schema.setdefault("type", "object")
        description = listed.get("description") or listed.get("title") or ""
        return {
            "server": self.name,
            "remote": remote,
            "definition": {"name": name, "description": description, "input_schema": schema},
            "side_effect": str(side_effect),
            # A function in the host's settings is asked per call; a bool is kept here.
            "requires_approval": approval
            if "requires_approval" not in override or callable(override["requires_approval"])
            else bool(override["requires_approval"]),
            "annotations": annotations,
        }


def classify(
    annotations: Mapping[str, Any], trusted: bool, destructive_needs_approval: bool = True
) -> tuple[SideEffect, bool]:
    """(side-effect class, needs approval) of a tool from its MCP annotations: only a
    trusted server's hints count (MCP: clients never decide on an untrusted server's)."""
    if not trusted:
        return SideEffect.NON_IDEMPOTENT, False
    if annotations.get("readOnlyHint"):
        return SideEffect.READ_ONLY, False
    # MCP's default for destructiveHint (of a tool that is not read-only) is true: a write
    # the server does not say is harmless (destructiveHint: false) may destroy, and waits
    # for a person unless the host says otherwise (destructive_needs_approval, tools=).
    approval = bool(annotations.get("destructiveHint", True)) and destructive_needs_approval
    if annotations.get("idempotentHint"):
        return SideEffect.IDEMPOTENT_WRITE, approval
    return SideEffect.NON_IDEMPOTENT, approval


def _options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    allowed = {
        "trusted", "timeout", "connect_timeout", "include", "exclude", "rename", "tools",
        "destructive_needs_approval",
    }  # fmt: skip
    unknown = set(options) - allowed
    if unknown:
        raise ConfigurationError(f"MCP server {name}: unknown option(s) {sorted(unknown)}")
    out = dict(options)
    for key in ("timeout", "connect_timeout"):
        if isinstance(out.get(key), timedelta):
            out[key] = out[key].total_seconds()
    if out.get("include") is not None:
        out["include"] = frozenset(out["include"])
    if "exclude" in out:
        out["exclude"] = frozenset(out["exclude"])
    if "rename" in out:
        out["rename"] = dict(out["rename"])
    if "tools" in out:
        out["tools"] = {k: dict(v) for k, v in out["tools"].items()}
    return out
