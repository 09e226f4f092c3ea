"""Wire shapes of the gateway protocol: frames, connect params, constants, and the limits of a frame.

All objects are closed (``extra="forbid"``), as in OpenClaw's TypeBox schemas, so a misspelt field
is an error rather than silently ignored. Two layers keep input that JSON interop, PostgreSQL or
the transport cannot carry out of every handler:

* :func:`decode_frame` refuses a frame before any validation when it nests deeper than
  :data:`MAX_JSON_DEPTH`, carries an integer outside ±(2^53-1), a non-finite number, or a string
  with a lone surrogate (not valid UTF-8 text); the refusal names the frame's own id when it can
  be read (:func:`request_id_of`), so that the client's call completes.
* :class:`ClosedModel` refuses NUL characters and lone surrogates in every string field (nested
  models, lists and dict keys included) and bounds every ``int`` field to ±(2^53-1) unless the
  field declares its own bounds. The JSON API validates with the same classes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator
from pydantic_core import PydanticCustomError, core_schema

from openclaw_client import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION

from .exceptions import FrameRejected

SERVER_VERSION = "2026.9.6-django"

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "INVALID_FRAME_ID",
    "MAX_JSON_DEPTH",
    "MAX_REQUEST_ID_CHARS",
    "MAX_SAFE_INTEGER",
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "SERVER_VERSION",
    "ClosedModel",
    "ConnectParams",
    "FrameHead",
    "NulCheckedByService",
    "RequestFrame",
    "decode_frame",
    "encode_frame",
    "format_validation_error",
    "read_frame_head",
    "request_id_of",
    "utf8_len_exceeds",
]

# Deeper than any frame OpenClaw's clients send; far below the recursion limits of the JSON
# decoder and pydantic, so a deep frame is refused cleanly instead of crashing the connection.
MAX_JSON_DEPTH = 64
# Number.MAX_SAFE_INTEGER: every integer a JavaScript client (OpenClaw's) reads exactly.
MAX_SAFE_INTEGER = 2**53 - 1
_MAX_SAFE_DIGITS = len(str(MAX_SAFE_INTEGER))
# Every answer echoes its request's id; OpenClaw's clients send UUIDs (36 characters).
MAX_REQUEST_ID_CHARS = 256
# The id of an answer to a frame whose own id cannot be read or sent back (reference protocol.md §1.2).
INVALID_FRAME_ID = "invalid"
# What a request frame may take unless its method declares otherwise (``registry.method(max_frame_bytes=…)``):
# room for the bounded params of every control method (the largest, ``exec.approval.request``, needs about
# 0.6 MB at most), twice OpenClaw's maxPayload before chat attachments (512 KiB). Methods that carry bulk
# (message text, node payloads, policy documents) declare their own.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
# How much of a frame's text :func:`read_frame_head` looks at.
FRAME_HEAD_CHARS = 4096

_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff); paired ones decode to one code point.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")

CLIENT_IDS = (
    "webchat-ui",
    "openclaw-control-ui",
    "openclaw-browser-copilot",
    "openclaw-tui",
    "webchat",
    "cli",
    "gateway-client",
    "openclaw-macos",
    "openclaw-linux",
    "openclaw-ios",
    "openclaw-watchos",
    "openclaw-android",
    "node-host",
    "openclaw-worker",
    "test",
    "fingerprint",
    "openclaw-probe",
)
CLIENT_MODES = ("webchat", "cli", "ui", "backend", "node", "worker", "probe", "test")


# --- decoding and encoding frames --------------------------------------------------------------


class _NumberRefused(ValueError):
    def __init__(self, reason: str, *, malformed: bool = False):
        super().__init__(reason)
        self.malformed = malformed


def _parse_int(literal: str) -> int:
    # Checked on the literal first: int() itself refuses more than 4,300 digits with a ValueError.
    if len(literal.lstrip("-")) > _MAX_SAFE_DIGITS or abs(value := int(literal)) > MAX_SAFE_INTEGER:
        raise _NumberRefused(f"integer out of range (must be within ±{MAX_SAFE_INTEGER})")
    return value


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NumberRefused("number out of range (must be finite)")
    return value


def _parse_constant(name: str) -> Any:
    # Python's decoder accepts NaN and ±Infinity; JSON has no such values.
    raise _NumberRefused(f"malformed JSON ({name} is not a JSON value)", malformed=True)


def _has_lone_surrogate(text: str) -> bool:
    # isascii() is a flag CPython keeps on the string: ASCII text (most frames) costs nothing here.
    return not text.isascii() and _SURROGATE.search(text) is not None


def utf8_len_exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` takes more than ``limit`` bytes as UTF-8, encoding it only when that decides."""
    # A str of n code points takes between n and 4n bytes (n when it is ASCII).
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit or text.isascii():
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest deeper than ``limit`` (breadth first, one list per level)."""
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        nested: list[Any] = []
        for item in level:
            children = item.values() if item.__class__ is dict else item
            nested += [child for child in children if child.__class__ is dict or child.__class__ is list]
        level, depth = nested, depth + 1
    return False


def _contains_lone_surrogate(value: Any) -> bool:
    """Whether any string (dict keys included) in the decoded value holds a lone surrogate."""
    level = [value]
    while level:
        nested: list[Any] = []
        for item in level:
            if item.__class__ is dict:
                if any(_has_lone_surrogate(key) for key in item):
                    return True
                children = item.values()
            else:
                children = item
            for child in children:
                kind = child.__class__
                if kind is str:
                    if _has_lone_surrogate(child):
                        return True
                elif kind is dict or kind is list:
                    nested.append(child)
        level = nested
    return False


def _lone_surrogate(frame_id: str) -> FrameRejected:
    return FrameRejected("lone surrogate in a string (not valid UTF-8 text)", frame_id=frame_id)


def _too_deep(max_depth: int, frame_id: str) -> FrameRejected:
    return FrameRejected(f"nested deeper than {max_depth} levels", frame_id=frame_id)


def request_id_of(raw: Any) -> str:
    """The id to answer a decoded frame under: its own when an answer can carry it back (a non-empty string of
    at most :data:`MAX_REQUEST_ID_CHARS` characters that is valid text), else :data:`INVALID_FRAME_ID`."""
    frame_id = raw.get("id") if isinstance(raw, dict) else None
    if isinstance(frame_id, str) and 0 < len(frame_id) <= MAX_REQUEST_ID_CHARS and not _has_lone_surrogate(frame_id):
        return frame_id
    return INVALID_FRAME_ID


def _number_read_as_zero(literal: str) -> int:
    return 0


def _id_despite_numbers(text: str) -> str:
    """The id of a frame refused for a number out of range: the text decoded again with every number read as 0
    (never converted, so no size matters), when it is JSON at all."""
    decoder = json.JSONDecoder(
        parse_int=_number_read_as_zero, parse_float=_number_read_as_zero, parse_constant=_parse_constant
    )
    try:
        return request_id_of(decoder.decode(text))
    except ValueError:  # not JSON after all (JSONDecodeError, NaN)
        return INVALID_FRAME_ID
    except RecursionError:
        return read_frame_head(text).request_id


def decode_frame(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse one JSON text with the protocol's limits, or raise :class:`FrameRejected`.

    Refused: malformed JSON (NaN and Infinity included), nesting deeper than ``max_depth``,
    integers outside ±(2^53-1), numbers that overflow to infinity, and lone surrogates (``\\ud800``
    is valid JSON syntax but not Unicode text: it cannot be stored, encoded or sent back). A refusal
    of text that is JSON carries the frame's own id (:func:`request_id_of`); malformed text's is
    ``"invalid"``.
    """
    # The integer hook is a Python call per integer literal, which frames hold few of; a regular expression
    # looking for long digit runs instead costs more on every frame (about 25 ms per MB of text).
    decoder = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    try:
        value = decoder.decode(text)
    except _NumberRefused as refused:
        if refused.malformed:
            raise FrameRejected(str(refused), malformed=True) from None
        raise FrameRejected(str(refused), frame_id=_id_despite_numbers(text)) from None
    except json.JSONDecodeError as exc:
        raise FrameRejected(f"malformed JSON ({exc.msg})", malformed=True) from None
    except RecursionError:
        raise _too_deep(max_depth, read_frame_head(text).request_id) from None
    if isinstance(value, str) and _has_lone_surrogate(value):
        raise _lone_surrogate(INVALID_FRAME_ID)
    if not isinstance(value, dict | list):
        return value
    # Both checks walk the value, so they run only when the text could fail them: counting the
    # brackets (strings included, so it over-counts) and looking for a surrogate escape are C-speed.
    if text.count("[") + text.count("{") > max_depth and _deeper_than(value, max_depth):
        raise _too_deep(max_depth, request_id_of(value))
    if (_SURROGATE_ESCAPE.search(text) or _has_lone_surrogate(text)) and _contains_lone_surrogate(value):
        raise _lone_surrogate(request_id_of(value))
    return value


