"""The sessions JSON API, full stack: token auth, RPC-identical payloads, errors mapped to HTTP statuses."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection
from django.test import Client

from gateway.models import AuditLog
from sessions_app import rpc, schemas
from sessions_app.models import Run, RunStatus, Session, TranscriptEvent
from sessions_app.services import runs, sessions
from sessions_app.services.transcripts import append_many
from tests.support.api import API_TOKEN

TOKEN = API_TOKEN


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.fixture
def turns_in_process(settings, monkeypatch):
    """Turns run in a thread of the test process; the waiter re-reads the run every 100 ms.

    There is no gateway event loop here, so the run-finished wake-up does not reach the waiter.
    Each turn gets a new thread, which must close its connection when it ends: a persistent one
    would outlive the thread and keep the test database from being dropped.
    """
    settings.OPENCLAW_TASK_MODE = "inprocess"
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "AGENT_WAIT_RECHECK_MS": 100}
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)


def make(key: str = "agent:main:s1", **fields) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id=key.split(":")[1], **fields))


def finished_turn(session: Session, run_id: str, message: str, reply: str) -> Run:
    runs.run_submit(session_key=session.key, message=message, idempotency_key=run_id)
    runs.run_claim(run_id=run_id, executor="test")
    return runs.run_finish(run_id=run_id, outcome=runs.TurnOutcome(status=RunStatus.OK, text=reply))


def error(code: str, message: str, **extra) -> dict:
    return {"error": {"code": code, "message": message, **extra}}


def wait_for_terminal(client: Client, run_id: str, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.get(f"/api/sessions/runs/{run_id}").json()
        if run["status"] not in ("queued", "running") or time.monotonic() > deadline:
            return run
        time.sleep(0.05)


# --- auth and schema ------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_endpoint_needs_the_token():
    make()
    anonymous, wrong = Client(), Client(headers={"Authorization": "Bearer wrong"})
    requests = [
        ("get", "/api/sessions/"),
        ("post", "/api/sessions/"),
        ("get", "/api/sessions/agent:main:s1"),
        ("patch", "/api/sessions/agent:main:s1"),
        ("delete", "/api/sessions/agent:main:s1"),
        ("get", "/api/sessions/agent:main:s1/history"),
        ("post", "/api/sessions/agent:main:s1/messages"),
        ("post", "/api/sessions/agent:main:s1/abort"),
        ("post", "/api/sessions/agent:main:s1/reset"),
        ("get", "/api/sessions/runs/r1"),
    ]

    for verb, url in requests:
        assert getattr(anonymous, verb)(url, content_type="application/json").status_code == 401, url
        assert getattr(wrong, verb)(url, content_type="application/json").status_code == 401, url
    assert Session.objects.filter(key="agent:main:s1").exists()
    assert Client().get("/api/sessions/", HTTP_X_OPENCLAW_TOKEN=TOKEN).status_code == 200


@pytest.mark.django_db
def test_openapi_schema_lists_the_sessions_paths():
    schema = Client().get("/api/openapi.json").json()

    paths = schema["paths"]
    assert set(paths["/api/sessions/"]) == {"get", "post"}
    assert set(paths["/api/sessions/{key}"]) == {"get", "patch", "delete"}
    assert set(paths["/api/sessions/{key}/history"]) == {"get"}
    assert set(paths["/api/sessions/{key}/messages"]) == {"post"}
    assert set(paths["/api/sessions/{key}/abort"]) == {"post"}
    assert set(paths["/api/sessions/{key}/reset"]) == {"post"}
    assert set(paths["/api/sessions/runs/{runId}"]) == {"get"}
    assert set(paths["/api/sessions/runs"]) == {"get"}
    patch = paths["/api/sessions/{key}"]["patch"]
    assert patch["tags"] == ["sessions"]
    assert {"200", "400", "404", "409", "503"} <= set(patch["responses"])
    conflict = patch["responses"]["409"]["content"]["application/json"]["schema"]
    assert conflict == {"$ref": "#/components/schemas/ErrorOut"}
    assert "201" in paths["/api/sessions/"]["post"]["responses"]


# --- list, create, describe -----------------------------------------------------------------


@pytest.mark.django_db
def test_list_is_the_sessions_list_payload(client):
    make("agent:main:a", label="alpha")
    make("agent:main:b", label="beta")
    make("agent:ops:c")
    sessions.session_patch(key="agent:main:b", changes={"archived": True})

    page = client.get("/api/sessions/", {"limit": 1})
    rpc_page = rpc.sessions_list_rpc(None, schemas.SessionsListParams(limit=1))

    assert page.status_code == 200
    body = page.json()
    assert {**body, "ts": 0} == {**rpc_page, "ts": 0}
    assert [s["key"] for s in body["sessions"]] == ["agent:ops:c"]
    assert (body["count"], body["hasMore"], body["nextOffset"]) == (1, True, 1)
    assert body["defaults"]["mainSessionKey"] == "agent:main:main"

    def keys(**query) -> list[str]:
        response = client.get("/api/sessions/", query)
        assert response.status_code == 200, response.content
        return [s["key"] for s in response.json()["sessions"]]

    assert keys() == ["agent:ops:c", "agent:main:a"]
    assert keys(archived="true") == ["agent:main:b"]
    assert keys(archived="all") == ["agent:main:b", "agent:ops:c", "agent:main:a"]
    assert keys(agentId="main", archived="all") == ["agent:main:b", "agent:main:a"]
    assert keys(label="alpha") == ["agent:main:a"]
    assert keys(search="ALP") == ["agent:main:a"]
    assert keys(offset=1) == ["agent:main:a"]


@pytest.mark.django_db
def test_list_errors(client):
    bad_agent = client.get("/api/sessions/", {"agentId": "Not valid!"})
    bad_limit = client.get("/api/sessions/", {"limit": 1001})

    assert bad_agent.status_code == 400
    assert bad_agent.json() == error("INVALID_REQUEST", "invalid agentId: Not valid!")
    # Schema validation errors have the same shape as every other error.
    assert bad_limit.status_code == 400
    assert bad_limit.json()["error"]["code"] == "INVALID_REQUEST"
    assert bad_limit.json()["error"]["message"].startswith("invalid request: at /limit (query):")


@pytest.mark.django_db
def test_create_answers_201_with_the_sessions_create_payload(client):
    response = client.post(
        "/api/sessions/",
        {"key": "Project-X", "label": " Project ", "displayName": "X", "model": "m1"},
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    session = Session.objects.get(key="agent:main:project-x")
    assert body["ok"] is True
    assert (body["key"], body["sessionId"], body["runStarted"]) == ("agent:main:project-x", session.session_id, False)
    assert body["entry"]["label"] == "Project"
    assert body["entry"]["displayName"] == "X"
    assert body["entry"]["parentSessionKey"] == "agent:main:main"
    assert body["resolved"] == {"modelProvider": "echo", "model": "m1"}
    assert "runId" not in body


@pytest.mark.django_db
def test_create_without_a_key_makes_a_dashboard_session_and_can_start_a_turn(client):
    response = client.post(
        "/api/sessions/",
        {"agentId": "ops", "message": "hello", "idempotencyKey": "first-turn"},
        content_type="application/json",
    )

    assert response.status_code == 201
    body = response.json()
    assert body["key"].startswith("agent:ops:dashboard:")
    assert (body["runStarted"], body["runId"]) == (True, "first-turn")
    run = Run.objects.get(run_id="first-turn")
    assert (run.session_key, run.status, run.message) == (body["key"], RunStatus.QUEUED, "hello")


@pytest.mark.django_db
def test_create_errors(client):
    make("agent:main:taken")

    taken = client.post("/api/sessions/", {"key": "taken"}, content_type="application/json")
    cwd = client.post("/api/sessions/", {"key": "x", "cwd": "/tmp"}, content_type="application/json")
    unknown = client.post("/api/sessions/", {"key": "x", "execNode": "n1"}, content_type="application/json")

    assert taken.status_code == 409
    assert taken.json() == error(
        "INVALID_REQUEST", "session already exists: agent:main:taken", details={"code": "SESSION_EXISTS"}
    )
    assert cwd.status_code == 400
    assert cwd.json() == error("INVALID_REQUEST", "sessions.create cwd requires worktree=true or execNode")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "INVALID_REQUEST"
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_describe_takes_the_key_in_the_path(client):
    session = make("agent:main:dashboard:abc", label="L")

    full = client.get("/api/sessions/agent:main:dashboard:abc")
    bare = client.get("/api/sessions/dashboard:abc")
    encoded = client.get("/api/sessions/agent%3Amain%3Adashboard%3Aabc")
    missing = client.get("/api/sessions/agent:main:nope")

    assert full.status_code == 200
    assert full.json() == rpc.sessions_describe_rpc(None, schemas.SessionsDescribeParams(key=session.key))
    assert full.json()["session"]["label"] == "L"
    assert bare.json() == full.json() == encoded.json()
    assert missing.status_code == 404, missing.json()
    assert missing.json() == error("INVALID_REQUEST", "session not found: agent:main:nope")


# --- patch and delete -----------------------------------------------------------------------


@pytest.mark.django_db
def test_patch_changes_only_the_given_fields(client):
    session = make(label="old", display_name="Shown")

    response = client.patch(
        f"/api/sessions/{session.key}",
        {"label": "new", "pinned": True, "expectedSessionId": session.session_id},
        content_type="application/json",
    )

    assert response.status_code == 200
    body = response.json()
    assert (body["ok"], body["key"]) == (True, session.key)
    assert body["entry"]["label"] == "new"
    assert body["entry"]["pinned"] is True
    assert body["resolved"] == {"modelProvider": "echo", "model": "echo"}
    session.refresh_from_db()
    assert (session.label, session.display_name, session.pinned_at is not None) == ("new", "Shown", True)


@pytest.mark.django_db
def test_patch_errors(client):
    session = make()
    url = f"/api/sessions/{session.key}"

    stale = client.patch(url, {"label": "x", "expectedLifecycleRevision": "old"}, content_type="application/json")
    empty = client.patch(url, {}, content_type="application/json")
    missing = client.patch("/api/sessions/agent:main:nope", {"label": "x"}, content_type="application/json")

    assert stale.status_code == 409
    assert stale.json() == error(
        "INVALID_REQUEST",
        f"Session {session.key} changed; retry.",
        details={
            "code": "SESSION_CHANGED",
            "sessionId": session.session_id,
            "lifecycleRevision": session.lifecycle_revision,
            "revision": 1,
        },
    )
    assert empty.status_code == 400
    assert empty.json() == error("INVALID_REQUEST", "sessions.patch needs at least one change")
    assert missing.status_code == 404, missing.json()
    assert missing.json() == error("INVALID_REQUEST", "session not found: agent:main:nope")
    session.refresh_from_db()
    assert session.label == ""


@pytest.mark.django_db
def test_patch_and_delete_with_a_stale_revision_change_nothing(client):
    session = make()
    url = f"/api/sessions/{session.key}"
    first = client.patch(url, {"label": "first", "expectedRevision": 1}, content_type="application/json")

    lost = client.patch(url, {"label": "lost", "expectedRevision": 1}, content_type="application/json")
    kept = client.delete(f"{url}?expectedRevision=1")
    bad = client.patch(url, {"label": "x", "expectedRevision": 0}, content_type="application/json")
    described = client.get(url)

    assert first.status_code == 200 and first.json()["entry"]["revision"] == 2
    assert lost.status_code == 409 and kept.status_code == 409
    message = f"Session {session.key} changed: expected revision 1, current revision 2; retry."
    assert lost.json()["error"]["message"] == kept.json()["error"]["message"] == message
    assert lost.json()["error"]["details"]["revision"] == 2
    assert bad.status_code == 400
    assert "/expectedRevision" in bad.json()["error"]["message"]
    assert described.json()["session"]["label"] == "first" and described.json()["session"]["revision"] == 2
    deleted = client.delete(f"{url}?expectedRevision=2")
    assert deleted.status_code == 200 and not Session.objects.filter(key=session.key).exists()


@pytest.mark.django_db
def test_delete_removes_the_session_and_404s_after(client):
    session = make()

    stale = client.delete(f"/api/sessions/{session.key}?expectedSessionId=other")
    deleted = client.delete(f"/api/sessions/{session.key}?expectedSessionId={session.session_id}")
    again = client.delete(f"/api/sessions/{session.key}")

    assert stale.status_code == 409
    assert stale.json()["error"]["details"]["code"] == "SESSION_CHANGED"
    assert deleted.status_code == 200
    assert deleted.json() == {"ok": True, "key": session.key, "deleted": True}
    assert not Session.objects.filter(key=session.key).exists()
    assert again.status_code == 404
    assert again.json() == error("INVALID_REQUEST", f"session not found: {session.key}")


@pytest.mark.django_db
def test_delete_is_refused_while_a_turn_runs(client):
    """The session's state refuses it, nothing failed: 409 over HTTP, UNAVAILABLE as the RPC says it."""
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="busy")
    runs.run_claim(run_id="busy", executor="test")

    response = client.delete(f"/api/sessions/{session.key}")

    assert response.status_code == 409
    assert response.json() == error(
        "UNAVAILABLE", "Delete is unavailable while the agent is working; abort the run first.", retryable=True
    )
    assert Session.objects.filter(key=session.key).exists()


