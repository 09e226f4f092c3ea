"""The console's look: the styled 403/404/500 pages, the favicon, the theme script (no inline script anywhere), the
status pills' variants and relative times on the pages that show a moment."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gateway import scopes as sc
from gateway.models import GatewayProcess
from operator_ui.templatetags.console import tone
from tests.operator_ui.failing_urls import FAILURE_DETAIL
from tests.operator_ui.test_pairing import operator_request, paired
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    return client


STACK_WORDS = ("Traceback", 'File "', "Exception Value", "Request Method", "DEBUG")


def _no_stack_or_exception(body: str) -> None:
    for word in STACK_WORDS:
        assert word not in body


def test_a_page_the_scopes_do_not_open_is_the_styled_403_naming_the_missing_scope(client):
    client.force_login(operator_user("reader-less"))

    response = client.get(reverse("ui:runs"))

    body = response.content.decode()
    assert response.status_code == 403
    assert response.templates[0].name == "403.html"
    assert "You may not open this page" in body
    assert "This page needs operator.read." in body
    assert "Nothing was read or changed." in body
    _no_stack_or_exception(body)


def test_a_login_without_any_scope_gets_the_styled_403_saying_so(client):
    client.force_login(operator_user("nobody"))

    response = client.get(reverse("ui:home"))

    assert response.status_code == 403
    assert "This login holds no operator scope: ask an administrator for one." in response.content.decode()


def test_django_s_own_403_uses_the_styled_page_without_the_exception_s_words(client):
    # A staff user without model permissions: the admin raises PermissionDenied, Django's handler403 answers.
    client.force_login(operator_user("staff-only", is_staff=True))

    response = client.get(reverse("admin:gateway_gatewayprocess_changelist"))

    body = response.content.decode()
    assert response.status_code == 403
    assert "You may not open this page" in body and "Your login is not allowed to do this." in body
    _no_stack_or_exception(body)


def test_an_unknown_address_is_the_styled_404_for_visitors_and_logins(staff_client):
    anonymous = Client().get("/no-such-page/")
    missing_device = staff_client.get(reverse("ui:pairing-device-remove", kwargs={"device_id": "f" * 64}))

    for response in (anonymous, missing_device):
        body = response.content.decode()
        assert response.status_code == 404
        assert "Nothing here" in body
        assert "no such paired device" not in body  # the view's exception text stays on the server
        _no_stack_or_exception(body)
    assert 'aria-label="Main"' in missing_device.content.decode()  # a login keeps its navigation


def test_an_unexpected_failure_is_the_styled_500_without_the_exception(settings):
    settings.ROOT_URLCONF = "tests.operator_ui.failing_urls"
    client = Client(raise_request_exception=False)

    response = client.get("/fails/")

    body = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on the gateway" in body
    assert FAILURE_DETAIL not in body and "RuntimeError" not in body
    _no_stack_or_exception(body)
    assert 'href="/static/operator_ui/console.css"' in body  # styled, though rendered without a context


def test_the_favicon_is_an_svg_and_favicon_ico_leads_to_it(client):
    icon = client.get("/favicon.ico")
    refused = client.post("/favicon.ico")
    svg = client.get(icon["Location"])

    assert icon.status_code == 301 and icon["Location"] == "/static/operator_ui/favicon.svg"
    assert refused.status_code == 405
    assert svg.status_code == 200 and svg["Content-Type"].startswith("image/svg+xml")
    assert Path(finders.find("operator_ui/favicon.svg")).read_text().startswith("<svg")


def test_every_page_loads_the_theme_script_in_its_head_and_no_inline_script(staff_client):
    paired()
    operator_request("d" * 64)
    pages = [Client().get(reverse("ui:login"))] + [
        staff_client.get(reverse(f"ui:{name}"))
        for name in ("sessions", "runs", "environments", "nodes", "pairing", "approvals", "usage", "logs", "system")
    ]

    for response in pages:
        body = response.content.decode()
        head = body.split("</head>")[0]
        assert response.status_code == 200
        assert '<script src="/static/operator_ui/theme.js"></script>' in head  # no defer: before the first paint
        assert '<link rel="icon" href="/static/operator_ui/favicon.svg" type="image/svg+xml">' in head
        assert 'id="theme-choice" hidden' in body  # nothing to press without the script
        scripts = re.findall(r"<script\b[^>]*>", body)
        assert scripts and all(" src=" in tag for tag in scripts), scripts


@pytest.mark.parametrize(
    ("status", "variant"),
    [("ok", "ok"), ("active", "ok"), ("running", "info"), ("pending", "warn"), ("failed", "error"), ("error", "error")],
)
def test_a_known_status_names_its_pill_variant(status, variant):
    assert tone(status) == variant


@pytest.mark.parametrize("status", ["", None, "something-new", '"><script>alert(1)</script>'])
def test_an_unknown_or_hostile_status_is_muted(status):
    assert tone(status) == "muted"


def test_the_system_page_shows_relative_times_with_the_absolute_time_in_the_tooltip(staff_client):
    started = timezone.now() - timedelta(hours=3)
    GatewayProcess.objects.create(
        boot_id="0b0e0e0e-0000-4000-8000-000000000001",
        hostname="gw-look",
        pid=42,
        started_at=started,
        heartbeat_at=timezone.now(),
    )

    body = staff_client.get(reverse("ui:system")).content.decode()

    assert f'title="{started.strftime("%Y-%m-%d %H:%M:%S")} UTC">3 h ago</time>' in body
    assert '<span class="pill pill-ok">live</span>' in body
