# The README's commands: `make demo` and `make test` (what CI runs).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
# The Postgres tier creates and drops the test database test_<name> of PG_URL's database.
PG_URL ?= postgres://postgres@127.0.0.1:5432/agentrun
# The Redis server of the integration tier: db 9 (and 11 for the fresh-project test).
AGENTRUN_TEST_REDIS ?= redis://127.0.0.1:6379
export AGENTRUN_TEST_REDIS

# The other supported Pythons (pyenv's, or whatever is on PATH): Django 6.x's tiers run on
# 3.12, the release check installs the built archives on 3.13.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
PYTHON313 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) python3.13)
VENV_DJANGO6 ?= .venv-django6

# `make test` runs its lanes at once (two by default, three with LANES=3: below), each its
# stages in turn, timed (the first stage of a lane that fails stops that lane; `make test`
# fails if any lane did):
# - TEST_STAGES, the CPU lane, at nice 10: lint, checks, the tiers without worker processes
#   on two pytest-xdist processes each, Django 6.x's tiers, and the release check (a fresh
#   project with its worker, from the built archives; last, so that its build has finished
#   in the background);
# - WORKER_STAGES, the worker lane, at nice -5 (where it may: root; else at 0): the worker
#   tier with real worker processes, less its MCP modules;
# - SERVER_STAGES, the servers lane, at the same nice: the worker tier's MCP modules, its
#   subsets on psycopg2 and behind the poolers, the Node client and the browsers.
# The worker lanes run one test at a time each, so a test has at most one neighbour with
# worker processes. They mostly wait (leases, polls, a browser); when they need the CPU they
# get it first (a 2 s lease's renewal has half a second to reach the database), so their
# timings hold while the CPU lane runs. Each lane has a Postgres database of its own
# (PG_URL, PG_URL_WORKERS, PG_URL_SERVERS): their test databases never meet; the servers
# lane's broker is Redis db 10 (SERVERS_BROKER_DB), the worker lane's db 9, and every test
# has queues and stream keys of its own. The worker lanes' output is in
# artifacts/lane-workers.log and artifacts/lane-servers.log, printed when every lane is done.
# The lanes take about as long as each other: a stage moved from one to another should keep
# them so. `make test SERIAL=1`: one lane, every stage in turn.
# test-postgres is not one of them: test-django6 runs its tiers on Postgres (psycopg 3),
# under Django 6, and test-postgres-ssb and -psycopg2 run them under Django 5.2 (less what is
# the same on any driver: one_driver, run under 5.2 on SQLite); the worker lanes run the
# engine on 5.2 and psycopg 3 with real processes.
TEST_STAGES = lint checks docs test-sqlite test-postgres-ssb test-postgres-psycopg2 test-django6 \
	test-explore test-release
WORKER_STAGES = test-workers
SERVER_STAGES = test-workers-mcp test-workers-psycopg2 test-pgbouncer test-django-pool test-node \
	test-browser test-browser-django6
PG_URL_WORKERS ?= $(PG_URL)_workers
PG_URL_SERVERS ?= $(PG_URL)_servers
SERVERS_BROKER_DB ?= 10
# LANES=2, the default: the servers lane's stages run in the worker lane, after its own (two
# lanes; the worker processes' tests never have a neighbour of their kind). `make test
# LANES=3` runs the servers lane beside it: shorter where the cores are free, but the worker
# tier is busier than it looks (about 600 s of CPU, mostly its workers' start-up imports),
# and under load both arrangements' timings were not yet shown to hold three times in a row
# (two loaded three-lane runs each failed a different lease-timing test).
LANES ?= 2
ifeq ($(LANES),2)
WORKER_LANE = $(WORKER_STAGES) $(SERVER_STAGES)
SERVER_LANE =
else
WORKER_LANE = $(WORKER_STAGES)
SERVER_LANE = $(SERVER_STAGES)
endif
# The browser tier's Chromium: Debian's package (Playwright's own download cannot be used here).
CHROMIUM ?= /usr/bin/chromium

.PHONY: test lane lint checks test-sqlite test-postgres test-workers test-workers-mcp \
	test-postgres-ssb test-postgres-psycopg2 test-workers-psycopg2 test-pgbouncer pgbouncer \
	test-django-pool test-node node test-browser chromium test-django6 test-browser-django6 test-release demo demo-traces chat admin \
	test-explore explore \
	bench bench-quick bench-load install soak

