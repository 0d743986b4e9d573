"""tests.settings plus django-celery-beat, for the processes tests/test_importbeat.py starts.

Not in tests.settings: django-celery-beat brings celery into every process of the suite
(about 0.15 s and 10 MB more at each start), its admin into every admin page, and its cap on
Django (2.9: below 6.1) into the matrix pass. Its tables are migrated into the test database
by those processes.
"""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]
