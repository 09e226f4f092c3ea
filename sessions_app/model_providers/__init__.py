"""Model providers: ``get_model_provider()`` picks one from ``settings.OPENCLAW_MODEL`` at call time."""

from __future__ import annotations

from django.conf import settings

from .base import (
    Aborted,
    ChatMessage,
    Delta,
    Finish,
    ModelProvider,
    ModelProviderError,
    ModelProviderErrorKind,
    ToolCall,
)
from .echo import EchoProvider
from .openai_compat import OpenAICompatConfig, OpenAICompatProvider

__all__ = [
    "Aborted",
    "ChatMessage",
    "Delta",
    "EchoProvider",
    "Finish",
    "ModelProvider",
    "ModelProviderError",
    "ModelProviderErrorKind",
    "OpenAICompatConfig",
    "OpenAICompatProvider",
    "ToolCall",
    "default_model",
    "get_model_provider",
]


def get_model_provider() -> ModelProvider:
    conf = settings.OPENCLAW_MODEL
    name = str(conf.get("PROVIDER") or "").strip()
    if name == "echo":
        return EchoProvider()
    if name == "openai":
        return OpenAICompatProvider(OpenAICompatConfig.from_settings(conf))
    raise ModelProviderError(f"unknown model provider: {name}", kind="unknown")


def default_model() -> str:
    return settings.OPENCLAW_MODEL["MODEL"]
