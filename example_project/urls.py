from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from example_project.demo.views import chat

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/agentrun/", include("django_agentrun.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The chat page (example_project/demo): it needs the ASGI server for its live stream.
    path("chat/", chat, name="chat"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    # Static files under uvicorn too, while DEBUG is on (runserver does it by itself).
    *staticfiles_urlpatterns(),
]
