"""Benchmarks of django-agentrun (not tests): `python bench/run.py [--quick] [--only NAME]`."""
