"""The @tool decorator, the ToolContext handed to handlers, and Reconciliation."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import signal
import subprocess
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pydantic

from . import children
from .abort import AbortSignal
from .exceptions import ConfigurationError, ToolCancelled, ToolError
from .side_effects import MEANINGS
from .states import SideEffect

logger = logging.getLogger(__name__)


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace (what argument hashes are taken of)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def arguments_hash(name: str, arguments: Any) -> str:
    # surrogatepass: arguments may hold undecodable bytes (lone surrogates), stored faithfully.
    text = f"{name}\n{canonical_json(arguments)}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class ToolArgumentsError(ToolError):
    """The arguments do not match the tool's input schema."""

    code = "invalid_arguments"


@dataclass(frozen=True)
class Reconciliation:
    """What a tool's reconcile check found about a call whose outcome is unknown."""

    status: str
    result: Any = None
    reason: str = ""

    @classmethod
    def done(cls, result: Any) -> Reconciliation:
        """The effect happened: record `result` as the call's result."""
        return cls("done", result=result)

    @classmethod
    def not_done(cls) -> Reconciliation:
        """The effect did not happen: one new attempt is allowed."""
        return cls("not_done")

    @classmethod
    def unknown(cls, reason: str) -> Reconciliation:
        """Cannot tell: a person decides."""
        return cls("unknown", reason=reason)


