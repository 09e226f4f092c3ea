"""A node's result payload: ``payloadJSON`` decoded (off the event loop when big), text that is not JSON kept as
text, and a plain ``payload`` passed on."""

from __future__ import annotations

import asyncio
import json

from gateway import invoke
from gateway.intake import OFF_LOOP_FRAME_CHARS

BIG = json.dumps({"rows": ["x" * 100] * (OFF_LOOP_FRAME_CHARS // 100)})


def test_a_big_payload_json_is_decoded_as_a_small_one_is():
    assert asyncio.run(invoke._result_payload({"payloadJSON": BIG})) == (json.loads(BIG), BIG)
    assert asyncio.run(invoke._result_payload({"payloadJSON": '{"a": 1}'})) == ({"a": 1}, '{"a": 1}')


def test_payload_json_that_is_not_json_is_kept_as_text_big_or_small():
    broken = BIG[:-1]
    assert asyncio.run(invoke._result_payload({"payloadJSON": broken})) == ({"payloadJSON": broken}, broken)
    assert asyncio.run(invoke._result_payload({"payloadJSON": "{"})) == ({"payloadJSON": "{"}, "{")


def test_a_plain_payload_is_passed_on():
    assert asyncio.run(invoke._result_payload({"payload": [1, 2]})) == ([1, 2], None)
