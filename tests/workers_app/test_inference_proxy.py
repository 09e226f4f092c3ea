"""The inference proxy of node turns (docs/node-worker-protocol.md, ``worker.launch.v1``):
``POST /api/workers/inference/chat/completions`` with the run's inference token.

A worker child on a node asks the model only through the gateway, so the gateway's provider key
stays here. The token is good only while its run is running on its session's active placement on
the token's node; anything else is refused before a model is called. The reply is server-sent
OpenAI chunks, an ``{"error": {kind, message}}`` event on failure or abort, then ``[DONE]``.

The route is a plain ASGI app beside Django (``openclaw_site.asgi.application`` sends it there): the
tests drive that application with ASGI messages inside ``async_to_sync`` from the test thread.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.core import signing
from prometheus_client import REGISTRY

from openclaw_client.agent.openai_stream import StreamState, ToolCall
from openclaw_client.worker import Turn, TurnJob
from openclaw_site.asgi import application
from sessions_app.models import Run, RunStatus, Session
from sessions_app.services import runs
from sessions_app.services.runs import TurnOutcome
from sessions_app.services.sessions import SessionSpec, session_create
from tests.openclaw_client.test_worker import inference_server
from tests.support.mock_openai import error, partial_then_drop
from workers_app import inference
from workers_app.inference import INFERENCE_PATH, TOKEN_SALT, inference_token
from workers_app.models import Placement, PlacementState, WorkerEnvironment
from workers_app.nodes.device_provider import device_profile
from workers_app.services import placements as store

# Transactional: the route reads through database_sync_to_async, which closes the thread's connection
# around each read (CONN_MAX_AGE=0 in tests), as it would end a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)

NODE = "a1" * 32
OTHER_NODE = "b2" * 32
ENVIRONMENT = "worker:inference"
API_KEY = "sk-inference-proxy-secret-0123456789abcdef"
NOT_VALID = "inference token is not valid for a running turn on this node"
HINT = "send 'Authorization: Bearer <the inference token of the turn>'"
GOOD_BODY = {"model": "anything", "messages": [{"role": "user", "content": "Reply exactly: hello there world"}]}


# --- state -------------------------------------------------------------------------------------


def placed_session(node_id: str = NODE, *, key: str = "agent:main:inference") -> Session:
    """A session whose placement is active on a device environment of ``node_id`` (a finished dispatch)."""
    session = session_create(spec=SessionSpec(key=key, agent_id="main"))
    WorkerEnvironment.objects.create(
        environment_id=ENVIRONMENT,
        provider_id="device",
        profile_id=f"device:{node_id}",
        profile_snapshot=device_profile(node_id).snapshot(),
        state="attached",
        lease_id=f"device:{node_id}:op",
        node_device_id=node_id,
        owner_epoch=1,
        attached_session_ids=[session.session_id],
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )
    placement = store.placement_start_dispatch(session=session)
    for from_state, to_state, patch in [
        ("requested", "provisioning", {"environment_id": ENVIRONMENT}),
        ("provisioning", "syncing", {"worker_bundle_hash": "a" * 64}),
        ("syncing", "starting", {"workspace_base_manifest_ref": "sha256:" + "b" * 64, "remote_workspace_dir": "/w"}),
        ("starting", "active", {"active_owner_epoch": 1}),
    ]:
        placement = store.placement_transition(
            session=session,
            from_state=from_state,
            to_state=to_state,
            expected_generation=placement.generation,
            patch=patch,
        )
    return session


def submitted(session: Session, message: str = "Reply exactly: hello there world") -> Run:
    """A queued turn of ``session`` that nobody else claims: the tests (and the modules importing this helper) are
    the worker-turn task; the runner the submit would hand it to (a gateway thread when embedded) would race them."""
    with mock.patch.object(runs, "dispatch_turn_on_commit", lambda run_id, session: None):
        return runs.run_submit(session_key=session.key, message=message, idempotency_key=str(uuid.uuid4())).run


def running(session: Session, message: str = "Reply exactly: hello there world") -> Run:
    """A turn of ``session`` claimed the way the worker-turn task claims it: queued → running."""
    claim = runs.run_claim(run_id=submitted(session, message).run_id, executor="test")
    assert claim is not None and claim.run.status == RunStatus.RUNNING
    return claim.run


def minted_seconds_ago(seconds: int, run_id: str, node_id: str = NODE) -> str:
    """An inference token as it was minted ``seconds`` ago (the signer's clock moved back)."""
    real = signing.TimestampSigner.timestamp
    try:
        signing.TimestampSigner.timestamp = lambda self: signing.b62_encode(int(time.time()) - seconds)
        return inference_token(run_id, node_id)
    finally:
        signing.TimestampSigner.timestamp = real


# --- HTTP --------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The ``data:`` payloads of the event stream, decoded (``[DONE]`` stays a string)."""
        frames = self.text.split("\n\n")
        assert frames[-1] == "", f"the stream must end with a complete event: {self.text[-200:]!r}"
        decoded = []
        for frame in frames[:-1]:
            assert frame.startswith("data: ") and "\n" not in frame, frame
            data = frame.removeprefix("data: ")
            decoded.append(data if data == "[DONE]" else json.loads(data))
        return decoded


class Exchange:
    """One request to the gateway's ASGI application: what it sent back, and a way to hang up."""

    def __init__(self, token: str | None, body: bytes, *, method: str = "POST", chunks: int = 1):
        headers = [(b"content-type", b"application/json")]
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": INFERENCE_PATH,
            "raw_path": INFERENCE_PATH.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 18789),
        }
        size = max(1, -(-len(body) // chunks))
        pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        self.incoming = [
            {"type": "http.request", "body": piece, "more_body": n < len(pieces) - 1} for n, piece in enumerate(pieces)
        ]
        self.sent: list[dict[str, Any]] = []
        self.hung_up = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.incoming:
            return self.incoming.pop(0)
        await self.hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def run(self) -> Answer:
        await application(self.scope, self.receive, self.send)
        start = self.sent[0]
        headers = {name.decode().title(): value.decode() for name, value in start["headers"]}
        body = b"".join(message.get("body", b"") for message in self.sent[1:])
        assert self.sent[-1]["type"] == "http.response.body" and not self.sent[-1].get("more_body")
        return Answer(start["status"], headers, body)


def _post(token: str | None, body: Any, *, raw: bytes | None = None, **options: Any) -> Exchange:
    return Exchange(token, raw if raw is not None else json.dumps(body).encode(), **options)


def post(token: str | None, body: Any = None, *, raw: bytes | None = None, **options: Any) -> Answer:
    """The whole answer to one request (the stream read to its end)."""
    return async_to_sync(_post(token, body, raw=raw, **options).run)()


def content_of(events: list[Any]) -> str:
    return "".join(
        event["choices"][0]["delta"].get("content", "")
        for event in events
        if isinstance(event, dict) and "choices" in event
    )


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def turns_stay_queued_until_a_test_claims_them(monkeypatch):
    """Committed submits would start the turn runner; here each test claims its runs itself."""
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


@pytest.fixture
def echo_model(settings):
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "echo", "BASE_URL": "", "MODEL": "echo"}


@pytest.fixture
def mock_model(settings, mock_openai):
    """The gateway's provider is the in-process mock OpenAI server, with a key the node must never see."""
    settings.OPENCLAW_MODEL = {
        **settings.OPENCLAW_MODEL,
        "PROVIDER": "openai",
        "BASE_URL": mock_openai.base_url,
        "API_KEY": API_KEY,
        "MODEL": "mock-model",
        "CONNECT_TIMEOUT_S": 5,
        "READ_TIMEOUT_S": 10,
        "TOTAL_TIMEOUT_S": 30,
    }
    return mock_openai


# --- a running turn ----------------------------------------------------------------------------


def test_a_running_turn_streams_the_models_reply_as_openai_chunks_then_done(echo_model):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), GOOD_BODY)

    assert answer.status == 200
    assert answer.headers["Content-Type"] == "text/event-stream"
    assert answer.headers["Cache-Control"] == "no-cache"
    events = answer.events()
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    assert content_of(chunks) == "hello there world"
    assert len({chunk["id"] for chunk in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(chunk["object"] == "chat.completion.chunk" and chunk["model"] == "echo" for chunk in chunks)
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["usage"] == {"input": 5, "output": 3, "totalTokens": 8}


def test_the_model_call_made_for_the_worker_is_timed(echo_model):
    run = running(placed_session())
    before = REGISTRY.get_sample_value("openclaw_model_call_seconds_count", {"provider": "echo"}) or 0.0

    assert post(inference_token(run.run_id, NODE), GOOD_BODY).status == 200

    assert REGISTRY.get_sample_value("openclaw_model_call_seconds_count", {"provider": "echo"}) == before + 1


def test_the_provider_gets_the_workers_messages_with_the_gateways_model_and_key(mock_model):
    """The worker names the history; the gateway names the model (the session's) and holds the key."""
    run = running(placed_session())
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Reply exactly: from the mock"},
    ]

    answer = post(inference_token(run.run_id, NODE), {"model": "the-worker-wants-this", "messages": messages})

    events = answer.events()
    assert answer.status == 200 and events[-1] == "[DONE]"
    assert content_of(events[:-1]) == "from the mock"
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-2]["model"] == "mock-model"
    [sent] = mock_model.requests
    assert (sent["model"], sent["messages"], sent["stream"]) == ("mock-model", messages, True)
    assert mock_model.request_headers[0]["authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in answer.text


# --- who may ask -------------------------------------------------------------------------------


def _unauthorized(message: str, code: str) -> dict:
    return {"error": {"code": "INVALID_REQUEST", "message": message, "details": {"code": code, "hint": HINT}}}


REFUSED = _unauthorized("inference token refused", "AUTH_TOKEN_MISMATCH")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no Authorization header", _unauthorized("inference token required", "AUTH_TOKEN_MISSING")),
        ("garbage", REFUSED),
        ("tampered signature", REFUSED),
        ("signed with another salt", REFUSED),
        ("no node in the grant", REFUSED),
        ("a run id that is not a string", REFUSED),
        ("expired", REFUSED),
    ],
)
def test_a_missing_forged_or_expired_token_is_401_and_calls_no_model(mock_model, case, expected):
    run = running(placed_session())
    good = inference_token(run.run_id, NODE)
    token = {
        "no Authorization header": None,
        "garbage": "garbage",
        "tampered signature": good[:-1] + ("A" if good[-1] != "A" else "B"),
        "signed with another salt": signing.dumps({"r": run.run_id, "n": NODE}, salt="another.salt", compress=True),
        "no node in the grant": signing.dumps({"r": run.run_id}, salt=TOKEN_SALT, compress=True),
        "a run id that is not a string": signing.dumps({"r": 1, "n": NODE}, salt=TOKEN_SALT, compress=True),
        "expired": minted_seconds_ago(settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"] + 70, run.run_id),
    }[case]

    answer = post(token, GOOD_BODY)

    assert (answer.status, answer.json()) == (401, expected)
    assert answer.headers["Content-Type"] == "application/json"
    assert mock_model.requests == []


def test_a_token_lives_for_the_turns_time_limit_plus_a_minute(echo_model, settings):
    """A turn may run for ``OPENCLAW_TURN_TIMEOUT_S`` (its task's soft limit), and its worker asks with its token
    until it ends: the token lives that long and a minute (margins: the signer's timestamp has whole seconds)."""
    run = running(placed_session())
    limit = settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"]

    assert post(minted_seconds_ago(limit + 50, run.run_id), GOOD_BODY).status == 200
    assert post(minted_seconds_ago(limit + 70, run.run_id), GOOD_BODY).json() == REFUSED

    settings.OPENCLAW_AGENT = {**settings.OPENCLAW_AGENT, "TURN_TIMEOUT_S": 10}
    assert post(minted_seconds_ago(60, run.run_id), GOOD_BODY).status == 200
    assert post(minted_seconds_ago(80, run.run_id), GOOD_BODY).json() == REFUSED


def _finish(run: Run) -> None:
    finished = runs.run_finish(run_id=run.run_id, outcome=TurnOutcome(status=RunStatus.OK, text="done"))
    assert finished is not None and finished.status == RunStatus.OK


def _drain(session: Session) -> None:
    placement = Placement.objects.get(pk=session.pk)
    store.placement_transition(
        session=session,
        from_state=PlacementState.ACTIVE,
        to_state=PlacementState.DRAINING,
        expected_generation=placement.generation,
    )


@pytest.mark.parametrize(
    "case",
    [
        "the run is still queued",
        "the run has finished",
        "no such run",
        "the token was minted for another node",
        "the placement is draining",
        "the environment is on another node",
        "the session was never placed",
    ],
)
def test_a_token_outside_a_running_turn_on_its_node_is_409_and_calls_no_model(mock_model, case):
    if case == "the session was never placed":
        session = session_create(spec=SessionSpec(key="agent:main:gateway-only", agent_id="main"))
    else:
        session = placed_session(OTHER_NODE if case == "the environment is on another node" else NODE)
    if case == "the run is still queued":
        run_id = submitted(session).run_id
    else:
        run_id = running(session).run_id
    if case == "the run has finished":
        _finish(Run.objects.get(pk=run_id))
    if case == "the placement is draining":
        _drain(session)
    token = inference_token(
        "run-that-never-was" if case == "no such run" else run_id,
        OTHER_NODE if case == "the token was minted for another node" else NODE,
    )

    answer = post(token, GOOD_BODY)

    assert (answer.status, answer.json()) == (409, {"error": {"code": "INVALID_REQUEST", "message": NOT_VALID}})
    assert mock_model.requests == []


# --- what may be asked -------------------------------------------------------------------------


def _invalid(path: str, message: str) -> dict:
    return {
        "error": {
            "code": "INVALID_REQUEST",
            "message": f"invalid request: at {path} (body): {message}",
            "details": {"errors": [{"in": "body", "path": path, "message": message}]},
        }
    }


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {"messages": []},
            _invalid("/messages", "List should have at least 1 item after validation, not 0"),
            id="no messages",
        ),
        pytest.param({}, _invalid("/messages", "must have required property"), id="messages missing"),
        pytest.param(
            {"messages": [{"role": "developer", "content": "x"}]},
            _invalid("/messages/0/role", "Input should be 'system', 'user', 'assistant' or 'tool'"),
            id="a role outside system, user, assistant, tool",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": 7}]},
            _invalid("/messages/0/content", "Input should be a valid string"),
            id="content not a string",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "x" * 1_000_001}]},
            _invalid("/messages/0/content", "String should have at most 1000000 characters"),
            id="content over a million characters",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": ""}] * 10_001},
            _invalid("/messages", "List should have at most 10000 items after validation, not 10001"),
            id="more than 10000 messages",
        ),
        pytest.param(
            {"model": "m" * 201, "messages": [{"role": "user", "content": "x"}]},
            _invalid("/model", "String should have at most 200 characters"),
            id="model name over 200 characters",
        ),
    ],
)
def test_a_body_outside_the_schema_is_400_and_calls_no_model(mock_model, body, expected):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), body)

    assert (answer.status, answer.json()) == (400, expected)
    assert mock_model.requests == []