class ToolContext:
    """What a handler knows about the call it executes, and how it cooperates."""

    def __init__(
        self,
        *,
        run_id: Any,
        tool_call_id: str,
        idempotency_key: str,
        attempt: int,
        tool_name: str = "",
        abort: AbortSignal | None = None,
        heartbeat: Callable[[], None] | None = None,
        grace_seconds: float | None = None,
        holder: str = "",
    ) -> None:
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self.tool_name = tool_name
        self.abort = abort or AbortSignal()
        self._heartbeat = heartbeat
        self._grace_seconds = grace_seconds
        self._holder = holder  # the lease holder's identity, marked on child processes

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop: finish quickly or raise ToolCancelled."""
        return self.abort.aborted

    def raise_if_cancelled(self) -> None:
        if self.abort.aborted:
            raise ToolCancelled(f"Tool {self.tool_name} cancelled: {self.abort.reason}")

    def heartbeat(self) -> None:
        """Tell the runtime this long handler is alive."""
        if self._heartbeat is not None:
            self._heartbeat()

    def run_subprocess(
        self,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        grace_seconds: float | None = None,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess:
        """Run a child process in its own process group; on cancel, SIGTERM it, then SIGKILL.

        Output is captured (text) unless `stdout`/`stderr` are given. Raises
        ToolCancelled when the run is cancelled, subprocess.TimeoutExpired on timeout.
        The child dies with the worker (see django_agentrun.children): a run is never
        recovered while something its dead worker started may still have an effect.
        """
        from .conf import agentrun_settings

        grace = grace_seconds if grace_seconds is not None else self._grace_seconds
        if grace is None:
            grace = agentrun_settings.CANCEL_GRACE_SECONDS
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        self.raise_if_cancelled()
        proc = children.spawn(args, self._holder, **kwargs)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                try:
                    stdout, stderr = proc.communicate(timeout=0.1)
                    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
                except subprocess.TimeoutExpired:
                    pass
                if self.abort.aborted:
                    _terminate_group(proc, grace)
                    raise ToolCancelled(f"Subprocess {args[0]!r} stopped: {self.abort.reason}")
                if deadline is not None and time.monotonic() > deadline:
                    _terminate_group(proc, grace)
                    raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        finally:
            if proc.poll() is None:  # an unexpected exception: never leave the child behind
                _terminate_group(proc, 0)
            children.forget(proc)


def _terminate_group(proc: subprocess.Popen, grace: float) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: grandchildren too
    except ProcessLookupError:
        pass
    proc.wait()


ApprovalPolicy = bool | Callable[[dict[str, Any], Any], bool]

# A tool's name as the Messages API takes it: "Must match the regex ^[a-zA-Z0-9_-]{1,64}$"
# (Define tools, https://platform.claude.com/docs/en/agents-and-tools/tool-use/define-tools).
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Tool:
    """What the engine knows of a tool the model may call, and how it runs one call. Two
    implementations: `FunctionTool` (a typed Python function, made by `@tool`) and
    `mcp.MCPTool` (an MCP server's tool, as a run's snapshot recorded it). Each gives its
    input schema, validates arguments, invokes the call and its reconcile check; the rest
    (the definition the model sees, the approval rule, batching, what its side-effect class
    means: side_effects.MEANINGS) is decided here, once.

    `Tool(func, ...)` makes a FunctionTool, as it always did."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Tool:
        return super().__new__(FunctionTool if cls is Tool else cls)

    def __init__(
        self,
        *,
        name: str,
        description: str = "",
        side_effect: SideEffect | str | None = None,
        reconcile: Callable[..., Reconciliation] | None = None,
        requires_approval: ApprovalPolicy = False,
        approval_timeout: timedelta | None = None,
    ) -> None:
        self.name = name
        self.description = description
        # Undeclared is treated as the one class that is never re-run blindly after a
        # crash; `manage.py check` lists such tools (agentrun.W005).
        self.side_effect_declared = side_effect is not None
        try:
            self.side_effect = SideEffect(
                SideEffect.NON_IDEMPOTENT if side_effect is None else side_effect
            )
        except ValueError:
            raise ConfigurationError(
                f"Tool {self.name}: side_effect must be one of {', '.join(SideEffect.values)}"
            ) from None
        if not TOOL_NAME.match(self.name):
            raise ConfigurationError(
                f"Tool {self.name!r}: a tool's name is 1 to 64 letters, digits, _ or - (the "
                "Messages API refuses any other); name it with @tool(name=...)"
            )
        self.meaning = MEANINGS[self.side_effect]  # what its class means (side_effects.py)
        self.reconcile = reconcile
        self.requires_approval = requires_approval
        self.approval_timeout = approval_timeout

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.side_effect})>"

    # -- what each implementation gives ------------------------------------------------

    def input_schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Canonical, validated arguments, or ToolArgumentsError with a message for the model."""
        raise NotImplementedError

    def invoke(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        """Run one call (its validated arguments); its result content, or ToolError."""
        raise NotImplementedError

    def invoke_reconcile(self, ctx: ToolContext, arguments: dict[str, Any]) -> Reconciliation:
        """Run the reconcile check (`reconcile` is set) for a call whose outcome is unknown."""
        raise NotImplementedError

    # -- decided once for every tool ---------------------------------------------------

    def definition(self) -> dict[str, Any]:
        """The tool as the Messages API declares it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema(),
        }

    @property
    def in_transaction(self) -> bool:
        """Its handler runs inside the transaction that records its result (atomic)."""
        return self.meaning.in_transaction

    def needs_approval(self, arguments: dict[str, Any], run: Any) -> bool:
        policy = self.requires_approval
        return bool(policy(arguments, run) if callable(policy) else policy)

    def runs_together(self, arguments: dict[str, Any], run: Any, approved: bool) -> bool:
        """Whether a call of this tool may run at once with the turn's other such calls (a
        batch): its class is safe to run again (side_effects.MEANINGS), and it needs no
        approval."""
        if not self.meaning.batches:
            return False
        try:
            return approved or not self.needs_approval(arguments, run)
        except Exception:  # noqa: BLE001 - it runs alone then, where the failure is met
            return False

    @staticmethod
    def _checked(found: Any, name: str) -> Reconciliation:
        if not isinstance(found, Reconciliation):
            raise ToolError(f"Reconcile check of {name} must return a Reconciliation")
        return found


