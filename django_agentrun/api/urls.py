"""The API's routes, namespaced `agentrun` (e.g. `agentrun:run-detail`,
`agentrun:toolcall-approve`, `agentrun:conversation-messages`, `agentrun:run-stream` and
`agentrun:conversation-stream` for the live streams, `agentrun:schema` for its OpenAPI document)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from .conversations import ConversationViewSet
from .streams import conversation_stream, run_stream
from .views import RunViewSet, SchemaView, ToolCallViewSet

app_name = "agentrun"

router = SimpleRouter()
router.register("runs", RunViewSet, basename="run")
router.register("tool-calls", ToolCallViewSet, basename="toolcall")
router.register("conversations", ConversationViewSet, basename="conversation")

urlpatterns = [
    *router.urls,
    path("runs/<str:pk>/stream/", run_stream, name="run-stream"),
    path("conversations/<str:pk>/stream/", conversation_stream, name="conversation-stream"),
    path("schema/", SchemaView.as_view(), name="schema"),
]
