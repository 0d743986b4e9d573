"""The tasks integration is optional: a project that does not use the Tasks framework
imports nothing of it, and one that does gets the workers' reports wired up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

INTEGRATION = "django_fencedjobs.integrations.tasks"
PROBE = (
    "import json, sys, django; django.setup(); "
    f"print(json.dumps(sorted(m for m in ({INTEGRATION!r}, 'django_tasks', 'django_tasks_db') "
    "if m in sys.modules)))"
)


@pytest.mark.parametrize(
    ("settings", "imported"),
    [
        (
            "from tests.settings import *\n"
            "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'django_tasks_db']\n"
            "del TASKS\n",
            [],
        ),
        ("from tests.settings import *\n", [INTEGRATION, "django_tasks_db"]),
    ],
    ids=["without-tasks", "with-tasks"],
)
def test_the_tasks_integration_is_imported_only_by_a_project_that_uses_tasks(
    tmp_path, settings, imported
):
    (tmp_path / "probe_settings.py").write_text(settings)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "probe_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    # The backport (Django 5.2) is imported with the integration, and not otherwise.
    assert [m for m in found if m != "django_tasks"] == sorted(imported)
    if not imported:
        assert found == []
