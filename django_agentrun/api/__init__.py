"""The REST API: mount `django_agentrun.api.urls` (namespace `agentrun`) in your URLconf.

Every endpoint calls `services`; see `views` for the status codes.
"""
