"""The model table is merged once per process: a turn's lookups neither merge it again nor
look at the refreshed file more often than AGENTRUN_MODELS_FILE_CHECK_SECONDS; a change of
the file (seen at the next look) or of a setting (at once) is merged again."""

from __future__ import annotations

import json
import os
import types

from django_agentrun.catalog import model_info, overrides, shipped_info

MODEL = "claude-sonnet-5-5"


def _write(path, effort):
    path.write_text(json.dumps({"models": {MODEL: {"effort": effort}}}))


def test_catalog__merged_once_the_file_looked_at_once_per_interval(settings, tmp_path, monkeypatch):
    path = tmp_path / "models.json"
    _write(path, ["low", "high"])
    settings.AGENTRUN_MODELS_FILE = str(path)
    settings.AGENTRUN_MODELS_FILE_CHECK_SECONDS = 5
    now = [1000.0]
    stats, merges = [], []

    def stat(name):
        stats.append(name)
        return os.stat(name)

    def counted_shipped_info(model):
        merges.append(model)
        return shipped_info(model)

    monkeypatch.setattr(overrides, "os", types.SimpleNamespace(stat=stat))
    monkeypatch.setattr(overrides, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(overrides, "shipped_info", counted_shipped_info)
    for _ in range(20):
        assert model_info(MODEL).effort == {"low", "high"}
        assert model_info("claude-opus-5-5") == shipped_info("claude-opus-5-5")
    assert len(stats) == 1
    assert merges == [MODEL, "claude-opus-5-5"]

    # The file changes: not looked at again within the interval...
    _write(path, ["low", "medium", "high"])
    os.utime(path, ns=(1, 1))
    now[0] += 4.9
    assert model_info(MODEL).effort == {"low", "high"}
    assert len(stats) == 1
    # ...and seen at the first look after it, merged again.
    now[0] += 0.2
    assert model_info(MODEL).effort == {"low", "medium", "high"}
    assert len(stats) == 2
    assert model_info(MODEL).effort == {"low", "medium", "high"}
    assert len(stats) == 2 and merges.count(MODEL) == 2

    # A setting changes (override_settings, the `settings` fixture): seen at once.
    settings.AGENTRUN_MODELS = {MODEL: {"effort": ["max"]}}
    assert model_info(MODEL).effort == {"max"}
    settings.AGENTRUN_MODELS_FILE = None
    del settings.AGENTRUN_MODELS
    assert model_info(MODEL) == shipped_info(MODEL)
