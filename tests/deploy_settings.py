"""tests.settings plus ``tests.deployapp`` (one job), for the processes that
tests/test_deploy_recipes.py starts from the recipes in deploy/."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.deployapp"]