@pytest.mark.django_db
def test_reset_starts_a_new_transcript_like_sessions_reset_and_is_audited(client):
    session = make()
    finished_turn(session, "r1", "hello", "hi")
    runs.run_submit(session_key=session.key, message="later", idempotency_key="queued")
    before = Session.objects.get(key=session.key)

    response = client.post(
        f"/api/sessions/{session.key}/reset",
        {"reason": "new", "expectedRevision": before.revision},
        content_type="application/json",
    )

    assert response.status_code == 200
    after = Session.objects.get(key=session.key)
    assert after.session_id != before.session_id and after.lifecycle_revision != before.lifecycle_revision
    body = response.json()
    assert body["ok"] is True and body["key"] == session.key
    assert body["entry"]["sessionId"] == after.session_id and body["entry"]["revision"] == after.revision
    history = client.get(f"/api/sessions/{session.key}/history").json()
    assert history["sessionId"] == after.session_id and history["messages"] == []
    queued = Run.objects.get(run_id="queued")
    assert queued.status == RunStatus.ERROR and queued.error == "session was reset before the turn started"
    entry = AuditLog.objects.get(action="session.reset", target_id=session.key)
    assert entry.data["reason"] == "new" and entry.data["previousSessionId"] == before.session_id
    assert entry.data["failedQueuedRuns"] == 1


