"""The live streams in the OpenAPI document: they are plain async views (api/streams.py),
which drf-spectacular does not see, so a postprocessing hook describes them."""

from __future__ import annotations

from typing import Any

from .stream_formats import FORMATS


def document_streams(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the streams are plain async views, which it does
    not see; describe `runs/{id}/stream/` next to `runs/{id}/` (and the same for
    conversations), wherever the API is mounted."""
    paths = result.get("paths", {})
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path in [p for p in paths if p.endswith("/runs/{id}/")]:
        paths[f"{path}stream/"] = {"get": _stream_operation(error)}
    for path in [p for p in paths if p.endswith("/conversations/{id}/")]:
        paths[f"{path}stream/"] = {"get": _conversation_operation(error)}
    return result


def _conversation_operation(error: dict[str, Any]) -> dict[str, Any]:
    op = _stream_operation(error)
    op.update(
        operationId="conversations_stream_retrieve",
        summary="A conversation's live stream (Server-Sent Events)",
        description=(
            "The stream of each run of the conversation in order, following it from run to "
            "run (a message queued or interrupting continues on it). Durable events carry "
            "`run` and `position`, and `id:` = `<position>-<seq>` (resume with "
            "`Last-Event-ID` or `after`). In `ai-sdk`, each run is one assistant message. "
            "Ends when every run rests; 204 when they rest and nothing follows the cursor."
        ),
        tags=["conversations"],
    )
    op["parameters"][2] = {"name": "after", "in": "query", "schema": {"type": "string"}}
    op["responses"]["400"] = {
        "description": "A cursor that is not `<position>-<seq>` (`invalid`).",
        "content": error,
    }
    op["responses"]["404"]["description"] = "No such conversation among those you may see."
    return op


def _stream_operation(error: dict[str, Any]) -> dict[str, Any]:
    def failed(text: str) -> dict[str, Any]:
        return {"description": text, "content": error}

    return {
        "operationId": "runs_stream_retrieve",
        "summary": "A run's live stream (Server-Sent Events)",
        "description": (
            "Durable events with `id:` = their seq (resume with `Last-Event-ID` or `after`), "
            "the model's deltas as it writes (not durable: a reconnect gets the current turn's "
            "again from its start), a keep-alive comment every 15 s. `format=events` (this "
            "app's events) or `ai-sdk` (the Vercel AI SDK's UI message stream, v1), or by "
            "`Accept`. Ends when the run rests; 204 when it rests and nothing follows the "
            "cursor. Ends early, with `event: reconnect`, after AGENTRUN_STREAM_MAX_SECONDS or "
            "for a client that does not read (reconnect with the cursor); ends at once when "
            "the user may no longer see the run (checked every AGENTRUN_STREAM_RECHECK_SECONDS). "
            "Serve it under ASGI."
        ),
        "tags": ["runs"],
        "parameters": [
            {
                "name": "id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "format": "uuid"},
            },
            {"name": "format", "in": "query", "schema": {"type": "string", "enum": list(FORMATS)}},
            {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
            {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
        ],
        "responses": {
            "200": {
                "description": "The stream.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            "204": {"description": "The run rests and nothing follows the cursor."},
            "400": failed("A cursor that is not a seq (`invalid`)."),
            "401": failed("Not authenticated, with the first authentication class's challenge."),
            "403": failed("Not authenticated (no challenge)."),
            "404": failed("No such run among those you may see (`not_found`)."),
            "429": failed(
                "The user holds AGENTRUN_STREAM_MAX_PER_USER open streams already (`throttled`)."
            ),
            "406": failed(
                "An unknown `format` or an `Accept` without a stream (`not_acceptable`)."
            ),
        },
    }
