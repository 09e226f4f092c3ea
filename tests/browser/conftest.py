"""Fixtures of the browser tests: Playwright's Chromium from Debian (``OPENCLAW_CHROMIUM``) through
pytest-playwright's ``page``, and a folder of screenshots per test (``test-artifacts/screenshots/<test>/``).

pytest-playwright keeps one Playwright for the whole session. Its sync API marks an event loop as running in
the test thread for as long as it lives, so every later test of the same worker would find ``asyncio.run()``
refused and Django refusing every query. Here Playwright lives for one test module at a time instead.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from tests.support.browser import DESKTOP, Screenshots, chromium_launch_args, chromium_missing_reason, in_ci


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """``./dev test`` installs chromium when it is missing; where it could not, these tests are left out,
    except in CI (``CI=true``), which runs every test and so fails instead."""
    reason = chromium_missing_reason()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI: missing Chromium: {reason}")
        pytest.skip(reason)
    return {**browser_type_launch_args, **chromium_launch_args()}


@pytest.fixture(scope="module")
def playwright(browser_type_launch_args):
    with pytest.MonkeyPatch.context() as patch:
        # Playwright's running-loop mark only guards its own sync API against nesting; no loop runs while a test
        # or pytest-django's flush queries, so Django's async-safety check has nothing to protect here. Gateway
        # processes never inherit this (tests/support/processes.py).
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as started:
            yield started


@pytest.fixture(scope="module")
def browser(playwright, browser_type_launch_args):
    browser = playwright.chromium.launch(**browser_type_launch_args)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def browser_context_args():
    return {"viewport": DESKTOP}


@pytest.fixture
def screenshots(request) -> Screenshots:
    return Screenshots.for_test(request.node.originalname)
