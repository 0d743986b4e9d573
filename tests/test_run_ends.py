"""What a handler hands to its run's end is checked where it hands it, and no end, however
bad, keeps another run's end from being recorded or stops the loop. In one process, on
both databases (real processes on PostgreSQL: tests/test_faults_poisoned_end.py)."""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from django_fencedjobs import fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.exceptions import WatermarkError
from django_fencedjobs.loop import Dispatcher, tick
from django_fencedjobs.models import JobRun, Outcome
from django_fencedjobs.run import ITEMS_MAX
from tests.conftest import JOBS_T0 as T0

pytestmark = pytest.mark.django_db(transaction=True)

DUE = T0 + timedelta(minutes=15, seconds=2)


def run_once(name: str, handler: Any) -> JobRun:
    """Declare ``handler`` as job ``name``, every 15 minutes, and run its first slot."""
    job("*/15 * * * *", name=name)(handler)
    tick()
    fake_clock.set(DUE)
    tick()
    return JobRun.objects.get(job=name)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "add_items() takes an int count of items, got bool True"),
        (1.5, TypeError, "add_items() takes an int count of items, got float 1.5"),
        (float("nan"), TypeError, "got float nan"),
        (float("inf"), TypeError, "got float inf"),
        (Decimal(3), TypeError, "got Decimal Decimal('3')"),
        ("3", TypeError, "got str '3'"),
        (None, TypeError, "got NoneType None"),
        (-5, ValueError, "add_items(-5): a count of items is 0 or more"),
        (2**63, ValueError, f"add_items() of {2**63} items would take the run past the"),
        (10**40, ValueError, f"add_items() of {10**40} items would take the run past"),
        (10**5000, ValueError, "add_items() of a 16610-bit number items would take the run"),
    ],
    ids=["bool", "float", "nan", "inf", "Decimal", "str", "None", "-5", "2**63", "10**40", "huge"],
)
def test_add_items_refuses_anything_but_a_count_the_record_holds_at_the_call(
    jobs, value, error, message
):
    raised: list[BaseException] = []

    def counts(run):
        with pytest.raises(error) as caught:
            run.add_items(value)
        raised.append(caught.value)
        with fenced_atomic(), pytest.raises(error):
            run.add_items(value)
        run.add_items(2)

    run = run_once("t.counts", counts)
    (exc,) = raised
    assert str(exc).startswith("job 't.counts': ") and message in str(exc), str(exc)
    assert "\n" not in str(exc) and len(str(exc)) < 200
    # Caught by the handler, nothing of it was counted; the run went on.
    assert (run.outcome, run.items) == (Outcome.SUCCEEDED, 2)


def test_a_bad_count_the_handler_lets_through_is_the_runs_failure(jobs):
    def poison(run):
        run.add_items(2**63)

    run = run_once("t.poison", poison)
    assert run.outcome == Outcome.FAILED and run.items == 0
    assert run.error.rstrip().splitlines()[-1] == (
        f"ValueError: job 't.poison': add_items() of {2**63} items would take the run past "
        f"the {ITEMS_MAX} items its record holds"
    )


def test_a_run_counts_up_to_what_its_record_holds_inside_and_outside_fenced_blocks(jobs):
    refused: list[BaseException] = []

    def counts(run):
        run.add_items(2**62)
        with fenced_atomic():
            run.add_items(2**62 - 1)
        try:
            run.add_items(1)  # one past
        except ValueError as exc:
            refused.append(exc)
        run.add_items(0)

    run = run_once("t.full", counts)
    assert len(refused) == 1
    assert (run.outcome, run.items) == (Outcome.SUCCEEDED, ITEMS_MAX)


def test_an_int_watermark_outside_its_column_is_refused_at_the_call(jobs):
    raised: list[BaseException] = []

    def marks(run):
        with fenced_atomic():
            for value in (2**63, -(2**63) - 1):
                with pytest.raises(WatermarkError) as caught:
                    run.advance_watermark(value)
                raised.append(caught.value)
            run.advance_watermark(ITEMS_MAX)

    run = run_once("t.marks", marks)
    assert run.outcome == Outcome.SUCCEEDED and run.watermark_after == str(ITEMS_MAX)
    assert [str(exc) for exc in raised] == [
        f"job 't.marks': an int watermark is a signed 64-bit integer, got {2**63}",
        f"job 't.marks': an int watermark is a signed 64-bit integer, got {-(2**63) - 1}",
    ]


def declare_poisoned_and_bystander() -> list[Any]:
    """Two jobs whose ends the database refuses (counts slipped past ``add_items``, as code
    that reaches into the run could) and a bystander, all due at :data:`DUE`."""

    def overflow(run):
        run._state.loose_items = 2**63

    def smuggler(run):
        run._state.loose_items = object()  # neither database takes it (nor a Decimal)

    def bystander(run):
        run.add_items(1)

    return [
        job("*/15 * * * *", name=name)(handler).job
        for name, handler in (
            ("t.overflow", overflow),
            ("t.smuggler", smuggler),
            ("t.bystander", bystander),
        )
    ]


def assert_recorded_each_on_its_own() -> None:
    outcomes = dict(JobRun.objects.values_list("job", "outcome"))
    assert outcomes == {
        "t.overflow": Outcome.FAILED,
        "t.smuggler": Outcome.FAILED,
        "t.bystander": Outcome.SUCCEEDED,
    }
    for name in ("t.overflow", "t.smuggler"):
        run = JobRun.objects.get(job=name)
        assert run.error.startswith("This run's end could not be recorded as it was ("), run.error
        assert run.error.endswith(
            "; recorded failed instead, without the items counted outside fenced blocks."
        )
        assert run.items == 0 and run.finished_at is not None
    assert JobRun.objects.get(job="t.bystander").items == 1


def test_an_end_the_database_refuses_is_recorded_failed_on_its_own_in_a_pass(jobs):
    declare_poisoned_and_bystander()
    tick()
    fake_clock.set(DUE)
    tick()
    assert_recorded_each_on_its_own()


def test_an_end_the_database_refuses_is_recorded_failed_on_its_own_in_a_loop(jobs):
    # On PostgreSQL the loop records its runs' ends together, in one statement.
    declared = declare_poisoned_and_bystander()
    tick()
    fake_clock.set(DUE)
    Dispatcher(declared, workers=3).loop(max_ticks=1)
    assert_recorded_each_on_its_own()


def test_an_error_that_is_not_the_databases_is_logged_counted_and_the_loop_goes_on(jobs, caplog):
    @job("*/15 * * * *", name="t.after")
    def after(run):
        pass

    tick()
    fake_clock.set(DUE)
    dispatcher = Dispatcher([after.job], workers=1)
    real_scan = dispatcher.scan
    failures = [RuntimeError("a fault of the loop's own")]

    def scan_failing_once() -> Any:
        if failures:
            raise failures.pop()
        return real_scan()

    dispatcher.scan = scan_failing_once  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="django_fencedjobs"):
        dispatcher.loop(max_ticks=2)
    assert dispatcher.errors == 1
    (failed,) = [r for r in caplog.records if getattr(r, "event", "") == "loop_failed"]
    assert failed.exc_info is not None and "a fault of the loop's own" in failed.getMessage()
    assert JobRun.objects.get(job="t.after").outcome == Outcome.SUCCEEDED
