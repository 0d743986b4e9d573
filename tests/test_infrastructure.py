"""The test infrastructure itself: the database is the one asked for, the
throwaway cluster can be restarted, and child processes share the test
database."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from django.db import DatabaseError, connection

from tests.testapp.models import Item


def expected_vendor() -> str:
    wanted = os.environ.get("FENCEDJOBS_TEST_DB", "").lower()
    url = os.environ.get("DATABASE_URL", "").lower()
    if wanted == "sqlite" or not url or url.startswith("sqlite:"):
        return "sqlite"
    return "postgresql"


@pytest.mark.django_db
def test_database_is_the_one_the_environment_names(on_postgres: bool) -> None:
    assert connection.vendor == expected_vendor()
    assert on_postgres is (connection.vendor == "postgresql")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    if connection.vendor == "sqlite":
        # A file, not :memory:, so that several processes can share it.
        name = str(connection.settings_dict["NAME"])
        assert "memory" not in name and os.path.isfile(name)


@pytest.mark.postgres_only
@pytest.mark.throwaway_server
@pytest.mark.django_db
def test_throwaway_cluster_exports_pg_ctl() -> None:
    pg_ctl = os.environ.get("FENCEDJOBS_TEST_PG_CTL", "")
    datadir = os.environ.get("FENCEDJOBS_TEST_PG_DATADIR", "")
    assert pg_ctl and datadir
    status = subprocess.run(
        [*shlex.split(pg_ctl), "status"], capture_output=True, text=True, check=False
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert "server is running" in status.stdout
    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        assert cursor.fetchone() == (datadir,)


@pytest.mark.postgres_only
@pytest.mark.throwaway_server
@pytest.mark.django_db(transaction=True)
def test_server_restart_breaks_connections_and_reconnecting_works() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (before,) = cursor.fetchone()
    subprocess.run(
        [*shlex.split(os.environ["FENCEDJOBS_TEST_PG_CTL"]), "restart", "-m", "fast", "-w"],
        check=True,
        capture_output=True,
    )
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (after,) = cursor.fetchone()
    assert after != before


@pytest.mark.django_db(transaction=True)
def test_child_process_sees_the_test_database(child_env: dict[str, str]) -> None:
    Item.objects.create(name="from-the-test")
    code = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "from tests.testapp.models import Item\n"
        "print(connection.vendor, *Item.objects.values_list('name', flat=True))\n"
        "Item.objects.create(name='from-the-child')\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == [connection.vendor, "from-the-test"]
    assert sorted(Item.objects.values_list("name", flat=True)) == [
        "from-the-child",
        "from-the-test",
    ]
