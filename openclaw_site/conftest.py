"""Fixtures shared by the apps' unit tests."""

from __future__ import annotations

import pytest

from openclaw_site.gateway.conf import shared_token

API_TOKEN = "api-test-token"


@pytest.fixture
def api_token(settings) -> str:
    """The gateway token the JSON API accepts (``Authorization: Bearer <token>``)."""
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": API_TOKEN}
    shared_token.cache_clear()
    yield API_TOKEN
    shared_token.cache_clear()
