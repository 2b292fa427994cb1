"""The ASGI application: the whole project, or only its live streams beside the WSGI app
(`uvicorn example_project.asgi:application`; see the README's "Build a chat frontend")."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_asgi_application()
