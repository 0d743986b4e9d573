"""A paginator for large tables: it never counts every row of an unfiltered list.

Generic (it knows no model of this app): any ``ModelAdmin`` over a large table can use it
with ``paginator = EstimatedCountPaginator`` and ``show_full_result_count = False``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db import connections, models
from django.db.models import QuerySet
from django.utils.functional import cached_property

__all__ = ["EstimatedCountPaginator", "estimated_rows"]


if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # not subscriptable at run time
    _Paginator = Paginator


class EstimatedCountPaginator(_Paginator):
    """A paginator that never counts a large table in full when nothing filters it.

    For the unfiltered list on PostgreSQL it asks the planner's estimate first
    (``pg_class.reltuples``, kept current by autovacuum): at or past :attr:`exact_below`
    rows that is the count, and the page count is approximate (the last page may be empty
    or a few rows short). Otherwise it counts at most :attr:`exact_below` rows (a bounded
    ``COUNT`` over a ``LIMIT``ed subquery: cheap whatever the table's size); below that
    the count is exact. A filtered list (or another database) past that bound is counted
    exactly: give the filters indexes that serve them.
    """

    exact_below = 10_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        unfiltered = not rows.query.where and not rows.query.distinct
        estimate = estimated_rows(rows.model, rows.db) if unfiltered else None
        if estimate is not None and estimate >= self.exact_below:
            return estimate
        bounded = rows.order_by()[: self.exact_below].count()
        if bounded < self.exact_below:
            return bounded
        if estimate is not None:  # a stale estimate (not analysed since a bulk load)
            return max(estimate, bounded)
        return rows.count()


def estimated_rows(model: type[models.Model], using: str) -> int | None:
    """The planner's estimate of the rows of ``model``'s table (PostgreSQL's
    ``pg_class.reltuples``, kept current by autovacuum); None where there is none, or the
    table was never analysed. The one difference between databases asked outside
    :mod:`django_fencedjobs.db` and :mod:`django_fencedjobs.lease`: this module is generic,
    and imports nothing of the app."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [model._meta.db_table],
        )
        found = cursor.fetchone()
    if found is None or found[0] is None or found[0] < 0:  # -1: never analysed
        return None
    return int(found[0])
