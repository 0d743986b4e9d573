# django-fencedjobs: the commands the README promises.
#
#   make test    the whole suite on a throwaway PostgreSQL, then on SQLite
#   make lint    ruff check, ruff format --check, mypy
#   make bench   benchmarks on a durable throwaway PostgreSQL
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
.PHONY: venv test test-postgres test-sqlite lint bench demo clean

venv: $(STAMP)

# Rebuilt when pyproject.toml changes; the stamp is written last, so a failed
# install is retried on the next run.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# Both passes always run; the target fails if either failed (pytest's exit
# code 5, "no tests collected", is a failure too).
test: venv
	@pg=0; sq=0; \
	echo "==> PostgreSQL pass"; \
	FENCEDJOBS_TEST_DB=postgres $(PY) scripts/throwaway_postgres.py -- \
		$(BIN)/python -m pytest $(PYTEST_ARGS) || pg=$$?; \
	echo "==> SQLite pass"; \
	env -u DATABASE_URL FENCEDJOBS_TEST_DB=sqlite \
		$(BIN)/python -m pytest -m "not postgres_only and not browser" $(PYTEST_ARGS) || sq=$$?; \
	if [ $$pg -ne 0 ]; then echo "make test: PostgreSQL pass FAILED (exit $$pg)"; fi; \
	if [ $$sq -ne 0 ]; then echo "make test: SQLite pass FAILED (exit $$sq)"; fi; \
	if [ $$pg -ne 0 ] || [ $$sq -ne 0 ]; then exit 1; fi; \
	echo "make test: both passes (PostgreSQL, SQLite) passed"

test-postgres: venv
	FENCEDJOBS_TEST_DB=postgres $(PY) scripts/throwaway_postgres.py -- $(BIN)/python -m pytest $(PYTEST_ARGS)

test-sqlite: venv
	env -u DATABASE_URL FENCEDJOBS_TEST_DB=sqlite \
		$(BIN)/python -m pytest -m "not postgres_only and not browser" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: venv
	$(PY) scripts/throwaway_postgres.py --durable -- $(BIN)/python bench/run.py $(BENCH_ARGS)

# The example project in the foreground (docs/demo.md): migrate its SQLite file, create
# or reset the admin login, seed data, then the scheduler (runjobs) and the admin
# (runserver) together until Ctrl-C. DEMO_PORT picks the port (default 8000);
# DATABASE_URL another database.
demo: venv
	$(BIN)/python manage.py demo

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
