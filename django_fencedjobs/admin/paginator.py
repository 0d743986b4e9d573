"""A paginator for large tables: it never counts every row of an unfiltered list.

Generic (it knows no model of this app): any ``ModelAdmin`` over a large table can use it
with ``paginator = EstimatedCountPaginator`` and ``show_full_result_count = False``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

__all__ = ["EstimatedCountPaginator"]


if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # not subscriptable at run time
    _Paginator = Paginator


class EstimatedCountPaginator(_Paginator):
    """A paginator that never counts a large table in full when nothing filters it.

    For the unfiltered list it asks :attr:`estimate_rows` first (a table's estimated rows,
    or None; the app's admin gives PostgreSQL's planner estimate,
    :func:`django_fencedjobs.db.estimated_rows`): at or past :attr:`exact_below` rows that
    is the count, and the page count is approximate (the last page may be empty or a few
    rows short). Otherwise it counts at most :attr:`exact_below` rows (a bounded ``COUNT``
    over a ``LIMIT``ed subquery: cheap whatever the table's size); below that the count is
    exact. A filtered list (or no estimate) past that bound is counted exactly: give the
    filters indexes that serve them.
    """

    exact_below = 10_000
    #: ``estimate_rows(queryset)``: the estimated rows of its table, or None (no estimate).
    estimate_rows: Callable[[QuerySet[Any]], int | None] = staticmethod(lambda rows: None)

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        unfiltered = not rows.query.where and not rows.query.distinct
        estimate = self.estimate_rows(rows) if unfiltered else None
        if estimate is not None and estimate >= self.exact_below:
            return estimate
        bounded = rows.order_by()[: self.exact_below].count()
        if bounded < self.exact_below:
            return bounded
        if estimate is not None:  # a stale estimate (not analysed since a bulk load)
            return max(estimate, bounded)
        return rows.count()
