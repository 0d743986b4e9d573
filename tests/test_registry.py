"""@job validates eagerly and never raises: a bad declaration is kept as an invalid job whose
error names the job and the field; the registry keeps declarations."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest

from django_fencedjobs import JobDefinitionError, ScheduleError, UnknownJob, job
from django_fencedjobs.registry import get_job, registry


class Handler:
    def __call__(self, run):
        pass


async def async_handler(run):
    pass


def generator_handler(run):
    yield run


def test_the_default_name_is_module_and_function(jobs):
    @job("*/5 * * * *")
    def sync_invoices(run):
        pass

    assert (
        sync_invoices.job.name
        == f"{__name__}.test_the_default_name_is_module_and_function.<locals>.sync_invoices"
    )
    assert get_job(sync_invoices.job.name) is sync_invoices.job


def test_the_function_is_returned_unchanged_for_unit_tests(jobs):
    def handler(run):
        return "called"

    assert job("*/5 * * * *", name="x")(handler) is handler


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"timeout": 30}, "timeout must be a datetime.timedelta"),
        ({"timeout": timedelta(0)}, "timeout must be positive"),
        ({"jitter": timedelta(seconds=-1)}, "jitter must be positive"),
        ({"max_batches": 0}, "max_batches must be a positive int"),
        ({"failure_threshold": 0}, "failure_threshold must be a positive int"),
        ({"exclusion": "mutex"}, "exclusion must be 'lease' or 'advisory'"),
        ({"starting_deadline": timedelta(seconds=-5)}, "starting_deadline must be positive"),
    ],
)
def test_bad_values_make_the_job_invalid_naming_job_and_field(jobs, kwargs, words):
    handler = job("*/5 * * * *", name="billing.sync", **kwargs)(lambda run: None)
    declared = get_job("billing.sync")
    assert handler.job is declared
    assert declared.schedule is None
    assert "billing.sync" in str(declared.schedule_error)
    assert words in str(declared.schedule_error)
    with pytest.raises((JobDefinitionError, ScheduleError)):
        _ = declared.valid_schedule


def test_bare_decorator_without_schedule_registers_an_invalid_job(jobs):
    @job
    def nothing(run):
        pass

    (declared,) = registry.all()
    assert declared.func is nothing
    assert declared.schedule is None
    assert "needs a schedule" in str(declared.schedule_error)


def test_a_timeout_not_shorter_than_the_interval_makes_the_job_invalid(jobs):
    job("*/5 * * * *", name="slow", timeout=timedelta(minutes=5))(lambda run: None)
    declared = get_job("slow")
    assert declared.schedule is None
    assert "timeout 0:05:00 is not shorter" in str(declared.schedule_error)


def test_two_functions_with_one_name_make_the_job_invalid(jobs):
    @job("*/5 * * * *", name="twice")
    def first(run):
        pass

    @job("*/10 * * * *", name="twice")
    def second(run):
        pass

    declared = get_job("twice")
    assert declared.schedule is None
    assert "declared twice" in str(declared.schedule_error)


@pytest.mark.parametrize(
    "handler",
    [
        functools.partial(lambda run, size: None, size=3),
        Handler(),
        lambda run, *more, extra=None: None,
    ],
    ids=["partial", "callable-object", "defaults"],
)
def test_a_partial_or_a_callable_object_is_a_valid_handler(jobs, handler):
    job("*/5 * * * *")(handler)
    (declared,) = registry.all()
    assert declared.schedule is not None, declared.schedule_error
    assert declared.func is handler


@pytest.mark.parametrize(
    ("handler", "words"),
    [
        (async_handler, "async def"),
        (generator_handler, "generator"),
        (lambda: None, "cannot take the Run"),
        (lambda run, other: None, "cannot take the Run"),
    ],
    ids=["async", "generator", "no-argument", "two-arguments"],
)
def test_a_handler_that_cannot_run_as_written_makes_the_job_invalid(jobs, handler, words):
    job("*/5 * * * *", name="h")(handler)
    declared = get_job("h")
    assert declared.schedule is None
    assert words in str(declared.schedule_error)


def test_an_invalid_schedule_is_kept_for_the_system_check(jobs):
    @job("61 * * * *", name="bad.cron")
    def bad(run):
        pass

    declared = get_job("bad.cron")
    assert declared.schedule is None
    assert "bad.cron" in str(declared.schedule_error)


def test_an_unknown_job_name_lists_the_known_ones(jobs):
    job("*/5 * * * *", name="a.one")(lambda run: None)
    with pytest.raises(UnknownJob, match=r"a\.one"):
        get_job("a.two")


def test_the_default_timeout_is_half_the_interval_at_most_an_hour(jobs):
    job("*/10 * * * *", name="ten")(lambda run: None)
    job("0 3 * * *", name="daily")(lambda run: None)
    assert get_job("ten").run_timeout == timedelta(minutes=5)
    assert get_job("daily").run_timeout == timedelta(hours=1)


def test_the_job_name_seeds_a_stable_jitter(jobs):
    job("*/10 * * * *", name="a", jitter=timedelta(minutes=5))(lambda run: None)
    job("*/10 * * * *", name="b", jitter=timedelta(minutes=5))(lambda run: None)
    a, b = get_job("a").valid_schedule, get_job("b").valid_schedule
    assert a.offset != b.offset
    assert timedelta(0) <= a.offset < timedelta(minutes=5)


def test_job_takes_each_option_as_a_keyword_argument_typed_and_defaulted_as_the_job_has_it():
    """The options are named once (JobOptions); the keyword arguments type checkers read
    (job's overload) and help(job) shows must say the same."""
    import dataclasses
    import inspect
    import typing

    from django_fencedjobs.registry import JobOptions

    options = {option.name: option for option in dataclasses.fields(JobOptions)}
    for signature in (
        inspect.signature(typing.get_overloads(job)[-1]),
        inspect.signature(job),
    ):
        parameters = dict(signature.parameters)
        assert parameters.pop("name").default is None
        assert list(parameters) == list(options)
        for name, parameter in parameters.items():
            assert parameter.default == options[name].default, name
            kind = parameter.POSITIONAL_ONLY if name == "cron" else parameter.KEYWORD_ONLY
            assert parameter.kind is kind, name
        written = {name: p.annotation for name, p in parameters.items() if name != "cron"}
        assert written == {name: o.type for name, o in options.items() if name != "cron"}


def test_an_unknown_keyword_argument_is_a_type_error_at_the_decorator(jobs):
    with pytest.raises(TypeError, match="job\\(\\) got an unexpected keyword argument 'timout'"):
        job("*/5 * * * *", timout=timedelta(minutes=1))


def test_a_wrongly_typed_option_is_left_at_its_default_on_the_invalid_job(jobs):
    job("*/5 * * * *", name="typed", timeout=30, exclusion="mutex", every=None)(lambda run: None)
    declared = get_job("typed")
    assert declared.timeout is None  # 30 is not a timedelta: the default
    assert declared.exclusion == "mutex"  # a string, shown as written
    assert declared.cron == "*/5 * * * *"
