"""The soak jobs' own tables, and the two records the checker reads besides the app's.

Every row a job writes carries the job's name, the lease row its run held and the run's
fence, and is written together with one :class:`Audit` row in the same fenced transaction.
None of these tables has a unique constraint on what the checker counts: a window written
twice must show up as two rows, not as a failed run.

Two tables are filled by database triggers (migration ``0001``), never by the jobs:

* :class:`Audit`, append-only (a trigger refuses UPDATE, DELETE and TRUNCATE): each row gets
  a *tick* from :class:`JobTick` as it is inserted.
* :class:`FenceEvent`, append-only: one row per change of a lease row's fence, and per
  lease row created or deleted, from a trigger on the app's lease table, with a tick too.

A tick is ``UPDATE ... SET tick = tick + 1 ... RETURNING tick`` on the lease row name's one
:class:`JobTick` row (a job's own row, an instance's, a backfill slot's or a one-off's).
The row stays locked until the transaction ends, so a second transaction asking for a
tick of the same name waits for the first to commit (or roll back) and then gets the next
number: per lease row name, ticks are in commit order, for writes, fence changes, and the
row's deletion and re-creation alike. That is what lets the checker prove that a write
committed while its fence was current (docs/reliability.md).
"""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A unit of per-item work: created by the driver, marked done by ``soak.items``."""

    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)
    done_fence = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["done_at", "id"], name="soak_item_pending")]

    def __str__(self) -> str:
        return f"item {self.pk}"


class ItemLog(models.Model):
    """One processing of one item, in the transaction that marks it done."""

    item_id = models.BigIntegerField()
    job = models.CharField(max_length=200)
    fence = models.BigIntegerField()

    def __str__(self) -> str:
        return f"item {self.item_id} by {self.job} fence {self.fence}"


class WindowRow(models.Model):
    """One processed window ``[start, end)``, in the transaction that advances the
    watermark to ``end``. ``lease`` is the lease row the run held: the job's own for its
    scheduled runs, a backfill slot's row (whose own watermark tiles that slot's
    interval) for a backfill's."""

    job = models.CharField(max_length=200)
    lease = models.CharField(max_length=300, default="")
    fence = models.BigIntegerField()
    start = models.DateTimeField()
    end = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.job} fence {self.fence} [{self.start}, {self.end})"


class SlowRow(models.Model):
    """A counter chain: each fenced block of ``soak.slow`` reads the highest ``seq`` and
    inserts the next one. Two writers at once would write the same number twice."""

    job = models.CharField(max_length=200)
    fence = models.BigIntegerField()
    seq = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.job} fence {self.fence} seq {self.seq}"


class FailRow(models.Model):
    """Written by ``soak.failing``. A ``doomed`` row is written in a block that raises:
    it must never be committed."""

    job = models.CharField(max_length=200)
    fence = models.BigIntegerField()
    doomed = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.job} fence {self.fence}{' doomed' if self.doomed else ''}"


class SlotRow(models.Model):
    """Written by ``soak.retrying`` (its scheduled runs, retries, one-offs and backfill
    runs) and by the instances of ``soak.inst``: one row per attempt that got as far as
    its fenced block. ``done`` is the attempt's work (a failing attempt writes a row that
    is not done, then raises); ``interval_start`` is the start of the run's data
    interval as its handler saw it; ``gen`` an instance's arguments' generation."""

    job = models.CharField(max_length=200)
    lease = models.CharField(max_length=300)
    fence = models.BigIntegerField()
    kind = models.CharField(max_length=20)
    slot = models.DateTimeField()
    attempt = models.IntegerField()
    interval_start = models.DateTimeField()
    done = models.BooleanField()
    gen = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.job} fence {self.fence} {self.kind} {self.slot} #{self.attempt}"


class Audit(models.Model):
    """One row per unit of work, in the same transaction as the work. ``tick``, ``txid``
    and ``at`` are set by a trigger, not by the job."""

    job = models.CharField(max_length=200)
    #: The lease row the run held (its ticks are that row's, as its fence changes are).
    lease = models.CharField(max_length=300, default="")
    fence = models.BigIntegerField()
    kind = models.CharField(max_length=20)
    key = models.CharField(max_length=64)
    tick = models.BigIntegerField(null=True)
    txid = models.BigIntegerField(null=True)
    at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.job} fence {self.fence} {self.kind} {self.key} tick {self.tick}"


class FenceEvent(models.Model):
    """A change of a lease row's fence (acquisition or revocation), or the row's creation
    or deletion (``op``), written by a trigger on the lease table in the transaction that
    made it. ``job`` is the lease row's name."""

    job = models.CharField(max_length=300)
    #: ``created``, ``changed`` or ``deleted``.
    op = models.CharField(max_length=10, default="changed")
    old_fence = models.BigIntegerField()
    new_fence = models.BigIntegerField()
    old_owner = models.CharField(max_length=200, blank=True)
    new_owner = models.CharField(max_length=200, blank=True)
    #: The row was paused after the change (a paused job or disabled instance).
    paused = models.BooleanField(default=False)
    tick = models.BigIntegerField()
    txid = models.BigIntegerField()
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.job} fence {self.old_fence} -> {self.new_fence} tick {self.tick}"


class JobTick(models.Model):
    """Per lease row name, the last tick handed out (see the module docstring)."""

    job = models.CharField(max_length=300, primary_key=True)
    tick = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.job} tick {self.tick}"
