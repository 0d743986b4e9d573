"""A job's slot timeline (docs/alerting.md, "Slots: absence you can see"): the slots its
schedule expected, against what happened, drawn by ``admin/fencedjobs/joblease/timeline.html``
(an inline SVG): compact in the jobs list (:data:`LIST`), whole on a job's page
(:data:`PAGE`). Runs are read for all the timelines of a page in one query (:func:`runs_in`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo
from html import escape
from typing import Any

from django.db.models import Q
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from django_fencedjobs.admin.display import plural
from django_fencedjobs.health import JobHealth
from django_fencedjobs.instants import format_instant, iso_utc
from django_fencedjobs.models import FAILURE_OUTCOMES, JobRun, Outcome
from django_fencedjobs.schedule import Schedule
from django_fencedjobs.text import error_excerpt

__all__ = ["LIST", "PAGE", "Size", "Window", "render", "runs_in", "window_of"]

TEMPLATE = "admin/fencedjobs/joblease/timeline.html"
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Size:
    """How much a timeline shows, and how large it is drawn."""

    width: int
    height: int
    #: The widest a mark is drawn (narrower where slots crowd).
    mark: float
    #: The last day is drawn when it holds ``day_fewest`` to ``most`` slots; else the last
    #: ``most`` slots of a job that fires more often, the last ``fewest`` of one that fires
    #: less often.
    most: int
    day_fewest: int
    fewest: int
    compact: bool


PAGE = Size(width=900, height=66, mark=7, most=96, day_fewest=24, fewest=30, compact=False)
LIST = Size(width=144, height=18, mark=4, most=24, day_fewest=24, fewest=24, compact=True)

#: A slot whose last attempt succeeded after an earlier one failed: not drawn as a slot that
#: ran well the first time.
RETRIED = "retried"
#: The words for each kind of mark, in the legend's order.
KIND_LABELS: dict[str, str] = {
    Outcome.SUCCEEDED.value: str(Outcome.SUCCEEDED.label),
    RETRIED: "succeeded after failing",
    **{outcome.value: str(outcome.label) for outcome in Outcome},
    "absent": "did not run",
    "coalesced": "did not run, caught up later",
    "paused": "did not run, paused",
    "due": "due, not late yet",
    "upcoming": "upcoming",
}
#: Fields of a run a timeline reads (the error only on a job's page).
_RUN_FIELDS = (
    *("pk", "job", "scheduled_for", "started_at", "finished_at", "outcome", "capped"),
    *("items", "missed_slots", "owner", "attempt"),
)


@dataclass(frozen=True)
class Window:
    """The stretch of time a timeline covers, and the slots expected in it."""

    #: ``(start, end]``: ``end`` is ``now``, or a little after it (the next slot and the
    #: deadline the job waits for).
    start: datetime
    end: datetime
    now: datetime
    #: Expected slots in the window after the job was first seen, ascending, UTC.
    slots: tuple[datetime, ...]
    #: When the job's lease row was created: nothing is expected before.
    first_seen: datetime
    #: The last day (else the last N slots, or since the job was first seen).
    day: bool
    #: The job's :meth:`~django_fencedjobs.registry.Job.late_after`, as for the dead man's
    #: switch: when a slot with no successful run counts as missing.
    late_after: Callable[[datetime], datetime]
    #: The window starts when the job was first seen (after the day or slots it would show).
    since_first_seen: bool = False

    @property
    def past_slots(self) -> int:
        """How many slots were expected up to ``now``."""
        return sum(slot <= self.now for slot in self.slots)


def window_of(h: JobHealth, first_seen: datetime, size: Size) -> Window | None:
    """The window of ``h``'s job at ``h.checked_at``; None without a valid schedule."""
    job = h.job
    if job is None or job.schedule is None:
        return None
    return expected_slots(
        job.schedule,
        h.checked_at,
        first_seen=first_seen,
        expected_by=h.expected_by,
        late_after=job.late_after,
        size=size,
    )


