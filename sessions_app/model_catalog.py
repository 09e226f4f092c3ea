"""The models this gateway offers (``models.list``) and whether its provider's key is set (``models.authStatus``).

One provider and one model are configured (``OPENCLAW_MODEL_PROVIDER``, ``OPENCLAW_MODEL``); a session may name
another model id (``sessions.patch``), which goes to the same provider. The key itself never leaves the settings:
``models.authStatus`` says only where it comes from.
"""

from __future__ import annotations

from django.conf import settings

from gateway.exceptions import InvalidRequest
from gateway.selectors import now_ms

from .schemas import ModelsListParams

# Where the provider's key comes from, as OpenClaw names an environment-provided key.
API_KEY_ENV_VAR = "OPENCLAW_MODEL_API_KEY"


def configured_model() -> dict:
    """The configured model as an OpenClaw model choice (the gateway knows no context window or capabilities)."""
    model = settings.OPENCLAW_MODEL
    return {
        "id": model["MODEL"],
        "name": model["MODEL"],
        "provider": model["PROVIDER"],
        "tags": ["default"],
        "available": True,
    }


def models_list_payload(params: ModelsListParams) -> dict:
    provider = settings.OPENCLAW_MODEL["PROVIDER"]
    if params.provider is not None and params.provider.strip().lower() != provider:
        raise InvalidRequest(f"unknown model provider: {params.provider} (this gateway's provider is {provider})")
    payload: dict = {"models": [configured_model()]}
    # As OpenClaw: the default-model preview comes with the "configured" view of no particular session or account
    # unless asked for either way. No utility model is routed automatically here.
    include_defaults = params.includeDefaultModels
    if include_defaults is None:
        include_defaults = params.view == "configured" and not params.sessionKey and not params.authProfileId
    if include_defaults:
        payload["defaultModels"] = {"automaticUtilityModel": None}
    return payload


def models_auth_status_payload() -> dict:
    """OpenClaw lists the providers that hold a credential. Here that is the OpenAI-compatible provider when
    ``OPENCLAW_MODEL_API_KEY`` is set; the built-in ``echo`` provider and a keyless endpoint need none."""
    model = settings.OPENCLAW_MODEL
    providers = []
    if model["PROVIDER"] == "openai" and model["API_KEY"]:
        providers.append(
            {
                "provider": model["PROVIDER"],
                "authProvider": model["PROVIDER"],
                "displayName": model["PROVIDER"],
                "status": "static",
                "profiles": [],
                "apiKey": {"source": "env", "envVar": API_KEY_ENV_VAR},
            }
        )
    # No provider can be signed into or given a key from a client here.
    return {"ts": now_ms(), "providers": providers, "providerCapabilities": []}
