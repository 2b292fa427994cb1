"""Test settings: the example project plus the test app; Postgres when DATABASE_URL is set."""

from example_project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405
AGENTRUN_MODEL_CLIENT = "django_agentrun.testing.ScriptedClient"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["NAME"] = ":memory:"  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": ":memory:"}  # noqa: F405
