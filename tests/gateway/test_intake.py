"""A frame's way in after the handshake (gateway/intake.py): the limits, checked before parsing where the head
names the method and again after it, the id every refusal is answered under, and the decode pool."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from gateway.exceptions import FrameRejected
from gateway.intake import OFF_LOOP_FRAME_CHARS, is_big, off_loop, take_frame
from gateway.protocol import DEFAULT_MAX_FRAME_BYTES, CancelFrame, RequestFrame
from gateway.registry import registry
from sessions_app.schemas import MAX_MESSAGE_CHARS, MESSAGE_FRAME_BYTES

MAX_PAYLOAD = 25 * 1024 * 1024


def _take(text: str, max_payload: int = MAX_PAYLOAD) -> RequestFrame | CancelFrame:
    return asyncio.run(take_frame(text, max_payload=max_payload))


def _refusal(text: str, max_payload: int = MAX_PAYLOAD) -> FrameRejected:
    with pytest.raises(FrameRejected) as refused:
        _take(text, max_payload)
    return refused.value


def _head(method: str, request_id: str = "r1") -> str:
    return '{"type":"req","id":"' + request_id + '","method":"' + method + '","params":'


def _unterminated(method: str, size: int) -> str:
    """A frame of ``size`` characters that is not JSON: refusing it for its size shows it was never parsed."""
    head = _head(method) + '{"message":"'
    return head + "x" * (size - len(head))


def test_the_methods_that_carry_bulk_declare_their_limits():
    assert registry.frame_limit("chat.send") == MESSAGE_FRAME_BYTES
    assert registry.frame_limit("sessions.create") == MESSAGE_FRAME_BYTES
    for method in ("node.invoke", "node.invoke.result", "node.event", "exec.approvals.set", "exec.approvals.node.set"):
        assert registry.frame_limit(method) is None, method  # maxPayload
    assert registry.frame_limit("health") == DEFAULT_MAX_FRAME_BYTES
    assert registry.frame_limit("no.such.method") == DEFAULT_MAX_FRAME_BYTES
    assert registry.frame_limit(None) == DEFAULT_MAX_FRAME_BYTES
    # A message at its limit fits in its method's frame, at any UTF-8 width.
    assert MESSAGE_FRAME_BYTES > 4 * MAX_MESSAGE_CHARS


@pytest.mark.parametrize(
    ("method", "size", "message"),
    [
        ("chat.send", MESSAGE_FRAME_BYTES + 1, f"frame exceeds the limit of chat.send ({MESSAGE_FRAME_BYTES} bytes)"),
        ("health", DEFAULT_MAX_FRAME_BYTES + 1, f"frame exceeds the limit of health ({DEFAULT_MAX_FRAME_BYTES} bytes)"),
        (
            "no.such.method",
            DEFAULT_MAX_FRAME_BYTES + 1,
            f"frame exceeds the limit of a request frame ({DEFAULT_MAX_FRAME_BYTES} bytes)",
        ),
        ("node.invoke.result", MAX_PAYLOAD + 1, f"frame exceeds maxPayload ({MAX_PAYLOAD} bytes)"),
    ],
)
def test_a_frame_over_its_limit_is_refused_before_it_is_parsed_under_its_id(method, size, message):
    refused = _refusal(_unterminated(method, size))
    assert refused.message == f"invalid request frame: {message}"
    assert refused.code == "INVALID_REQUEST"
    assert refused.frame_id == "r1"


def test_the_limit_counts_utf8_bytes():
    head = _head("health") + '{"pad":"'
    pad = "é" * ((DEFAULT_MAX_FRAME_BYTES - len(head)) // 2 + 1)  # under the limit in characters, over it in bytes
    refused = _refusal(head + pad + '"}}')
    assert refused.reason == f"frame exceeds the limit of health ({DEFAULT_MAX_FRAME_BYTES} bytes)"


def test_a_configured_max_payload_below_a_method_limit_applies_first():
    refused = _refusal(_unterminated("health", 70_000), max_payload=65_536)
    assert (refused.reason, refused.frame_id) == ("frame exceeds maxPayload (65536 bytes)", "r1")


def test_a_frame_whose_head_does_not_name_its_method_is_checked_after_parsing():
    pad = "p" * DEFAULT_MAX_FRAME_BYTES
    text = json.dumps({"params": {"pad": pad}, "type": "req", "id": "late", "method": "sessions.list"})
    refused = _refusal(text)
    assert refused.reason == f"frame exceeds the limit of sessions.list ({DEFAULT_MAX_FRAME_BYTES} bytes)"
    assert refused.frame_id == "late"


def test_a_frame_whose_head_names_another_method_is_checked_with_the_one_it_really_calls():
    # The head says chat.send (4 MiB); the frame, parsed, calls health (1 MiB): refused by health's limit.
    text = json.dumps({"type": "req", "id": "r1", "method": "chat.send", "params": {"pad": "p" * 2_000_000}})
    text = text[:-1] + ',"method":"health"}'
    refused = _refusal(text)
    assert refused.reason == f"frame exceeds the limit of health ({DEFAULT_MAX_FRAME_BYTES} bytes)"


def test_an_oversized_cancel_frame_is_refused():
    text = json.dumps({"type": "cancel", "id": "c1", "pad": "p" * DEFAULT_MAX_FRAME_BYTES})
    refused = _refusal(text)
    assert (refused.reason, refused.frame_id) == (
        f"frame exceeds the limit of a request frame ({DEFAULT_MAX_FRAME_BYTES} bytes)",
        "c1",
    )


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("chat.send", {"sessionKey": "agent:main:main", "message": "m" * MAX_MESSAGE_CHARS, "idempotencyKey": "k"}),
        ("node.invoke.result", {"id": "i", "nodeId": "n", "ok": True, "payload": {"blob": "b" * 3_000_000}}),
    ],
)
def test_big_frames_within_their_method_limit_are_taken(method, params):
    text = json.dumps({"type": "req", "id": "big", "method": method, "params": params})
    assert is_big(text)
    frame = _take(text)
    assert isinstance(frame, RequestFrame)
    assert (frame.id, frame.method, frame.params) == ("big", method, params)


def test_small_frames_are_taken_as_they_are():
    assert not is_big('{"type":"req","id":"s","method":"health"}')
    frame = _take('{"type":"cancel","id":"s"}')
    assert isinstance(frame, CancelFrame) and frame.id == "s"


@pytest.mark.parametrize(
    ("text", "frame_id", "reason"),
    [
        ('{"type":"req","id":"r9","method":"health","params":{"x":9007199254740993}}', "r9", None),
        ('{"type":"req","id":"r9","method":""}', "r9", "at /method: String should have at least 1 character"),
        ("[1]", "invalid", "must be an object, got list"),
    ],
)
def test_every_refusal_names_the_id_to_answer_under(text, frame_id, reason):
    refused = _refusal(text)
    assert refused.frame_id == frame_id
    if reason is not None:
        assert refused.reason == reason


def test_a_big_frame_refused_by_the_decoder_still_names_its_id():
    text = '{"type":"req","id":"r9","method":"health","params":{"pad":"' + "p" * OFF_LOOP_FRAME_CHARS + '","x":1e999}}'
    refused = _refusal(text)
    assert (refused.reason, refused.frame_id) == ("number out of range (must be finite)", "r9")


def test_work_off_the_loop_runs_in_the_decode_pool():
    async def where() -> tuple[str, str]:
        return threading.current_thread().name, await off_loop(lambda: threading.current_thread().name)

    loop_thread, pool_thread = asyncio.run(where())
    assert pool_thread.startswith("gateway-decode")
    assert pool_thread != loop_thread
