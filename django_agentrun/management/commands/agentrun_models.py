"""manage.py agentrun_models: the model table; `refresh` stores the Models API's
capabilities where every process reads them (AGENTRUN_MODELS_FILE)."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_agentrun import catalog
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.conf import agentrun_settings


def capabilities(api_model: dict[str, Any], base: catalog.ModelInfo | None) -> dict[str, Any]:
    """What the Models API says of one model, in the AGENTRUN_MODELS vocabulary (only the
    fields it knows: prices, sampling and forced tool_choice stay the table's)."""
    entry: dict[str, Any] = {}
    if api_model.get("max_input_tokens"):
        entry["context_window"] = int(api_model["max_input_tokens"])
    if api_model.get("max_tokens"):
        entry["max_output"] = int(api_model["max_tokens"])
    caps = api_model.get("capabilities") or {}
    thinking = caps.get("thinking") or {}
    types = thinking.get("types") or {}
    if types:
        accepted = sorted(
            kind
            for kind, flag in types.items()
            if kind in catalog.THINKING_TYPES and (flag or {}).get("supported")
        )
        entry["thinking"] = accepted
        entry["thinking_budget"] = "enabled" in accepted
    effort = caps.get("effort")
    if effort is not None:
        entry["effort"] = (
            [level for level in catalog.EFFORT_LEVELS if (effort.get(level) or {}).get("supported")]
            if effort.get("supported")
            else []
        )
    if caps.get("structured_outputs") is not None:
        entry["structured_output"] = bool(caps["structured_outputs"].get("supported"))
    tools = caps.get("server_tools")
    if tools is not None and base is not None:
        accepted_tools = set(base.server_tools)
        if not (tools.get("web_search") or {}).get("supported"):
            accepted_tools -= set(catalog.WEB_SEARCH)
        if not (tools.get("code_execution") or {}).get("supported"):
            accepted_tools -= set(catalog.CODE_EXECUTION)
        entry["server_tools"] = sorted(accepted_tools)
    return entry


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)  # readers see the old file or the new one, never half
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _money(value: Any) -> str:
    return f"{value.normalize():f}"