def expected_slots(
    schedule: Schedule,
    now: datetime,
    *,
    first_seen: datetime,
    expected_by: datetime | None,
    late_after: Callable[[datetime], datetime],
    size: Size,
) -> Window:
    """The window a timeline of ``size`` draws for ``schedule`` at ``now``: the last day or
    slots, or since the job was first seen."""
    day = schedule.fire_times(now - DAY, now, limit=size.most + 1)
    past = day
    start, whole_day = now - DAY, True
    if not size.day_fewest <= len(day) <= size.most:
        count = size.most if len(day) > size.most else size.fewest
        last = _last_slots(schedule, now, count)
        if last:  # else it never fired in the last 16 years: an empty day
            gap = (last[-1] - last[0]) / (len(last) - 1) if len(last) > 1 else DAY
            past, start, whole_day = last, last[0] - gap / 2, False
    span = now - start
    young = first_seen > start
    if young:
        # Nothing is expected before the job was first seen: the window starts there, and
        # reaches the slot it waits for and its deadline within an older job's window span.
        start, whole_day = min(first_seen, now), False
        ahead = start + span
    else:  # what the job waits for next, when near enough to read on this scale
        ahead = now + span / 5
    end = now
    for instant in (schedule.next_after(now), expected_by):
        if instant is not None and now < instant <= ahead:
            end = max(end, instant)
    future = schedule.fire_times(now, end) if end > now else []
    slots = tuple(slot for slot in (*past, *future) if slot > first_seen)
    return Window(start, end, now, slots, first_seen, whole_day, late_after, young)


def _last_slots(schedule: Schedule, now: datetime, count: int) -> list[datetime]:
    """The last ``count`` fire times up to ``now`` (fewer if it fired fewer in 16 years):
    ``min_interval() * count`` holds at most ``count``, so each widening reads few slots."""
    span = schedule.min_interval() * count
    while True:
        slots = schedule.fire_times(now - span, now)
        if len(slots) >= count or span > 16 * 366 * DAY:
            return slots[-count:]
        span *= 2


def runs_in(
    windows: Mapping[str, Window], *, using: str, with_errors: bool = False
) -> dict[str, list[JobRun]]:
    """Each job's runs in its window, in one query (an index range scan per job)."""
    found: dict[str, list[JobRun]] = {name: [] for name in windows}
    if not windows:
        return found
    condition = Q()
    for name, w in windows.items():
        condition |= Q(job=name, scheduled_for__gt=w.start, scheduled_for__lte=w.end)
    fields = (*_RUN_FIELDS, "error") if with_errors else _RUN_FIELDS
    for run in JobRun.objects.using(using).filter(condition).only(*fields).order_by():
        found[run.job].append(run)
    return found


@dataclass
class _Event:
    at: datetime
    kind: str
    run: JobRun | None = None
    #: A run at an instant that is not a slot of the schedule (run now).
    offslot: bool = False
    #: The run that caught up on a coalesced slot, or the skipped run that counts it.
    caught_up_by: JobRun | None = None
    #: For an upcoming slot: the first of them, the one the job runs next.
    next: bool = False
    #: For a run: the earlier slots it caught up on (:func:`_last_attempts`).
    covers: int = 0


def events(w: Window, runs: Iterable[JobRun], *, paused: bool) -> list[_Event]:
    """Every expected slot and every run in ``w``, in order, each with its kind.

    The ``n`` slots of the schedule before a run that coalesced ``n`` (its ``missed_slots``)
    are *coalesced*, however recent (*skipped* for an operator's skipped run). A slot is
    drawn as its last attempt; a retry redoes the first attempt's interval, so the slots
    read caught up by the retry. A slot with no run before a later run is never *due*, and
    a paused job's slots after its last run are *paused*, none *due* or *absent*."""
    expected = sorted(w.slots)
    on_schedule = set(expected)
    by_instant, covers = _last_attempts(w, runs)
    caught_up: dict[datetime, JobRun] = {}
    for at, catching_up in sorted(by_instant.items()):
        if covers[at] > 0:
            i = bisect_left(expected, at)
            for slot in expected[max(0, i - covers[at]) : i]:
                if slot not in by_instant:
                    caught_up[slot] = catching_up
    last_run = max(by_instant, default=None)
    found: list[_Event] = []
    upcoming = 0
    for at in sorted({*expected, *by_instant}):
        run = by_instant.get(at)
        after_last_run = last_run is None or at > last_run
        if run is not None:
            kind = RETRIED if run.outcome == Outcome.SUCCEEDED and run.attempt > 1 else run.outcome
            found.append(_Event(at, kind, run, offslot=at not in on_schedule, covers=covers[at]))
        elif at in caught_up:
            by = caught_up[at]
            kind = Outcome.SKIPPED.value if by.outcome == Outcome.SKIPPED else "coalesced"
            found.append(_Event(at, kind, caught_up_by=by))
        elif at > w.now:
            found.append(_Event(at, "upcoming", next=upcoming == 0))
            upcoming += 1
        elif paused and after_last_run:
            found.append(_Event(at, "paused"))
        elif after_last_run and w.late_after(at) >= w.now:
            found.append(_Event(at, "due"))
        else:
            found.append(_Event(at, "absent"))
    return found


