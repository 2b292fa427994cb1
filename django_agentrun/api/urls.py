"""DRF endpoints (filled in by the API issue)."""

urlpatterns: list = []