def test_a_body_that_is_not_json_is_400(mock_model):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), raw=b"{not json")

    assert (answer.status, answer.json()) == (
        400,
        {"error": {"code": "INVALID_REQUEST", "message": "invalid request: the body is not valid JSON"}},
    )
    assert mock_model.requests == []


def test_a_history_within_the_schemas_limits_but_over_2_5_mib_is_served(echo_model):
    run = running(placed_session())
    history = [{"role": "user", "content": "x" * 900_000}] * 3 + [{"role": "user", "content": "Reply exactly: ok"}]

    answer = post(inference_token(run.run_id, NODE), {"messages": history})

    assert answer.status == 200, answer.text
    assert content_of(answer.events()[:-1]) == "ok"


# --- failures and aborts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        (error(500), {"kind": "http", "message": "model provider returned HTTP 500: mock error"}),
        (
            error(429, "slow down"),
            {"kind": "rate_limit", "message": "model provider returned HTTP 429: slow down"},
        ),
        (
            error(400, "maximum context length exceeded", "context_length_exceeded"),
            {
                "kind": "context_length",
                "message": "model provider returned HTTP 400: maximum context length exceeded",
            },
        ),
    ],
)
def test_a_failing_model_ends_the_stream_with_one_error_event_then_done(mock_model, behaviour, expected):
    run = running(placed_session())
    mock_model.script(behaviour)

    answer = post(inference_token(run.run_id, NODE), GOOD_BODY)

    assert answer.status == 200
    assert answer.events() == [{"error": expected}, "[DONE]"]
    assert len(mock_model.requests) == 1
    assert API_KEY not in answer.text


