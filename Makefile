# The README's commands: `make demo` and `make test` (what CI runs).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
# The Postgres tier creates and drops the test database test_<name> of PG_URL's database.
PG_URL ?= postgres://postgres@127.0.0.1:5432/agentrun
# The Redis server of the integration tier: db 9 (and 11 for the fresh-project test).
AGENTRUN_TEST_REDIS ?= redis://127.0.0.1:6379
export AGENTRUN_TEST_REDIS

.PHONY: test lint checks test-sqlite test-postgres test-postgres-ssb test-postgres-psycopg2 demo bench bench-quick install

# A virtualenv with the project and its test dependencies, rebuilt when pyproject changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

test: install lint checks test-sqlite test-postgres test-postgres-ssb test-postgres-psycopg2

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(VENV)/bin/lint-imports

checks: install
	env -u DATABASE_URL DJANGO_SETTINGS_MODULE=example_project.settings $(PYTHON) manage.py check --fail-level WARNING
	env -u DATABASE_URL DJANGO_SETTINGS_MODULE=example_project.settings $(PYTHON) manage.py makemigrations --check --dry-run

# Tests live in tiers by what they need (tests/conftest.py): pure (no database), db (any
# database), postgres (Postgres only), workers (real Celery worker processes on Postgres
# and Redis). Each run below takes the tiers whose outcome can differ on its database.

# SQLite in memory, scripted model client: no services.
test-sqlite: install
	env -u DATABASE_URL $(PYTHON) -m pytest tests/pure tests/db -q

# Postgres on psycopg 3, with Redis and real Celery worker processes.
test-postgres: install
	DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/db tests/postgres tests/workers -q

# Again with Django's server-side parameter binding (psycopg), which the engine's and the
# reaper's raw SQL must also work with.
test-postgres-ssb: install
	AGENTRUN_TEST_SERVER_SIDE_BINDING=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/db tests/postgres -q

# Again through psycopg2 (projects on the older driver): the tests make `import psycopg`
# fail, so Django and the app fall back to psycopg2, workers included. Tests marked
# one_driver (the API's and admin's surfaces, the demo on SQLite, the fresh project) run once.
test-postgres-psycopg2: install
	AGENTRUN_TEST_PSYCOPG2=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/db tests/postgres tests/workers -q -m "not one_driver"

# The seed's scenario with real processes; SQLite and a server-less broker unless told otherwise.
demo: install
	$(PYTHON) manage.py agentrun_demo

bench: install
	DATABASE_URL=$(PG_URL) $(PYTHON) bench/run.py

bench-quick: install
	DATABASE_URL=$(PG_URL) $(PYTHON) bench/run.py --quick
