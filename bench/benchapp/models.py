"""Tables the benchmark jobs write to."""

from django.db import models


class Row(models.Model):
    """P1: one row per write of a benchmark transaction."""

    seq = models.BigIntegerField()
    note = models.CharField(max_length=32)

    def __str__(self) -> str:
        return f"{self.note} {self.seq}"


class Task(models.Model):
    """P2: a queue item, claimed per item with ``SKIP LOCKED`` and marked processed.

    ``times_processed`` is incremented by every claim that processed the item: anything
    but 1 at the end means an item was processed twice (or never).
    """

    processed_at = models.DateTimeField(null=True)
    processed_by = models.BigIntegerField(null=True)
    times_processed = models.IntegerField(default=0)

    class Meta:
        indexes = [
            # The queue's head: the claim query walks only unprocessed items.
            models.Index(
                fields=["id"],
                name="benchapp_task_pending",
                condition=models.Q(processed_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"task {self.pk}"
