"""Property-based fuzzing of a live gateway (Hypothesis): every registered method's params, and raw frames.

Whatever a client sends after the handshake, the gateway answers it — a success, or a protocol
error that is not an internal one — the connection stays usable, and a refused request writes
nothing. Before the handshake, a frame that is not a valid ``connect`` ends the connection only
with a close code the reference prescribes (1008, 1002, 1009), with a reason.

``FUZZ_EXAMPLES`` scales the number of generated cases (default 1,000: 1,000 method calls, 800 raw
frames and 200 first frames, 2,000 per profile in CI, the same cases every run); ``FUZZ_RANDOM=1``
draws new ones (``bench/fuzz_bench.py`` runs longer, unseeded).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest
import websockets
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.registry import registry
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))
CI_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") != "1",
    suppress_health_check=list(HealthCheck),
    database=None,
)
ERROR_CODES = {"INVALID_REQUEST", "UNAVAILABLE", "NOT_PAIRED", "FORBIDDEN", "AGENT_TIMEOUT"}
PREAUTH_CLOSE_CODES = {1008, 1002, 1009}
COUNTED_TABLES = (
    "sessions_app_session",
    "sessions_app_run",
    "sessions_app_transcriptevent",
    "gateway_paireddevice",
    "gateway_devicetoken",
    "gateway_devicepairingrequest",
    "gateway_auditlog",
)


class LoopThread:
    """One event loop in a thread, so Hypothesis's synchronous examples can drive async clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def loop():
    runner = LoopThread()
    yield runner
    runner.stop()


def row_counts() -> tuple[int, ...]:
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(f"SELECT COUNT(*) FROM {table}" for table in COUNTED_TABLES))
        return tuple(row[0] for row in cursor.fetchall())


# --- values -------------------------------------------------------------------------------------

ODD_TEXT = st.sampled_from(
    ["", " ", "\x00", "a\x00b", "\ud800", "x\udfffy", "\u202e", "𝄞", "-q", "--no-checkout", "../..", "%s", "' OR 1=1"]
)
TEXT = st.one_of(st.text(max_size=40), ODD_TEXT, st.text(min_size=200, max_size=400))
NUMBERS = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, -1, 2**53 - 1, 2**53, 10**400]),
    st.floats(allow_nan=False, allow_infinity=False),
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.one_of(st.text(max_size=10), ODD_TEXT), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def method_params(draw) -> tuple[str, Any]:
    """A registered method and params shaped like its own (its field names) or like anything at all."""
    name = draw(st.sampled_from(sorted(registry.methods)))
    fields = sorted(registry.methods[name].params.model_fields)
    if fields and draw(st.booleans()):
        chosen = draw(st.lists(st.sampled_from(fields), unique=True, max_size=len(fields)))
        params = {field: draw(JSON) for field in chosen}
        if draw(st.booleans()):
            params[draw(st.text(min_size=1, max_size=8))] = draw(JSON)  # an unknown property
    else:
        params = draw(JSON)
    if isinstance(params, dict) and "timeoutMs" in fields:
        # A wait as long as the caller asks (agent.wait waits 30 s by default): keep it short here.
        timeout = params.get("timeoutMs")
        if timeout is None or (isinstance(timeout, int | float) and not isinstance(timeout, bool)):
            params["timeoutMs"] = min(abs(int(timeout or 0)) % 1000, 300)
    return name, params


RAW_FRAMES = st.one_of(
    st.text(max_size=200),
    JSON.map(lambda value: json.dumps(value)),
    st.sampled_from(
        [
            "[" * 20000 + "]" * 20000,
            '{"type":"req","id":"x","method":"health","params":' + "4" * 5000 + "}",
            '{"type":"req","id":"\\ud800","method":"health"}',
            '{"type":"req","id":"x","method":"sessions.list","params":{"limit":1e999}}',
            '{"type":"req","id":"x","method":"health","params":{"a":NaN}}',
            '{"type":"cancel","id":"nope"}',
            "null",
            '"just a string"',
        ]
    ),
    JSON.map(lambda params: json.dumps({"type": "req", "id": str(uuid.uuid4()), "method": "status", "params": params})),
)


# --- the properties ---------------------------------------------------------------------------------


async def _open(gateway):
    client = operator(gateway)
    await client.connect()
    client._reader.cancel()  # this test reads the frames itself
    return client


