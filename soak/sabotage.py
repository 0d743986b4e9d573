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
``restart-fences``
    Every new lease row's fences start at 0 again, as they did before fences were made
    never to repeat for a name: an instance deleted and created again, and each backfill
    slot's and one-off's row, gives out the fences its name has given out before. Applied
    in the driver too (it creates the instances' and one-shots' rows).
"""

from __future__ import annotations

from typing import Any

SABOTAGE = ("time-only-lease", "check-then-act", "restart-fences")
NEEDED = ("lock_fence", "renew", "HeldTransaction")


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

    def plain_select(connection: Any, name: str, fence: int, idle_limit: Any = None) -> Any:
        table = connection.ops.quote_name(JobLease._meta.db_table)
        sql = f"SELECT {lease._IDENTIFY}, {lease._limit_idle(idle_limit)} FROM {table}"
        with connection.cursor() as cursor:
            cursor.execute(f"{sql} WHERE name = %s AND fence = %s", [name, fence])
            return lease._held(connection, cursor.fetchone())

    if name == "restart-fences":
        if not hasattr(lease, "FENCE_EPOCH"):
            raise SystemExit("soak: sabotage needs django_fencedjobs.lease.FENCE_EPOCH")
        lease.FENCE_EPOCH = 0  # type: ignore[misc]
        return
    if name == "check-then-act":
        lease.lock_fence = plain_select
        return
    # Every fence check passes; the transaction it registers is none the server knows.
    lease.lock_fence = lambda connection, *args: lease.HeldTransaction(connection.alias)
    lease.renew = lambda name, fence, until: True
    supervisor.Supervisor.run = lambda self: None  # type: ignore[method-assign]
