from django.contrib import admin
from django.urls import include, path

from openclaw_site.api import api
from operations_app import views as operations_views
from operations_app.metrics_views import metrics_view
from operator_ui import system_views

urlpatterns = [
    # HTTP only: a WebSocket at `/` is the gateway's (asgi.py routes it before Django sees it).
    path("", system_views.root, name="root"),
    path("favicon.ico", system_views.favicon, name="favicon"),
    path("healthz", operations_views.healthz, name="healthz"),
    path("readyz", operations_views.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("ui/", include("operator_ui.urls")),
    path("metrics", metrics_view, name="metrics"),
]