def test_a_stream_that_fails_midway_keeps_what_was_sent_then_errors(mock_model):
    """The worker sees the chunks it got, then the error (it does not have to guess the stream ended)."""
    run = running(placed_session())
    mock_model.script(partial_then_drop("Hello "))

    events = post(inference_token(run.run_id, NODE), GOOD_BODY).events()

    assert content_of(events[:-2]) == "Hello "
    assert events[-2]["error"]["kind"] == "connection"
    assert events[-2]["error"]["message"].startswith("model provider connection dropped mid-stream: ")
    assert events[-1] == "[DONE]"


def test_a_provider_error_quoting_the_api_key_does_not_leak_it_to_the_node(mock_model):
    run = running(placed_session())
    mock_model.script(error(401, f"Incorrect API key provided: {API_KEY}", "invalid_api_key"))

    answer = post(inference_token(run.run_id, NODE), GOOD_BODY)

    [failure, done] = answer.events()
    assert (failure["error"]["kind"], done) == ("http", "[DONE]")
    assert API_KEY not in answer.text


async def _eventually(check, *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def test_an_abort_of_the_run_ends_a_waiting_stream_with_an_aborted_error(
    mock_model, django_capture_on_commit_callbacks
):
    """The provider is held mid-call; ``chat.abort``'s service sets the run's abort flag and the proxy
    stops the model call and tells the worker, instead of waiting for the provider."""
    session = placed_session()
    run = running(session, "Reply exactly: HOLD-INFERENCE")
    held = {"messages": [{"role": "user", "content": "Reply exactly: HOLD-INFERENCE"}]}
    mock_model.hold("HOLD-INFERENCE")

    def abort() -> None:
        with django_capture_on_commit_callbacks(execute=True):
            assert runs.run_abort(session_key=session.key, run_id=run.run_id) == [run.run_id]

    async def scenario() -> tuple[Answer, float]:
        reading = asyncio.ensure_future(_post(inference_token(run.run_id, NODE), held).run())
        await _eventually(lambda: mock_model.held() == ["HOLD-INFERENCE"])
        await sync_to_async(abort)()
        aborted_at = time.monotonic()
        answer = await asyncio.wait_for(reading, 10)
        return answer, time.monotonic() - aborted_at

    answer, waited = async_to_sync(scenario)()

    assert answer.status == 200
    assert answer.events() == [{"error": {"kind": "aborted", "message": "the turn was aborted"}}, "[DONE]"]
    assert waited < 5  # the abort ended it, not a provider timeout
    assert Run.objects.get(pk=run.run_id).abort_requested_at is not None


def test_a_worker_that_hangs_up_ends_its_model_call(mock_model):
    """The worker is gone (its turn was cancelled, its node went away): the model call stops too,
    instead of running to its end for nobody."""
    run = running(placed_session(), "Reply exactly: HOLD-HANGUP")
    mock_model.hold("HOLD-HANGUP")

    async def scenario() -> list[dict[str, Any]]:
        exchange = _post(inference_token(run.run_id, NODE), {"messages": [{"role": "user", "content": "HOLD-HANGUP"}]})
        serving = asyncio.ensure_future(application(exchange.scope, exchange.receive, exchange.send))
        await _eventually(lambda: mock_model.held() == ["HOLD-HANGUP"])
        exchange.hung_up.set()
        await asyncio.wait_for(serving, 10)
        return exchange.sent

    sent = async_to_sync(scenario)()

    assert sent[0]["status"] == 200  # the stream had started; it simply ends
    with_content = [message for message in sent[1:] if message.get("body")]
    assert with_content == []
    deadline = time.monotonic() + 10
    while mock_model.held():  # the provider's request was dropped, so the mock stops holding it
        assert time.monotonic() < deadline, "the model call outlived the worker's request"
        time.sleep(0.02)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_a_method_other_than_post_is_405_with_allow(mock_model, method):
    answer = post(None, raw=b"", method=method)

    assert answer.status == 405
    assert answer.headers["Allow"] == "POST"
    assert answer.json() == {
        "error": {
            "code": "INVALID_REQUEST",
            "message": f"method {method} is not allowed on {INFERENCE_PATH}",
            "details": {"allowed": ["POST"]},
        }
    }
    assert mock_model.requests == []


def test_a_body_over_the_payload_limit_is_413_and_calls_no_model(mock_model, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), {"messages": [{"role": "user", "content": "x" * 2000}]}, chunks=4)

    assert (answer.status, answer.json()["error"]["message"]) == (413, "request body too large (at most 1000 bytes)")
    assert mock_model.requests == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', "invalid request: the body is not valid JSON"),
        (b"[" * 200 + b"]" * 200, "invalid request: nested deeper than 64 levels"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "invalid request: lone surrogate"),
    ],
    ids=["not UTF-8", "nested too deep", "a lone surrogate"],
)
def test_a_body_beyond_the_protocols_bounds_is_400_and_calls_no_model(mock_model, raw, message):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), raw=raw)

    assert answer.status == 400
    assert answer.json()["error"]["message"].startswith(message)
    assert mock_model.requests == []


