"""What a browser gets from a running gateway: the admin's static files and the API docs, offline."""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_admin_css_and_javascript_are_served(gateway):
    css = httpx.get(f"{gateway.http_url}/static/admin/css/base.css")
    js = httpx.get(f"{gateway.http_url}/static/admin/js/actions.js")
    missing = httpx.get(f"{gateway.http_url}/static/admin/css/no-such-file.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert missing.status_code == 404


def test_the_api_docs_load_their_assets_from_the_gateway_not_a_cdn(gateway):
    page = httpx.get(f"{gateway.http_url}/api/docs")
    assert page.status_code == 200
    assert "cdn.jsdelivr" not in page.text and "unpkg" not in page.text
    assert "/static/ninja/swagger-ui-bundle.js" in page.text
    bundle = httpx.get(f"{gateway.http_url}/static/ninja/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and len(bundle.content) > 100_000


def test_the_start_banner_names_the_model_provider(gateway):
    assert "model provider: built-in echo" in gateway.log()