def _last_attempts(
    w: Window, runs: Iterable[JobRun]
) -> tuple[dict[datetime, JobRun], dict[datetime, int]]:
    """The last attempt at each slot in ``w`` (a slot is judged by it), and the earlier
    slots its runs caught up on (counted by its first attempt; a retry redoes its interval)."""
    last: dict[datetime, JobRun] = {}
    covers: dict[datetime, int] = {}
    for run in sorted(runs, key=lambda run: run.attempt):
        if w.start < (at := run.scheduled_for) <= w.end:
            last[at] = run
            covers[at] = max(covers.get(at, 0), run.missed_slots)
    return last, covers


def render(
    h: JobHealth,
    w: Window,
    runs: Iterable[JobRun],
    size: Size,
    *,
    run_url: Callable[[int], str] | None = None,
    runs_url: str = "",
) -> SafeString:
    """The timeline of ``h``'s job over ``w``: an inline SVG, with a caption and a legend
    unless compact."""
    drawn = events(w, runs, paused=h.paused)
    frame = _Frame.of(w, size)
    bands = _bands(h, w, frame)
    kinds = sorted({event.kind for event in drawn}, key=list(KIND_LABELS).index)
    context = {
        "compact": size.compact,
        "width": _n(size.width),
        "height": _n(size.height),
        "marks": _marks(drawn, frame, h.tz, w.late_after, size, run_url),
        "bands": bands,
        "band_kinds": {b["kind"] for b in bands},
        "now_x": _n(frame.x(w.now)),
        "now_title": f"now: {format_instant(w.now, h.tz)}",
        "ticks": [] if size.compact else _ticks(w.start, w.end, h.tz, frame.x, size.width),
        "axis_y": _n(frame.band_top + frame.band_height),
        "tick_y": _n(frame.band_top + frame.band_height + 4),
        "label_y": _n(size.height - 4),
        "legend": [(kind, KIND_LABELS[kind]) for kind in kinds],
        "slot_count": w.past_slots,
        "day": w.day,
        "since_first_seen": w.since_first_seen,
        "first_seen": format_instant(w.first_seen, h.tz),
        "since": format_instant(w.start, h.tz),
        "aria_label": _aria_label(w, drawn),
        "late": any(b["kind"] == "late" for b in bands),
        "runs_url": runs_url,
    }
    return SafeString(render_to_string(TEMPLATE, context))


#: The margin left and right of the plot, in pixels.
_MARGIN = 4.0


@dataclass(frozen=True)
class _Frame:
    """Where a timeline draws: an instant's x, and the rows of the marks and bands."""

    start: datetime
    seconds: float
    width: int
    top: float
    height: float
    band_top: float
    band_height: float

    @classmethod
    def of(cls, w: Window, size: Size) -> _Frame:
        seconds = max((w.end - w.start).total_seconds(), 1.0)
        if size.compact:
            rows = (2.0, size.height - 4.0, 0.0, float(size.height))
        else:
            rows = (12.0, 26.0, 6.0, 38.0)
        return cls(w.start, seconds, size.width, *rows)

    def x(self, instant: datetime) -> float:
        plot = self.width - 2 * _MARGIN
        return _MARGIN + plot * (instant - self.start).total_seconds() / self.seconds


