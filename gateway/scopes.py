"""Roles, operator scopes and their implication rules (reference/protocol.md §3)."""

from __future__ import annotations

from collections.abc import Iterable

ROLE_OPERATOR = "operator"
ROLE_NODE = "node"
ROLES = (ROLE_OPERATOR, ROLE_NODE)

READ = "operator.read"
WRITE = "operator.write"
ADMIN = "operator.admin"
APPROVALS = "operator.approvals"
PAIRING = "operator.pairing"
# Answering an agent's questions (question.*); only operator.admin implies it.
QUESTIONS = "operator.questions"
TALK_SECRETS = "operator.talk.secrets"

KNOWN_OPERATOR_SCOPES = (READ, WRITE, ADMIN, APPROVALS, PAIRING, QUESTIONS, TALK_SECRETS)
CLI_DEFAULT_SCOPES = [ADMIN, READ, WRITE, APPROVALS, PAIRING]


def scope_satisfied(granted: Iterable[str], required: str) -> bool:
    """``operator.admin`` satisfies every operator scope; ``operator.write`` satisfies read."""
    granted_set = set(granted)
    if required in granted_set:
        return True
    if required.startswith("operator.") and ADMIN in granted_set:
        return True
    if required == READ and WRITE in granted_set:
        return True
    return False


def scopes_cover(granted: Iterable[str], requested: Iterable[str]) -> bool:
    granted_list = list(granted)
    return all(scope_satisfied(granted_list, scope) for scope in requested)


def normalize_scopes(scopes: Iterable[str] | None) -> list[str]:
    """Trimmed, de-duplicated, order-preserving."""
    seen: dict[str, None] = {}
    for scope in scopes or []:
        cleaned = scope.strip()
        if cleaned:
            seen.setdefault(cleaned, None)
    return list(seen)
