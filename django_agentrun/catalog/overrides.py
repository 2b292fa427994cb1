"""The table as a host project runs it: the shipped entries, with the capabilities a
refresh stored (AGENTRUN_MODELS_FILE) and AGENTRUN_MODELS / AGENTRUN_PRICES merged over
them. Reads Django settings, lazily: importing this needs none.

Merged once per process and model, kept until an AGENTRUN_* setting changes (Django's
setting_changed; `reset`) or the file does: its mtime is looked at no more often than every
AGENTRUN_MODELS_FILE_CHECK_SECONDS (time.monotonic). The checks (`catalog_errors`) merge
afresh and look at the file each time."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

from .table import SHIPPED, shipped_info
from .vocabulary import (
    EFFORT_LEVELS,
    SERVER_TOOL_TYPES,
    STATUSES,
    THINKING_DISPLAYS,
    THINKING_TYPES,
    ModelInfo,
    Prices,
)

D = Decimal
logger = logging.getLogger("django_agentrun.catalog")

# ---- settings and the refreshed file ----------------------------------------------------

_PRICE_FIELDS = tuple(f.name for f in fields(Prices) if f.name != "bands")
_INFO_FIELDS = {f.name for f in fields(ModelInfo)} - {"id"}
_SET_FIELDS = {
    "thinking",
    "thinking_display",
    "effort",
    "server_tools",
    "fixed_effort_with",
    "unsourced",
}
_INT_FIELDS = {"context_window", "max_output", "cache_min_tokens"}
# Fields a new entry may leave out: their defaults apply (the lifecycle: an entry is live).
_OPTIONAL_FIELDS = {"deprecated", "retired", "replacement", "preserved_thinking"}
_BOOL_FIELDS = {
    "retired",
    "preserved_thinking",
    "forced_tool_choice",
    "sampling",
    "thinking_budget",
    "structured_output",
    "inference_geo",
}


class CatalogError(ValueError):
    """An AGENTRUN_MODELS / AGENTRUN_MODELS_FILE entry that does not make a model."""


def _decimal(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise CatalogError(f"{where}: expected a number, got {value!r}")
    try:
        result = D(str(value))
    except InvalidOperation:
        raise CatalogError(f"{where}: expected a number, got {value!r}") from None
    if not result.is_finite() or result < 0:
        raise CatalogError(f"{where}: expected a number >= 0, got {value!r}")
    return result


def _merge_prices(base: Prices | None, raw: Any, where: str) -> Prices:
    if isinstance(raw, Prices):
        return raw
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{where}: expected a dict of prices, got {type(raw).__name__}")
    unknown = set(raw) - set(_PRICE_FIELDS) - {"bands"}
    if unknown:
        raise CatalogError(
            f"{where}: unknown price field(s) {sorted(unknown)} (known: {', '.join(_PRICE_FIELDS)}, bands)"
        )
    values: dict[str, Any] = {}
    for name in _PRICE_FIELDS:
        if name in raw:
            values[name] = _decimal(raw[name], f"{where}.{name}")
        elif base is not None:
            values[name] = getattr(base, name)
        elif name in ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read"):
            raise CatalogError(f"{where}: a new model needs prices.{name}")
    bands: tuple[tuple[int, Prices], ...] = base.bands if base is not None else ()
    if "bands" in raw:
        if not isinstance(raw["bands"], list | tuple):
            raise CatalogError(f"{where}.bands: expected a list of [threshold, prices]")
        built = []
        for i, band in enumerate(raw["bands"]):
            if not (isinstance(band, list | tuple) and len(band) == 2):
                raise CatalogError(f"{where}.bands[{i}]: expected [threshold, prices]")
            threshold, band_prices = band
            if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
                raise CatalogError(f"{where}.bands[{i}]: threshold must be an int >= 0")
            top = Prices(**{k: v for k, v in values.items()})
            built.append((threshold, _merge_prices(top, band_prices, f"{where}.bands[{i}]")))
        bands = tuple(built)
    return Prices(**values, bands=bands)


def _merge(base: ModelInfo | None, model: str, raw: Any, where: str) -> ModelInfo:
    """`raw` (a partial dict) merged over `base`; a new model names every field (or `like`)."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{where}: expected a dict, got {type(raw).__name__}")
    raw = dict(raw)
    like = raw.pop("like", None)
    if like is not None:
        base = shipped_info(like) if isinstance(like, str) else None
        if base is None:
            raise CatalogError(f"{where}.like: {like!r} is not a model of the shipped table")
    unknown = set(raw) - _INFO_FIELDS
    if unknown:
        raise CatalogError(
            f"{where}: unknown field(s) {sorted(unknown)} (known: {', '.join(sorted(_INFO_FIELDS))}, like)"
        )
    values: dict[str, Any] = {}
    for name in sorted(_INFO_FIELDS):
        if name not in raw:
            if base is None and name in _OPTIONAL_FIELDS:
                default = next(f.default for f in fields(ModelInfo) if f.name == name)
                values[name] = None if default is MISSING else default
                continue
            if base is None:
                raise CatalogError(
                    f"{where}: {model!r} is not in the shipped table: give every field, "
                    f"or 'like' a shipped model (missing {name!r})"
                )
            values[name] = getattr(base, name)
            continue
        value = raw[name]
        if name == "prices":
            values[name] = _merge_prices(base.prices if base else None, value, f"{where}.prices")
        elif name in _SET_FIELDS:
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise CatalogError(f"{where}.{name}: expected a list of strings")
            items = frozenset(value)
            allowed = {
                "thinking": THINKING_TYPES,
                "thinking_display": THINKING_DISPLAYS,
                "effort": frozenset(EFFORT_LEVELS),
                "server_tools": None,
                "fixed_effort_with": THINKING_TYPES,
                "unsourced": frozenset(_INFO_FIELDS),
            }[name]
            bad = sorted(str(i) for i in items if not isinstance(i, str))
            if not bad and allowed is not None:
                bad = sorted(items - allowed)
            if bad:
                raise CatalogError(f"{where}.{name}: unknown value(s) {bad}")
            values[name] = items
        elif name in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CatalogError(f"{where}.{name}: expected an int >= 0, got {value!r}")
            values[name] = value
        elif name in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise CatalogError(f"{where}.{name}: expected true or false, got {value!r}")
            values[name] = value
        elif name == "thinking_off":
            if value is not None and value not in THINKING_TYPES:
                raise CatalogError(f"{where}.thinking_off: expected a thinking type or None")
            values[name] = value
        elif name == "effort_by_thinking":
            values[name] = _couplings(value, f"{where}.effort_by_thinking")
        elif name == "deprecated":
            values[name] = _date(value, f"{where}.deprecated")
        elif name == "replacement":
            if not isinstance(value, str):
                raise CatalogError(f"{where}.replacement: expected a model id")
            values[name] = value
        elif name == "status":
            if value not in STATUSES:
                raise CatalogError(f"{where}.status: expected 'current' or 'legacy'")
            values[name] = value
    return ModelInfo(id=model, **values)