# --- the head of a frame, read before it is parsed ------------------------------------------------

_JSON_SPACE = "[ \t\n\r]*"
_HEAD_OPEN = re.compile(_JSON_SPACE + r"\{" + _JSON_SPACE)
_HEAD_KEY = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")' + _JSON_SPACE + ":" + _JSON_SPACE)
_HEAD_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_HEAD_SCALAR = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_HEAD_COMMA = re.compile(_JSON_SPACE + "," + _JSON_SPACE)
_HEAD_MEMBERS = ("type", "id", "method")


@dataclass(frozen=True)
class FrameHead:
    """What a frame's leading members say, read without parsing the frame (:func:`read_frame_head`).

    ``request_id`` is as :func:`request_id_of` gives it; ``method`` and ``type`` are None where the head
    does not name them.
    """

    request_id: str
    method: str | None
    type: str | None


def _json_string(token: str) -> str | None:
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def read_frame_head(text: str) -> FrameHead:
    """The ``type``, ``id`` and ``method`` of a frame from its first :data:`FRAME_HEAD_CHARS` characters.

    For what must be decided before a big frame is parsed (its size against its method's limit) or when it
    cannot be parsed at all (nested past the decoder): members are read in order up to the first object
    or array (``params``: clients send ``type``, ``id``, ``method`` first) or the end of the head. A duplicate
    of a member past that is not seen; after parsing, the frame's own members decide.
    """
    end = min(len(text), FRAME_HEAD_CHARS)
    found: dict[str, str] = {}
    opening = _HEAD_OPEN.match(text, 0, end)
    pos = opening.end() if opening else end
    while pos < end:
        key = _HEAD_KEY.match(text, pos, end)
        if key is None:
            break
        pos = key.end()
        value = _HEAD_STRING.match(text, pos, end) or _HEAD_SCALAR.match(text, pos, end)
        if value is None:
            break  # an object or array, or a string that runs past the head
        name = _json_string(key.group(1))
        if name in _HEAD_MEMBERS and value.group().startswith('"'):
            member = _json_string(value.group())
            if member:
                found[name] = member
        comma = _HEAD_COMMA.match(text, value.end(), end)
        if comma is None:
            break
        pos = comma.end()
    return FrameHead(request_id=request_id_of(found), method=found.get("method"), type=found.get("type"))


