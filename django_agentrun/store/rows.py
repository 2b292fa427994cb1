"""Rows back from statements, without the ORM's per-query compilation (the engine reads a
run's turns and calls at every claim).

- `instances`: model instances from `SELECT *` / `RETURNING *` rows, through the fields'
  and the backend's converters, matched by column name;
- `orm_rows`: a queryset's rows as a statement's (`Result`: column names, rows), for the
  portable store.

(A row as the JSON the `write` statement takes is postgres.py's.)
"""

from __future__ import annotations

from typing import Any

from django.db import connection

# A statement's result: its column names and its rows.
Result = tuple[tuple[str, ...], list[tuple]]


_Plan = tuple[
    list[str], list[int], list[tuple[int, Any, list[Any]]], list[tuple[str, int, Any, list[Any]]]
]
_PLANS: dict[tuple[str, type, tuple[str, ...]], _Plan] = {}


def _converters(field: Any, table: str) -> tuple[Any, list[Any]]:
    col = field.get_col(table)
    return col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)


def _plan(model: type, names: tuple[str, ...]) -> _Plan:
    """The attnames of the model's fields among `names` (in field order; the others are
    deferred), where each is among `names`, the converters of the columns that need one,
    and the recorded values among `names` (models/recorded.py: a column named as the ORM's
    annotation, converted as the attribute's field)."""
    key = (connection.vendor, model, names)
    plan = _PLANS.get(key)
    if plan is None:
        table = model._meta.db_table
        position = {name: i for i, name in enumerate(names)}
        fields = [f for f in model._meta.concrete_fields if f.column in position]
        converters = []
        for i, field in enumerate(fields):
            col, funcs = _converters(field, table)
            if funcs:
                converters.append((i, col, funcs))
        order = [position[f.column] for f in fields]
        recorded = [
            (spec.annotation, position[spec.annotation])
            + _converters(model._meta.get_field(spec.attr), table)
            for spec in getattr(model, "RECORDED", ())
            if spec.annotation in position
        ]
        plan = _PLANS[key] = ([f.attname for f in fields], order, converters, recorded)
    return plan


def _converted(value: Any, col: Any, funcs: list[Any]) -> Any:
    for func in funcs:
        value = func(value, col, connection)
    return value


def instances(model: type, names: tuple[str, ...], rows: list[tuple]) -> list[Any]:
    """Model instances from rows whose columns are `names` (a cursor's description, in the
    table's order, which need not be the model's; columns left out are deferred), through
    the fields' and the backend's converters (what a queryset applies), with the values
    their events hold where the rows bring them (`recorded_content`...)."""
    attnames, order, converters, recorded = _plan(model, names)
    alias = connection.alias
    out = []
    for row in rows:
        values = [row[i] for i in order]
        for i, col, funcs in converters:
            values[i] = _converted(values[i], col, funcs)
        obj = model.from_db(alias, attnames, values)
        for annotation, i, col, funcs in recorded:
            setattr(obj, annotation, _converted(row[i], col, funcs))
        out.append(obj)
    return out


def column_names(cursor: Any) -> tuple[str, ...]:
    return tuple(d[0] for d in cursor.description)


def orm_rows(queryset: Any, only: tuple[str, ...] | None = None) -> Result:
    """The rows of `queryset` (all the model's columns, or those of the fields `only`), and
    its annotations after them (a value an event holds: models/recorded.py)."""
    fields = [f for f in queryset.model._meta.concrete_fields if only is None or f.name in only]
    annotated = tuple(queryset.query.annotations)
    names = tuple(f.column for f in fields) + annotated
    attnames = (*(f.attname for f in fields), *annotated)
    sql_text, params = queryset.values_list(*attnames).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql_text, params)
        return names, cursor.fetchall()
