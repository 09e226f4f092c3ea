from django.contrib import admin
from django.urls import include, path

from openclaw_site.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("ui/", include("operator_ui.urls")),
]
