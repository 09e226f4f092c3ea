"""Template tags of the console's base page."""

from __future__ import annotations

from django import template

from approvals_app import selectors as approval_selectors

register = template.Library()


@register.simple_tag
def pending_approval_count() -> int:
    """The header's badge: one COUNT, drawn on staff users' pages only (the template asks for it there)."""
    return approval_selectors.pending_approvals().count()
