"""Generic fixtures for the whole suite.

Tests marked ``postgres_only`` are not skipped on SQLite: ``make test``
deselects them there (``-m "not postgres_only"``), and one that runs on
SQLite anyway fails with an explanation instead of passing vacuously.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from django.conf import settings

REPO_ROOT = Path(__file__).resolve().parent.parent


def _configured_vendor() -> str:
    engine = settings.DATABASES["default"]["ENGINE"]
    return "postgresql" if "postgresql" in engine else "sqlite" if "sqlite" in engine else engine


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
