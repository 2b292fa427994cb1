# The README's commands. `make test` is what CI runs.
PYTHON ?= python
PG_URL ?= postgres://postgres@127.0.0.1:5432/agentrun

.PHONY: test lint checks test-sqlite test-postgres demo bench

test: lint checks test-sqlite test-postgres

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

checks:
	DJANGO_SETTINGS_MODULE=example_project.settings $(PYTHON) manage.py check --fail-level WARNING
	DJANGO_SETTINGS_MODULE=example_project.settings $(PYTHON) manage.py makemigrations --check --dry-run

# The unit tier needs no services: SQLite in memory, scripted model client.
test-sqlite:
	env -u DATABASE_URL $(PYTHON) -m pytest tests/unit -q

# Everything on Postgres, with Redis and real Celery worker processes.
test-postgres:
	DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests -q

demo:
	$(PYTHON) manage.py agentrun_demo

bench:
	DATABASE_URL=$(PG_URL) $(PYTHON) bench/run.py