def test_an_unexpected_failure_is_a_generic_500_with_a_reference(mock_model, monkeypatch, caplog):
    run = running(placed_session())

    def broken(grant):
        raise RuntimeError("SELECT secret FROM somewhere")

    monkeypatch.setattr(inference, "running_run", broken)
    answer = post(inference_token(run.run_id, NODE), GOOD_BODY)

    assert answer.status == 500
    error = answer.json()["error"]
    assert error["message"].startswith("internal error; reference ")
    assert "SELECT" not in answer.text
    assert error["details"]["errorId"] in caplog.text
    assert mock_model.requests == []


# --- tools ---------------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            "strict": False,
        },
    },
    {"type": "function", "function": {"name": "ls"}},
]
PLAN = {
    "steps": [{"calls": [{"name": "read", "arguments": {"path": "a.txt"}}, {"name": "ls"}]}],
    "final": "a.txt holds {tool_result:call_0_0}",
}
CALL = {"id": "call_0_0", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}}


def plan_message() -> dict[str, Any]:
    return {"role": "user", "content": f"TOOL_PLAN: {json.dumps(PLAN)}"}


def folded(answer: Answer):
    """The proxy's stream read by the folder the worker child reads it with."""
    state = StreamState()
    for line in answer.text.split("\n"):
        state.feed_line(line)
    state.end_of_stream()
    return state.reply()


