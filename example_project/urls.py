from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.staticfiles.views import serve
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView

from example_project.demo.views import chat

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/agentrun/", include("django_agentrun.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The chat page (example_project/demo): it needs the ASGI server for its live stream.
    path("chat/", chat, name="chat"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    # A POST (Django's LogoutView takes no GET): the chat page's button; the admin has its own.
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
if settings.SERVE_STATIC:
    # Static files under uvicorn too, DEBUG on or off (see SERVE_STATIC in settings.py).
    urlpatterns.append(
        re_path(rf"^{settings.STATIC_URL.lstrip('/')}(?P<path>.*)$", serve, {"insecure": True}),
    )
