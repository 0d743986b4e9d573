# django-fencedjobs: the commands the README promises.
#
#   make test    the whole suite on a throwaway PostgreSQL, then on SQLite, then
#                the matrix pass (make test-matrix)
#   make lint    ruff check, ruff format --check, mypy (strict: pyproject.toml), then the
#                sdist and the wheel built and checked (make dist-check)
#   make bench   benchmarks on a durable throwaway PostgreSQL
#   make soak    random faults against three runners on a throwaway PostgreSQL (docs/reliability.md)
#   make soak-pgbouncer  the same, through PgBouncer in transaction pooling
#   make demo    the example project
#
# PY picks the Python for the virtualenv; PYTEST_ARGS are passed to both
# pytest passes (e.g. make test PYTEST_ARGS="-x -k lease"). If DATABASE_URL
# is set, the PostgreSQL pass uses that server instead of a throwaway one.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
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
	$(BIN)/python -m pip install --quiet -e '.[dev]'
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
# PgBouncer, which scripts/throwaway_postgres.py starts in front of its cluster. Installed
# here when missing and we may (root with apt); otherwise those tests fail and say why.
pooler-deps:
	@if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then \
		if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing the Debian package pgbouncer for the pooler tests"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends pgbouncer </dev/null \
				|| echo "make: installing pgbouncer failed; the pooler tests will fail"; \
		else \
			echo "make: pgbouncer is missing (apt-get install pgbouncer); the pooler tests will fail"; \
		fi; \
	fi

# All three passes always run; the target fails if any failed (pytest's exit
# code 5, "no tests collected", is a failure too).
test: venv browser-deps pooler-deps
	@pg=0; sq=0; mx=0; \
	echo "==> PostgreSQL pass"; \
	FENCEDJOBS_TEST_DB=postgres $(PY) scripts/throwaway_postgres.py -- \
		$(BIN)/python -m pytest $(PYTEST_ARGS) || pg=$$?; \
	echo "==> SQLite pass"; \
	env -u DATABASE_URL FENCEDJOBS_TEST_DB=sqlite \
		$(BIN)/python -m pytest -m "not postgres_only and not browser and not system" $(PYTEST_ARGS) || sq=$$?; \
	$(MAKE) --no-print-directory test-matrix || mx=$$?; \
	if [ $$pg -ne 0 ]; then echo "make test: PostgreSQL pass FAILED (exit $$pg)"; fi; \
	if [ $$sq -ne 0 ]; then echo "make test: SQLite pass FAILED (exit $$sq)"; fi; \
	if [ $$mx -ne 0 ]; then echo "make test: matrix pass FAILED (exit $$mx)"; fi; \
	if [ $$pg -ne 0 ] || [ $$sq -ne 0 ] || [ $$mx -ne 0 ]; then exit 1; fi; \
	echo "make test: all passes (PostgreSQL, SQLite, matrix) passed"

test-postgres: venv browser-deps pooler-deps
	FENCEDJOBS_TEST_DB=postgres $(PY) scripts/throwaway_postgres.py -- $(BIN)/python -m pytest $(PYTEST_ARGS)

test-sqlite: venv
	env -u DATABASE_URL FENCEDJOBS_TEST_DB=sqlite \
		$(BIN)/python -m pytest -m "not postgres_only and not browser and not system" $(PYTEST_ARGS)

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
	touch $@

test-matrix: $(MATRIX_STAMP) pooler-deps
	@$(MATRIX_BIN)/python -c 'import sys, django; print("==> Matrix pass: Django", django.get_version(), "on Python", sys.version.split()[0])'
	FENCEDJOBS_TEST_DB=postgres $(PY) scripts/throwaway_postgres.py -- \
		$(MATRIX_BIN)/python -m pytest -m "not browser" $(PYTEST_ARGS)

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
