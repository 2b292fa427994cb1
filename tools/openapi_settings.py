"""The drf-spectacular settings of the API's own schema view, for `manage.py spectacular
--custom-settings tools.openapi_settings.SETTINGS` (the docs site's OpenAPI document, built
by tools/docs_hooks.py): the same document `GET <mount>/schema/` serves."""

from django_agentrun.api.views import SchemaView

SETTINGS = SchemaView.custom_settings