class Command(BaseCommand):
    help = (
        "List the model table (capabilities and prices, with AGENTRUN_MODELS and a refresh "
        "applied), or `refresh` it from the Models API into AGENTRUN_MODELS_FILE."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "action", nargs="?", choices=("list", "refresh"), default="list", help="default: list"
        )
        parser.add_argument("--json", action="store_true", help="list as JSON")
        parser.add_argument(
            "--api-key", help="for refresh (default: ANTHROPIC_API_KEY, as the model client)"
        )
        parser.add_argument("--base-url", help="for refresh (default: ANTHROPIC_BASE_URL)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "refresh":
            self.refresh(options["api_key"], options["base_url"])
        else:
            self.list(as_json=options["json"])

    # -- list ----------------------------------------------------------------------------

    def list(self, *, as_json: bool) -> None:
        try:
            rows = [
                info
                for model in catalog.known_models()
                if (info := catalog.model_info(model)) is not None and info.id == model
            ]
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if as_json:
            out = []
            for info in rows:
                prices = info.prices
                out.append(
                    {
                        "id": info.id,
                        "status": info.lifecycle(),  # current, legacy, deprecated, retired
                        "retires": info.deprecated.isoformat() if info.deprecated else None,
                        "replacement": info.replacement or None,
                        "context_window": info.context_window,
                        "max_output": info.max_output,
                        "thinking": sorted(info.thinking),
                        "thinking_display": sorted(info.thinking_display),
                        "effort": [e for e in catalog.EFFORT_LEVELS if e in info.effort],
                        "forced_tool_choice": info.forced_tool_choice,
                        "sampling": info.sampling,
                        "thinking_budget": info.thinking_budget,
                        "structured_output": info.structured_output,
                        "server_tools": sorted(info.server_tools),
                        "cache_min_tokens": info.cache_min_tokens,
                        # The couplings (catalog.RULES): effort levels by thinking type.
                        "effort_by_thinking": {
                            kind: [e for e in catalog.EFFORT_LEVELS if e in levels]
                            for kind, levels in info.effort_by_thinking
                        },
                        "thinking_off": info.thinking_off,
                        "inference_geo": info.inference_geo,
                        "prices": _prices_json(prices),
                    }
                )
            self.stdout.write(json.dumps(out, indent=2))
            return
        header = (
            f"{'model':<24} {'status':<10} {'context':>9} {'output':>7}  "
            f"{'in':>6} {'out':>6} {'5m':>6} {'1h':>6} {'read':>6}  thinking / effort"
        )
        self.stdout.write(header)
        for info in rows:
            p = info.prices
            effort = ",".join(e for e in catalog.EFFORT_LEVELS if e in info.effort) or "-"
            self.stdout.write(
                f"{info.id:<24} {info.lifecycle():<10} {info.context_window:>9} {info.max_output:>7}  "
                f"{_money(p.input):>6} {_money(p.output):>6} {_money(p.cache_write_5m):>6} "
                f"{_money(p.cache_write_1h):>6} {_money(p.cache_read):>6}  "
                f"{','.join(sorted(info.thinking)) or '-'} / {effort}"
            )
            if info.deprecated is not None:
                verb = "retired" if info.lifecycle() == "retired" else "retires"
                instead = f", use {info.replacement}" if info.replacement else ""
                self.stdout.write(f"  {verb} {info.deprecated.isoformat()}{instead}")
            for threshold, band in p.bands:
                self.stdout.write(
                    f"{'  prompt > ' + str(threshold):<55}  {_money(band.input):>6} "
                    f"{_money(band.output):>6} {_money(band.cache_write_5m):>6} "
                    f"{_money(band.cache_write_1h):>6} {_money(band.cache_read):>6}"
                )
        path = agentrun_settings.MODELS_FILE
        self.stdout.write(
            "USD per million tokens. "
            + (f"Refreshed capabilities: {path}." if path else "AGENTRUN_MODELS_FILE is not set.")
        )

    # -- refresh -------------------------------------------------------------------------

    def refresh(self, api_key: str | None, base_url: str | None) -> None:
        path = agentrun_settings.MODELS_FILE
        if not path:
            raise CommandError(
                "AGENTRUN_MODELS_FILE is not set: name the JSON file every process (web and "
                "workers) reads the refreshed capabilities from."
            )
        if not (api_key or os.environ.get("ANTHROPIC_API_KEY")):
            self.stdout.write(
                "No API key (ANTHROPIC_API_KEY or --api-key): nothing refreshed; the shipped "
                "table (with AGENTRUN_MODELS) is used."
            )
            return
        client = AnthropicModelClient(api_key=api_key, base_url=base_url)
        try:
            listed = client.list_models()
        except anthropic.APIError as exc:
            raise CommandError(f"The Models API refused the request: {exc}") from None
        finally:
            client.close()
        models: dict[str, Any] = {}
        unpriced = []
        for api_model in listed:
            model_id = api_model.get("id")
            if not isinstance(model_id, str):
                continue
            base = catalog.shipped_info(model_id)
            if base is None and model_id not in (agentrun_settings.MODELS or {}):
                unpriced.append(model_id)
            models[base.id if base is not None else model_id] = capabilities(api_model, base)
        payload = {
            "refreshed_at": datetime.now(UTC).isoformat(),
            "source": "GET /v1/models",
            "models": models,
            "lifecycle": {m["id"]: m.get("lifecycle") for m in listed if m.get("id")},
        }
        _write_atomically(Path(path), payload)
        catalog.reset()  # this process sees it at once; the others at their next look
        self.stdout.write(f"Refreshed {len(models)} models into {path}.")
        if unpriced:
            self.stdout.write(
                "Not in the table (no prices; add them to AGENTRUN_MODELS with 'like' and "
                "'prices' to use them): " + ", ".join(sorted(unpriced))
            )


def _prices_json(prices: catalog.Prices) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: str(getattr(prices, name))
        for name in (
            "input",
            "output",
            "cache_write_5m",
            "cache_write_1h",
            "cache_read",
            "web_search_per_1k",
            "web_fetch_per_1k",
            "code_execution_per_hour",
        )
    }
    out["bands"] = [[threshold, _prices_json(band)] for threshold, band in prices.bands]
    return out
