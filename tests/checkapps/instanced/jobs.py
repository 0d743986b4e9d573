"""A job run as its instances (schedules as data), for the commands that take an instance's
name, ``inst.digest[key]``, or every instance's, ``inst.digest[*]``."""

from datetime import timedelta

from django_fencedjobs import job


@job(instances=True, name="inst.digest", timeout=timedelta(minutes=5))
def digest(run, *, tenant_id: int):
    run.add_items(tenant_id)