def encode_frame(frame: Any) -> str:
    """The frame as JSON text, or ValueError when it cannot go out as valid UTF-8 JSON.

    ``json.dumps`` alone would write NaN (not JSON) and leave a lone surrogate that only fails
    inside the transport, after the frame was counted as sent.
    """
    text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if not text.isascii() and _has_lone_surrogate(text):
        raise ValueError("frame contains a lone surrogate")
    return text


# Set on a ``websocket.send`` message (and on a published event, ``dropIfSlow``) whose frame a
# connection past ``maxBufferedBytes`` skips instead of being closed as a slow consumer
# (``daphne_server.py``). OpenClaw marks presence, ``sessions.changed`` and chat deltas so.
DROP_IF_SLOW_KEY = "dropIfSlow"


@dataclass(frozen=True)
class EncodedEvent:
    """An event frame encoded once for many connections (ticks, broadcasts); each adds its own ``seq``.

    ``body`` is the frame's JSON without its closing brace, or None when the event cannot be
    encoded: then every connection takes the per-frame path, which closes it with a reason.
    """

    event: str
    payload: Any
    state_version: dict | None
    body: str | None
    drop_if_slow: bool = False

    @classmethod
    def of(
        cls, event: str, payload: Any, *, state_version: dict | None = None, drop_if_slow: bool = False
    ) -> EncodedEvent:
        frame: dict[str, Any] = {"type": "event", "event": event, "payload": payload}
        if state_version is not None:
            frame["stateVersion"] = state_version
        try:
            body: str | None = encode_frame(frame)[:-1]
        except (TypeError, ValueError):
            body = None
        return cls(event=event, payload=payload, state_version=state_version, body=body, drop_if_slow=drop_if_slow)

    def frame_text(self, seq: int) -> str:
        assert self.body is not None
        return f'{self.body},"seq":{seq}}}'


