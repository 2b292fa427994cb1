"""The fields the API's serializers share: states as schema enums, text a database can
store, JSON objects, a run's input."""

from __future__ import annotations

from typing import Any

from django.db.models import TextChoices
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..parsers import text_problem


class StateField(serializers.CharField):
    """A read-only state, shown in the schema as its own enum component (RunState...):
    runs, turns and tool calls all name the field `state`, so enums named after the
    field would collide."""

    def __init__(self, choices: type[TextChoices], **kwargs: Any) -> None:
        self.state_choices = choices
        super().__init__(read_only=True, **kwargs)


class StateFieldExtension(OpenApiSerializerFieldExtension):
    target_class = StateField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        choices = self.target.state_choices
        component = ResolvedComponent(
            name=choices.__name__,
            type=ResolvedComponent.SCHEMA,
            object=choices,
            schema={"type": "string", "enum": list(choices.values)},
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


def _storable(value: str) -> None:
    problem = text_problem(value)
    if problem is not None:
        raise serializers.ValidationError(problem)


class StorableCharField(serializers.CharField):
    """A request's text field: it goes to a text column, which cannot hold NUL or unpaired
    surrogates on every database (JSON fields can: docs/explanation/durability.md)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(_storable)


def json_problem(value: Any) -> str | None:
    """Where a JSON value holds a string (a key included) a text column could not hold,
    and why; None when it holds none. Iterative: the parser bounds the depth."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{path or 'the value'}: {problem}" if path else problem
        elif isinstance(item, dict):
            for key, child in item.items():
                problem = text_problem(key)
                if problem is not None:
                    return f"the key {key.encode('unicode_escape').decode()!r}: {problem}"
                stack.append((child, f"{path}[{key!r}]"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


class StorableJSONField(serializers.JSONField):
    """A request's JSON value: no NUL and no unpaired surrogate in any string, keys
    included. Stored values may hold them (tool output: docs/explanation/durability.md); what people
    send does not, so every screen that shows it can."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        problem = json_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


@extend_schema_field(OpenApiTypes.OBJECT)
class ObjectField(StorableJSONField):
    """A JSON object."""

    default_error_messages = {"not_an_object": "Must be a JSON object."}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_an_object")
        return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "object"}},
        ]
    }
)
class RunInputField(StorableJSONField):
    """A string or a list of content blocks (checked by `services.start_run`)."""
