"""What every view of the API carries itself, whatever the host's REST_FRAMEWORK says:
its parser, renderers, error handler and schema class."""

from __future__ import annotations

import json
from typing import Any

from django.apps import apps
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.settings import api_settings

from .errors import exception_handler
from .parsers import StrictJSONParser
from .schema import AgentRunSchema


class StorableJSONRenderer(JSONRenderer):
    """DRF's JSON renderer, which also renders what JSON values may hold here: text with
    unpaired surrogates (undecodable bytes a tool returned, stored faithfully) cannot be
    UTF-8, so such a response escapes its non-ASCII characters (`\\udcff`) instead."""

    def render(self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            text = json.dumps(data, cls=self.encoder_class, ensure_ascii=True, allow_nan=False)
            return text.encode()


class StorableBrowsableAPIRenderer(BrowsableAPIRenderer):
    """DRF's browsable API, showing the content as StorableJSONRenderer renders it (DRF
    would take the first of the view's `renderer_classes`: the host's plain JSON renderer,
    which fails on an unpaired surrogate, a 500 for every user who can see the run)."""

    def get_default_renderer(self, view: Any) -> BaseRenderer:
        return StorableJSONRenderer()


def api_renderers() -> list[BaseRenderer]:
    """JSON always; the browsable API when its templates and static files are there
    (`rest_framework` installed) and the host has not turned it off in its defaults."""
    renderers: list[BaseRenderer] = [StorableJSONRenderer()]
    browsable = any(
        issubclass(cls, BrowsableAPIRenderer) for cls in api_settings.DEFAULT_RENDERER_CLASSES
    )
    if browsable and apps.is_installed("rest_framework"):
        renderers.append(StorableBrowsableAPIRenderer())
    return renderers


class FormatNegotiation(DefaultContentNegotiation):
    """An unknown `?format=` is a 406 like an unknown Accept header (DRF: a bare 404)."""

    def filter_renderers(self, renderers: list[BaseRenderer], format: str) -> list[BaseRenderer]:
        kept = [renderer for renderer in renderers if renderer.format == format]
        if not kept:
            formats = ", ".join(sorted({str(r.format) for r in renderers}))
            raise NotAcceptable(f"Unknown format {format!r}; one of {formats}.")
        return kept


class AgentRunAPIView:
    """Mixin of the API's views (and only theirs: the schema lists exactly these)."""

    parser_classes = [StrictJSONParser]
    content_negotiation_class = FormatNegotiation
    # The host's default filter backends would filter (and reorder) these querysets.
    filter_backends: list[Any] = []
    schema = AgentRunSchema()

    def get_renderers(self) -> list[BaseRenderer]:
        return api_renderers()

    def get_exception_handler(self) -> Any:
        return exception_handler


def this_api_only(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: keep the endpoints of this API, wherever mounted."""
    return [
        (path, regex, method, callback)
        for path, regex, method, callback in endpoints
        if issubclass(getattr(callback, "cls", object), AgentRunAPIView)
    ]