def _marks(
    drawn: list[_Event],
    frame: _Frame,
    tz: tzinfo,
    late_after: Callable[[datetime], datetime],
    size: Size,
    run_url: Callable[[int], str] | None,
) -> SafeString:
    """One mark per event, narrower where events crowd; a run's links to its page. Written
    here in one string: a list page draws a thousand, and a template node per attribute
    would cost more than the rest of the page."""
    xs = [frame.x(event.at) for event in drawn]
    marks = []
    for i, event in enumerate(drawn):
        neighbours = [abs(xs[i] - xs[j]) for j in (i - 1, i + 1) if 0 <= j < len(xs)]
        width = max(1.5, min([size.mark, *(0.8 * gap for gap in neighbours)]))
        top, height = frame.top, frame.height
        if event.offslot:
            top, height = top + height / 4, height / 2
        kind = escape(event.kind)
        if event.run is None:
            what = _no_run(event, tz, late_after)
        else:
            what = _ran(event, event.run, tz, compact=size.compact)
        title = f"{format_instant(event.at, tz)}: {what}"
        mark = (
            f'<rect class="fj-slot fj-slot-{kind}{" fj-offslot" if event.offslot else ""}" '
            f'data-at="{iso_utc(event.at)}" data-kind="{kind}" x="{_n(xs[i] - width / 2)}" '
            f'y="{_n(top)}" width="{_n(width)}" height="{_n(height)}">'
            f"<title>{escape(title)}</title></rect>"
        )
        if run_url is not None and event.run is not None:
            mark = f'<a href="{escape(run_url(event.run.pk))}">{mark}</a>'
        marks.append(mark)
    return mark_safe("\n".join(marks))  # every value above is escaped or a number


def _bands(h: JobHealth, w: Window, frame: _Frame) -> list[dict[str, Any]]:
    """Behind the marks, cut to the window: the slot the dead man's switch waits for, up to
    its deadline, and the time since, when the job is late (as health decided)."""
    slot, deadline = h.awaited_slot, h.expected_by
    if slot is None or deadline is None:
        return []

    def at(instant: datetime, ref: datetime | None = None) -> str:
        return format_instant(instant, h.tz, ref=ref)

    waiting = f"waiting for the run of {at(slot)}: late if no run has succeeded by "
    spans = [("awaited", slot, deadline, waiting + at(deadline, ref=slot))]
    if w.now > deadline:
        success = at(h.last_success_at) if h.last_success_at else "it was first seen"
        late = f"late since {at(deadline)}: no success since {success}"
        spans.append(("late", deadline, w.now, late))
    bands = []
    for kind, start, end, title in spans:
        left, right = frame.x(max(start, w.start)), frame.x(min(end, w.end))
        if right - left > 0:
            bands.append(
                {
                    "kind": kind,
                    "start": iso_utc(start),
                    "end": iso_utc(end),
                    "x": _n(left),
                    "y": _n(frame.band_top),
                    "width": _n(right - left),
                    "height": _n(frame.band_height),
                    "title": title,
                }
            )
    return bands


