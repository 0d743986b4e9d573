"""Break the app on purpose, to show that the soak catches what it claims to.

``scripts/soak.py --sabotage NAME`` sets ``SOAK_SABOTAGE=NAME`` for the runner processes
(not for the final passes), and :class:`soak.soakapp.apps.SoakAppConfig` calls
:func:`apply` at their start-up. A soak with sabotage is expected to end with safety
violations; one that does not means the faults never reached that failure in that run.

Sabotage patches the app's internals (``django_fencedjobs.lease``), so it is tied to them;
the soak itself is not (it uses the public API and the management commands only). When an
internal it needs is gone, :func:`apply` says so and the runner exits.

``time-only-lease``
    The lease is a lock with a time-to-live and nothing else, as in the schedulers the
    README compares against: ``fenced_atomic`` and ``run.batches()`` do not check the
    fence, the run's supervisor does nothing (no renewal, so no noticing that the lease
    was lost; no timeout), and the server does not end a paused holder's idle
    transaction. A holder paused past its lease resumes and writes as if nothing
    happened.
``check-then-act``
    Only the fence check is weakened: a plain ``SELECT`` of the fence, no row lock, so a
    successor can take the lease between the check and the commit. The other defences
    (renewal noticing the loss, the server ending idle transactions) stay.
"""

from __future__ import annotations

from typing import Any

SABOTAGE = ("time-only-lease", "check-then-act")
NEEDED = ("lock_fence", "fence_held", "renew", "limit_idle_transactions")


def apply(name: str) -> None:
    from django_fencedjobs import lease, supervisor
    from django_fencedjobs.models import JobLease

    if name not in SABOTAGE:
        raise SystemExit(f"soak: unknown sabotage {name!r} (known: {', '.join(SABOTAGE)})")
    missing = [f"lease.{attr}" for attr in NEEDED if not hasattr(lease, attr)]
    if not hasattr(supervisor, "Supervisor"):
        missing.append("supervisor.Supervisor")
    if missing:
        raise SystemExit(f"soak: sabotage needs django_fencedjobs.{', '.join(missing)}")

    def plain_select(connection: Any, name: str, fence: int) -> bool:
        table = connection.ops.quote_name(JobLease._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {table} WHERE name = %s AND fence = %s", [name, fence])
            return cursor.fetchone() is not None

    # run.batches() then claims without locking the lease row and checks with lock_fence.
    lease.fence_held = lambda connection, name, fence: None
    if name == "check-then-act":
        lease.lock_fence = plain_select
        return
    lease.lock_fence = lambda connection, name, fence: True
    lease.renew = lambda name, fence, until: True
    lease.limit_idle_transactions = lambda connection, ttl: None
    supervisor.Supervisor.run = lambda self: None  # type: ignore[method-assign]