# A virtualenv with the project and its test dependencies, rebuilt when pyproject changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e ".[test,docs]"
	touch $@

install: $(VENV)/.installed

# The slow installs (Django 6's virtualenv; the release check's archives and fresh
# virtualenvs; Debian's Chromium, PgBouncer and Node.js where they are missing) are built in
# the background, at nice 10, while the first stages run (logs in artifacts/prebuild-*.log);
# each stage that needs one waits for its build (flock).
test:
	@mkdir -p artifacts
	@nice -n 10 $(MAKE) --no-print-directory prebuild-system >artifacts/prebuild-system.log 2>&1 &
	@nice -n 10 $(MAKE) --no-print-directory prebuild-django6 >artifacts/prebuild-django6.log 2>&1 &
	@$(MAKE) --no-print-directory install
	@nice -n 10 $(MAKE) --no-print-directory prebuild-release >artifacts/prebuild-release.log 2>&1 &
	@if [ -n "$(SERIAL)" ]; then \
	  exec $(MAKE) --no-print-directory lane STAGES="$(TEST_STAGES) $(WORKER_STAGES) $(SERVER_STAGES)"; \
	fi; \
	started=$$(date +%s); \
	first=""; [ "$$(id -u)" -ne 0 ] || first="nice -n -5"; \
	$$first $(MAKE) --no-print-directory lane STAGES="$(WORKER_LANE)" PG_URL=$(PG_URL_WORKERS) \
	  >artifacts/lane-workers.log 2>&1 & workers=$$!; \
	AGENTRUN_TEST_BROKER_URL=$(AGENTRUN_TEST_REDIS)/$(SERVERS_BROKER_DB) \
	  $$first $(MAKE) --no-print-directory lane STAGES="$(SERVER_LANE)" PG_URL=$(PG_URL_SERVERS) \
	  >artifacts/lane-servers.log 2>&1 & servers=$$!; \
	nice -n 10 $(MAKE) --no-print-directory lane STAGES="$(TEST_STAGES)"; units=$$?; \
	wait $$workers; status=$$?; \
	wait $$servers; served=$$?; \
	echo "--- the worker lane (artifacts/lane-workers.log) ---"; \
	cat artifacts/lane-workers.log; \
	echo "--- the servers lane (artifacts/lane-servers.log) ---"; \
	cat artifacts/lane-servers.log; \
	echo "lanes: $$(( $$(date +%s) - started )) s (exit $$units, $$status, $$served)"; \
	[ $$units -eq 0 ] && [ $$status -eq 0 ] && [ $$served -eq 0 ]

# One lane: STAGES in turn, timed; the first that fails stops it.
lane:
	@for stage in $(STAGES); do \
	  started=$$(date +%s); \
	  $(MAKE) --no-print-directory $$stage PREBUILT=1; status=$$?; \
	  echo "stage $$stage: $$(( $$(date +%s) - started )) s (exit $$status)"; \
	  [ $$status -eq 0 ] || exit $$status; \
	done

# Debian's packages of the servers lane: Chromium (the browser tier), PgBouncer and Node.js
# with npm, those that are missing installed with one apt-get where it can (as root; under
# `make test`, in the background from the start: prebuild-system). Each stage's own target
# (chromium, pgbouncer, node) waits for that install (flock), then installs what is still
# missing or says that it could not (its tier is then skipped, saying so).
SYSTEM_LOCK ?= .system-packages.lock
SYSTEM_PACKAGES ?= chromium pgbouncer node

prebuild-system:
	flock $(SYSTEM_LOCK) $(MAKE) --no-print-directory system-packages

chromium:
	@flock $(SYSTEM_LOCK) $(MAKE) --no-print-directory system-packages SYSTEM_PACKAGES=chromium
pgbouncer:
	@flock $(SYSTEM_LOCK) $(MAKE) --no-print-directory system-packages SYSTEM_PACKAGES=pgbouncer
node:
	@flock $(SYSTEM_LOCK) $(MAKE) --no-print-directory system-packages SYSTEM_PACKAGES=node

