"""Helpers of the fault tests: the jobs child processes run (:mod:`tests.faults.jobs`),
their entry point (:mod:`tests.faults.worker`) and the test side (:mod:`tests.faults.harness`).

Nothing here is collected by pytest or autodiscovered by Django: the worker registers the
jobs in the child, and a test registers them only inside ``registry.isolated()``.
"""
