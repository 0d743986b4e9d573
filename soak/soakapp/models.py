"""The soak jobs' own tables, and the two records the checker reads besides the app's.

Every row a job writes carries the job's name and the run's fence, and is written together
with one :class:`Audit` row in the same fenced transaction. None of these tables has a
unique constraint on what the checker counts: a window written twice must show up as two
rows, not as a failed run.

Two tables are filled by database triggers (migration ``0001``), never by the jobs:

* :class:`Audit`, append-only (a trigger refuses UPDATE, DELETE and TRUNCATE): each row gets
  a *tick* from :class:`JobTick` as it is inserted.
* :class:`FenceEvent`, append-only: one row per change of a job's fence, from a trigger on
  the app's lease table, with a tick too.

A tick is ``UPDATE ... SET tick = tick + 1 ... RETURNING tick`` on the job's one
:class:`JobTick` row. The row stays locked until the transaction ends, so a second
transaction asking for a tick of the same job waits for the first to commit (or roll back)
and then gets the next number: per job, ticks are in commit order, for writes and fence
changes alike. That is what lets the checker prove that a write committed while its
fence was current (docs/reliability.md).
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
    watermark to ``end``."""

    job = models.CharField(max_length=200)
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


class Audit(models.Model):
    """One row per unit of work, in the same transaction as the work. ``tick``, ``txid``
    and ``at`` are set by a trigger, not by the job."""

    job = models.CharField(max_length=200)
    fence = models.BigIntegerField()
    kind = models.CharField(max_length=20)
    key = models.CharField(max_length=64)
    tick = models.BigIntegerField(null=True)
    txid = models.BigIntegerField(null=True)
    at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.job} fence {self.fence} {self.kind} {self.key} tick {self.tick}"


class FenceEvent(models.Model):
    """A change of a job's fence (acquisition or revocation), written by a trigger on the
    lease table in the transaction that made it."""

    job = models.CharField(max_length=200)
    old_fence = models.BigIntegerField()
    new_fence = models.BigIntegerField()
    old_owner = models.CharField(max_length=200, blank=True)
    new_owner = models.CharField(max_length=200, blank=True)
    tick = models.BigIntegerField()
    txid = models.BigIntegerField()
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.job} fence {self.old_fence} -> {self.new_fence} tick {self.tick}"


class JobTick(models.Model):
    """Per job, the last tick handed out (see the module docstring)."""

    job = models.CharField(max_length=200, primary_key=True)
    tick = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.job} tick {self.tick}"
