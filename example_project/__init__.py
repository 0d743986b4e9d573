"""The example project: django-fencedjobs' demo, run with ``make demo``."""
