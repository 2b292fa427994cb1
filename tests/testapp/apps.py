from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "agentrun_testapp"

    def ready(self) -> None:
        from . import hardening  # noqa: F401 - registers the hardening tests' agent