# --- the base of every params model --------------------------------------------------------------


def _guard_text(value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
    # Checked before the inner schema too: its own constraints (patterns, lengths) would otherwise
    # report a lone surrogate as an unreadable string instead of naming the problem.
    if isinstance(value, str):
        _check_text(value)
    result = handler(value)
    if result is not value and isinstance(result, str):
        _check_text(result)
    return result


def _check_text(value: str) -> None:
    if "\x00" in value:
        raise PydanticCustomError("text_nul", "must not contain NUL characters")
    _check_unicode(value)


def _check_unicode(value: str) -> None:
    if _has_lone_surrogate(value):
        raise PydanticCustomError("text_surrogate", "must not contain lone surrogates (not valid UTF-8 text)")


def _guard_unicode(value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
    if isinstance(value, str):
        _check_unicode(value)
    return handler(value)


class NulCheckedByService:
    """``Annotated[str, NulCheckedByService()]``: a field whose NUL check belongs to its service.

    For the fields where OpenClaw answers NUL with a message of its own (``chat.send``'s
    ``message must not contain null bytes``): lone surrogates are still refused here, and the
    service must refuse NUL before any write.
    """

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(_guard_unicode, handler(source))


def _harden(schema: Any, seen: set[int]) -> None:
    """Guard every ``str`` and bound every ``int`` of a pydantic core schema, in place.

    Idempotent: a nested model's schema (already hardened by its own class) is recognised by the
    guard wrapped around its strings and left alone.
    """
    if isinstance(schema, list):
        for item in schema:
            _harden(item, seen)
        return
    if not isinstance(schema, dict) or id(schema) in seen:
        return
    seen.add(id(schema))
    kind = schema.get("type")
    if kind == "function-wrap" and schema.get("function", {}).get("function") in (_guard_text, _guard_unicode):
        return
    if kind == "str":
        inner = dict(schema)
        seen.add(id(inner))
        schema.clear()
        schema.update(core_schema.no_info_wrap_validator_function(_guard_text, inner))
        return
    if kind == "int":
        # A field that declares a bound keeps it; the other side gets the default.
        if "le" not in schema and "lt" not in schema:
            schema["le"] = MAX_SAFE_INTEGER
        if "ge" not in schema and "gt" not in schema:
            schema["ge"] = -MAX_SAFE_INTEGER
    for key, value in schema.items():
        if key not in ("metadata", "serialization") and isinstance(value, dict | list):
            _harden(value, seen)


class ClosedModel(BaseModel):
    """Closed object; text without NUL or lone surrogates; integers within ±(2^53-1) by default.

    PostgreSQL refuses NUL in text and no UTF-8 encoder takes a lone surrogate, so both are refused
    here, for every vendor alike, before any service runs. ``Any`` fields are opaque JSON: the
    frame decoder has already screened them for surrogates, depth and number size.
    """

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False, allow_inf_nan=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        schema = handler(source)
        _harden(schema, set())
        return schema


NonEmptyStr = Field(min_length=1)


class RequestFrame(ClosedModel):
    type: Literal["req"]
    id: str = Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS)
    method: str = Field(min_length=1)
    params: Any = None


class CancelFrame(ClosedModel):
    type: Literal["cancel"]
    id: str = Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS)


# --- connect (strict: no string-to-number or number-to-bool coercion, as OpenClaw's Ajv) ---------


class StrictClosedModel(ClosedModel):
    model_config = ConfigDict(strict=True)