@pytest.mark.django_db
def test_reset_without_a_body_is_a_plain_reset(client):
    session = make()

    response = client.generic("POST", f"/api/sessions/{session.key}/reset")  # no body at all

    assert response.status_code == 200
    assert Session.objects.get(key=session.key).session_id != session.session_id
    assert AuditLog.objects.get(action="session.reset").data["reason"] == "reset"


@pytest.mark.django_db
def test_reset_refusals_change_nothing(client):
    session = make()
    url = f"/api/sessions/{session.key}/reset"

    def post(body: dict, target: str = url):
        return client.post(target, body, content_type="application/json")

    stale = post({"expectedRevision": session.revision + 1})
    wrong_owner = post({"expectedSessionId": "someone-else"})
    bad_reason = post({"reason": "wipe"})
    unknown_field = post({"force": True})
    missing = post({}, "/api/sessions/agent:main:nobody/reset")
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="busy")
    runs.run_claim(run_id="busy", executor="test")
    busy = post({})

    assert stale.status_code == 409 and stale.json()["error"]["details"]["revision"] == session.revision
    assert wrong_owner.status_code == 409
    assert wrong_owner.json()["error"]["details"]["code"] == "SESSION_CHANGED"
    assert bad_reason.status_code == 400 and "/reason" in bad_reason.json()["error"]["message"]
    assert unknown_field.status_code == 400
    assert missing.status_code == 404
    assert missing.json() == error("INVALID_REQUEST", "session not found: agent:main:nobody")
    assert busy.status_code == 409
    assert busy.json() == error("UNAVAILABLE", "Reset is unavailable while the agent is working.", retryable=True)
    unchanged = Session.objects.get(key=session.key)
    assert unchanged.session_id == session.session_id
    assert not AuditLog.objects.filter(action="session.reset").exists()