def _n(value: float) -> str:
    """A number for an SVG attribute, as text: the template must not localise it (a decimal
    comma would break the drawing)."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _no_run(event: _Event, tz: tzinfo, late_after: Callable[[datetime], datetime]) -> str:
    """What became of a slot without a run of its own."""
    by = event.caught_up_by
    if event.kind == Outcome.SKIPPED and by is not None:
        return f"did not run; skipped by {by.owner or 'an operator'}"
    if event.kind == "coalesced" and by is not None:
        caught = format_instant(by.scheduled_for, tz)
        if by.outcome == Outcome.SUCCEEDED:
            return f"did not run; caught up by the run of {caught}"
        if by.outcome == Outcome.RUNNING:
            return f"did not run; the run of {caught}, in progress, catches up on it"
        return f"did not run; coalesced into the run of {caught} ({Outcome(by.outcome).label})"
    if event.kind == "due":
        deadline = format_instant(late_after(event.at), tz, ref=event.at)
        return f"due; late if no run has succeeded by {deadline}"
    if event.kind == "upcoming":
        return "the next slot" if event.next else "a slot to come"
    if event.kind == "paused":
        return "did not run (the job is paused)"
    return "did not run"


def _not_run(run: JobRun) -> str:
    """A slot recorded as not run: skipped by an operator, or by a rule (the error says
    which), or excluded by a calendar."""
    if run.outcome == Outcome.EXCLUDED:
        return f"did not run; excluded by {run.error}"
    if run.error.startswith("Not run: "):
        return f"did not run; {run.error.removeprefix('Not run: ')}"
    n = run.missed_slots
    with_others = f" with {plural(n, 'earlier slot')}" if n else ""
    return f"did not run; skipped by {run.owner or 'an operator'}{with_others}"


def _ran(event: _Event, run: JobRun, tz: tzinfo, *, compact: bool) -> str:
    """How the slot's run went, and on a job's page a failure's error."""
    if run.outcome == Outcome.RUNNING and run.started_at is not None:
        parts = [f"running since {format_instant(run.started_at, tz, ref=event.at)}"]
    elif run.outcome in (Outcome.SKIPPED, Outcome.EXCLUDED):
        return _not_run(run)
    else:
        parts = [str(Outcome(run.outcome).label)]
        if run.duration is not None:
            parts.append(f"in {run.duration:.1f}s")
    if run.items:
        parts.append(plural(run.items, "item"))
    if run.capped:
        parts.append("capped at max_batches")
    if event.offslot:
        parts.append("not a slot of the schedule (run now)")
    if run.attempt > 1:
        parts.append(f"attempt {run.attempt}")
    if event.covers:
        parts.append(f"caught up {plural(event.covers, 'earlier slot')}")
    text = ", ".join(parts)
    if not compact and run.outcome in FAILURE_OUTCOMES and (excerpt := error_excerpt(run.error)):
        text += f": {excerpt}"
    return text


def _aria_label(w: Window, drawn: list[_Event]) -> str:
    missing = sum(event.kind in ("absent", "coalesced", "paused") for event in drawn)
    skipped = sum(event.kind == Outcome.SKIPPED for event in drawn)
    by_operator = f", {skipped} skipped by an operator" if skipped else ""
    if w.since_first_seen:
        span = "since the job was first seen"
    elif w.day:
        span = "the last day"
    else:
        span = f"the last {w.past_slots} slots"
    return f"Expected slots {span}: {w.past_slots}, {missing} of them did not run{by_operator}"


#: Tick spacings in minutes (below a day: wall-clock multiples; from a day: midnights).
_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)
_MAX_TICKS = 8
_MIN_LABEL_GAP = 56.0


def _ticks(
    start: datetime, end: datetime, tz: tzinfo, x: Callable[[datetime], float], width: int
) -> list[dict[str, Any]]:
    """Ticks at round wall-clock times of the job's zone, a midnight labelled with its date
    (``Tue 1 Dec``), another tick with its time."""
    minutes = (end - start).total_seconds() / 60
    step = next((s for s in _STEPS if minutes / s <= _MAX_TICKS), None)
    instants: list[datetime] = []
    day, last_day = start.astimezone(tz).date(), end.astimezone(tz).date()
    while day <= last_day:
        midnight = datetime.combine(day, time(), tzinfo=tz)
        if step is None:  # months: the 1st of every month
            candidates = [midnight] if day.day == 1 else []
        elif step >= 1440:
            every = step // 1440
            keep = day.weekday() == 0 if every == 7 else day.toordinal() % every == 0
            candidates = [midnight] if keep else []
        else:
            candidates = [
                (datetime.combine(day, time()) + timedelta(minutes=m)).replace(tzinfo=tz)
                for m in range(0, 1440, step)
            ]
        instants += [c for c in candidates if start < c.astimezone(UTC) <= end]
        day += DAY
    ticks = []
    last_label = -_MIN_LABEL_GAP
    for instant in instants:
        position = x(instant.astimezone(UTC))
        local = instant.astimezone(tz)
        if step is None:
            label = f"{local:%b %Y}"
        elif local.hour == 0 and local.minute == 0:
            label = f"{local:%a} {local.day} {local:%b}"
        else:
            label = f"{local:%H:%M}"
        show = position - last_label >= _MIN_LABEL_GAP
        if show:
            last_label = position
        anchor = "start" if position < 28 else "end" if position > width - 28 else "middle"
        ticks.append({"x": _n(position), "label": label if show else "", "anchor": anchor})
    return ticks
