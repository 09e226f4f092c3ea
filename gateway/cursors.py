"""Opaque page cursors of the JSON API's keyset-paginated lists.

A cursor is the sort key of the last row a page showed, as URL-safe base64 of a JSON array; the next
page starts strictly after it, so rows written meanwhile neither repeat nor shift the pages. Clients
pass it back unchanged: anything else is refused as ``invalid cursor`` before a query runs.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from .exceptions import InvalidRequest

INVALID = "invalid cursor"


def cursor_encode(*values: str | int) -> str:
    raw = json.dumps(list(values), separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def cursor_decode(text: str, *parsers: Callable[[Any], Any]) -> tuple:
    """The cursor's values, each through its parser (which raises ValueError or TypeError on a bad one)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        values = json.loads(raw.decode("ascii"))
        if not isinstance(values, list) or len(values) != len(parsers):
            raise ValueError(INVALID)
        return tuple(parse(value) for parse, value in zip(parsers, values, strict=True))
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, OverflowError):
        raise InvalidRequest(INVALID) from None


def cursor_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
        raise ValueError(INVALID)
    return value


def cursor_str(value: Any) -> str:
    if not isinstance(value, str) or "\x00" in value or len(value) > 300:
        raise ValueError(INVALID)
    return value
