"""Benchmarks of django-fencedjobs against PostgreSQL: ``make bench`` (see bench/run.py)."""
