"""Generic fixtures for the whole suite.

Tests marked ``postgres_only`` are not skipped on SQLite: ``make test``
deselects them there (``-m "not postgres_only"``), and one that runs on
SQLite anyway fails with an explanation instead of passing vacuously.

Tests marked ``throwaway_server`` restart or inspect the PostgreSQL cluster that
``scripts/throwaway_postgres.py`` started; with a ``DATABASE_URL`` supplied by the
caller they are deselected (and counted as such), never skipped.

Tests marked ``pgbouncer`` go through the PgBouncer that script starts in front of the
cluster; with the caller's ``DATABASE_URL`` they are deselected too, unless
``FENCEDJOBS_TEST_PGBOUNCER_URL`` names a pooler in front of it. Under the script
without a PgBouncer (not installed, or it would not start) they fail and say why.

Tests are marked ``database_independent`` here, not by hand: those of the modules in
``DATABASE_INDEPENDENT_MODULES`` that use no test database. Their result is the same on
PostgreSQL and SQLite, so ``make test`` runs them once, on its SQLite pass.

Under pytest-xdist (``make test`` runs ``-n``) every worker has a test database of its
own (pytest-django adds ``_gw0``, ``_gw1``... to its name), which ``child_env`` hands to
the processes a test starts; the PostgreSQL server, its PgBouncer and the machine are
shared, so a test looks only at its own database's sessions and locks, and takes a free
port, never a fixed one. ``throwaway_server`` tests restart the server: ``make test``
runs them one at a time, on a server of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

import pytest
from django.conf import settings

if TYPE_CHECKING:
    from tests.test_sentry import CapturingTransport

REPO_ROOT = Path(__file__).resolve().parent.parent


def _configured_vendor() -> str:
    engine = settings.DATABASES["default"]["ENGINE"]
    return "postgresql" if "postgresql" in engine else "sqlite" if "sqlite" in engine else engine


#: Modules whose tests, where they use no test database, do not depend on the database:
#: schedules, job definitions, the wheel, the deploy recipes, the soak's plan and checker,
#: the benchmarks' result pages, the throwaway server script's arguments.
DATABASE_INDEPENDENT_MODULES = frozenset(
    {
        "test_bench_results.py",
        "test_deploy_recipes.py",
        "test_packaging.py",
        "test_registry.py",
        "test_schedule.py",
        "test_schedule_dst.py",
        "test_schedule_properties.py",
        "test_soak.py",
        "test_sqlite_write_lock.py",
        "test_throwaway_postgres_script.py",
    }
)
#: Tests with these marks run on PostgreSQL only, never marked database_independent.
_POSTGRES_PASS_ONLY = ("postgres_only", "throwaway_server", "pgbouncer", "system", "browser")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "database_independent: uses no test database and gives the same result on "
        "PostgreSQL and SQLite (set by tests/conftest.py, never by hand)",
    )


def uses_the_test_database(item: pytest.Item) -> bool:
    """The test asks for the test database: its mark, a fixture that sets it up (``db``,
    ``transactional_db``, ``child_env``...), or which database it is (``on_postgres``)."""
    fixtures = getattr(item, "fixturenames", ())
    return (
        item.get_closest_marker("django_db") is not None
        or "django_db_setup" in fixtures
        or "on_postgres" in fixtures
    )


@pytest.hookimpl(tryfirst=True)  # before -m selects by marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (
            item.path.name in DATABASE_INDEPENDENT_MODULES
            and not uses_the_test_database(item)
            and not any(item.get_closest_marker(m) for m in _POSTGRES_PASS_ONLY)
        ):
            item.add_marker(pytest.mark.database_independent)
    if os.environ.get("FENCEDJOBS_TEST_PG_THROWAWAY") == "1":
        return
    markers = ["throwaway_server"]
    if not os.environ.get("FENCEDJOBS_TEST_PGBOUNCER_URL"):
        # The caller's server, and no pooler in front of it that we know of.
        markers.append("pgbouncer")
    deselected = [item for item in items if any(item.get_closest_marker(m) for m in markers)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        gone = set(deselected)
        items[:] = [item for item in items if item not in gone]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres_only") and _configured_vendor() != "postgresql":
        pytest.fail(
            "postgres_only test selected but the database is "
            f"{_configured_vendor()}: run it under scripts/throwaway_postgres.py "
            "or deselect it with -m 'not postgres_only'",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def on_postgres() -> bool:
    """True when the suite runs on PostgreSQL, False on SQLite."""
    return _configured_vendor() == "postgresql"


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL that tests.settings turns back into settings_dict's database."""
    if "sqlite" in settings_dict["ENGINE"]:
        return "sqlite:///" + quote(str(Path(settings_dict["NAME"]).resolve()))
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
    host = quote(settings_dict.get("HOST") or "", safe="")
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    query = urlencode(
        {k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if isinstance(v, str | int)}
    )
    url = f"postgres://{auth}{host}{port}/{quote(settings_dict['NAME'], safe='')}"
    return f"{url}?{query}" if query else url