async def _exchange(client, frame: str, request_id: str | None = None) -> list[dict]:
    """Send ``frame`` and then a ``health`` ping; return the answers other than the ping's.

    Requests run concurrently, so answers may come in any order: wait for the ping's answer (the
    connection still works) and, when ``request_id`` is given, for that request's (or a frame
    refusal's). Some frames get no answer at all (a ``cancel``).
    """
    ping = f"ping-{uuid.uuid4()}"
    own_ids = {"invalid", request_id or _frame_id(frame)}
    await client.send_raw(frame)
    await client.send_raw(json.dumps({"type": "req", "id": ping, "method": "health"}))
    answers: list[dict] = []
    pinged = False
    while not (pinged and (request_id is None or answers)):
        reply = json.loads(await asyncio.wait_for(client._ws.recv(), 30))
        if reply.get("type") != "res":
            continue  # events of the operator's own turns, ticks, presence
        if reply.get("id") == ping:
            assert reply["ok"], reply
            pinged = True
        elif reply.get("id") in own_ids:
            answers.append(reply)
        else:
            _assert_a_protocol_answer(reply)  # a late answer to an earlier frame (it came after its ping)
    return answers


def _frame_id(frame: str) -> str | None:
    try:
        raw = json.loads(frame)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        return None
    frame_id = raw.get("id") if isinstance(raw, dict) else None
    return frame_id if isinstance(frame_id, str) else None


def _assert_a_protocol_answer(reply: dict) -> None:
    if reply.get("ok"):
        return
    error = reply["error"]
    assert error["code"] in ERROR_CODES, error
    assert not error["message"].startswith("internal error"), error


def test_every_method_answers_any_params_with_success_or_a_protocol_error(gateway, loop):
    client = loop.run(_open(gateway))
    methods_called: set[str] = set()
    cases = 0

    def call(name: str, params: Any) -> None:
        methods_called.add(name)
        request_id = str(uuid.uuid4())
        before = row_counts()
        frame = json.dumps({"type": "req", "id": request_id, "method": name, "params": params})
        answers = loop.run(_exchange(client, frame, request_id))
        # Refusals by the frame decoder (depth, number size, text) too come under the request's own id.
        assert len(answers) == 1 and answers[0]["id"] == request_id, answers
        _assert_a_protocol_answer(answers[0])
        if not answers[0].get("ok"):
            assert row_counts() == before, (name, params, answers[0])

    @CI_SETTINGS
    @given(case=method_params())
    def property_(case: tuple[str, Any]) -> None:
        nonlocal cases
        cases += 1
        call(*case)

    try:
        property_()
        # Hypothesis favours some draws over others: a method it happened not to draw is still called, with
        # empty params and with params that are not an object, so every method is held to the same answers.
        for name in sorted(set(registry.methods) - methods_called):
            call(name, {})
            call(name, [None])
    finally:
        loop.run(client.close())
    assert cases >= EXAMPLES
    assert methods_called == set(registry.methods)


def test_raw_frames_after_the_handshake_are_answered_and_the_connection_stays(gateway, loop):
    client = loop.run(_open(gateway))
    cases = 0

    @settings(CI_SETTINGS, max_examples=EXAMPLES * 4 // 5)
    @given(frame=RAW_FRAMES)
    def property_(frame: str) -> None:
        nonlocal cases
        cases += 1
        before = row_counts()
        answers = loop.run(_exchange(client, frame))
        assert len(answers) <= 1, answers
        for answer in answers:
            _assert_a_protocol_answer(answer)
        if not any(answer.get("ok") for answer in answers):
            assert row_counts() == before

    try:
        property_()
    finally:
        loop.run(client.close())
    assert cases >= EXAMPLES * 4 // 5


@settings(CI_SETTINGS, max_examples=max(50, EXAMPLES // 5))
@given(frame=RAW_FRAMES)
def test_a_bad_first_frame_ends_the_connection_only_as_the_reference_prescribes(gateway, frame):
    async def first_frame() -> tuple[int | None, str]:
        async with websockets.connect(gateway.url, max_size=None) as ws:
            json.loads(await ws.recv())  # connect.challenge
            await ws.send(frame)
            try:
                while True:
                    reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    assert reply.get("type") == "res" and reply.get("ok") is False, reply
                    assert not reply["error"]["message"].startswith("internal error"), reply
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None, closed.rcvd.reason if closed.rcvd else ""

    code, reason = asyncio.run(first_frame())
    assert code in PREAUTH_CLOSE_CODES, (code, reason, frame[:200])
    assert reason
