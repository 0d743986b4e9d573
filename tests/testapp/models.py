"""Models for jobs in the tests to write to."""

from django.db import models


class Item(models.Model):
    """A unit of work; a job marks it processed under its fence."""

    name = models.CharField(max_length=200)
    processed_at = models.DateTimeField(null=True, blank=True)
    processed_by_fence = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class Write(models.Model):
    """One write by a job run, to check that fenced writes are never lost or doubled."""

    job = models.CharField(max_length=200)
    fence = models.BigIntegerField()
    seq = models.BigIntegerField()
    written_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job} fence={self.fence} seq={self.seq}"
