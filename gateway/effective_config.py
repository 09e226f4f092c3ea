"""``config.get``: this gateway's effective configuration in OpenClaw's config shape, secrets redacted.

The configuration here is the environment the process started with (``OPENCLAW_*`` and friends, read once by
``openclaw_site/settings.py``), not a file. Settings that have a counterpart in OpenClaw's config are shown under
its names (docs/gateway-protocol.md, "config.get", has the table); the others (databases, Redis, worker profiles,
limits OpenClaw does not have) are not part of this view. Every secret is replaced by OpenClaw's redaction
sentinel, and host paths are left out (no operator.read client needs where the gateway keeps its files).
"""

from __future__ import annotations

import base64
import hashlib
import json
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings

from .conf import gateway_setting, shared_token
from .redaction import redact_secrets

# The value OpenClaw's config.get shows in place of every secret.
REDACTED = "__OPENCLAW_REDACTED__"
LOOPBACK_ADDRESS = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


def _bind(address: str) -> dict:
    """OpenClaw names bind modes, not addresses: loopback (127.0.0.1), lan (0.0.0.0) or custom with the address."""
    if address == LOOPBACK_ADDRESS:
        return {"bind": "loopback"}
    if address == ALL_INTERFACES:
        return {"bind": "lan"}
    return {"bind": "custom", "customBindHost": address}


def _auth() -> dict:
    has_token = bool(shared_token())
    has_password = bool(gateway_setting("PASSWORD"))
    auth: dict = {"mode": "token" if has_token or not has_password else "password"}
    if has_token:
        auth["token"] = REDACTED
    if has_password:
        auth["password"] = REDACTED
    return auth


def _is_secret_parameter(name: str, value: str) -> bool:
    pair = f"{name}={value}"
    return redact_secrets(pair) != pair


def shown_url(url: str) -> str:
    """A provider URL without its credentials: the password in it, the values of query parameters named like
    secrets (``api_key``, ``token``, … as gateway/redaction.py knows them) and OpenAI-style keys become the
    sentinel; the rest is kept as it is."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(name, REDACTED if _is_secret_parameter(name, value) else value) for name, value in pairs])
    path = redact_secrets(parts.path).replace("***", REDACTED)
    return urlunsplit(parts._replace(netloc=netloc, path=path, query=query))


def _model_sections() -> dict:
    model = settings.OPENCLAW_MODEL
    provider, model_id = model["PROVIDER"], model["MODEL"]
    sections: dict = {"agents": {"defaults": {"model": {"primary": f"{provider}/{model_id}"}}}}
    if provider == "openai":
        entry: dict = {"baseUrl": shown_url(model["BASE_URL"])}
        if model["API_KEY"]:
            entry["apiKey"] = REDACTED
        entry["api"] = "openai-completions"
        entry["models"] = [{"id": model_id, "name": model_id}]
        sections["models"] = {"providers": {provider: entry}}
    return sections


def effective_config() -> dict:
    sections = _model_sections()
    sections["agents"]["defaults"]["timeoutSeconds"] = settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"]
    return {
        "gateway": {
            "mode": "local",
            "port": gateway_setting("PORT"),
            **_bind(gateway_setting("BIND")),
            "auth": _auth(),
        },
        **sections,
        "tools": {"exec": {"timeoutSeconds": settings.OPENCLAW_AGENT["EXEC_TIMEOUT_S"]}},
    }


def config_snapshot() -> dict:
    """OpenClaw's config.get answer for this configuration: always present and valid (settings that are not stop
    the process at start), already applied, with the same object under each of OpenClaw's views of it."""
    config = effective_config()
    raw = json.dumps(config, indent=2)
    digest = base64.urlsafe_b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode("ascii")
    config_hash = f"sha256:{digest}"
    return {
        "includedPaths": [],
        "includeProvenance": [],
        "agentRosterIncludeOwned": False,
        "bindingsIncludeOwned": False,
        "exists": True,
        "raw": raw,
        "parsed": config,
        "sourceConfig": config,
        "resolved": config,
        "valid": True,
        "runtimeConfig": config,
        "config": config,
        "hash": config_hash,
        "issues": [],
        "warnings": [],
        "legacyIssues": [],
        "configRevisionHash": config_hash,
        "appliedConfigHash": config_hash,
    }
