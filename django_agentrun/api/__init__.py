"""The REST API: mount `django_agentrun.api.urls` (namespace `agentrun`) in your URLconf.

Every endpoint calls `services`; `views` says the status codes, `errors` the one error
body, `schema` how the OpenAPI document (the `schema/` route) describes them.
"""