system-packages:
	@missing=""; \
	for name in $(SYSTEM_PACKAGES); do case $$name in \
	  chromium) test -x $(CHROMIUM) || missing="$$missing chromium";; \
	  pgbouncer) command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer \
	    || missing="$$missing pgbouncer";; \
	  node) command -v npm >/dev/null || missing="$$missing nodejs npm";; \
	esac; done; \
	[ -z "$$missing" ] || { \
	  echo "Missing: apt-get install -y$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) \
	    >/dev/null 2>&1 || echo "Could not install$$missing (what needs it is skipped, saying so)"; \
	}

.PHONY: prebuild-django6 prebuild-release prebuild-system system-packages
prebuild-django6:
	flock $(VENV_DJANGO6).lock $(MAKE) --no-print-directory $(VENV_DJANGO6)/.installed

# Outside the checkout: the fresh-project test checks that the app is imported from the
# installed archive, not from this tree.
RELEASE_WORK ?= /tmp/agentrun-release-$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)
prebuild-release: install
	rm -rf $(RELEASE_WORK)
	flock $(RELEASE_WORK).lock $(PYTHON) tools/release_check.py --python $(PYTHON313) \
	  --prepare --keep $(RELEASE_WORK)

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(VENV)/bin/lint-imports

checks: install
	env -u DATABASE_URL DJANGO_SETTINGS_MODULE=example_project.settings DJANGO_SECRET_KEY=checks-only-$$(date +%s) $(PYTHON) manage.py check --fail-level WARNING
	env -u DATABASE_URL DJANGO_SETTINGS_MODULE=example_project.settings DJANGO_SECRET_KEY=checks-only-$$(date +%s) $(PYTHON) manage.py makemigrations --check --dry-run

# Tests live in tiers by what they need (tests/conftest.py): pure (no database), db (any
# database), postgres (Postgres only), workers (real Celery worker processes on Postgres
# and Redis), browser. Each run below takes the tiers whose outcome can differ in its
# setting (database, driver, Django). The tiers without worker processes run on two
# pytest-xdist processes ($(XDIST); each has a test database of its own); the workers tier
# runs one test at a time in each run, so that its leases and timings are measured against
# one neighbour at most (the other worker lane's test under `make test`, both ahead of the
# CPU lane: see above).
XDIST ?= -n 2
# Not in the workers tier's runs: the fresh-project test runs in test-release (on the built
# wheel and sdist instead of this checkout), the AI SDK's in test-node.
WORKER_TIER = tests/workers --ignore=tests/workers/test_fresh_project.py \
	--ignore=tests/workers/test_ai_sdk.py
# Under `make test` the tier is run in two halves, one in each worker lane (see `test`): the
# MCP modules (real MCP server processes: their crash matrix on both protocols, the
# credentials) in test-workers-mcp, in the servers lane; the rest in test-workers. `make
# test-workers test-workers-mcp` runs the whole tier.
WORKER_TIER_MCP = tests/workers/test_mcp.py tests/workers/test_mcp_credentials.py

# SQLite in memory, scripted model client: no services.
test-sqlite: install
	env -u DATABASE_URL $(PYTHON) -m pytest tests/pure tests/db -q $(XDIST)

# Postgres on psycopg 3: the db and postgres tiers.
test-postgres: install
	DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/db tests/postgres -q $(XDIST)

# Real Celery worker processes (warm starts: tests/processes.py) on Postgres (psycopg 3) and
# Redis, killed with SIGKILL (the chaos test also through TCP proxies it faults, and with a
# worker whose wall clock jumps: tests/wallclock.c, built with the system's C compiler).
test-workers: install
	DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest $(WORKER_TIER) $(addprefix --ignore=,$(WORKER_TIER_MCP)) \
	  -q

test-workers-mcp: install
	DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest $(WORKER_TIER_MCP) -q

