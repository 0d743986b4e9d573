"""The demo app: reminders to send, events to roll up, a weekday report (see jobs.py)."""