# --- chat -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_history_is_the_chat_history_payload(client):
    session = make()
    finished_turn(session, "r1", "one", "ONE")
    finished_turn(session, "r2", "two", "TWO")

    response = client.get(f"/api/sessions/{session.key}/history", {"limit": 3})
    missing = client.get("/api/sessions/agent:main:nope/history")

    assert response.status_code == 200
    body = response.json()
    assert body == rpc.chat_history_rpc(None, schemas.ChatHistoryParams(sessionKey=session.key, limit=3))
    assert [(m["role"], m["content"][0]["text"]) for m in body["messages"]] == [
        ("assistant", "ONE"),
        ("user", "two"),
        ("assistant", "TWO"),
    ]
    assert (body["totalMessages"], body["hasMore"], body["sessionId"]) == (4, True, session.session_id)
    assert missing.status_code == 404, missing.json()
    assert missing.json() == error("INVALID_REQUEST", "session not found: agent:main:nope")


@pytest.mark.django_db
def test_history_and_the_session_page_show_messages_of_shapes_this_gateway_does_not_write(client, admin_client):
    """A node records messages as its agent made them: content as one string, parts that are not objects. History
    passes them on as they are (a long string cut like text), and the console draws them."""
    session = make()
    bodies = [
        {"role": "user", "content": "the whole content as a string"},
        {"role": "assistant", "content": ["a bare string part", 7, None, {"type": "text", "text": "fine"}]},
        {"role": "assistant", "content": "x" * 20_000},
        {"role": "assistant"},
    ]
    append_many(window_id=session.session_id, session_key=session.key, bodies=bodies)

    response = client.get(f"/api/sessions/{session.key}/history")
    page = admin_client.get(f"/ui/sessions/{session.key}/")

    assert response.status_code == 200
    contents = [message.get("content") for message in response.json()["messages"]]
    assert contents[:2] == [bodies[0]["content"], bodies[1]["content"]]
    assert contents[2].startswith("x" * 100) and contents[2].endswith("...(truncated)...")
    assert len(contents[2]) < 20_000 and contents[3] == []
    assert page.status_code == 200
    assert "the whole content as a string" in page.content.decode() and "a bare string part" in page.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "editor_text"),
    [("asked as one string", "asked as one string"), (["bare", {"type": "text", "text": "typed"}, 3], "typed")],
)
def test_a_fork_at_a_user_message_of_another_shape_hands_over_its_text(client, content, editor_text):
    session = make()
    bodies = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": []},
        {"role": "user", "content": content},
    ]
    append_many(window_id=session.session_id, session_key=session.key, bodies=bodies)
    entry = TranscriptEvent.objects.filter(window_id=session.session_id).order_by("seq")[2]

    response = client.post(
        f"/api/sessions/{session.key}/fork", {"entryId": entry.event_id}, content_type="application/json"
    )

    assert response.status_code == 201
    assert response.json()["editorText"] == editor_text


