"""Secrets out of text that leaves the process (errors shown to clients, stored reasons, logs).

Model providers and workers quote what they were told (an upstream error may echo a key or a header);
whatever passes through here keeps its meaning but not the secret.
"""

from __future__ import annotations

import re

_SECRETS = re.compile(
    r"(?i)(authorization:\s*(?:bearer\s+|basic\s+)?|bearer\s+|(?:api[_-]?key|token|password|secret)[\"']?\s*[:=]\s*[\"']?)"
    r"[^\s\"',;]+"
)
_OPENAI_KEYS = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")


def redact_secrets(text: str) -> str:
    """``text`` with bearer tokens, ``key=…``-style values and OpenAI-style keys replaced by ``***``."""
    return _OPENAI_KEYS.sub("sk-***", _SECRETS.sub(lambda m: f"{m.group(1)}***", text))