# The chaos soak, long (docs/how-to/development.md): SOAKS soaks in a row, each SOAK_SECONDS
# of faults over SOAK_RUNS runs, a new seed each; the first that fails stops it.
SOAKS ?= 10
SOAK_SECONDS ?= 60
SOAK_RUNS ?= 20
soak: install
	@mkdir -p artifacts
	@for i in $$(seq 1 $(SOAKS)); do \
	  started=$$(date +%s); \
	  AGENTRUN_CHAOS_SECONDS=$(SOAK_SECONDS) AGENTRUN_CHAOS_RUNS=$(SOAK_RUNS) DATABASE_URL=$(PG_URL) \
	    $(PYTHON) -m pytest tests/workers/test_chaos.py -q -s >artifacts/soak-$$i.log 2>&1; status=$$?; \
	  echo "soak $$i: $$(( $$(date +%s) - started )) s (exit $$status): $$(grep -h -m1 'chaos seed' artifacts/soak-$$i.log) $$(grep -h -m1 'chaos actions' artifacts/soak-$$i.log)"; \
	  [ $$status -eq 0 ] || { tail -50 artifacts/soak-$$i.log; exit $$status; }; \
	done

# Again with Django's server-side parameter binding (psycopg), which the engine's and the
# reaper's raw SQL must also work with: the db and postgres tiers less what is the same on
# any driver and binding (one_driver: the API's and the admin's modules, whose queries are
# Django's own).
test-postgres-ssb: install
	AGENTRUN_TEST_SERVER_SIDE_BINDING=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/db tests/postgres -q \
	  -m "not one_driver" $(XDIST)

# Again through psycopg2 (projects on the older driver): the tests make `import psycopg`
# fail, so Django and the app fall back to psycopg2, workers included. The db and postgres
# tiers, less what is the same on any driver (one_driver), and of the worker processes the
# one that exercises the heartbeat's reconnect (both_drivers, test-workers-psycopg2); the
# crash matrix and the chaos test run on psycopg 3 only.
test-postgres-psycopg2: install
	AGENTRUN_TEST_PSYCOPG2=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/db tests/postgres -q \
	  -m "not one_driver" $(XDIST)

test-workers-psycopg2: install
	AGENTRUN_TEST_PSYCOPG2=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest $(WORKER_TIER) -q -m both_drivers

# Behind connection poolers, with the app's settings at their defaults: the worker tier's
# end-to-end, approval, conversation and crash tests (a subset: the full matrix runs on the
# direct connection above). test-pgbouncer: Debian's PgBouncer in transaction mode with 3
# server connections, started by tests/pgbouncer.py as a child of the run; the test process
# and its workers connect through it (DISABLE_SERVER_SIDE_CURSORS, as Django asks), the test
# database is made on the direct port. Without pgbouncer (and no way to install it) the
# stage says it was skipped. test-django-pool: Django's own psycopg pool, OPTIONS "pool"
# (psycopg_pool's defaults; test_django_pool.py gives its worker max_size 4 and a batch of 6).
POOLED_TESTS = tests/workers/test_delivery.py::test_duplicate_delivery__two_workers_execute_each_turn_once \
	tests/workers/test_conversations.py \
	tests/workers/test_crash_matrix.py::test_non_idempotent_without_check__waits_for_a_person \
	"tests/workers/test_crash_matrix.py::test_crash_at__every_failpoint[tool.after_handler]" \
	"tests/workers/test_crash_matrix.py::test_crash_at__every_failpoint__follow_up[tool.after_commit]" \
	tests/workers/test_governor.py::test_caps__at_most_n_runs_of_a_key_are_worked_at_once \
	tests/postgres/test_concurrency.py::test_cap__claims_racing_under_one_cap_take_its_slots_only
POOL_TESTS = tests/workers/test_delivery.py::test_duplicate_delivery__two_workers_execute_each_turn_once \
	tests/workers/test_django_pool.py \
	tests/workers/test_conversations.py::test_interrupt__a_run_waiting_for_an_approval_and_the_one_queued_behind_it \
	"tests/workers/test_crash_matrix.py::test_crash_at__every_failpoint[tool.after_handler]"

test-pgbouncer: install pgbouncer
	DATABASE_URL=$(PG_URL) $(PYTHON) -m tests.pgbouncer --mode transaction --pool-size 3 -- \
	  $(PYTHON) -m pytest $(POOLED_TESTS) -q -rs

test-django-pool: install
	AGENTRUN_TEST_DJANGO_POOL=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest $(POOL_TESTS) -q

# The AI SDK's own client (the `ai` package from npm, pinned by tests/node/package-lock.json)
# reading the live stream's UI message stream format from uvicorn and a real worker.
test-node: install node
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/workers/test_ai_sdk.py -q -rs