@pytest.mark.django_db(transaction=True)
def test_send_and_wait_returns_the_reply(client, turns_in_process):
    started = time.monotonic()
    response = client.post(
        "/api/sessions/agent:main:main/messages", {"message": "Reply exactly: PONG"}, content_type="application/json"
    )

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["outputText"] == "PONG"
    assert body["terminalReply"] == {"disposition": "visible", "text": "PONG"}
    assert body["endedAt"] >= body["startedAt"]
    assert uuid.UUID(body["runId"]).version == 4
    assert time.monotonic() - started < 10
    run = Run.objects.get(run_id=body["runId"])
    assert (run.session_key, run.status, run.output_text) == ("agent:main:main", RunStatus.OK, "PONG")
    assert Session.objects.get(key="agent:main:main").created_via == "internal"
    history = client.get("/api/sessions/agent:main:main/history").json()
    assert [m["content"][0]["text"] for m in history["messages"]] == ["Reply exactly: PONG", "PONG"]


@pytest.mark.django_db(transaction=True)
def test_send_without_waiting_acknowledges_like_chat_send(client, turns_in_process):
    make("agent:main:work")
    url = "/api/sessions/agent:main:work/messages"
    payload = {"message": "Reply exactly: DONE", "idempotencyKey": "k1", "wait": False}

    first = client.post(url, payload, content_type="application/json")
    run = wait_for_terminal(client, "k1")
    again = client.post(url, payload, content_type="application/json")
    waited_again = client.post(url, {**payload, "wait": True}, content_type="application/json")

    assert first.status_code == 200
    assert first.json() == {"runId": "k1", "status": "started"}
    assert run["status"] == "ok"
    assert run["sessionKey"] == "agent:main:work"
    assert run["outputText"] == "DONE"
    assert run["error"] is None
    assert run["endedAt"] >= run["startedAt"]
    assert again.json() == {"runId": "k1", "status": "ok"}
    assert waited_again.json()["outputText"] == "DONE"
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_send_times_out_when_the_run_does_not_finish(client, turns_in_process, monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)
    make("agent:main:stuck")

    response = client.post(
        "/api/sessions/agent:main:stuck/messages",
        {"message": "hi", "idempotencyKey": "never", "timeoutMs": 200},
        content_type="application/json",
    )

    assert response.status_code == 200
    assert response.json() == {"runId": "never", "status": "timeout"}
    assert Run.objects.get(run_id="never").status == RunStatus.QUEUED