def _date(value: Any, where: str) -> date | None:
    """A retirement date: a date, "YYYY-MM-DD", or None (not deprecated)."""
    if value is None or isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise CatalogError(
            f"{where}: expected a date (YYYY-MM-DD) or None, got {value!r}"
        ) from None


def _couplings(value: Any, where: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """{thinking type: [effort levels it is accepted at]} as the table keeps it."""
    if not isinstance(value, Mapping):
        value = dict(value) if isinstance(value, list | tuple) else None
    if value is None:
        raise CatalogError(f"{where}: expected {{thinking type: [effort levels]}}")
    out = []
    for kind, levels in value.items():
        if kind not in THINKING_TYPES or isinstance(levels, str):
            raise CatalogError(f"{where}: bad entry {kind!r}")
        levels = frozenset(levels)
        if levels - set(EFFORT_LEVELS):
            raise CatalogError(f"{where}.{kind}: unknown effort(s) {sorted(levels)}")
        out.append((kind, levels))
    return tuple(sorted(out))


# What this process merged, and the state of the refreshed file it merged with. Guarded by
# _lock (a worker's heartbeat thread may price a turn while the main thread asks).
_lock = threading.RLock()
_merged: dict[str, ModelInfo | None] = {}
_file: dict[str, Any] = {}  # path, key (path, mtime, size), checked (monotonic), data, data_key
_watching: list[bool] = []


def reset(**kwargs: Any) -> None:
    """Forget what was merged and what the file held: the next lookup merges again."""
    with _lock:
        _merged.clear()
        _file.clear()


def _setting_changed(setting: str = "", **kwargs: Any) -> None:
    if setting.startswith("AGENTRUN_"):
        reset()


def _watch_settings() -> None:
    """Reset on any AGENTRUN_* setting change (override_settings, pytest's `settings`);
    connected on first use, so that importing this needs no Django."""
    if not _watching:
        from django.core.signals import setting_changed

        setting_changed.connect(_setting_changed, dispatch_uid="django_agentrun.catalog")
        _watching.append(True)


def _file_key(path: Any, *, fresh: bool = False) -> tuple[str, int, int] | None:
    """(path, mtime, size) of the refreshed file, None without one: os.stat'ed at most every
    AGENTRUN_MODELS_FILE_CHECK_SECONDS (`fresh`: now)."""
    from ..conf import agentrun_settings

    now = time.monotonic()
    checked = _file.get("checked")
    if (
        not fresh
        and _file.get("path") == path
        and checked is not None
        and now - checked < float(agentrun_settings.MODELS_FILE_CHECK_SECONDS)
    ):
        return _file["key"]
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        key = None
    else:
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    _file.update(path=path, key=key, checked=now)
    return key


def _refreshed(*, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """The capabilities `agentrun_models refresh` stored, read again when the file changed."""
    from ..conf import agentrun_settings

    path = agentrun_settings.MODELS_FILE
    if not path:
        return {}
    with _lock:
        key = _file_key(path, fresh=fresh)
        if key is None:
            return {}
        if _file.get("data_key") == key:
            return _file["data"]
        try:
            with open(path, encoding="utf-8") as fh:
                payload = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CatalogError(f"AGENTRUN_MODELS_FILE {path}: cannot be read: {exc}") from None
        data = payload.get("models", {}) if isinstance(payload, dict) else None
        if not isinstance(data, dict):
            raise CatalogError(f"AGENTRUN_MODELS_FILE {path}: expected {{'models': {{...}}}}")
        _file.update(data_key=key, data=data)
        return data


def _legacy_prices() -> dict[str, dict[str, Any]]:
    """AGENTRUN_PRICES (deprecated) in the AGENTRUN_MODELS price vocabulary."""
    from ..conf import agentrun_settings

    out: dict[str, dict[str, Any]] = {}
    for model, raw in (agentrun_settings.PRICES or {}).items():
        if not isinstance(raw, Mapping):
            raise CatalogError(f"AGENTRUN_PRICES[{model!r}]: expected a dict")
        prices = {k: v for k, v in raw.items() if k != "cache_write"}
        if "cache_write" in raw:  # the old single cache-write price was the 5-minute one
            prices.setdefault("cache_write_5m", raw["cache_write"])
        if "input" in raw and "cache_write_1h" not in raw:
            # It had no 1-hour price: the API's rule, 2 x the base input price.
            prices["cache_write_1h"] = (
                _decimal(raw["input"], f"AGENTRUN_PRICES[{model!r}].input") * 2
            )
        out[model] = prices
    return out


def _effective(model: str, *, strict: bool = False) -> ModelInfo | None:
    """`model`'s merged entry, kept (see the module's docstring). `strict` (the check): merged
    afresh, and a refreshed file that cannot be read or merged is an error; otherwise it is
    logged and skipped, so a turn never fails on it."""
    if strict:
        return _merge_model(model, strict=True)
    from ..conf import agentrun_settings

    with _lock:
        _watch_settings()
        path = agentrun_settings.MODELS_FILE
        key = _file_key(path) if path else None
        if _file.get("merged_with", key) != key:
            _merged.clear()  # the file changed: merge again
        _file["merged_with"] = key
        if model in _merged:
            return _merged[model]
        info = _merge_model(model, strict=False)
        _merged[model] = info
        return info


def _merge_model(model: str, *, strict: bool) -> ModelInfo | None:
    from ..conf import agentrun_settings

    overrides = agentrun_settings.MODELS or {}
    if not isinstance(overrides, Mapping):
        raise CatalogError("AGENTRUN_MODELS: expected a dict of model id -> dict")
    key = model
    base = shipped_info(model)
    if model not in overrides and base is not None:
        key = base.id
    info = base
    if info is None and key in overrides:
        # A model the host project adds: its own entry first, then what a refresh knows.
        info = _merge(None, key, overrides[key], f"AGENTRUN_MODELS[{key!r}]")
    try:
        refreshed = _refreshed(fresh=strict).get(key)
        if refreshed is not None and info is not None:
            info = _merge(info, key, refreshed, f"AGENTRUN_MODELS_FILE[{key!r}]")
    except CatalogError as exc:
        if strict:
            raise
        logger.warning("Model table: %s; the refreshed capabilities are not used", exc)
    legacy = _legacy_prices()
    if key in legacy or model in legacy:
        raw_prices = legacy.get(model, legacy.get(key))
        if info is None:
            # A price-only entry for a model the table lacks: priced, capabilities unknown
            # (nothing is refused for it).
            info = _unknown_capabilities(key)
        info = _merge(info, key, {"prices": raw_prices}, f"AGENTRUN_PRICES[{key!r}]")
    if key in overrides:
        # The host project's word is last (its `like` was applied above, if new).
        entry = overrides[key]
        if info is not None and isinstance(entry, Mapping):
            entry = {k: v for k, v in entry.items() if k != "like"}
        info = _merge(info, key, entry, f"AGENTRUN_MODELS[{key!r}]")
    return info


def _unknown_capabilities(model: str) -> ModelInfo:
    return ModelInfo(
        id=model,
        status="legacy",
        context_window=0,
        max_output=0,
        thinking=THINKING_TYPES,
        thinking_display=THINKING_DISPLAYS,
        effort=frozenset(EFFORT_LEVELS),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        structured_output=True,
        server_tools=SERVER_TOOL_TYPES,
        cache_min_tokens=0,
        prices=Prices(D(0), D(0), D(0), D(0), D(0)),
    )


def model_info(model: str) -> ModelInfo | None:
    """`model`'s entry: shipped, with the refreshed capabilities and AGENTRUN_MODELS over it.

    Raises django.core.exceptions.ImproperlyConfigured for an override that does not make
    a model (manage.py check reports the same as agentrun.E020).
    """
    try:
        return _effective(model)
    except CatalogError as exc:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(str(exc)) from None


def known_models() -> list[str]:
    """Every id model_info answers for (shipped, AGENTRUN_MODELS, AGENTRUN_PRICES)."""
    from ..conf import agentrun_settings

    ids = set(SHIPPED) | set(agentrun_settings.MODELS or {}) | set(agentrun_settings.PRICES or {})
    return sorted(ids)


def catalog_errors() -> list[str]:
    """What is wrong with AGENTRUN_MODELS / AGENTRUN_PRICES / AGENTRUN_MODELS_FILE."""
    from ..conf import agentrun_settings

    errors: list[str] = []
    overrides = agentrun_settings.MODELS
    if overrides is not None and not isinstance(overrides, Mapping):
        return ["AGENTRUN_MODELS: expected a dict of model id -> dict"]
    prices = agentrun_settings.PRICES
    if prices is not None and not isinstance(prices, Mapping):
        return ["AGENTRUN_PRICES: expected a dict of model id -> dict"]
    for model in sorted(set(overrides or {}) | set(prices or {}) | set(SHIPPED)):
        try:
            _effective(model, strict=True)
        except CatalogError as exc:
            errors.append(str(exc))
    return sorted(set(errors))
