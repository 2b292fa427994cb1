"""Values written once, in the event that records them (issue #38): a turn's content is the
`content` of its model_response event's payload. The row names that event by its seq (the
`*_seq` column) instead of keeping a copy of its own; a row written before migration
0020_content_once keeps the value inline, in the column itself (the seq NULL), and a row
no event describes (made directly through the ORM) does the same.

In memory the value is the model's attribute as before (`turn.content`): what writes it
puts NULL in the column when the seq is set (`RecordedField.pre_save`; the Postgres store's
JSON rows likewise), and what reads rows fills it from the event:

- the ORM: the model's default and base manager annotate every queryset with the event's
  value (`recorded`: one correlated subquery, a lookup of the run's event row by the
  unique (run, seq) index), which lands in the attribute through `filled_from`;
- the claim's own statements (queries.sql `select_turns`...): the same subquery, by hand.

Why the event and not the row: the event is written once and never updated, and it must
keep what it said anyway; a turn's row is updated after its answer (its state, its end),
and every update writes the whole row again to the WAL. See docs/explanation/storage.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db import models

from ..fields import StorableJSONDecoder, StorableJSONEncoder


class Recorded(NamedTuple):
    """A model's value kept in an event: the attribute (a RecordedField), the column naming
    the event's seq, the payload's key, and the annotation that brings it back."""

    attr: str
    seq_field: str
    key: str

    @property
    def annotation(self) -> str:
        return f"recorded_{self.attr}"


class RecordedField(models.JSONField):
    """A JSON value stored by the storage rule (fields.py) that goes into the column only
    when no event holds it: NULL there once `seq_field` names its event."""

    def __init__(self, *args: Any, seq_field: str = "", **kwargs: Any) -> None:
        self.seq_field = seq_field
        kwargs.setdefault("encoder", StorableJSONEncoder)
        kwargs.setdefault("decoder", StorableJSONDecoder)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["seq_field"] = self.seq_field
        return name, path, args, kwargs

    def pre_save(self, model_instance: Any, add: bool) -> Any:
        if getattr(model_instance, self.seq_field) is not None:
            return None
        return super().pre_save(model_instance, add)


class EventValue(models.Func):
    """`key` of the payload of the event at the row's `seq_field` in its run's events: the
    event row holding that seq (the last one starting at or before it, read backwards
    through the unique (run, seq) index), its element at seq - the row's first seq. NULL
    when the row names no event."""

    def __init__(self, seq_field: str, key: str, output_field: models.Field) -> None:
        if not key.isidentifier():
            raise ValueError(f"Not a payload key: {key!r}")
        self.key = key
        super().__init__(models.F("run_id"), models.F(seq_field), output_field=output_field)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        (run, run_params), (seq, seq_params) = (
            compiler.compile(e) for e in self.get_source_expressions()
        )
        if connection.vendor == "postgresql":
            value = f'e."events" -> ({seq} - e."seq") -> 1 -> \'{self.key}\''
        else:  # SQLite's -> returns JSON text, strings quoted
            value = f"e.\"events\" -> ('$[' || ({seq} - e.\"seq\") || '][1].{self.key}')"
        sql = (
            f'(SELECT {value} FROM "agentrun_runeventrow" AS e'
            f' WHERE e."run_id" = {run} AND e."seq" <= {seq}'
            ' ORDER BY e."seq" DESC LIMIT 1)'
        )
        return sql, [*seq_params, *run_params, *seq_params]


def filled_from(spec: Recorded) -> property:
    """The attribute an annotation named `spec.annotation` sets: the event's value becomes
    the model's attribute, where the row names an event (an inline value stays)."""

    def fill(self: Any, value: Any) -> None:
        # Read from __dict__: a deferred seq is not loaded for this (a query per row).
        if self.__dict__.get(spec.seq_field) is not None:
            setattr(self, spec.attr, value)

    return property(fset=fill, doc=f"Where the ORM puts the {spec.attr} its event holds.")


def annotations(model: type) -> dict[str, EventValue]:
    """The annotations that bring back `model`'s recorded values."""
    return {
        spec.annotation: EventValue(spec.seq_field, spec.key, model._meta.get_field(spec.attr))
        for spec in model.RECORDED
    }


class RecordedQuerySet(models.QuerySet):
    """A queryset whose instances carry their recorded values (RECORDED)."""

    def with_recorded(self) -> RecordedQuerySet:
        return self.annotate(**annotations(self.model))


class RecordedManager(models.Manager.from_queryset(RecordedQuerySet)):  # type: ignore[misc]
    """The default and base manager of a model with RECORDED values: every queryset, the
    related managers' and `refresh_from_db`'s included, brings them back."""

    def get_queryset(self) -> Any:
        return super().get_queryset().with_recorded()
