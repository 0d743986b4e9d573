"""The soak: a randomized fault test of the whole system, ``make soak``.

Three runner processes (a ``runjobs`` loop over every job, a ``runjobs --job ...`` loop over
some of them, and ``runjobs --once`` started every few seconds by a cron-like driver) run
the jobs of :mod:`soak.soakapp.jobs` against a PostgreSQL server, while the driver
SIGSTOPs, SIGCONTs, SIGKILLs and SIGTERMs them and restarts the server, on a schedule drawn
from one seed. Then a checker proves from the data that no stale write committed, no item
was lost or done twice, every window was covered exactly once, every slot is accounted
for, and that the jobs recovered once the faults stopped. See docs/reliability.md.

* :mod:`soak.plan`: the fault schedule, a pure function of the seed and the duration.
* :mod:`soak.driver`: the processes, the faults, the phases.
* :mod:`soak.check`: the invariants, read from the database.
* :mod:`soak.report`: the figures, as text, JSON and a markdown table.
* ``scripts/soak.py``: the command line.
"""
