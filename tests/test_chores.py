"""A runner's chores (retention, the task relay, notifications, the orphan sweep) are its
dispatcher's own timers: each runs at most once per its interval, and one that fails is
logged, counted and tried again at its next turn, never stopping the runner or the other
chores. On both databases where a runner is involved. (The ``jobs`` fixture selects the
fake clock, which the chores are given the time by.)"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.test import override_settings

from django_fencedjobs import job
from django_fencedjobs.chores import Chore, Chores
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import Dispatcher, app_chores, tick
from django_fencedjobs.models import JobRun, Outcome
from tests.conftest import JOBS_T0 as T0


def always(seconds: float):
    return lambda: seconds


def failing(exc: Exception):
    def action(now) -> None:
        raise exc

    return action


def test_a_chore_that_fails_is_logged_counted_and_tried_again_and_the_others_still_run(
    jobs, caplog
):
    done: list[str] = []
    chores = Chores(
        [
            Chore("broken", always(0), failing(RuntimeError("a bug in a chore"))),
            Chore("away", always(0), failing(OperationalError("server closed the connection"))),
            Chore("fine", always(0), lambda now: done.append("fine")),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="django_fencedjobs"):
        for _ in range(3):
            assert chores.run_due() == ["broken", "away", "fine"]
    assert done == ["fine"] * 3
    assert chores.failures == {"broken": 3, "away": 3}
    logged = [r for r in caplog.records if getattr(r, "event", "") == "chore_failed"]
    assert [(r.chore, r.failures) for r in logged][-2:] == [("broken", 3), ("away", 3)]
    broken, away = logged[-2:]
    # A fault of the code: an error with its traceback; the database away: a warning.
    assert broken.levelno == logging.ERROR and broken.exc_info is not None
    assert "runner chore broken failed (3 time(s) so far)" in broken.getMessage()
    assert away.levelno == logging.WARNING and away.exc_info is None
    assert "server closed the connection" in away.getMessage()


def test_a_chore_runs_at_most_once_per_its_interval_and_only_when_enabled(jobs):
    done: list[str] = []
    enabled = [False]
    chores = Chores(
        [
            Chore("hourly", always(3600), lambda now: done.append("hourly")),
            Chore("opt-in", always(0), lambda now: done.append("opt-in"), lambda: enabled[0]),
        ]
    )
    assert chores.run_due() == ["hourly"]
    assert chores.run_due() == []
    enabled[0] = True
    assert chores.run_due() == ["opt-in"]
    assert done == ["hourly", "opt-in"]


def test_a_chore_behind_after_its_turn_gets_its_next_turn_as_soon_as_it_asks(jobs):
    # Retention's way: a turn that leaves work behind asks for the next in seconds, not
    # after its usual interval. How soon is read after the turn, from what it found.
    behind = [False]

    def turn(now):
        behind[0] = True  # more expired than one turn deletes

    chores = Chores([Chore("retention", lambda: 0 if behind[0] else 3600, turn)])
    assert chores.run_due() == ["retention"]
    assert chores.run_due() == ["retention"]


def test_a_chore_of_the_same_name_replaces_the_one_before():
    chores = Chores([Chore("sweep", always(1), lambda now: None)])
    chores.add(Chore("sweep", always(2), lambda now: None))
    assert [(c.name, c.every()) for c in chores.chores] == [("sweep", 2)]


@pytest.mark.django_db(transaction=True)
def test_a_runner_whose_chore_fails_goes_on_running_its_jobs(jobs, caplog):
    @job("*/15 * * * *", name="t.steady")
    def steady(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=2))
    dispatcher = Dispatcher(
        [steady.job], workers=1, chores=[Chore("broken", always(0), failing(KeyError("x")))]
    )
    with caplog.at_level(logging.ERROR, logger="django_fencedjobs"):
        dispatcher.loop(max_ticks=2)
    assert dispatcher.chores.failures["broken"] >= 2
    assert dispatcher.errors == 0  # the loop itself never failed
    assert [r.outcome for r in JobRun.objects.filter(job="t.steady")] == [Outcome.SUCCEEDED]
    # The loop adds its own chore, the orphan sweep, which ran.
    assert [c.name for c in dispatcher.chores.chores] == ["broken", "orphan sweep"]
    assert "orphan sweep" not in dispatcher.chores.failures


def test_the_apps_chores_are_retention_and_in_a_loop_notifications_while_notify_is_on():
    once = [c.name for c in app_chores(loop=False)]
    looping = {c.name: c for c in app_chores(loop=True)}
    # The task relay is there when the project uses django.tasks (the test settings do).
    assert once == ["retention", "task relay"]
    assert list(looping) == ["retention", "task relay", "notifications"]
    notifications = looping["notifications"]
    with override_settings(FENCEDJOBS={"NOTIFY": False, "RUNNER_BEAT": timedelta(seconds=5)}):
        assert not notifications.enabled()
    with override_settings(FENCEDJOBS={"NOTIFY": True, "RUNNER_BEAT": timedelta(seconds=5)}):
        assert notifications.enabled()
        assert notifications.every() == 15
