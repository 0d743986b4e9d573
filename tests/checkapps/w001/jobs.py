"""A jobs module that must trigger fencedjobs.W001: ten jobs without jitter that start at
the same instant, 03:00 in Berlin, whatever the day (the hourly, quarter-hourly and
five-minutely ones fire then too). The jittered one does not count."""

from datetime import timedelta

from django_fencedjobs import job


def handler(run):
    pass


for i in range(4):
    job("0 * * * *", name=f"checks.hourly_{i}")(handler)
for i in range(3):
    job("0 3 * * *", name=f"checks.nightly_{i}", timezone="Europe/Berlin")(handler)
for i in range(2):
    job("*/15 * * * *", name=f"checks.quarterly_{i}")(handler)
job(every=timedelta(minutes=5), name="checks.every_5_minutes")(handler)
job("0 * * * *", name="checks.jittered", jitter=timedelta(minutes=10))(handler)
