"""tests.settings plus ``tests.deployapp`` (one job), for the processes that
tests/test_deploy_recipes.py starts from the recipes in deploy/.

No LOGGING, as in a project that configures none: what the recipes' processes print is
what ``runjobs`` prints by default.
"""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.deployapp"]
LOGGING: dict = {}
