"""Template tags of the console's base page."""

from __future__ import annotations

from typing import Any

from django import template

from approvals_app import selectors as approval_selectors
from gateway.user_scopes import user_has_scope, user_may_call

register = template.Library()


@register.simple_tag
def pending_approval_count() -> int:
    """The header's badge: one COUNT, drawn only on the pages of users who may decide approvals (the template
    asks for it there)."""
    return approval_selectors.pending_approvals().count()


@register.filter
def may_call(user: Any, method: str) -> bool:
    """``{% if user|may_call:"node.pair.approve" %}``: a link or a form only for a user whose scopes allow the
    gateway method behind it (the view checks the same)."""
    return user_may_call(user, method)


@register.filter
def holds(user: Any, scope: str) -> bool:
    """``{% if user|holds:"operator.admin" %}``, for a page no gateway method mirrors."""
    return user_has_scope(user, scope)