class ClientInfo(StrictClosedModel):
    # Lengths: the columns that keep them (PairedDevice, GatewayConnection); buildId and timeZone
    # as OpenClaw bounds them.
    id: str
    displayName: str | None = Field(default=None, min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=100)
    platform: str = Field(min_length=1, max_length=100)
    deviceFamily: str | None = Field(default=None, min_length=1, max_length=100)
    modelIdentifier: str | None = Field(default=None, min_length=1, max_length=100)
    mode: str
    instanceId: str | None = Field(default=None, min_length=1, max_length=200)
    buildId: str | None = Field(default=None, min_length=1, max_length=96)
    timeZone: str | None = Field(default=None, min_length=1, max_length=64)

    @field_validator("id")
    @classmethod
    def _known_client_id(cls, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in CLIENT_IDS:
            raise ValueError(f"must be one of: {', '.join(CLIENT_IDS)}")
        return lowered

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in CLIENT_MODES:
            raise ValueError(f"must be one of: {', '.join(CLIENT_MODES)}")
        return lowered


class DeviceProof(StrictClosedModel):
    id: str = Field(min_length=1, max_length=256)
    publicKey: str = Field(min_length=1, max_length=1024)
    signature: str = Field(min_length=1, max_length=256)
    signedAt: StrictInt = Field(ge=0)
    # Optional here so that a missing nonce gets OpenClaw's "device nonce required".
    nonce: str | None = Field(default=None, max_length=256)


class ConnectAuth(StrictClosedModel):
    token: str | None = Field(default=None, max_length=4096)
    bootstrapToken: str | None = Field(default=None, max_length=256)
    deviceToken: str | None = Field(default=None, max_length=256)
    password: str | None = Field(default=None, max_length=4096)
    approvalRuntimeToken: str | None = Field(default=None, max_length=2048)
    agentRuntimeIdentityToken: str | None = Field(default=None, max_length=2048)


NonEmptyText = Annotated[str, Field(min_length=1)]


class ConnectParams(StrictClosedModel):
    minProtocol: StrictInt = Field(ge=1)
    maxProtocol: StrictInt = Field(ge=1)
    client: ClientInfo
    caps: list[NonEmptyText] = Field(default_factory=list)
    commands: list[NonEmptyText] | None = None
    permissions: dict[NonEmptyText, bool] | None = None
    pathEnv: str | None = None
    # Any non-empty string here; a role outside the closed set gets OpenClaw's "invalid role".
    role: str | None = Field(default=None, min_length=1)
    scopes: list[NonEmptyText] | None = None
    device: DeviceProof | None = None
    auth: ConnectAuth | None = None
    locale: str | None = None
    userAgent: str | None = None


# --- errors ------------------------------------------------------------------------------------------

_MAX_PATH_PART = 64


def _path_part(part: Any) -> str:
    # A refused key is echoed in the message: keep it short, printable and encodable.
    text = str(part)
    if len(text) > _MAX_PATH_PART:
        text = text[:_MAX_PATH_PART] + "…"
    return "".join(
        f"\\u{ord(ch):04x}" if (ch.isascii() and not ch.isprintable()) or _SURROGATE.match(ch) else ch for ch in text
    )


def error_path(loc: tuple[Any, ...]) -> str:
    """``/client/id``: where in what the client sent, each part escaped so the message can always be sent."""
    return "/" + "/".join(_path_part(part) for part in loc) if loc else "/"


def validation_message(item: dict[str, Any]) -> str:
    """One validation problem in OpenClaw's words (``must have required property``, ``unexpected property``)."""
    kind = item.get("type", "")
    if kind == "missing":
        return "must have required property"
    if kind == "extra_forbidden":
        return "unexpected property"
    return str(item.get("msg", "invalid")).removeprefix("Value error, ")


def format_validation_error(error: ValidationError) -> str:
    """Readable one-line summary: ``at /client/id: must be one of …; at /minProtocol: required``."""
    parts = [
        f"at {error_path(tuple(item.get('loc', ())))}: {validation_message(item)}"
        for item in error.errors(include_url=False)
    ]
    return "; ".join(parts) or "invalid"


def negotiate_protocol(min_protocol: int, max_protocol: int) -> int | None:
    """Highest version both sides speak, or None."""
    candidate = min(max_protocol, PROTOCOL_VERSION)
    if candidate < max(min_protocol, MIN_PROTOCOL_VERSION):
        return None
    return candidate