class FunctionTool(Tool):
    """A plain function the model may call; see `tool()`."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        side_effect: SideEffect | str | None = None,
        reconcile: Callable[..., Reconciliation] | None = None,
        requires_approval: ApprovalPolicy = False,
        approval_timeout: timedelta | None = None,
    ) -> None:
        self.func = func
        super().__init__(
            name=name or func.__name__,
            description=(description or inspect.getdoc(func) or "").strip(),
            side_effect=side_effect,
            reconcile=reconcile,
            requires_approval=requires_approval,
            approval_timeout=approval_timeout,
        )
        self.takes_ctx, self.input_model = _input_model(func, self.name)
        if reconcile is not None:
            self.reconcile_takes_ctx = _takes_ctx(reconcile)

    def __repr__(self) -> str:
        return f"<Tool {self.name} ({self.side_effect})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def input_schema(self) -> dict[str, Any]:
        schema = self.input_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                f"Tool {self.name} expects a JSON object of arguments, got {type(arguments).__name__}."
            )
        try:
            model = self.input_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors(include_url=False, include_input=False)
            )
            raise ToolArgumentsError(
                f"Invalid arguments for tool {self.name}: {problems}"
            ) from None
        return model.model_dump(mode="json")

    def invoke(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        kwargs = self._python_kwargs(arguments)
        return self.func(ctx, **kwargs) if self.takes_ctx else self.func(**kwargs)

    def invoke_reconcile(self, ctx: ToolContext, arguments: dict[str, Any]) -> Reconciliation:
        assert self.reconcile is not None
        kwargs = self._python_kwargs(arguments)
        found = (
            self.reconcile(ctx, **kwargs) if self.reconcile_takes_ctx else self.reconcile(**kwargs)
        )
        return self._checked(found, self.name)

    def _python_kwargs(self, arguments: dict[str, Any]) -> dict[str, Any]:
        # Re-validate so handlers get typed values (nested models, dates) rather than JSON.
        model = self.input_model.model_validate(arguments)
        return {name: getattr(model, name) for name in type(model).model_fields}


def batch(
    calls: Sequence[Any], first: Any, tool_of: Callable[[str], Tool | None], run: Any
) -> list:
    """`first` and the requested calls after it among `calls` (a turn's, in the model's
    order, up to one that may not) when each may run at once with the others
    (`Tool.runs_together`), and AGENTRUN_TOOL_CONCURRENCY allows it; else `first` alone."""
    from .conf import agentrun_settings

    together: list[Any] = []
    for call in calls[next(i for i, c in enumerate(calls) if c is first) :]:
        tool = tool_of(call.name)
        if call.state != "requested" or tool is None:
            break
        if not tool.runs_together(call.arguments, run, call.approved):
            break
        together.append(call)
    if len(together) > 1 and agentrun_settings.TOOL_CONCURRENCY > 1:
        return together
    return [first]


def _takes_ctx(func: Callable[..., Any]) -> bool:
    params = list(inspect.signature(func).parameters.values())
    if not params:
        return False
    first = params[0]
    if first.name == "ctx":
        return True
    hints = typing.get_type_hints(func)
    return hints.get(first.name) is ToolContext


def _input_model(func: Callable[..., Any], name: str) -> tuple[bool, type[pydantic.BaseModel]]:
    takes_ctx = _takes_ctx(func)
    hints = typing.get_type_hints(func)
    fields: dict[str, Any] = {}
    params = list(inspect.signature(func).parameters.values())
    for param in params[1:] if takes_ctx else params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"Tool {name}: *args/**kwargs cannot be described to the model"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = pydantic.create_model(
        f"{name}_input",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return takes_ctx, model


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effect: SideEffect | str | None = None,
    reconcile: Callable[..., Reconciliation] | None = None,
    requires_approval: ApprovalPolicy = False,
    approval_timeout: timedelta | None = None,
) -> Any:
    """Turn a typed function into a tool; its docstring is the description the model sees.

    Declare `side_effect`: without it the tool counts as non_idempotent (never re-run
    after a crash without a reconcile check or a person)."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return FunctionTool(
            f,
            name=name,
            description=description,
            side_effect=side_effect,
            reconcile=reconcile,
            requires_approval=requires_approval,
            approval_timeout=approval_timeout,
        )

    return wrap(func) if func is not None else wrap
