"""An app with one job, installed by ``tests.deploy_settings`` only: the processes that
``tests/test_deploy_recipes.py`` starts from the deployment recipes run it."""