@pytest.fixture
def child_env(django_db_setup: None) -> dict[str, str]:
    """Environment for a subprocess (``python -c``, ``manage.py``-style) that
    must use this run's *test* database, with ``tests.settings``.

    Data the child should see must be committed: use ``transactional_db``.
    """
    from django.db import connection

    env = dict(os.environ)
    env["DATABASE_URL"] = database_url(connection.settings_dict)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


#: Where the ``jobs`` fixture sets the fake clock.
JOBS_T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


@pytest.fixture
def jobs():
    """An empty job registry and the fake clock, set to 2026-11-29 09:00 UTC, for one test.

    Jobs declared with ``@job`` inside the test land in the isolated registry and run with
    ``loop.tick()`` as the clock is moved (``fake_clock.set`` / ``advance``).
    """
    from django.test import override_settings

    from django_fencedjobs.clock import fake_clock
    from django_fencedjobs.registry import registry

    with (
        registry.isolated() as isolated,
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        fake_clock.set(JOBS_T0)
        yield isolated


@pytest.fixture
def spawn(child_env, tmp_path):
    """Starts fault-test workers (``tests.faults.worker``) in child processes; every one of
    them is killed when the test ends, stopped ones first resumed."""
    from tests.faults.harness import Spawner

    with Spawner(child_env, tmp_path) as spawner:
        yield spawner


@pytest.fixture
def via() -> str:
    """How the processes ``spawn_via`` starts reach the database: ``direct``, ``pgbouncer``
    (transaction pooling) or ``pool`` (Django's own pool). Tests parametrize it."""
    return "direct"


@pytest.fixture
def spawn_via(child_env, tmp_path, via):
    """``spawn``, for workers that reach the database ``via`` a connection pooler (see
    ``tests.settings``, ``FENCEDJOBS_TEST_VIA``). Afterwards the sessions PgBouncer kept
    open on the test database are ended, so that it can be flushed and dropped."""
    from tests.faults.harness import Spawner, pooler_env, release_pooled_sessions

    env = pooler_env(child_env, via)
    try:
        with Spawner(env, tmp_path) as spawner:
            yield spawner
    finally:
        if via == "pgbouncer":
            release_pooled_sessions()


@pytest.fixture
def unmigrated_env(child_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """Like ``child_env``, but for an empty database that ``migrate`` never ran on: a new
    SQLite file, or a new database on this run's PostgreSQL server (dropped afterwards)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        empty = {**connection.settings_dict, "NAME": str(tmp_path / "unmigrated.sqlite3")}
        yield {**child_env, "DATABASE_URL": database_url(empty)}
        return
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        url = database_url({**connection.settings_dict, "NAME": name})
        yield {**child_env, "DATABASE_URL": url}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sentry() -> Iterator[CapturingTransport]:
    """sentry-sdk initialised for one test, its envelopes captured
    (:class:`tests.test_sentry.CapturingTransport`): no network."""
    import sentry_sdk

    from tests.test_sentry import CapturingTransport

    transport = CapturingTransport()
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=transport,
        default_integrations=False,
        auto_enabling_integrations=False,
        environment="test",
    )
    try:
        yield transport
    finally:
        client = sentry_sdk.get_client()
        sentry_sdk.get_global_scope().set_client(None)
        client.close()


def round_trips_of(block: Callable[[], None]) -> int:
    """How many round trips ``block`` makes on this thread's default connection
    (PostgreSQL), counted in the wire protocol: a round trip ends with the server's
    ReadyForQuery."""
    import tempfile

    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    with tempfile.TemporaryFile("w+") as trace:
        raw.pgconn.trace(trace.fileno())
        try:
            block()
        finally:
            raw.pgconn.untrace()
        trace.seek(0)
        return sum("\tReadyForQuery" in line for line in trace.read().splitlines())


# -- Redis and RQ workers (tests/test_tasks_rq.py) ---------------------------------------------

if TYPE_CHECKING:
    from tests.redis_harness import RedisServer, RQWorkers


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A throwaway ``redis-server`` of this test's own (:class:`tests.redis_harness.RedisServer`):
    on a free port of 127.0.0.1, nothing persisted, ``.url`` for clients, ``.restart()`` on
    the same port; stopped when the test ends. Without Debian's ``redis-server`` the test
    fails saying so (``make test`` installs it): a skipped test would prove nothing."""
    from tests.redis_harness import RedisServer, redis_binary

    if redis_binary() is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    (tmp_path / "redis").mkdir()
    with RedisServer(directory=tmp_path / "redis") as server:
        yield server


@pytest.fixture
def rq_env(child_env: dict[str, str], redis_server: RedisServer) -> dict[str, str]:
    """``child_env`` for processes that use the RQ task backend (``rq``, tests.rq_settings)
    on this test's Redis server: the runners (``python -m tests.rq_jobs JOB``) and the
    workers ``rq_worker`` starts."""
    return {
        **child_env,
        "DJANGO_SETTINGS_MODULE": "tests.rq_settings",
        "FENCEDJOBS_TEST_REDIS_URL": redis_server.url,
    }


@pytest.fixture
def rq_worker(rq_env: dict[str, str], tmp_path: Path) -> Iterator[RQWorkers]:
    """Starts real RQ workers of django-tasks-rq against the test database and this test's
    Redis server: ``rq_worker("W0")`` (:class:`tests.redis_harness.RQWorkers`) returns the
    running :class:`~tests.redis_harness.RQWorker`; every one is killed when the test ends.
    Data the workers should see must be committed: use ``transactional_db``."""
    from tests.redis_harness import RQWorkers

    with RQWorkers(rq_env, tmp_path) as workers:
        yield workers


# -- Celery workers (tests/test_tasks_celery.py) -----------------------------------------------

if TYPE_CHECKING:
    from tests.redis_harness import CeleryWorkers


@pytest.fixture
def celery_env(child_env: dict[str, str], redis_server: RedisServer) -> dict[str, str]:
    """``child_env`` for processes that use django-tasks-fennel's Celery backend (``celery``,
    tests.celery_settings) with this test's Redis server as broker and result backend: the
    runners (``python -m tests.celery_jobs JOB``) and the workers ``celery_worker`` starts."""
    return {
        **child_env,
        "DJANGO_SETTINGS_MODULE": "tests.celery_settings",
        "FENCEDJOBS_TEST_REDIS_URL": redis_server.url,
    }


@pytest.fixture
def celery_worker(celery_env: dict[str, str], tmp_path: Path) -> Iterator[CeleryWorkers]:
    """Starts real Celery workers of django-tasks-fennel against the test database and this
    test's Redis server: ``celery_worker("W0")`` (:class:`tests.redis_harness.CeleryWorkers`)
    returns the running :class:`~tests.redis_harness.CeleryWorker`; every one is killed,
    with its pool's processes, when the test ends. Data the workers should see must be
    committed: use ``transactional_db``."""
    from tests.redis_harness import CeleryWorkers

    with CeleryWorkers(celery_env, tmp_path) as workers:
        yield workers