def test_tools_reach_the_provider_and_its_tool_calls_come_back_whole_in_the_last_chunk(mock_model):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), {"messages": [plan_message()], "tools": TOOLS})

    assert answer.status == 200, answer.text
    [sent] = mock_model.requests
    assert sent["tools"] == TOOLS and sent["tool_choice"] == "auto"
    events = answer.events()
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"][0] == {
        "index": 0,
        "delta": {
            "tool_calls": [
                {"index": 0, **CALL},
                {"index": 1, "id": "call_0_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
            ]
        },
        "finish_reason": "tool_calls",
    }
    assert last["usage"]["totalTokens"] > 0 and last["model"] == "mock-model"
    assert content_of(events[:-1]) == ""
    assert folded(answer).tool_calls == (
        ToolCall("call_0_0", "read", '{"path": "a.txt"}'),
        ToolCall("call_0_1", "ls", "{}"),
    )


def test_tool_messages_reach_the_provider_as_the_worker_sent_them(mock_model):
    run = running(placed_session())
    messages = [
        {"role": "system", "content": "You have tools."},
        plan_message(),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "hello world"},
        {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "call_0_1"}]},
        {"role": "tool", "tool_call_id": "call_0_1", "content": "a.txt", "name": "ls"},
    ]

    answer = post(inference_token(run.run_id, NODE), {"messages": messages, "tools": TOOLS})

    [sent] = mock_model.requests
    assert sent["messages"] == [
        *messages[:4],
        {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "call_0_1"}]},  # "" and null alike
        messages[5],
    ]
    reply = folded(answer)
    assert (reply.text, reply.tool_calls, reply.finish_reason) == ("a.txt holds hello world", (), "stop")


