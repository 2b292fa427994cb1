"""What the real Messages API refuses, checked the way it checks (same error shapes and,
where known, the same wording)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from . import cache, history, options, servertools, system_messages, thinking
from .script import ERROR_TYPES, text

_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
# "Must match the regex ^[a-zA-Z0-9_-]{1,64}$" (Define tools,
# https://platform.claude.com/docs/en/agents-and-tools/tool-use/define-tools).
_TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


# Top-level request keys the real API knows; anything else is "Extra inputs are not permitted".
_KNOWN_PARAMS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "stream",
        "metadata",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "thinking",
        "service_tier",
        "container",
        "mcp_servers",
        "context_management",
        "output_config",
        "inference_geo",
        "speed",
        "cache_control",
        "diagnostics",
    }
)
_BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
        "mcp_tool_use",
        "mcp_tool_result",
        "mcp_tool_listing",
        "tool_reference",
        "compaction",
    }
)


class APIRequestError(Exception):
    """A request the API would refuse: `status`, `error_type` and `message` as it answers them."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ERROR_TYPES.get(status, "api_error")
        self.details = details


def invalid(message: str) -> APIRequestError:
    return APIRequestError(400, message)


def _content_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [text(content)] if content else []
    return content


def _check_cache_control(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise invalid(f"{where}.cache_control.type: Input should be 'ephemeral'")
    if value.get("ttl") not in (None, "5m", "1h"):
        raise invalid(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")


def _check_block(block: Any, where: str, role: str) -> None:
    """Validate one content block (how many cache breakpoints a request has, and where, is
    cache.breakpoint_problem's)."""
    if not isinstance(block, dict):
        raise invalid(f"{where}: Input should be a valid dictionary or object")
    kind = block.get("type")
    if kind not in _BLOCK_TYPES:
        raise invalid(
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the expected tags"
        )
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise invalid(f"{where}.text: Field required")
        if not block["text"]:
            raise invalid("messages: text content blocks must be non-empty")
        if not block["text"].strip():
            # The API's wording as clients quote it (third-party: continuedev/continue#11446);
            # no official page states the rule.
            raise invalid("messages: text content blocks must contain non-whitespace text")
    elif kind == "tool_use":
        if role != "assistant":
            raise invalid(f"{where}: `tool_use` blocks can only be in `assistant` messages")
        tool_id = block.get("id")
        if not isinstance(tool_id, str) or not _ID_PATTERN.match(tool_id):
            raise invalid(f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
        if not isinstance(block.get("name"), str) or not block["name"]:
            raise invalid(f"{where}.tool_use.name: Field required")
        if not isinstance(block.get("input"), dict):
            raise invalid(f"{where}.tool_use.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if role != "user":
            raise invalid(f"{where}: `tool_result` blocks can only be in `user` messages")
        if not isinstance(block.get("tool_use_id"), str):
            raise invalid(f"{where}.tool_result.tool_use_id: Field required")
        if "is_error" in block and not isinstance(block["is_error"], bool):
            raise invalid(f"{where}.tool_result.is_error: Input should be a valid boolean")
        inner = block.get("content")
        if isinstance(inner, list):
            for k, item in enumerate(inner):
                if not isinstance(item, dict) or item.get("type") not in {
                    "text",
                    "image",
                    "document",
                    "search_result",
                    "tool_reference",
                }:
                    raise invalid(f"{where}.tool_result.content.{k}: Input should be a valid block")
                _check_block(item, f"{where}.tool_result.content.{k}", "user")
        elif inner is not None and not isinstance(inner, str):
            raise invalid(f"{where}.tool_result.content: Input should be a valid list or string")
    elif kind in ("image", "document"):
        _check_download(block.get("source"))
    elif kind in ("thinking", "redacted_thinking"):
        if role != "assistant":
            raise invalid(f"{where}: `{kind}` blocks can only be in `assistant` messages")
        for key in ("thinking", "signature") if kind == "thinking" else ("data",):
            if not isinstance(block.get(key), str):
                raise invalid(f"{where}.{kind}.{key}: Field required")
    _check_cache_control(block.get("cache_control"), where)


def _check_download(source: Any) -> None:
    """The real API downloads a URL source when it reads the request, and answers 400 when
    it cannot. This server has no network: it takes every URL as reachable except those
    under the reserved `.invalid` domain (RFC 2606), which never resolve."""
    if not isinstance(source, dict) or source.get("type") != "url":
        return
    host = urlsplit(str(source.get("url", ""))).hostname or ""
    if host == "invalid" or host.endswith(".invalid"):
        raise invalid("Unable to download the file")


def validate_request(body: Any, betas: set[str] | None = None) -> None:
    """Raise APIRequestError for a body the real Messages API would reject.

    Usable without the server, e.g. by an in-process fake model client. `betas`: the
    request's anthropic-beta header values (None: not checked).
    """
    try:
        _validate(body, betas)
    except servertools.Refusal as exc:
        raise invalid(str(exc)) from None


def _validate(body: Any, betas: set[str] | None) -> None:
    """The checks in the API's order: the first refusal is the one it answers."""
    _check_fields(body)
    _check_sampling(body)
    _check_metadata(body.get("metadata"))
    # Server tools as declared (their types and names) before what the model accepts.
    declared = servertools.check_tools(body)
    problem = options.problem(body)
    if problem:
        raise invalid(problem)
    # Automatic caching: a top-level cache_control (it takes one of the breakpoints).
    _check_cache_control(body.get("cache_control"), "cache_control")
    servertools.check_context_management(body, betas)
    servertools.check_mcp_beta(body, betas)
    _check_system(body.get("system"))
    tool_names = _check_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), tool_names)
    parsed = _parse_messages(body["messages"])
    problem = system_messages.problem(body, parsed)
    if problem:
        raise invalid(problem)
    problem = cache.breakpoint_problem(body) or history.prefill_problem(body, parsed)
    if problem:
        raise invalid(problem)
    # Server tool blocks are the request's server tools, each answered in its own message.
    servertools.check_messages(body, parsed, declared)
    _check_thinking(body, parsed)
    if not body.get("tools") and any(
        b.get("type") in ("tool_use", "tool_result") for _, blocks in parsed for b in blocks
    ):
        raise invalid(
            "Requests which include `tool_use` or `tool_result` blocks must define tools."
        )
    _check_results_answer_uses(parsed)
    _check_uses_answered(parsed)


def _check_fields(body: Any) -> None:
    """The body is an object of known fields, with a model, max_tokens and messages."""
    if not isinstance(body, dict):
        raise invalid("Input should be a valid dictionary")
    for key in body:
        if key not in _KNOWN_PARAMS:
            raise invalid(f"{key}: Extra inputs are not permitted")
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise invalid(f"{key}: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise invalid("model: Input should be a valid string")
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise invalid("max_tokens: Input should be a valid integer")
    if max_tokens < 0:  # 0 fills the prompt cache, no answer (catalog RULES max_tokens_zero)
        raise invalid("max_tokens: Input should be greater than or equal to 0")
    if max_tokens == 0:
        _check_prewarm(body)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise invalid("stream: Input should be a valid boolean")


def _check_prewarm(body: dict[str, Any]) -> None:
    """A `max_tokens: 0` request (pre-warming the cache) "is rejected with an
    invalid_request_error if any of the following are set, since each implies output that a
    zero-token budget cannot produce": stream, thinking enabled, output_config.format, a
    forced tool_choice (Prompt caching, "Pre-warming the cache", Limitations,
    https://platform.claude.com/docs/en/build-with-claude/prompt-caching). The wording is
    the stand-in's (UNSOURCED)."""
    thinking = body.get("thinking")
    output = body.get("output_config")
    choice = body.get("tool_choice")
    found = [
        name
        for name, present in (
            ("stream: true", body.get("stream") is True),
            (
                'thinking.type "enabled"',
                isinstance(thinking, dict) and thinking.get("type") == "enabled",
            ),
            ("output_config.format", isinstance(output, dict) and output.get("format") is not None),
            (
                "a forced tool_choice",
                isinstance(choice, dict) and choice.get("type") in ("any", "tool"),
            ),
        )
        if present
    ]
    if found:
        raise invalid(f"max_tokens: 0 cannot be combined with {found[0]}: it writes no output")


def _check_sampling(body: dict[str, Any]) -> None:
    """temperature, top_p, top_k and stop_sequences, as values (what a model accepts of
    them is options.problem's)."""
    for key, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise invalid(f"{key}: Input should be a valid number")
            if not low <= value <= high:
                raise invalid(f"{key}: Input should be between {low:g} and {high:g}")
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise invalid("top_k: Input should be a non-negative integer")
    stop_sequences = body.get("stop_sequences")
    if stop_sequences is not None and (
        not isinstance(stop_sequences, list) or not all(isinstance(s, str) for s in stop_sequences)
    ):
        raise invalid("stop_sequences: Input should be a valid list of strings")


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise invalid("metadata: Input should be a valid dictionary")
    for key in metadata:
        if key != "user_id":
            raise invalid(f"metadata.{key}: Extra inputs are not permitted")
    user_id = metadata.get("user_id")
    if user_id is not None and (not isinstance(user_id, str) or len(user_id) > 256):
        raise invalid("metadata.user_id: String should have at most 256 characters")


def _check_system(system: Any) -> None:
    """A string, or a list of non-empty text blocks."""
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise invalid("system: Input should be a valid string or list")
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"system.{j}.type: Input should be 'text'")
        if not isinstance(block.get("text"), str) or not block["text"]:
            raise invalid("system: text content blocks must be non-empty")
        _check_cache_control(block.get("cache_control"), f"system.{j}")


def _check_tools(tools: Any) -> list[str]:
    """The tools' names (unique), each custom tool with an object schema (a strict one
    within what strict schemas allow); server tools were checked before."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid("tools: Input should be a valid list")
    names: list[str] = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools.{j}: Input should be a valid dictionary")
        name = tool.get("name")
        if tool.get("type") == "mcp_toolset":  # named by its server (servertools checked it)
            _check_cache_control(tool.get("cache_control"), f"tools.{j}")
            continue
        if tool.get("type") in (None, "custom"):
            _check_custom_tool(tool, j)
        elif not isinstance(name, str) or not name:
            raise invalid(f"tools.{j}.name: Field required")
        names.append(name)
        _check_cache_control(tool.get("cache_control"), f"tools.{j}")
    if len(set(names)) != len(names):
        raise invalid("tools: Tool names must be unique.")
    return names


def _check_custom_tool(tool: dict[str, Any], j: int) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not _TOOL_NAME_PATTERN.match(name):
        raise invalid(
            f"tools.{j}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        )
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise invalid(f"tools.{j}.custom.input_schema: Field required")
    if schema.get("type", "object") != "object":
        raise invalid(f"tools.{j}.custom.input_schema.type: Input should be 'object'")
    if "strict" in tool and not isinstance(tool["strict"], bool):
        raise invalid(f"tools.{j}.custom.strict: Input should be a valid boolean")
    if tool.get("strict"):
        problem = options.schema_problem(schema, f"tools.{j}.custom.input_schema")
        if problem:
            raise invalid(problem)


def _check_tool_choice(tool_choice: Any, tool_names: list[str]) -> None:
    """auto, any, none, or a tool the request defines."""
    if tool_choice is None:
        return
    if not isinstance(tool_choice, dict) or tool_choice.get("type") not in (
        "auto",
        "any",
        "tool",
        "none",
    ):
        raise invalid(
            "tool_choice: Input tag found using 'type' does not match any of the expected "
            "tags: 'auto', 'any', 'tool', 'none'"
        )
    if tool_choice["type"] == "tool":
        name = tool_choice.get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice.tool.name: Field required")
        if name not in tool_names:
            raise invalid(f"tool_choice.name: Tool '{name}' not found in tools")
    if "disable_parallel_tool_use" in tool_choice and not isinstance(
        tool_choice["disable_parallel_tool_use"], bool
    ):
        raise invalid(
            f"tool_choice.{tool_choice['type']}.disable_parallel_tool_use: "
            "Input should be a valid boolean"
        )


def _parse_messages(messages: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each message's role and content blocks, each block checked; the first from the user."""
    if not isinstance(messages, list):
        raise invalid("messages: Input should be a valid list")
    if not messages:
        raise invalid("messages: at least one message is required")
    parsed: list[tuple[str, list[dict[str, Any]]]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages.{i}: Input should be a valid dictionary")
        for key in message:
            if key not in ("role", "content"):
                raise invalid(f"messages.{i}.{key}: Extra inputs are not permitted")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise invalid(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'")
        if "content" not in message:
            raise invalid(f"messages.{i}.content: Field required")
        content = message["content"]
        if not isinstance(content, str | list):
            raise invalid(f"messages.{i}.content: Input should be a valid list")
        blocks = _content_blocks(content)
        for j, block in enumerate(blocks):
            found = system_messages.block_problem(block, f"messages.{i}.content.{j}")
            if role == "system" and found:
                raise invalid(found)
            _check_block(block, f"messages.{i}.content.{j}", role)
        is_final_assistant = i == len(messages) - 1 and role == "assistant"
        if not blocks and not is_final_assistant:
            raise invalid(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        parsed.append((role, blocks))
    if parsed[0][0] != "user":
        raise invalid('messages: first message must use the "user" role')
    return parsed


def _check_thinking(body: dict[str, Any], parsed: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Thinking blocks come back unchanged, under the system prompt and tools they were made
    under (thinking.py): a changed block or prefix is refused."""
    for i, (_role, blocks) in enumerate(parsed):
        for j, block in enumerate(blocks):
            if block["type"] in ("thinking", "redacted_thinking") and not thinking.valid(
                body, block, i
            ):
                field = "signature" if block["type"] == "thinking" else "data"
                raise invalid(
                    f"messages.{i}.content.{j}: Invalid `{field}` in `{block['type']}` block. "
                    + thinking.BOUND
                )


def _check_results_answer_uses(parsed: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Every tool_result answers a tool_use of the assistant message just before it."""
    for i, (role, blocks) in enumerate(parsed):
        if role != "user":
            continue
        expected: set[str] = set()
        if i > 0 and parsed[i - 1][0] == "assistant":
            expected = {b["id"] for b in parsed[i - 1][1] if b["type"] == "tool_use"}
        for j, block in enumerate(blocks):
            if block["type"] == "tool_result" and block["tool_use_id"] not in expected:
                raise invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block['tool_use_id']}. Each `tool_result` block "
                    "must have a corresponding `tool_use` block in the previous message."
                )


def _check_uses_answered(parsed: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Every tool_use (ids unique across the messages) is answered, first thing, by the
    next (user) message."""
    seen_ids: set[str] = set()
    for i, (role, blocks) in enumerate(parsed):
        if role != "assistant":
            continue
        ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if not ids:
            continue
        if len(set(ids)) != len(ids) or seen_ids & set(ids):
            raise invalid(f"messages.{i}: `tool_use` ids must be unique")
        seen_ids.update(ids)
        following = parsed[i + 1] if i + 1 < len(parsed) else None
        answered: set[str] = set()
        leading = 0
        if following is not None and following[0] == "user":
            answered = {b["tool_use_id"] for b in following[1] if b["type"] == "tool_result"}
            for block in following[1]:
                if block["type"] != "tool_result":
                    break
                leading += 1
        missing = [tool_id for tool_id in ids if tool_id not in answered]
        if missing:
            raise invalid(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        if leading < len(ids):
            raise invalid(
                f"messages.{i + 1}: Did not find {len(ids)} `tool_result` block(s) at the "
                "beginning of this message. Messages following `tool_use` blocks must begin "
                "with a matching number of `tool_result` blocks."
            )
