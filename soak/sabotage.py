"""Break the app on purpose, to show that the checker catches what it claims to.

``scripts/soak.py --sabotage NAME`` sets ``SOAK_SABOTAGE=NAME`` for every runner process,
and :class:`soak.soakapp.apps.SoakAppConfig` calls :func:`apply` at start-up. A soak with
sabotage must end with safety violations; one that does not would mean the checker is
blind to that failure.

Sabotage patches the app's internals, so it is tied to them (the soak itself is not: it
uses the public API and the management commands only). When an internal it needs is
gone, :func:`apply` says so and the runner exits.

``no-fence-check``
    ``fenced_atomic`` no longer checks the fence (the fence check and the claim's lock
    always "succeed"): a time-only lease, which is what the README says fails.
``check-then-act``
    The fence is checked with a plain ``SELECT`` (no row lock): a successor can take the
    lease between the check and the commit.
"""

from __future__ import annotations

from typing import Any

SABOTAGE = ("no-fence-check", "check-then-act")


def apply(name: str) -> None:
    from django_fencedjobs import lease
    from django_fencedjobs.models import JobLease

    if name not in SABOTAGE:
        raise SystemExit(f"soak: unknown sabotage {name!r} (known: {', '.join(SABOTAGE)})")
    if not hasattr(lease, "lock_fence") or not hasattr(lease, "fence_held"):
        raise SystemExit("soak: sabotage needs django_fencedjobs.lease.lock_fence/fence_held")

    def no_claim_lock(connection: Any, name: str, fence: int) -> None:
        return None  # run.batches() then checks with lock_fence, patched below

    if name == "no-fence-check":

        def lock_fence(connection: Any, name: str, fence: int) -> bool:
            return True

    else:

        def lock_fence(connection: Any, name: str, fence: int) -> bool:
            table = connection.ops.quote_name(JobLease._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT 1 FROM {table} WHERE name = %s AND fence = %s", [name, fence]
                )
                return cursor.fetchone() is not None

    lease.fence_held = no_claim_lock  # type: ignore[assignment]
    lease.lock_fence = lock_fence
