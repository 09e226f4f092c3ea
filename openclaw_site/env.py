"""Reading configuration from the environment, validated where it is read.

A value that cannot be used stops the start with one line naming the variable (``manage.py``
prints it without a traceback), instead of a ``ValueError`` from deep inside Django. Every
variable read through here is recorded in :data:`READ`, so a test can check the README documents
each one.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
LOG_LEVELS = frozenset(logging.getLevelNamesMapping())

READ: set[str] = set()


class SettingsError(ImproperlyConfigured):
    """A configuration value that cannot be used; the message names the variable and what it needs."""


def _raw(name: str) -> str:
    READ.add(name)
    return os.environ.get(name, "").strip()


def env_str(name: str, default: str = "") -> str:
    return _raw(name) or default


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = _raw(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, not {raw!r}") from None
    _check_range(name, value, minimum, maximum)
    return value


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    raw = _raw(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, not {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingsError(f"{name} must be a finite number, not {raw!r}")
    _check_range(name, value, minimum, maximum)
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = _raw(name).lower()
    if not raw:
        return default
    if raw in TRUE_WORDS:
        return True
    if raw in FALSE_WORDS:
        return False
    raise SettingsError(f"{name} must be one of 1/0, true/false, yes/no, on/off, not {raw!r}")


def env_choice(name: str, default: str, choices: Iterable[str]) -> str:
    allowed = tuple(choices)
    value = _raw(name) or default
    if value not in allowed:
        raise SettingsError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def env_log_level(name: str, default: str) -> str:
    value = (_raw(name) or default).upper()
    if value not in LOG_LEVELS:
        raise SettingsError(f"{name} must be a log level ({', '.join(sorted(LOG_LEVELS))}), not {value!r}")
    return value


def env_list(name: str, *, separator: str = ",") -> list[str]:
    return [item.strip() for item in _raw(name).split(separator) if item.strip()]


def env_absolute_paths(name: str) -> list[Path]:
    """``os.pathsep``-separated absolute directories."""
    paths = [Path(item) for item in env_list(name, separator=os.pathsep)]
    for path in paths:
        if not path.is_absolute():
            raise SettingsError(f"{name} must list absolute directories, not {str(path)!r}")
    return paths


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated IP addresses or networks (``127.0.0.1``, ``10.0.0.0/8``, ``::1``); unset: none."""
    networks = []
    for item in env_list(name):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SettingsError(f"{name} must list IP addresses or networks (10.0.0.0/8), not {item!r}") from None
    return tuple(networks)


def env_json_object(name: str) -> dict[str, Any]:
    """A JSON object (unset: empty); its content is validated by whoever uses it."""
    raw = _raw(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise SettingsError(f"{name} must be a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{name} must be a JSON object, not {type(value).__name__}")
    return value


def env_int_map(name: str, *, minimum: int | None = None, maximum: int | None = None) -> dict[str, int]:
    """A JSON object of names to integers (unset: empty), each checked against the range."""
    values = env_json_object(name)
    for key, value in values.items():
        if type(value) is not int:
            raise SettingsError(f"{name}: the value of {key!r} must be an integer, not {json.dumps(value)}")
        _check_range(f"{name}[{key!r}]", value, minimum, maximum)
    return values


def env_url(name: str, default: str = "", *, schemes: Iterable[str]) -> str:
    value = _raw(name) or default
    allowed = tuple(schemes)
    if value and value.split("://", 1)[0] not in allowed:
        raise SettingsError(f"{name} must be a URL starting with {' or '.join(s + '://' for s in allowed)}")
    return value


def _check_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be at most {maximum}, not {value}")
