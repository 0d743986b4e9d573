import os

from django.apps import AppConfig


class SoakAppConfig(AppConfig):
    name = "soak.soakapp"
    label = "soakapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        sabotage = os.environ.get("SOAK_SABOTAGE")
        if sabotage:  # scripts/soak.py --sabotage: see soak/sabotage.py
            from soak.sabotage import apply

            apply(sabotage)
