"""The site's URLs plus one view that fails: the real 500 handler answers it (tests/operator_ui/test_look.py)."""

from django.http import HttpRequest, HttpResponse
from django.urls import path

from openclaw_site.urls import urlpatterns as site_urlpatterns

FAILURE_DETAIL = "the secret detail of an unexpected failure"


def fails(request: HttpRequest) -> HttpResponse:
    raise RuntimeError(FAILURE_DETAIL)


urlpatterns = [*site_urlpatterns, path("fails/", fails)]