# The admin as an operator uses it, and the example chat page: headless Chromium (Debian's,
# through the playwright package) against a live server on Postgres, psycopg 3 (the chat
# page: uvicorn, real workers, Redis). Screenshots in artifacts/screenshots/.
# Without Chromium (and no way to install it) the tier is skipped, saying so.
test-browser: install chromium
	AGENTRUN_CHROMIUM=$(CHROMIUM) DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/browser -q -rs

# The newest Django 6.x pip resolves, on Python 3.12: the pure, db and postgres tiers on
# Postgres (psycopg 3; under `make test`, in place of test-postgres), and the admin in the
# browser (its layout moved in 6.1). What is cut, and why it is still
# covered: the db tier on SQLite under Django 6 (what differs between SQLite and Postgres is
# the store's two implementations, run on Django 5 by test-sqlite and the driver runs; what
# differs on Django 6 is Django's API, which the db tier meets the same way on either
# database), and the chat page's browser tests under Django 6 (the example project's own
# page and script against the API: the API under Django 6 is the db tier's, the page's
# behaviour in a browser is test-browser's).
DJANGO6 ?= Django>=6.0
$(VENV_DJANGO6)/.installed: pyproject.toml
	test -x $(VENV_DJANGO6)/bin/python || $(PYTHON312) -m venv $(VENV_DJANGO6)
	$(VENV_DJANGO6)/bin/python -m pip install -q --upgrade pip
	$(VENV_DJANGO6)/bin/python -m pip install -q --upgrade -e ".[test]" "$(DJANGO6)"
	touch $@

test-django6:
	flock $(VENV_DJANGO6).lock $(MAKE) --no-print-directory $(VENV_DJANGO6)/.installed \
	  || { cat artifacts/prebuild-django6.log 2>/dev/null; exit 1; }
	DATABASE_URL=$(PG_URL) $(VENV_DJANGO6)/bin/python -m pytest tests/pure tests/db tests/postgres \
	  -q $(XDIST)

# The schedule explorer (tests/explorer, docs/how-to/development.md): the engine, the reaper
# and people as actors on Postgres (psycopg 3), interleaved at every scheduling point, within
# its budget (a fixed set of seeds per scenario, the defects it found as their schedules);
# `make explore SCHEDULES=N` runs N guided schedules (EXPLORE_FIRST_SEED=K moves the seeds).
SCHEDULES ?= 2000
EXPLORE_FIRST_SEED ?= 1000
test-explore: install
	AGENTRUN_EXPLORE=1 DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/postgres/test_explore.py \
	  -q $(XDIST)

explore: install
	AGENTRUN_EXPLORE=1 EXPLORE_SCHEDULES=$(SCHEDULES) EXPLORE_FIRST_SEED=$(EXPLORE_FIRST_SEED) \
	  DATABASE_URL=$(PG_URL) $(PYTHON) -m pytest tests/postgres/test_explore.py -q -s -k long

# The admin in the browser on that Django 6.x (skipped, saying so, without Chromium).
test-browser-django6: chromium
	flock $(VENV_DJANGO6).lock $(MAKE) --no-print-directory $(VENV_DJANGO6)/.installed \
	  || { cat artifacts/prebuild-django6.log 2>/dev/null; exit 1; }
	AGENTRUN_CHROMIUM=$(CHROMIUM) DATABASE_URL=$(PG_URL) $(VENV_DJANGO6)/bin/python -m pytest \
	  tests/browser/test_console.py -q -rs

# What a user installs: the wheel and the sdist built from a clean export, checked, listed
# against the package's files, installed into fresh virtualenvs on Python 3.13 and run
# as a fresh project (tools/release_check.py).
# Under `make test` (PREBUILT=1) it tests what prebuild-release prepared in the background.
test-release: install
	@if [ -n "$(PREBUILT)" ]; then \
	  flock $(RELEASE_WORK).lock true; \
	  cat artifacts/prebuild-release.log; \
	  DATABASE_URL=$(PG_URL) $(PYTHON) tools/release_check.py --python $(PYTHON313) \
	    --prepared --keep $(RELEASE_WORK); \
	else \
	  DATABASE_URL=$(PG_URL) $(PYTHON) tools/release_check.py --python $(PYTHON313); \
	fi