@pytest.mark.django_db(transaction=True)
def test_send_errors(client, monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)
    make("agent:main:work")
    runs.run_submit(session_key=make("agent:main:other").key, message="x", idempotency_key="used")

    def send(key: str, **payload):
        return client.post(f"/api/sessions/{key}/messages", payload, content_type="application/json")

    missing = send("agent:main:nope", message="hi")
    blank = send("agent:main:work", message="   ")
    reused = send("agent:main:work", message="hi", idempotencyKey="used", wait=False)
    bad_key = send("agent:main:", message="hi")
    unknown_field = send("agent:main:work", message="hi", sessionKey="x")

    assert missing.status_code == 404, missing.json()
    assert missing.json() == error("INVALID_REQUEST", "session not found: agent:main:nope")
    assert blank.status_code == 400
    assert blank.json() == error("INVALID_REQUEST", "message or attachment required")
    assert reused.status_code == 409
    assert reused.json() == error(
        "INVALID_REQUEST", "idempotencyKey already used for another session", details={"code": "RUN_KEY_REUSED"}
    )
    assert bad_key.status_code == 400
    assert bad_key.json() == error("INVALID_REQUEST", "invalid session key: agent:main:")
    assert unknown_field.status_code == 400
    assert list(Run.objects.values_list("run_id", flat=True)) == ["used"]
    assert not Session.objects.filter(key="agent:main:nope").exists()


@pytest.mark.django_db
def test_abort(client, monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="queued")
    url = f"/api/sessions/{session.key}/abort"

    wrong_run = client.post(url, {"runId": "unknown"}, content_type="application/json")
    aborted = client.post(url, {"runId": "queued"}, content_type="application/json")
    nothing = client.generic("POST", url)  # no body at all
    missing = client.post("/api/sessions/agent:main:nope/abort", {}, content_type="application/json")

    assert wrong_run.status_code == 400
    assert wrong_run.json() == error("INVALID_REQUEST", "runId does not match sessionKey")
    assert aborted.status_code == 200
    assert aborted.json() == {"ok": True, "aborted": True, "runIds": ["queued"]}
    assert Run.objects.get(run_id="queued").status == RunStatus.ABORTED
    assert nothing.json() == {"ok": True, "aborted": False, "runIds": []}
    assert missing.status_code == 404, missing.json()
    assert missing.json() == error("INVALID_REQUEST", "session not found: agent:main:nope")


# --- runs -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_run_detail(client):
    session = make()
    waiting = make("agent:main:waiting")  # its turn stays queued (a session's turns start in the order sent)
    runs.run_submit(session_key=waiting.key, message="hi", idempotency_key="queued")
    finished_turn(session, "done", "one", "ONE")

    queued = client.get("/api/sessions/runs/queued")
    done = client.get("/api/sessions/runs/done")
    missing = client.get("/api/sessions/runs/nope")
    # "history" is a run id here, not the history of a session called "runs".
    not_history = client.get("/api/sessions/runs/history")

    assert queued.status_code == 200
    assert queued.json() == {
        "runId": "queued",
        "sessionKey": waiting.key,
        "status": "queued",
        "startedAt": None,
        "endedAt": None,
        "error": None,
        "outputText": None,
    }
    body = done.json()
    assert (body["status"], body["outputText"], body["error"]) == ("ok", "ONE", None)
    assert body["endedAt"] >= body["startedAt"] > 0
    assert missing.status_code == 404, missing.json()
    assert missing.json() == error("INVALID_REQUEST", "run not found: nope")
    assert not_history.status_code == 404
    assert not_history.json() == error("INVALID_REQUEST", "run not found: history")
