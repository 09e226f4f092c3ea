"""The console's shared template tags: shortened ids and relative times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from operator_ui.templatetags.console import relative_words

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def render(source: str, **context) -> str:
    return Template("{% load console %}" + source).render(Context(context))


def test_a_long_id_shows_12_characters_with_the_whole_id_in_its_tooltip_and_copy_button():
    full = "0123456789abcdef" * 4
    html = render("{% short_id value %}", value=full)
    assert '<code title="' + full + '">0123456789ab…</code>' in html
    assert 'data-copy="' + full + '"' in html and " hidden>" in html


def test_a_short_id_is_shown_whole_without_a_copy_button_and_a_link_wraps_it():
    html = render('{% short_id value "/ui/nodes/" %}', value="main")
    assert '<a href="/ui/nodes/"><code title="main">main</code></a>' in html
    assert "data-copy" not in html


def test_an_id_is_escaped():
    html = render("{% short_id value %}", value='<b>"x"</b>')
    assert "<b>" not in html and "&lt;b&gt;" in html


@pytest.mark.parametrize(
    ("delta", "words"),
    [
        (timedelta(seconds=3), "just now"),
        (timedelta(seconds=42), "42 s ago"),
        (timedelta(minutes=5, seconds=10), "5 min ago"),
        (timedelta(hours=3), "3 h ago"),
        (timedelta(days=1, hours=2), "1 day ago"),
        (timedelta(days=12), "12 days ago"),
        (timedelta(days=400), "2025-10-31"),
        (-timedelta(minutes=4), "in 4 min"),
    ],
)
def test_relative_words(delta, words):
    assert relative_words(NOW - delta, NOW) == words


def test_when_draws_a_time_element_with_the_absolute_utc_time_from_a_datetime_or_epoch_ms():
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    for value in (moment, int(moment.timestamp() * 1000)):
        html = render("{% when value %}", value=value)
        assert html.startswith('<time datetime="2026-01-02T03:04:05+00:00" title="2026-01-02 03:04:05 UTC">')


# Epoch milliseconds past year 9999, or past what a float holds: a node or a model made them up.
@pytest.mark.parametrize("value", [None, "", 0, -5, "yesterday", True, 10**17, 10**30, 1e308, float("inf")])
def test_when_draws_a_dash_for_no_time(value):
    assert render("{% when value %}", value=value) == "–"
