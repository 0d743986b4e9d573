# django-fencedjobs: the commands the README promises.
#
#   make test    the whole suite on a throwaway PostgreSQL and on SQLite, side by side
#   make test-matrix  the suite on the newest Django and a newer Python (PostgreSQL)
#   make lint    ruff check, ruff format --check, mypy (strict: pyproject.toml), then the
#                sdist and the wheel built and checked (make dist-check)
#   make bench   benchmarks on a durable throwaway PostgreSQL
#   make soak    random faults against three runners on a throwaway PostgreSQL (docs/reliability.md)
#   make soak-pgbouncer  the same, through PgBouncer in transaction pooling
#   make demo    the example project
#
# PY picks the Python for the virtualenv; PYTEST_ARGS are passed to every
# pytest pass (e.g. make test PYTEST_ARGS="-x -k lease"); TEST_WORKERS is how many
# tests a pass runs at a time (4). If DATABASE_URL is set, the PostgreSQL pass uses
# that server instead of a throwaway one.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# django-tasks-rq, installed without its dependencies: pyproject.toml's dev extra has the
# ones it uses (not rq-scheduler, whose `crontab` shadows django-celery-beat's).
RQ_BACKEND := 'django-tasks-rq>=0.12,<0.13'
PYTEST_ARGS ?=
BENCH_ARGS ?=

.DEFAULT_GOAL := test
.PHONY: venv browser-deps pooler-deps test test-postgres test-sqlite test-matrix lint bench demo clean

venv: $(STAMP)

# Rebuilt when pyproject.toml changes; the stamp is written last, so a failed
# install is retried on the next run.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,dev-celery-beat]'
	$(BIN)/python -m pip install --quiet --no-deps $(RQ_BACKEND)
	touch $@

