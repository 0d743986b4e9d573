"""``runjobs --once`` with no due job costs a constant number of queries, whatever the number
of registered jobs: cron runs it every minute on every host, so it must not grow with the
project (one read of every lease row at once, never one query per job)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test.utils import CaptureQueriesContext

from django_fencedjobs import job
from django_fencedjobs.loop import tick
from django_fencedjobs.registry import registry

pytestmark = pytest.mark.django_db

#: The clock (on PostgreSQL), one read of the lease rows and one of the pending backfill
#: slots and one-offs, with room for constant housekeeping; the point is that 5 and 200
#: jobs cost the same.
MAX_QUERIES = 5
#: The command adds its start-up checks (the app's tables exist, and on PostgreSQL the
#: server's transaction isolation) and its chores, as every ``runjobs --once`` process does
#: them: retention's three reads of what has expired, and the task relay's one.
MAX_COMMAND_QUERIES = MAX_QUERIES + 2 + 4


def declare(count: int) -> None:
    for n in range(count):

        def handler(run):
            raise AssertionError("not due: must not run")

        # Yearly, so no job is due while the test runs.
        job("0 0 1 1 *", name=f"count.job_{n:03d}", timeout=timedelta(minutes=5))(handler)


def queries_of_an_idle_pass(count: int, django_assert_max_num_queries) -> CaptureQueriesContext:
    with registry.isolated():
        declare(count)
        first = tick()  # creates the lease rows
        assert first.runs == []
        with django_assert_max_num_queries(MAX_QUERIES) as captured:
            result = tick()
        assert result.runs == []
        assert result.next_wakeup is not None
    return captured


def test_an_idle_once_pass_issues_the_same_queries_for_5_and_200_jobs(
    django_assert_max_num_queries,
):
    few = queries_of_an_idle_pass(5, django_assert_max_num_queries)
    many = queries_of_an_idle_pass(200, django_assert_max_num_queries)
    assert len(few) == len(many), (
        [q["sql"][:120] for q in few.captured_queries],
        [q["sql"][:120] for q in many.captured_queries],
    )


def test_runjobs_once_command_with_no_due_job_is_as_cheap(django_assert_max_num_queries):
    """As cron runs it (``-v 0``, the crontab recipe): the pass, plus the command's start-up
    checks (the tables exist; PostgreSQL: the isolation level)."""
    from django.core.management import call_command

    counts = []
    for count in (5, 200):
        with registry.isolated():
            declare(count)
            call_command("runjobs", "--once", verbosity=0)
            with django_assert_max_num_queries(MAX_COMMAND_QUERIES) as captured:
                call_command("runjobs", "--once", verbosity=0)
        counts.append(len(captured))
    assert counts[0] == counts[1]
