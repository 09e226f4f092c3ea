"""The console's Usage page: totals, the chart per day (SVG drawn by the server), top sessions linking to their
pages, the cost per model with its missing prices said, the date range from GET parameters, and refusals."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from sessions_app.models import Run
from tests.operations_app.conftest import PRICES, at, turn

pytestmark = pytest.mark.django_db

MARCH = {"startDate": "2026-03-01", "endDate": "2026-03-07"}


@pytest.fixture(autouse=True)
def _prices(settings):
    settings.OPENCLAW_MODEL_PRICES = PRICES


@pytest.fixture
def week():
    turn("agent:main:alpha", "a1", at("2026-03-01"), {"input": 1000, "output": 500})
    turn("agent:main:alpha", "a2", at("2026-03-03"), {"input": 4000, "output": 2000})
    turn("agent:ops:beta", "b1", at("2026-03-03", "15:00"), {"input": 300, "output": 700}, model="mystery")
    turn("agent:main:gamma", "g1", at("2026-03-02"), {"input": 10, "output": 10})


def test_the_page_shows_totals_a_chart_top_sessions_and_models(operator_client, week, django_assert_max_num_queries):
    # The login's session and user, its permissions (its scopes: given directly and through groups), the
    # report's four grouped reads.
    with django_assert_max_num_queries(8):
        response = operator_client.get("/ui/usage/", MARCH)

    assert response.status_code == 200
    page = response.content.decode()
    assert re.search(r'data-figure="input">5,310<', page)
    assert re.search(r'data-figure="output">3,210<', page)
    # 5000 in at $2/M + 2500 out at $8/M + 20 tokens of g1: $0.0300 + $0.00010 (mystery has no price).
    assert re.search(r'data-figure="cost">\$0\.0301', page)
    assert "No price for openai/mystery" in page
    # One bar per day with tokens (1st, 2nd, 3rd), each titled with its figures; the 4th to the 7th have none.
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert len(re.findall(r"<rect ", svg)) == 3
    assert "<title>2026-03-03: 7,000 tokens, $0.0240</title>" in svg
    assert 'viewBox="0 0 70 100"' in svg  # a slot for each of the 7 days
    assert "<span>2026-03-01</span><span>2026-03-07</span>" in page
    assert "Busiest day: 7,000 tokens" in page
    # Sessions by tokens, linking to their pages: alpha 7500, beta 1000, gamma 20.
    order = [
        page.index(f'href="/ui/sessions/{key}/"') for key in ("agent:main:alpha", "agent:ops:beta", "agent:main:gamma")
    ]
    assert order == sorted(order)
    assert "no price" in page
    assert 'aria-current="page">Usage<' in page


def test_the_range_is_chosen_with_get_parameters(operator_client, week):
    page = operator_client.get("/ui/usage/", {"startDate": "2026-03-02", "endDate": "2026-03-02"}).content.decode()

    assert re.search(r'data-figure="input">10<', page)
    assert "2026-03-02 to 2026-03-02 (1 day)" in page
    assert 'href="/ui/sessions/agent:main:alpha/"' not in page


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"startDate": "2026-03-09", "endDate": "2026-03-01"}, "startDate must not be after endDate"),
        (
            {"startDate": "2025-01-01", "endDate": "2026-03-01"},
            "date range too long: 425 days from startDate to endDate, at most 366",
        ),
        (
            {"startDate": "2026-02-30", "endDate": "2026-03-01"},
            "invalid startDate: expected a valid YYYY-MM-DD calendar date",
        ),
        ({"startDate": "yesterday", "endDate": "2026-03-01"}, "startDate: String should match pattern"),
        ({"startDate": "2026-03-01"}, "startDate and endDate must be provided together"),
    ],
)
def test_a_range_that_cannot_be_read_is_refused_and_shows_no_figures(operator_client, week, params, message):
    response = operator_client.get("/ui/usage/", params)

    assert response.status_code == 400
    page = response.content.decode()
    assert message in page
    assert "data-figure" not in page
    assert "<svg" not in page


def test_with_no_runs_the_page_says_so(operator_client):
    response = operator_client.get("/ui/usage/")

    assert response.status_code == 200
    page = response.content.decode()
    assert re.search(r'data-figure="input">0<', page)
    assert re.search(r'data-figure="cost">\$0\.00<', page)
    assert "No turns in these days." in page
    assert "<svg" not in page
    assert "No price for" not in page


def test_the_default_range_is_the_last_30_days(operator_client):
    turn("agent:main:main", "today", timezone.now(), {"input": 42, "output": 1})
    turn("agent:main:main", "old", timezone.now() - timedelta(days=45), {"input": 1000, "output": 1})

    page = operator_client.get("/ui/usage/").content.decode()

    assert re.search(r'data-figure="input">42<', page)
    assert "(30 days)" in page
    assert Run.objects.count() == 2


def test_the_page_needs_a_login(client):
    response = client.get("/ui/usage/")
    assert response.status_code == 302
    assert response["Location"].startswith("/ui/login/")