# The browser test drives Debian's Chromium (never a downloaded browser). Installed
# here when missing and we may (root with apt); otherwise that test fails and says why.
browser-deps:
	@if ! command -v chromium >/dev/null && [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing the Debian package chromium for the browser test"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium </dev/null \
				|| echo "make: installing chromium failed; the browser test will fail"; \
		else \
			echo "make: chromium is missing (apt-get install chromium); the browser test will fail"; \
		fi; \
	fi

# The pooler tests (tests/test_poolers.py) and make soak-pgbouncer go through Debian's
# PgBouncer, which scripts/throwaway_postgres.py starts in front of its cluster; the RQ task
# tests (tests/test_tasks_rq.py) start a throwaway Debian redis-server of their own. Each is
# installed here when missing and we may (root with apt); otherwise the tests that need it
# fail and say why.
pooler-deps:
	@missing=""; \
	command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing="$$missing pgbouncer"; \
	command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing the Debian packages$$missing for the pooler and RQ task tests"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing </dev/null \
				|| echo "make: installing$$missing failed; the tests that need them will fail"; \
		else \
			echo "make: missing$$missing (apt-get install$$missing); the tests that need them will fail"; \
		fi; \
	fi

# make test runs three parts in two lines side by side (make -j2), each part printing its
# output, and how long it took, when it ends:
#   test-postgres-shared  the suite on a throwaway PostgreSQL, TEST_WORKERS tests at a time
#                         (pytest-xdist; each worker has a test database of its own);
# beside it, one after the other (test-server-then-sqlite):
#   test-postgres-server  the throwaway_server tests (the soak, server restarts), which
#                         restart their server: one at a time, on a throwaway server of
#                         their own;
#   test-sqlite           the suite on SQLite, TEST_WORKERS tests at a time.
# Never all three at once: the fault tests of the three, with real runner processes and
# their lateness measured, starve each other of the two cores.
# A test that uses no database and gives the same result on both (database_independent,
# see tests/conftest.py) runs once, on the SQLite pass; make test-postgres runs those
# too. Every part always runs; the target fails if any failed (pytest's exit code 5, "no
# tests collected", is a failure too, unless PYTEST_ARGS narrowed the selection).
# TEST_WORKERS=0 runs the tests of each part one at a time.
TEST_WORKERS ?= 4
TEST_BIN ?= $(BIN)
SQLITE_MARKS := not postgres_only and not browser and not system
PG_SHARED_MARKS ?= not throwaway_server
PG_PASS ?= PostgreSQL pass
ON_THROWAWAY_PG := FENCEDJOBS_TEST_DB=postgres $(PY) scripts/throwaway_postgres.py --
XDIST = -n $(TEST_WORKERS) --dist worksteal

# $(call pytest_part,NAME,COMMAND): COMMAND, then one line saying how it went, and how long
# it took.
pytest_part = start=$$(date +%s); rc=0; $(2) || rc=$$?; \
	$(if $(strip $(PYTEST_ARGS)),[ $$rc -ne 5 ] || rc=0;) \
	took="$$(( $$(date +%s) - start )) s"; \
	if [ $$rc -eq 0 ]; then echo "==> $(1): passed in $$took"; \
	else echo "==> $(1): FAILED (exit $$rc) after $$took"; fi; exit $$rc

test: venv browser-deps pooler-deps
	@echo "==> make test: the PostgreSQL pass, and beside it its server tests then the SQLite pass, $(TEST_WORKERS) tests at a time in each; each part prints its output when it ends"
	@start=$$(date +%s); rc=0; \
	$(MAKE) --no-print-directory -k -j2 --output-sync=target \
		PG_SHARED_MARKS="not throwaway_server and not database_independent" \
		test-postgres-shared test-server-then-sqlite || rc=1; \
	if [ $$rc -eq 0 ]; then \
		echo "make test: all passes (PostgreSQL, SQLite) passed in $$(( $$(date +%s) - start )) s"; \
	else \
		echo "make test: FAILED (the part that failed says so above)"; exit 1; \
	fi

# Both always run; it fails if either failed.
.PHONY: test-server-then-sqlite
test-server-then-sqlite:
	@rc=0; $(MAKE) --no-print-directory test-postgres-server || rc=1; \
	$(MAKE) --no-print-directory test-sqlite || rc=1; exit $$rc

test-postgres: venv browser-deps pooler-deps
	@$(MAKE) --no-print-directory -k -j2 --output-sync=target test-postgres-shared test-postgres-server

# The parts. Their callers make the virtualenv and install what the tests need.
.PHONY: test-postgres-shared test-postgres-server
test-postgres-shared:
	@$(call pytest_part,$(PG_PASS),$(ON_THROWAWAY_PG) $(TEST_BIN)/python -m pytest $(XDIST) -m "$(PG_SHARED_MARKS)" $(PYTEST_ARGS))

# With the caller's DATABASE_URL there is no server of our own to restart: conftest.py
# deselects every throwaway_server test, so this part has nothing to run.
test-postgres-server:
	@if [ -n "$$DATABASE_URL" ]; then \
		echo "==> $(PG_PASS), server tests: none on the caller's DATABASE_URL"; exit 0; fi; \
	$(call pytest_part,$(PG_PASS) server tests,$(ON_THROWAWAY_PG) $(TEST_BIN)/python -m pytest -m throwaway_server $(PYTEST_ARGS))

test-sqlite: venv
	@$(call pytest_part,SQLite pass,env -u DATABASE_URL FENCEDJOBS_TEST_DB=sqlite $(BIN)/python -m pytest $(XDIST) -m "$(SQLITE_MARKS)" $(PYTEST_ARGS))

# The matrix pass: the newest Django 6.x on a newer Python (3.13, else 3.12) in a
# second virtualenv, on a throwaway PostgreSQL, without the browser tests. The
# main passes cover the oldest supported pair (Django 5.2 LTS, Python 3.11).
# MATRIX_PY names the interpreter; by default scripts/find_python looks under
# pyenv and on PATH, and fails with what to do when there is none.
MATRIX_VENV ?= .venv-django6
MATRIX_BIN := $(MATRIX_VENV)/bin
MATRIX_STAMP := $(MATRIX_VENV)/.installed
MATRIX_PY ?=
MATRIX_DJANGO ?= Django>=6,<7

$(MATRIX_STAMP): pyproject.toml
	@py='$(MATRIX_PY)'; [ -n "$$py" ] || py=$$(scripts/find_python 3.13 3.12) || exit 1; \
	echo "$(MATRIX_VENV): $$($$py --version) ($$py)"; \
	rm -rf $(MATRIX_VENV) && $$py -m venv $(MATRIX_VENV)
	$(MATRIX_BIN)/python -m pip install --quiet --upgrade pip
	$(MATRIX_BIN)/python -m pip install --quiet -e '.[dev]' '$(MATRIX_DJANGO)'
	$(MATRIX_BIN)/python -m pip install --quiet --no-deps $(RQ_BACKEND)
	touch $@

# In two parts side by side, as the PostgreSQL pass of make test.
test-matrix: $(MATRIX_STAMP) pooler-deps
	@$(MATRIX_BIN)/python -c 'import sys, django; print("==> Matrix pass: Django", django.get_version(), "on Python", sys.version.split()[0])'
	@$(MAKE) --no-print-directory -k -j2 --output-sync=target TEST_BIN=$(MATRIX_BIN) \
		PG_PASS="Matrix pass" PG_SHARED_MARKS="not throwaway_server and not browser" \
		test-postgres-shared test-postgres-server

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@$(MAKE) --no-print-directory dist-check

# The sdist and the wheel as users get them, built into a temporary directory (removed
# after): twine checks their metadata (the README renders), scripts/check_dist.py their
# contents (every module, migration, template and static file, py.typed, LICENSE; the
# sdist's tests and docs, as MANIFEST.in says; nothing stray). The build's log is shown
# only when it fails.
.PHONY: dist-check
dist-check: venv
	@dist=$$(mktemp -d); \
	echo "==> python -m build --outdir $$dist"; \
	if $(BIN)/python -m build --outdir "$$dist" . >"$$dist/build.log" 2>&1; then \
		$(BIN)/twine check --strict "$$dist"/*.tar.gz "$$dist"/*.whl \
			&& $(BIN)/python scripts/check_dist.py "$$dist"; \
		rc=$$?; \
	else \
		rc=$$?; cat "$$dist/build.log"; echo "make dist-check: the build failed"; \
	fi; \
	rm -rf "$$dist"; exit $$rc

bench: venv
	$(PY) scripts/throwaway_postgres.py --durable -- $(BIN)/python bench/run.py $(BENCH_ARGS)

# The example project in the foreground (docs/demo.md): migrate its SQLite file, create
# or reset the admin login, seed data, then the scheduler (runjobs), a task worker
# (db_worker, for the scheduled task) and the admin (runserver) together until Ctrl-C. DEMO_PORT picks the port (default 8000);
# DATABASE_URL another database.
demo: venv
	$(BIN)/python manage.py demo

clean:
	rm -rf $(VENV) $(MATRIX_VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The randomized fault test (docs/reliability.md): SOAK_SECONDS of faults (default 600)
# then a quiet period, against a throwaway PostgreSQL; SOAK_SEED replays a schedule (the
# seed is printed first); SOAK_ARGS passes more (--markdown FILE, --json FILE, --dir DIR).
#   make soak SOAK_SECONDS=1800 SOAK_SEED=123
SOAK_SECONDS ?= 600
SOAK_SEED ?=
SOAK_ARGS ?=
.PHONY: soak soak-pgbouncer
soak: venv
	$(PY) scripts/throwaway_postgres.py -- $(BIN)/python scripts/soak.py \
		--seconds $(SOAK_SECONDS) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) $(SOAK_ARGS)

# The soak with PgBouncer (transaction pooling, default_pool_size 3) between every process
# and the server: make soak SOAK_ARGS=--pgbouncer is the same.
soak-pgbouncer: venv pooler-deps
	$(PY) scripts/throwaway_postgres.py --pgbouncer -- $(BIN)/python scripts/soak.py --pgbouncer \
		--seconds $(SOAK_SECONDS) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) $(SOAK_ARGS)
