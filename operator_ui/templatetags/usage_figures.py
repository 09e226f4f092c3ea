"""Figures of the Usage page as people read them."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def thousands(value: int) -> str:
    """``12345`` → ``12,345`` (the page's language is English; no locale machinery for one separator)."""
    return f"{value:,}"