def test_a_request_without_tools_sends_the_provider_none(mock_model):
    run = running(placed_session())

    post(inference_token(run.run_id, NODE), GOOD_BODY)

    [sent] = mock_model.requests
    assert set(sent) == {"model", "messages", "stream"}


def test_echo_takes_the_tools_and_answers_text(echo_model):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), {**GOOD_BODY, "tools": TOOLS})

    assert content_of(answer.events()[:-1]) == "hello there world"
    assert answer.events()[-2]["choices"][0]["delta"] == {}


def test_the_worker_childs_turn_reads_the_proxys_tool_calls(mock_model):
    """The worker's Turn against exactly what the proxy sent (replayed by a local server)."""
    run = running(placed_session())
    answer = post(inference_token(run.run_id, NODE), {"messages": [plan_message()], "tools": TOOLS})

    with inference_server() as server:
        server.scripts["proxy"] = [answer.text]
        job = TurnJob(
            run_id=run.run_id,
            model="m",
            messages=[plan_message()],
            url=server.url("proxy"),
            token="run-token-123",
            timeout_ms=10_000,
            cwd=None,
        )
        reply = Turn(job, on_delta=lambda piece, text: None).ask([plan_message()], TOOLS)

    assert reply.finish_reason == "tool_calls"
    assert [(call.id, call.name, call.arguments) for call in reply.tool_calls] == [
        ("call_0_0", "read", '{"path": "a.txt"}'),
        ("call_0_1", "ls", "{}"),
    ]
    assert reply.usage == answer.events()[-2]["usage"]