# The docs site (mkdocs.yml) into site/, strict: a broken link, a missing page or anchor, a
# docstring mkdocstrings cannot read or an OpenAPI warning fails the build.
.PHONY: docs
docs: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --quiet

# The seed's scenario with real processes; SQLite and a server-less broker unless told otherwise.
# Its own small virtualenv: the package and what the example project needs (the mcp SDK: the
# demo agent's order system is an MCP server), no test tooling.
DEMO_VENV ?= .venv-demo
$(DEMO_VENV)/.installed: pyproject.toml
	test -x $(DEMO_VENV)/bin/python || python3 -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q -e ".[mcp]"
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/python manage.py agentrun_demo

# The demo with its traces (docs/how-to/telemetry.md): every process writes its spans and
# metrics to .demo-traces/ through the OpenTelemetry SDK; the runs' span trees are printed
# at the end. With OTEL_EXPORTER_OTLP_ENDPOINT (and opentelemetry-exporter-otlp) instead,
# the example project sends them to that OTLP viewer.
demo-traces: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/python -m pip install -q "opentelemetry-sdk>=1.27"
	rm -rf .demo-traces
	AGENTRUN_TELEMETRY_DIR=$(CURDIR)/.demo-traces AGENTRUN_TELEMETRY_INTERVAL=5 \
	  $(DEMO_VENV)/bin/python manage.py agentrun_demo
	$(DEMO_VENV)/bin/python -m django_agentrun.testing.telemetry .demo-traces

# The example chat page at http://127.0.0.1:$(PORT)/chat/ (user demo, password demo): uvicorn
# and a Celery worker on Redis at REDIS_URL (make chat PORT=8001 REDIS_URL=redis://host:6379/1;
# CHAT_ARGS for the command's other options).
PORT ?= 8000
REDIS_URL ?= redis://127.0.0.1:6379/0
chat: install
	$(PYTHON) manage.py agentrun_chat --port $(PORT) --redis-url $(REDIS_URL) $(CHAT_ARGS)

# A staff user (a superuser) for the admin, in the chat page's SQLite database, before or
# after `make chat`: the tables are made first. It asks for a name and a password
# (ADMIN_ARGS="--noinput" with DJANGO_SUPERUSER_USERNAME, _PASSWORD and _EMAIL set does not).
admin: install
	DJANGO_SECRET_KEY=$${DJANGO_SECRET_KEY:-local-admin-only} $(PYTHON) manage.py migrate --no-input -v 0
	DJANGO_SECRET_KEY=$${DJANGO_SECRET_KEY:-local-admin-only} $(PYTHON) manage.py createsuperuser $(ADMIN_ARGS)

bench: install
	DATABASE_URL=$(PG_URL) $(PYTHON) bench/run.py

bench-quick: install
	DATABASE_URL=$(PG_URL) $(PYTHON) bench/run.py --quick

# The load target (bench/load.py): 1,000 runs, 2 prefork workers x 2, lease 3 s, the reaper
# every second; BENCH_HOG=2 runs it beside two busy loops at nice -5 (a saturated machine).
bench-load: install
	DATABASE_URL=$(BENCH_DB_URL) $(PYTHON) bench/run.py --only load

# The governor check (bench/governor.py, issue #26): 120 + 4 runs against a stand-in
# limited to 5 requests/s, 2 workers x 2 processes (BENCH_ARGS=--quick: 40 + 4 runs).
bench-governor: install
	DATABASE_URL=$(BENCH_DB_URL) $(PYTHON) bench/governor.py $(BENCH_ARGS)

# The side-by-side benchmark (bench/side_by_side.py): django-agentrun against DBOS and
# LangGraph, whose packages live in a virtualenv of their own (never in $(VENV)).
PEERS_VENV ?= bench/.venv-peers
BENCH_DB_URL ?= postgres://postgres@127.0.0.1:5432/agentrun_bench
.PHONY: bench-peers bench-side-by-side bench-governor

$(PEERS_VENV)/.installed: bench/peers/requirements.txt
	test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q -r bench/peers/requirements.txt
	touch $@

bench-peers: $(PEERS_VENV)/.installed

# BENCH_ARGS="--quick" or "--rounds 5".
bench-side-by-side: install bench-peers
	DATABASE_URL=$(BENCH_DB_URL) $(PYTHON) bench/side_by_side.py $(BENCH_ARGS)
