"""Rows to statements and back, without the ORM's per-query compilation (the engine writes
a turn's rows every turn): the pieces a unit of work (unit.py) composes.

- `RowUpdate` / `RowInsert`: a compare-and-set update of a turn or tool call, an insert of
  new ones, built but not yet sent.
- `columns` / `instances`: the SELECT list of a model and model instances from its rows,
  through the same converters a queryset applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, models

from ..exceptions import ConcurrentUpdate
from .clock import DatabaseNow, clock
from .sql import sql


def quoted(name: str) -> str:
    return connection.ops.quote_name(name)


def assignments(model: type, fields: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """`column = %s` clauses and their database values for an UPDATE of `model` (a foreign
    key is written as its target's id; DatabaseNow as the database's time)."""
    sets, params = [], []
    for name, value in fields.items():
        field = model._meta.get_field(name)
        if isinstance(value, DatabaseNow):
            now, extra = clock()
            sets.append(f"{quoted(field.column)} = {now}")
            params += extra
            continue
        target = field
        if field.is_relation:
            value = getattr(value, "pk", value)
            target = field.target_field
        sets.append(f"{quoted(field.column)} = %s")
        params.append(target.get_db_prep_save(value, connection))
    return sets, params


@dataclass
class RowUpdate:
    """A compare-and-set UPDATE of one turn or tool call, built but not yet sent."""

    model: type
    pk: Any
    sql: str
    params: list[Any]

    @classmethod
    def build(cls, obj: Any, old_state: str | None, fields: dict[str, Any]) -> RowUpdate:
        """The update of `obj`'s `fields` (and its state from memory, expected to still be
        `old_state` in the row); `obj` takes the new values at once."""
        if old_state is not None:
            fields["state"] = obj.state
        model = type(obj)
        sets, params = assignments(model, fields)
        params.append(obj.pk)
        expected = ""
        if old_state is not None:
            expected = sql("expected_state")
            params.append(old_state)
        text = sql(
            "row_update",
            table=quoted(model._meta.db_table),
            assignments=", ".join(sets),
            expected_state=expected,
        )
        for name, value in fields.items():
            if name != "state":
                setattr(obj, name, value)
        return cls(model, obj.pk, text, params)

    def send(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(self.sql, self.params)
            updated = cursor.rowcount
        self.check(updated)

    def check(self, updated: int) -> None:
        if updated != 1:
            raise ConcurrentUpdate(f"{self.model.__name__} {self.pk} changed concurrently")


@dataclass
class RowInsert:
    """An INSERT of new turns or tool calls, built but not yet sent; their ids are set
    when it is (`assign`)."""

    objs: list[Any]
    sql: str
    params: list[Any]

    @classmethod
    def build(cls, objs: list[Any]) -> RowInsert:
        model = type(objs[0])
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        params: list[Any] = []
        for obj in objs:
            for field in fields:
                params.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        text = sql(
            "rows_insert",
            table=quoted(model._meta.db_table),
            columns=", ".join(quoted(f.column) for f in fields),
            rows=", ".join([row] * len(objs)),
        )
        return cls(list(objs), text, params)

    def send(self) -> None:
        with connection.cursor() as cursor:
            # RETURNING keeps the VALUES order.
            cursor.execute(f"{self.sql} RETURNING {quoted('id')}", self.params)
            self.assign([r[0] for r in cursor.fetchall()])

    def assign(self, ids: list[Any]) -> None:
        for obj, pk in zip(self.objs, ids, strict=True):
            obj.pk = pk
            obj._state.adding = False
            obj._state.db = connection.alias


Deferred = RowUpdate | RowInsert


def _utc_timestamps() -> bool:
    return connection.vendor == "postgresql" and bool(settings.USE_TZ)


def columns(model: type) -> str:
    """The model's concrete columns, in field order (what `instances` expects)."""
    utc = _utc_timestamps()
    return ", ".join(
        sql("utc_column", column=quoted(f.column))
        if utc and isinstance(f, models.DateTimeField)
        else quoted(f.column)
        for f in model._meta.concrete_fields
    )


def _aware_utc(value: datetime | None, expression: Any, connection: Any) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None else None


_CONVERTERS: dict[tuple[str, bool, type], list[tuple[int, Any, list[Any]]]] = {}


def instances(model: type, rows: list[tuple]) -> list[Any]:
    """Model instances from rows of `columns(model)`, through the fields' and the backend's
    converters (what a queryset applies), without compiling a query."""
    utc = _utc_timestamps()
    key = (connection.vendor, utc, model)
    converters = _CONVERTERS.get(key)
    if converters is None:
        converters = []
        for i, field in enumerate(model._meta.concrete_fields):
            col = field.get_col(model._meta.db_table)
            funcs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if utc and isinstance(field, models.DateTimeField):
                funcs = [_aware_utc, *funcs]
            if funcs:
                converters.append((i, col, funcs))
        _CONVERTERS[key] = converters
    alias = connection.alias
    out = []
    for row in rows:
        values = list(row)
        for i, col, funcs in converters:
            value = values[i]
            for func in funcs:
                value = func(value, col, connection)
            values[i] = value
        out.append(model.from_db(alias, None, values))
    return out
