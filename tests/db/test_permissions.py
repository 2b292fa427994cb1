"""The permission names: one module names them, the models declare them, the surfaces share them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import AnonymousUser, Permission, User

import django_agentrun
from django_agentrun import permissions

PACKAGE = Path(django_agentrun.__file__).parent
# The surfaces that check permissions; each must take the names from `permissions`.
SURFACES = ["admin", "api", "management", "tasks.py"]


def named() -> dict[str, str]:
    return {key: value for key, value in vars(permissions).items() if key.endswith("_PERMISSION")}


def declared() -> set[str]:
    return {
        f"{model._meta.app_label}.{codename}"
        for model in apps.get_app_config("agentrun").get_models()
        for codename, _ in model._meta.permissions
    }


def test_permissions__every_name_is_declared_in_a_models_meta():
    assert named(), "no *_PERMISSION constants found"
    assert set(named().values()) == declared()


def surface_files() -> list[Path]:
    files: list[Path] = []
    for name in SURFACES:
        path = PACKAGE / name
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.exists():
            files.append(path)
    return files


def test_permissions__surfaces_spell_no_permission_name_of_their_own():
    """A literal "agentrun.cancel_run" in the admin or the API could drift from the model's."""
    names = declared()
    found = []
    for path in surface_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert surface_files()
    assert found == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "check, codename",
    [(permissions.can_decide, "approve_toolcall"), (permissions.can_cancel, "cancel_run")],
)
def test_permissions__helpers_need_the_permission(check, codename):
    user = User.objects.create_user("someone", is_staff=True)
    assert not check(AnonymousUser())
    assert not check(None)
    assert not check(user)
    user.user_permissions.add(Permission.objects.get(codename=codename))
    assert check(User.objects.get(pk=user.pk))  # fresh permission cache
