"""Session keys: ``agent:<agentId>:<rest>``; default agent ``main``, main session ``agent:main:main``."""

from __future__ import annotations

import re
import uuid

from gateway.exceptions import InvalidRequest

DEFAULT_AGENT_ID = "main"
MAIN_KEY = "main"
AGENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_KEY_LENGTH = 300


def normalize_agent_id(agent_id: str | None) -> str:
    value = (agent_id or DEFAULT_AGENT_ID).strip().lower()
    if not AGENT_ID_RE.match(value):
        raise InvalidRequest(f"invalid agentId: {agent_id}")
    return value


def canonical_key(key: str, agent_id: str | None = None) -> str:
    """``agent:<agent>:<rest>`` as given (lower-cased), or a bare key placed under the agent."""
    raw = key.strip().lower()
    if not raw:
        raise InvalidRequest("session key required")
    if "\x00" in raw or len(raw) > MAX_KEY_LENGTH:
        raise InvalidRequest("invalid session key")
    parts = raw.split(":")
    if parts[0] == "agent":
        if len(parts) < 3 or not all(parts[1:]):
            raise InvalidRequest(f"invalid session key: {key}")
        normalize_agent_id(parts[1])
        return raw
    return f"agent:{normalize_agent_id(agent_id)}:{raw}"


def agent_of(key: str) -> str:
    return key.split(":")[1]


def main_key(agent_id: str | None = None) -> str:
    return f"agent:{normalize_agent_id(agent_id)}:{MAIN_KEY}"


def is_main_key(key: str) -> bool:
    parts = key.split(":")
    return len(parts) == 3 and parts[0] == "agent" and parts[2] == MAIN_KEY


def dashboard_key(agent_id: str | None = None) -> str:
    return f"agent:{normalize_agent_id(agent_id)}:dashboard:{uuid.uuid4()}"
