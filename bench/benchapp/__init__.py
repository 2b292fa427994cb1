"""Bench-only agents and tools (installed by bench.settings)."""
