"""The API's routes, namespaced `agentrun` (e.g. `agentrun:run-detail`, `agentrun:toolcall-approve`)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from .views import RunViewSet, ToolCallViewSet

app_name = "agentrun"

router = SimpleRouter()
router.register("runs", RunViewSet, basename="run")
router.register("tool-calls", ToolCallViewSet, basename="toolcall")

urlpatterns = router.urls
