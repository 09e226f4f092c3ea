"""The limits of a frame (decode_frame, encode_frame) and of every params model (ClosedModel)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from django.test import Client
from pydantic import Field, ValidationError

from devices_app.schemas import DeviceIdParams, TokenRevokeParams
from gateway import protocol
from gateway.exceptions import FrameRejected
from gateway.protocol import (
    FRAME_HEAD_CHARS,
    MAX_JSON_DEPTH,
    MAX_REQUEST_ID_CHARS,
    MAX_SAFE_INTEGER,
    ClosedModel,
    ConnectParams,
    FrameHead,
    NulCheckedByService,
    decode_frame,
    encode_frame,
    format_validation_error,
    read_frame_head,
    request_id_of,
    utf8_len_exceeds,
)
from gateway.registry import registry
from sessions_app.models import Session
from sessions_app.schemas import AgentWaitParams, SessionsCreateParams, SessionsListParams

DEEP = MAX_JSON_DEPTH + 1
TOO_BIG = f"Input should be less than or equal to {MAX_SAFE_INTEGER}"


# --- decode_frame ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 20000 + "]" * 20000, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        ("[" * DEEP + "]" * DEEP, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        ('{"a":' * DEEP + "1" + "}" * DEEP, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        ('{"params":' + "[" * 100 + "]" * 100 + "}", f"nested deeper than {MAX_JSON_DEPTH} levels"),
        ('{"minProtocol": ' + "4" * 4301 + "}", f"integer out of range (must be within ±{MAX_SAFE_INTEGER})"),
        ('{"limit": ' + "9" * 17 + "}", f"integer out of range (must be within ±{MAX_SAFE_INTEGER})"),
        (f'{{"limit": {MAX_SAFE_INTEGER + 1}}}', f"integer out of range (must be within ±{MAX_SAFE_INTEGER})"),
        (f'{{"limit": -{MAX_SAFE_INTEGER + 1}}}', f"integer out of range (must be within ±{MAX_SAFE_INTEGER})"),
        ('{"x": 1e999}', "number out of range (must be finite)"),
        ('{"x": -1e999}', "number out of range (must be finite)"),
        ('{"type":"req","id":"\\ud800","method":"health"}', "lone surrogate in a string (not valid UTF-8 text)"),
        ('{"params":{"a":["ok","\\udfff"]}}', "lone surrogate in a string (not valid UTF-8 text)"),
        ('{"params":{"\\udc00":1}}', "lone surrogate in a string (not valid UTF-8 text)"),
        ('"\\ud800"', "lone surrogate in a string (not valid UTF-8 text)"),
        ('{"x":"\\ude00\\ud83d"}', "lone surrogate in a string (not valid UTF-8 text)"),
    ],
    ids=lambda value: value[:40] if isinstance(value, str) else value,
)
def test_frames_beyond_the_limits_are_refused(text, reason):
    with pytest.raises(FrameRejected) as refused:
        decode_frame(text)
    assert refused.value.reason == reason
    assert refused.value.message == f"invalid request frame: {reason}"
    assert refused.value.code == "INVALID_REQUEST"
    assert refused.value.frame_id == "invalid"
    assert not refused.value.malformed


@pytest.mark.parametrize("text", ["{not json", "NaN", '{"x": Infinity}', '{"x": -Infinity}', ""])
def test_text_that_is_not_json_is_malformed(text):
    with pytest.raises(FrameRejected) as refused:
        decode_frame(text)
    assert refused.value.malformed
    assert refused.value.reason.startswith("malformed JSON (")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, json.loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)),
        (f'{{"n": {MAX_SAFE_INTEGER}, "m": -{MAX_SAFE_INTEGER}}}', {"n": MAX_SAFE_INTEGER, "m": -MAX_SAFE_INTEGER}),
        ('{"f": 1.5e300, "g": 0.1}', {"f": 1.5e300, "g": 0.1}),
        ('{"emoji": "\\ud83d\\ude00", "raw": "😀"}', {"emoji": "😀", "raw": "😀"}),
        ('{"nul": "a\\u0000b"}', {"nul": "a\x00b"}),  # valid JSON text; the schemas decide about NUL
        # Brackets inside strings count for the quick check but not for the depth.
        ('{"s": "' + "[" * 200 + '"}', {"s": "[" * 200}),
        ('{"id": "1234567890123456789012"}', {"id": "1234567890123456789012"}),
    ],
    ids=lambda value: str(value)[:30],
)
def test_frames_within_the_limits_decode_as_json(text, value):
    assert decode_frame(text) == value


def test_a_wide_frame_is_not_a_deep_one():
    text = json.dumps({"params": [[i, {"k": [i]}] for i in range(5000)]})
    assert len(decode_frame(text)["params"]) == 5000


INT_REASON = f"integer out of range (must be within ±{MAX_SAFE_INTEGER})"
SURROGATE_REASON = "lone surrogate in a string (not valid UTF-8 text)"
DEEP_REASON = f"nested deeper than {MAX_JSON_DEPTH} levels"


def _request(params: str, request_id: str = '"a6"') -> str:
    return '{"type":"req","id":' + request_id + ',"method":"health","params":' + params + "}"


@pytest.mark.parametrize(
    ("text", "reason", "frame_id"),
    [
        # The frame of issue 27: JavaScript's JSON.parse reads all of these, so the client waits for "a6".
        (_request('{"x":9007199254740993}'), INT_REASON, "a6"),
        (_request('{"x":-' + "4" * 4301 + "}"), INT_REASON, "a6"),
        (_request('{"x":1e999}'), "number out of range (must be finite)", "a6"),
        (_request('{"x":"\\ud800"}'), SURROGATE_REASON, "a6"),
        (_request('{"\\udc00":1}'), SURROGATE_REASON, "a6"),
        (_request("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH), DEEP_REASON, "a6"),
        # Nested past what the decoder parses at all: the id comes from the frame's head.
        (_request("[" * 20000 + "]" * 20000), DEEP_REASON, "a6"),
        # The id after the number: the whole frame is read again, numbers as 0.
        ('{"params":{"x":' + "9" * 17 + '},"type":"req","id":"late","method":"health"}', INT_REASON, "late"),
        # The id after a part too deep to parse: not in the head, so not read.
        ('{"params":' + "[" * 20000 + "]" * 20000 + ',"id":"late"}', DEEP_REASON, "invalid"),
        # Ids no answer could carry back, or none at all.
        (_request('{"x":"\\ud800"}', request_id='"\\ud800"'), SURROGATE_REASON, "invalid"),
        (_request('{"x":9007199254740993}', request_id="7"), INT_REASON, "invalid"),
        (_request('{"x":9007199254740993}', request_id='""'), INT_REASON, "invalid"),
        (_request('{"x":1e999}', request_id=json.dumps("i" * (MAX_REQUEST_ID_CHARS + 1))), None, "invalid"),
        ('[1, "\\ud800"]', SURROGATE_REASON, "invalid"),
        ('"\\ud800"', SURROGATE_REASON, "invalid"),
    ],
    ids=[
        "issue-27-integer",
        "4301-digits",
        "infinite",
        "surrogate-value",
        "surrogate-key",
        "depth-65",
        "depth-20000",
        "id-after-the-number",
        "id-after-the-depth",
        "surrogate-id",
        "number-id",
        "empty-id",
        "id-too-long",
        "array",
        "string",
    ],
)
def test_a_refused_frame_that_is_json_names_its_own_id(text, reason, frame_id):
    with pytest.raises(FrameRejected) as refused:
        decode_frame(text)
    assert refused.value.frame_id == frame_id
    assert not refused.value.malformed
    if reason is not None:
        assert refused.value.reason == reason


@pytest.mark.parametrize(
    "text",
    [
        _request('{"x":NaN}'),
        # Refused for the number first, but not JSON after all: its id is not read.
        _request('{"x":9007199254740993,"y":NaN}'),
        _request('{"x":9007199254740993') + ",",
        '{"type":"req","id":"a6"',
    ],
    ids=["nan", "number-then-nan", "number-then-garbage", "truncated"],
)
def test_text_that_is_not_json_is_answered_under_invalid(text):
    with pytest.raises(FrameRejected) as refused:
        decode_frame(text)
    assert refused.value.frame_id == "invalid"


@pytest.mark.parametrize(
    ("raw", "frame_id"),
    [
        ({"id": "r1"}, "r1"),
        ({"id": "a\x00b"}, "a\x00b"),  # NUL is text an answer can carry (escaped)
        ({"id": "i" * MAX_REQUEST_ID_CHARS}, "i" * MAX_REQUEST_ID_CHARS),
        ({"id": "i" * (MAX_REQUEST_ID_CHARS + 1)}, "invalid"),
        ({"id": "\udfff"}, "invalid"),
        ({"id": ""}, "invalid"),
        ({"id": None}, "invalid"),
        ({"id": ["r1"]}, "invalid"),
        ({}, "invalid"),
        (["r1"], "invalid"),
        ("r1", "invalid"),
    ],
)
def test_the_id_a_refusal_is_answered_under(raw, frame_id):
    assert request_id_of(raw) == frame_id


# --- the head of a frame ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "head"),
    [
        ('{"type":"req","id":"r1","method":"chat.send","params":{"a":1}}', FrameHead("r1", "chat.send", "req")),
        (' {\n "id" : "r\\u0031" ,\t"n": -1.5e3, "ok": true, "method":"health"}', FrameHead("r1", "health", None)),
        ('{"id":"r1","id":"r2","method":"health"}', FrameHead("r2", "health", None)),
        ('{"type":"cancel","id":"c1"}', FrameHead("c1", None, "cancel")),
        # Members after the first object or array are not read.
        ('{"params":{},"type":"req","id":"r1","method":"health"}', FrameHead("invalid", None, None)),
        ('{"type":"req","params":[1],"id":"r1"}', FrameHead("invalid", None, "req")),
        # A string that runs past the head, and whatever is not an object.
        ('{"id":"' + "i" * FRAME_HEAD_CHARS + '","method":"health"}', FrameHead("invalid", None, None)),
        ('{"pad":"' + "p" * FRAME_HEAD_CHARS + '","id":"r1"}', FrameHead("invalid", None, None)),
        ('["req","r1"]', FrameHead("invalid", None, None)),
        ("not json", FrameHead("invalid", None, None)),
        ('{"id":5,"method":7}', FrameHead("invalid", None, None)),
        ('{"id":"\\ud800","method":"health"}', FrameHead("invalid", "health", None)),
    ],
    ids=lambda value: str(value)[:40],
)
def test_the_head_of_a_frame_is_read_without_parsing_the_rest(text, head):
    assert read_frame_head(text) == head


def test_the_head_of_a_huge_frame_is_read_from_its_beginning_only():
    text = '{"type":"req","id":"big","method":"chat.send","params":{"message":"' + "x" * 10_000_000
    assert read_frame_head(text) == FrameHead("big", "chat.send", "req")


@pytest.mark.parametrize(
    ("text", "limit", "exceeds"),
    [
        ("a" * 10, 10, False),
        ("a" * 11, 10, True),
        ("é" * 5, 10, False),  # 10 bytes
        ("é" * 6, 10, True),
        ("😀" * 2, 8, False),
        ("😀" * 3, 8, True),
        ("\ud800" * 3, 9, False),  # 3 bytes each, as the frame's text would carry them
        ("\ud800" * 4, 9, True),
    ],
)
def test_sizes_are_counted_in_utf8_bytes(text, limit, exceeds):
    assert utf8_len_exceeds(text, limit) is exceeds


# --- encode_frame ---------------------------------------------------------------------------------


def test_frames_that_cannot_go_out_as_utf8_json_are_refused():
    assert encode_frame({"id": "é😀", "n": 1}) == '{"id":"é😀","n":1}'
    with pytest.raises(ValueError):
        encode_frame({"id": "\ud800"})
    with pytest.raises(ValueError):
        encode_frame({"x": float("nan")})
    with pytest.raises(TypeError):
        encode_frame({"x": object()})


# --- ClosedModel --------------------------------------------------------------------------------------


class Inner(ClosedModel):
    name: str = Field(min_length=1, max_length=10)
    big: int = Field(default=0, le=10**30)


class Sample(ClosedModel):
    text: str | None = None
    items: list[str] = []
    mapping: dict[str, bool] | None = None
    count: int = 0
    bounded: Annotated[int, Field(ge=1, le=1000)] = 1
    inner: Inner | None = None
    inners: list[Inner] = []
    pattern: str | None = Field(default=None, pattern=r"^[a-z]+$")
    opaque: Any = None
    message: Annotated[str, NulCheckedByService()] = ""
    ratio: float | None = None


def _error(model: type[ClosedModel], data: dict) -> str:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data)
    return format_validation_error(refused.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"text": "a\x00b"}, "at /text: must not contain NUL characters"),
        ({"text": "\ud800"}, "at /text: must not contain lone surrogates (not valid UTF-8 text)"),
        ({"items": ["ok", "b\x00"]}, "at /items/1: must not contain NUL characters"),
        ({"mapping": {"k\x00": True}}, "at /mapping/k\\u0000/[key]: must not contain NUL characters"),
        ({"inner": {"name": "\ud800"}}, "at /inner/name: must not contain lone surrogates (not valid UTF-8 text)"),
        ({"inners": [{"name": "a"}, {"name": "\x00"}]}, "at /inners/1/name: must not contain NUL characters"),
        ({"pattern": "\ud800"}, "at /pattern: must not contain lone surrogates (not valid UTF-8 text)"),
        ({"message": "\udfff"}, "at /message: must not contain lone surrogates (not valid UTF-8 text)"),
        ({"count": 2**53}, f"at /count: {TOO_BIG}"),
        ({"count": -(2**53)}, f"at /count: Input should be greater than or equal to -{MAX_SAFE_INTEGER}"),
        ({"count": int("9" * 401)}, f"at /count: {TOO_BIG}"),
        ({"count": 1e300}, "at /count: Unable to parse input string as an integer, exceeded maximum size"),
        ({"bounded": 5000}, "at /bounded: Input should be less than or equal to 1000"),
        ({"ratio": float("inf")}, "at /ratio: Input should be a finite number"),
        ({"unknown\x00": 1}, "at /unknown\\u0000: unexpected property"),
    ],
    ids=lambda value: str(value)[:40],
)
def test_closed_models_refuse_text_and_numbers_storage_cannot_take(data, message):
    assert _error(Sample, data) == message


def test_what_closed_models_keep():
    sample = Sample.model_validate(
        {
            "text": "é😀\ttab",
            "count": MAX_SAFE_INTEGER,
            "inner": {"name": "n", "big": 10**20},  # a field's own bound wins over the default
            "opaque": {"nul": "a\x00b"},  # opaque JSON: screened by the frame decoder, not here
            "message": "a\x00b",  # its service refuses NUL with OpenClaw's message
        }
    )
    assert sample.inner.big == 10**20
    assert sample.count == MAX_SAFE_INTEGER
    assert Sample.model_json_schema()["properties"]["count"]["maximum"] == MAX_SAFE_INTEGER


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        (
            SessionsListParams,
            {"offset": int("7" * 401)},
            f"at /offset: Input should be less than or equal to {MAX_SAFE_INTEGER}",
        ),
        (
            SessionsCreateParams,
            {"key": "\ud800\udc00"[::-1]},
            "at /key: must not contain lone surrogates (not valid UTF-8 text)",
        ),
        (SessionsCreateParams, {"label": "a\x00b"}, "at /label: must not contain NUL characters"),
        # A field named like pydantic's own schema key ``ref`` is text like any other.
        (
            SessionsCreateParams,
            {"repository": {"url": "https://example.org/r.git", "ref": "main\x00"}},
            "at /repository/ref: must not contain NUL characters",
        ),
        (AgentWaitParams, {"runId": "\x00"}, "at /runId: must not contain NUL characters"),
        (DeviceIdParams, {"deviceId": "dev\x00"}, "at /deviceId: must not contain NUL characters"),
        (TokenRevokeParams, {"deviceId": "d", "role": "operator\x00"}, "at /role: must not contain NUL characters"),
    ],
    ids=lambda value: getattr(value, "__name__", str(value)[:30]),
)
def test_the_apps_params_models_inherit_the_limits(model, data, message):
    assert _error(model, data) == message


def _unguarded(schema: Any, path: str = "") -> list[str]:
    """Paths of ``str`` schemas outside a text guard and ``int`` schemas without both bounds."""
    found: list[str] = []
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            found += _unguarded(item, f"{path}[{index}]")
        return found
    if not isinstance(schema, dict):
        return found
    kind = schema.get("type")
    if kind == "function-wrap" and schema["function"]["function"] in (protocol._guard_text, protocol._guard_unicode):
        return found
    if kind == "str":
        found.append(f"{path}: str")
    if kind == "int" and not (("le" in schema or "lt" in schema) and ("ge" in schema or "gt" in schema)):
        found.append(f"{path}: int")
    for key, value in schema.items():
        if key not in ("metadata", "serialization"):
            found += _unguarded(value, f"{path}.{key}")
    return found


def test_every_registered_method_validates_text_and_bounds_integers():
    assert {"health", "sessions.create", "chat.send", "node.invoke"} <= set(registry.methods)
    for name, spec in registry.methods.items():
        assert issubclass(spec.params, ClosedModel), name
        assert _unguarded(spec.params.__pydantic_core_schema__) == [], name


# --- connect: a closed, strict object ----------------------------------------------------------------

CLIENT = {"id": "cli", "version": "1", "platform": "linux", "mode": "cli"}
CONNECT = {"minProtocol": 3, "maxProtocol": 4, "client": CLIENT}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"minProtocol": "4"}, "at /minProtocol: Input should be a valid integer"),
        ({"maxProtocol": 2**64}, f"at /maxProtocol: {TOO_BIG}"),
        ({"maxProtocol": True}, "at /maxProtocol: Input should be a valid integer"),
        ({"minProtocol": 0}, "at /minProtocol: Input should be greater than or equal to 1"),
        ({"role": ""}, "at /role: String should have at least 1 character"),
        ({"client": {**CONNECT["client"], "version": "\x00"}}, "at /client/version: must not contain NUL characters"),
        (
            {"client": {**CONNECT["client"], "version": ""}},
            "at /client/version: String should have at least 1 character",
        ),
        (
            {"client": {**CONNECT["client"], "displayName": "x" * 201}},
            "at /client/displayName: String should have at most 200 characters",
        ),
        ({"client": {**CONNECT["client"], "extra": 1}}, "at /client/extra: unexpected property"),
        ({"permissions": {"camera": "yes"}}, "at /permissions/camera: Input should be a valid boolean"),
        ({"permissions": {"camera": 1}}, "at /permissions/camera: Input should be a valid boolean"),
        ({"permissions": {"": True}}, "at /permissions//[key]: String should have at least 1 character"),
        ({"permissions": ["camera"]}, "at /permissions: Input should be a valid dictionary"),
        ({"caps": [""]}, "at /caps/0: String should have at least 1 character"),
        ({"scopes": ["operator.read", 1]}, "at /scopes/1: Input should be a valid string"),
        ({"commands": "system.run"}, "at /commands: Input should be a valid list"),
        ({"auth": {"token": 123}}, "at /auth/token: Input should be a valid string"),
        ({"auth": {"token": "a\x00"}}, "at /auth/token: must not contain NUL characters"),
        (
            {"device": {"id": "d", "publicKey": "k", "signature": "s", "signedAt": "1", "nonce": "n"}},
            "at /device/signedAt: Input should be a valid integer",
        ),
    ],
    ids=lambda value: str(value)[:50],
)
def test_connect_params_are_strict(patch, message):
    assert _error(ConnectParams, {**CONNECT, **patch}) == message


def test_connect_params_that_openclaw_clients_send_pass():
    params = ConnectParams.model_validate(
        {
            **CONNECT,
            "client": {
                "id": "CLI",
                "version": "2026.9.6",
                "platform": "linux",
                "deviceFamily": "Linux",
                "mode": "cli",
                "instanceId": "7f959190-1d97-445c-94da-073d74fbfa97",
            },
            "caps": [],
            "auth": {"token": "tok"},
            "role": "operator",
            "scopes": ["operator.read"],
            "permissions": {"screenRecording": False, "location": True},
        }
    )
    assert params.client.id == "cli"
    assert params.permissions == {"screenRecording": False, "location": True}


# --- the JSON API validates with the same classes ------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("get", "/api/sessions/?offset=" + "7" * 401, None, "/offset"),
        ("get", "/api/sessions/?search=a%00b", None, "/search"),
        ("post", "/api/sessions/", '{"key": "\\udc00\\ud800"}', "/key"),
        ("post", "/api/sessions/", '{"key": "k", "label": "a\\u0000b"}', "/label"),
    ],
    ids=["offset-401-digits", "search-nul", "key-surrogates", "label-nul"],
)
def test_the_json_api_refuses_the_same_input(api_token, method, path, body, field):
    client = Client(headers={"Authorization": f"Bearer {api_token}"})
    if method == "get":
        response = client.get(path)
    else:
        response = client.post(path, body, content_type="application/json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and field in error["message"]
    assert not Session.objects.exists()
