"""Worker profiles (``OPENCLAW_WORKER_PROFILES``), checked once at start against the registered providers.

A bad profile stops the start with one line naming the profile and the field; the gateway never
finds out at dispatch time that a profile it advertised cannot work.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from openclaw_site.env import SettingsError

from .providers import ProviderRegistry, WorkerProfile, WorkerProviderError, providers

SETTING = "OPENCLAW_WORKER_PROFILES"
PROFILE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PROFILE_KEYS = frozenset({"provider", "install", "settings"})
INSTALL_KINDS = ("bundle", "local")


def parse_profiles(raw: dict[str, Any], registry: ProviderRegistry) -> dict[str, WorkerProfile]:
    profiles: dict[str, WorkerProfile] = {}
    for profile_id, entry in raw.items():
        where = f"{SETTING}: profile {profile_id!r}"
        if not PROFILE_ID.match(profile_id):
            raise SettingsError(f"{where}: a profile id is 1-64 letters, digits, '.', '_' or '-'")
        if not isinstance(entry, dict):
            raise SettingsError(f"{where} must be an object")
        unknown = set(entry) - PROFILE_KEYS
        if unknown:
            raise SettingsError(f"{where}: unknown field {sorted(unknown)[0]!r} (allowed: provider, install, settings)")
        provider_id = entry.get("provider")
        if not isinstance(provider_id, str) or not provider_id:
            raise SettingsError(f"{where}: field 'provider' is required")
        provider = registry.get(provider_id)
        if provider is None:
            raise SettingsError(
                f"{where}: field 'provider' names an unknown provider {provider_id!r} "
                f"(registered: {', '.join(registry.ids()) or 'none'})"
            )
        install = entry.get("install", "bundle")
        if install not in INSTALL_KINDS:
            raise SettingsError(f"{where}: field 'install' must be 'bundle' or 'local', not {install!r}")
        provider_settings = entry.get("settings", {})
        if not isinstance(provider_settings, dict):
            raise SettingsError(f"{where}: field 'settings' must be an object")
        try:
            provider.validate_settings(provider_settings)
        except WorkerProviderError as error:
            field = f"settings.{error.field}" if error.field else "settings"
            raise SettingsError(f"{where}: field {field!r}: {error.message}") from None
        profiles[profile_id] = WorkerProfile(
            id=profile_id, provider_id=provider_id, install=install, settings=provider_settings
        )
    return profiles


class _Profiles:
    def __init__(self) -> None:
        self.loaded: dict[str, WorkerProfile] = {}


_profiles = _Profiles()


def load_profiles() -> None:
    """Called from ``WorkersConfig.ready()`` after the providers registered."""
    _profiles.loaded = parse_profiles(settings.OPENCLAW_WORKER_PROFILES, providers)


def profile_get(profile_id: str) -> WorkerProfile | None:
    return _profiles.loaded.get(profile_id)


def profiles_all() -> list[WorkerProfile]:
    return [_profiles.loaded[key] for key in sorted(_profiles.loaded)]


def profile_for_environment(provider_id: str, profile_id: str, snapshot: dict[str, Any]) -> WorkerProfile:
    """The profile an environment was created from: the configured one when it still names the same
    provider, else the snapshot the environment kept (a removed profile must still be cleaned up)."""
    configured = _profiles.loaded.get(profile_id)
    if configured is not None and configured.provider_id == provider_id:
        return configured
    settings_snapshot = snapshot.get("settings") if isinstance(snapshot, dict) else None
    return WorkerProfile(
        id=profile_id,
        provider_id=provider_id,
        install=snapshot.get("install", "bundle") if isinstance(snapshot, dict) else "bundle",
        settings=settings_snapshot if isinstance(settings_snapshot, dict) else {},
    )


KEY_FILE_SHOWN = "(a file on the gateway host)"


def profile_shown(snapshot: dict[str, Any]) -> dict[str, Any]:
    """An environment's profile snapshot as an operator page shows it: a key file is named as the profile's, not
    located (its path is the gateway host's; an environment variable's name is the reference itself)."""
    settings_shown = snapshot.get("settings") if isinstance(snapshot, dict) else None
    key_ref = settings_shown.get("keyRef") if isinstance(settings_shown, dict) else None
    if not isinstance(key_ref, dict) or key_ref.get("source") != "file":
        return snapshot
    return {**snapshot, "settings": {**settings_shown, "keyRef": {**key_ref, "id": KEY_FILE_SHOWN}}}
