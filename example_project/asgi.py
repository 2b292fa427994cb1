"""The ASGI application: the whole project, or only its live streams beside the WSGI app
(`uvicorn example_project.asgi:application`; see the README's "Build a chat frontend").
The streams' requests start on a few shared threads (`stream_threads`), not a thread each."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_asgi_application()

from django_agentrun.api.stream_serving import stream_threads  # noqa: E402 - after setup

application = stream_threads(application)