def _message(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "x"}, fields]}


def _tool_call(**function: Any) -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}", **function}}


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        (
            _message(role="tool", content="x"),
            "/messages/1",
            "a tool message, and only a tool message, has a tool_call_id",
        ),
        (
            _message(role="user", content="x", tool_call_id="c"),
            "/messages/1",
            "a tool message, and only a tool message, has a tool_call_id",
        ),
        (
            _message(role="user", content="x", tool_calls=[_tool_call()]),
            "/messages/1",
            "only an assistant message has tool_calls",
        ),
        (_message(role="assistant", content=None), "/messages/1", "content may be null only next to tool_calls"),
        (
            _message(role="assistant", content="", tool_calls=[_tool_call()] * 65),
            "/messages/1/tool_calls",
            "List should have at most 64 items after validation, not 65",
        ),
        (
            _message(role="assistant", content="", tool_calls=[_tool_call(arguments={"path": "a"})]),
            "/messages/1/tool_calls/0/function/arguments",
            "Input should be a valid string",
        ),
        (
            _message(role="assistant", content="", tool_calls=[_tool_call(arguments="x" * (1024 * 1024 + 1))]),
            "/messages/1/tool_calls/0/function/arguments",
            "String should have at most 1048576 characters",
        ),
        (
            _message(role="assistant", content="", tool_calls=[_tool_call(name="")]),
            "/messages/1/tool_calls/0/function/name",
            "String should have at least 1 character",
        ),
        (
            _message(role="assistant", content="", tool_calls=[_tool_call(name="n" * 129)]),
            "/messages/1/tool_calls/0/function/name",
            "String should have at most 128 characters",
        ),
        (
            _message(role="assistant", content="", tool_calls=[{**_tool_call(), "id": "i" * 257}]),
            "/messages/1/tool_calls/0/id",
            "String should have at most 256 characters",
        ),
        (
            _message(role="assistant", content="", tool_calls=[{**_tool_call(), "type": "custom"}]),
            "/messages/1/tool_calls/0/type",
            "Input should be 'function'",
        ),
        (
            _message(role="tool", content="x", tool_call_id="i" * 257),
            "/messages/1/tool_call_id",
            "String should have at most 256 characters",
        ),
        (
            {**GOOD_BODY, "tools": [TOOLS[1]] * 65},
            "/tools",
            "List should have at most 64 items after validation, not 65",
        ),
        ({**GOOD_BODY, "tools": {"read": TOOLS[0]}}, "/tools", "Input should be a valid list"),
        ({**GOOD_BODY, "tools": ["read"]}, "/tools/0", "Input should be a valid dictionary"),
        (
            {**GOOD_BODY, "tools": [{"type": "custom", "custom": {"name": "x"}}]},
            "/tools/0",
            'a tool is {"type": "function", "function": {name, description?, parameters?}}',
        ),
        (
            {**GOOD_BODY, "tools": [{"type": "function", "function": {"name": ""}}]},
            "/tools/0",
            "a tool's function name is a string of 1 to 128 characters",
        ),
        (
            {**GOOD_BODY, "tools": [{"type": "function", "function": {"name": "ls", "parameters": []}}]},
            "/tools/0",
            "a tool's function parameters are a JSON Schema object",
        ),
        (
            {**GOOD_BODY, "tools": [{"type": "function", "function": {"name": "ls", "description": "d" * 65_536}}]},
            "/tools/0",
            "a tool is at most 65536 bytes of JSON",
        ),
    ],
    ids=[
        "a tool message without its call id",
        "a call id on a user message",
        "tool calls on a user message",
        "null content without tool calls",
        "65 tool calls",
        "arguments that are not text",
        "arguments over a MiB",
        "an empty call name",
        "a call name over 128 characters",
        "a call id over 256 characters",
        "a call that is not a function",
        "a tool_call_id over 256 characters",
        "65 tools",
        "tools not a list",
        "a tool that is not an object",
        "a tool that is not a function",
        "a tool without a name",
        "parameters that are not an object",
        "a tool over 64 KiB",
    ],
)
def test_tools_or_tool_messages_outside_the_schema_are_400_and_call_no_model(mock_model, body, path, message):
    run = running(placed_session())

    answer = post(inference_token(run.run_id, NODE), body)

    assert (answer.status, answer.json()) == (400, _invalid(path, message))
    assert mock_model.requests == []


def test_a_tool_of_just_64_kib_is_taken(echo_model):
    run = running(placed_session())
    tool = {"type": "function", "function": {"name": "ls", "description": ""}}
    tool["function"]["description"] = "d" * (65_536 - len(json.dumps(tool, separators=(",", ":"))))

    answer = post(inference_token(run.run_id, NODE), {**GOOD_BODY, "tools": [tool] * 64})

    assert answer.status == 200, answer.text
