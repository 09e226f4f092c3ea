from django.contrib import admin
from django.urls import include, path

from openclaw_site.api import api
from operations_app.views import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("ui/", include("operator_ui.urls")),
    path("metrics", metrics_view, name="metrics"),
]
