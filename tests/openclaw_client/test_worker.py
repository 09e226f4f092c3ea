"""The worker child (``python -m openclaw_client.worker``) as a real subprocess against a local SSE server.

The server plays the gateway's inference endpoint: it checks the turn's bearer token and answers by
script (an ok stream, an error event, HTTP errors, a stream that stalls until the child hangs up).
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from openclaw_client.worker import Turn, TurnCancelled, TurnFailed, TurnJob
from tests.support.mock_openai import MockOpenAI

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "run-token-123"


def chunk(content: str | None = None, finish: str | None = None, **extra) -> str:
    delta = {"content": content} if content is not None else {}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body)}\n\n"


DONE = "data: [DONE]\n\n"
TOOL_CALLS = [
    {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}},
    {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
]


def event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def calls_event(*calls: dict, **extra) -> str:
    return event(
        {"choices": [{"index": 0, "delta": {"tool_calls": list(calls)}, "finish_reason": "tool_calls"}], **extra}
    )


# The gateway's proxy sends the calls whole, in the chunk that says why the reply stopped.
TOOL_CALLS_STREAM = [
    chunk("Let me look."),
    calls_event(
        *({"index": i, **call} for i, call in enumerate(TOOL_CALLS)),
        usage={"input": 9, "output": 4, "totalTokens": 13},
        model="mock-model",
    ),
    DONE,
]


# Longer than the node host's progress window (PROGRESS_COALESCE_S), so each delta leaves on its own.
PACED_PAUSE_S = 0.05
OK_STREAM = [
    chunk("Hel"),
    chunk("lo"),
    chunk(None, "stop", usage={"input": 3, "output": 2, "totalTokens": 5}, model="mock-model"),
    "data: [DONE]\n\n",
]


@dataclass
class InferenceServer:
    """Answers ``POST /v1/<script>``; ``requests`` records (path, headers, body) of each call.

    It also serves ``files`` by path on ``GET`` to ``Authorization: Bearer <file_token>`` (a gateway's
    bundle download), after ``get_delay`` seconds; ``gets`` records the paths asked for.
    """

    server: ThreadingHTTPServer
    requests: list[tuple[str, dict, dict]] = field(default_factory=list)
    hung_up: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    files: dict[str, bytes] = field(default_factory=dict)
    # More scripts by name: the events answered to ``POST /v1/<name>``.
    scripts: dict[str, list[str]] = field(default_factory=dict)
    file_token: str = "device-token"
    gets: list[str] = field(default_factory=list)
    get_delay: float = 0.0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, script: str) -> str:
        return f"{self.origin}/v1/{script}"


def _handler(state: InferenceServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            state.gets.append(self.path)
            time.sleep(state.get_delay)
            if self.headers.get("Authorization") != f"Bearer {state.file_token}":
                return self._json(401, {"error": {"code": "UNAUTHORIZED", "message": "unauthorized"}})
            if self.path not in state.files:
                return self._json(404, {"error": {"code": "NOT_FOUND", "message": "not found"}})
            self._raw(200, state.files[self.path], "application/gzip")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            state.requests.append((self.path, dict(self.headers), body))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._json(401, {"error": {"kind": "unauthorized", "message": "bad inference token"}})
            script = self.path.rsplit("/", 1)[-1]
            if script == "http-500":
                return self._json(500, {"error": {"message": "provider exploded"}})
            if script == "http-502-text":
                return self._raw(502, b"<html>bad gateway</html>", "text/html")
            if script == "http-429":
                return self._json(429, {"error": {"message": "slow down"}})
            events = {
                "ok": OK_STREAM,
                "echo": [chunk(body["messages"][-1]["content"], "stop"), "data: [DONE]\n\n"],
                "error-event": [
                    chunk("partial"),
                    'data: {"error": {"kind": "rate_limit", "message": "too many requests"}}\n\n',
                    "data: [DONE]\n\n",
                ],
                "aborted-event": [chunk("so far"), 'data: {"error": {"kind": "aborted", "message": "x"}}\n\n'],
                "malformed": [chunk("a"), "data: {not json\n\n"],
                "truncated": [chunk("a")],
                "no-done": [chunk("all", "stop")],
                "garbage-line": ["hello there\n\n"],
                "tool-calls": TOOL_CALLS_STREAM,
                "nameless-call": [calls_event({"index": 0, "id": "c"}), DONE],
                "refusal": [event({"choices": [{"delta": {"refusal": "not this one"}}]}), DONE],
                "empty": [DONE],
                **state.scripts,
            }.get(script)
            if script == "stall":
                return self._stall()
            if script == "paced":  # OK_STREAM with a pause before each event, as a model's tokens come
                return self._stream(OK_STREAM, pause=PACED_PAUSE_S)
            self._stream(events or [])

        def _json(self, status: int, body: dict) -> None:
            self._raw(status, json.dumps(body).encode(), "application/json")

        def _raw(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

        def _stream(self, events: list[str], pause: float = 0.0) -> None:
            self._start_stream()
            for event in events:
                time.sleep(pause)
                self.wfile.write(event.encode())
                self.wfile.flush()
            self.close_connection = True

        def _stall(self) -> None:
            """One delta, then nothing until the client hangs up (or the test releases it)."""
            self._start_stream()
            self.wfile.write(chunk("first").encode())
            self.wfile.flush()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not state.release.is_set():
                try:
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                except OSError:
                    state.hung_up.set()
                    return
                time.sleep(0.05)
            self.close_connection = True

    return Handler


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up mid-answer is what several tests do on purpose


@contextmanager
def inference_server() -> Iterator[InferenceServer]:
    state = InferenceServer(server=None)  # type: ignore[arg-type]
    state.server = QuietServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=state.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        state.server.shutdown()
        state.server.server_close()


@pytest.fixture
def server():
    with inference_server() as running:
        yield running


class WorkerProcess:
    """A worker child with its stdout read on a thread (so a test can wait with a timeout)."""

    def __init__(self, cwd: Path = ROOT):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "openclaw_client.worker"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(json.loads(line))

    def send(self, job: dict) -> None:
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()

    def turn(self, run_id: str, url: str, **extra) -> None:
        job = {
            "type": "turn",
            "runId": run_id,
            "model": "mock-model",
            "messages": [{"role": "user", "content": "hi"}],
            "inference": {"url": url, "token": TOKEN},
            **extra,
        }
        self.send(job)

    def next(self, timeout: float = 10.0) -> dict:
        return self.lines.get(timeout=timeout)

    def until_done(self, timeout: float = 10.0) -> tuple[list[dict], dict]:
        deltas = []
        while True:
            event = self.next(timeout)
            if event["type"] == "done":
                return deltas, event
            deltas.append(event)

    def close(self) -> int:
        self.process.stdin.close()
        return self.process.wait(timeout=10)


@pytest.fixture
def worker():
    child = WorkerProcess()
    yield child
    if child.process.poll() is None:
        child.process.kill()
    child.process.wait()
    for pipe in (child.process.stdin, child.process.stdout, child.process.stderr):
        with contextlib.suppress(OSError):
            pipe.close()


def test_an_ok_stream_gives_deltas_then_the_reply_with_usage_and_model(server, worker):
    worker.turn("run-1", server.url("ok"))
    deltas, done = worker.until_done()
    assert deltas == [
        {"type": "delta", "runId": "run-1", "delta": "Hel", "text": "Hel"},
        {"type": "delta", "runId": "run-1", "delta": "lo", "text": "Hello"},
    ]
    assert done == {
        "type": "done",
        "runId": "run-1",
        "status": "ok",
        "text": "Hello",
        "stopReason": "stop",
        "usage": {"input": 3, "output": 2, "totalTokens": 5},
        "model": "mock-model",
    }
    path, headers, body = server.requests[0]
    assert path == "/v1/ok" and headers["Authorization"] == f"Bearer {TOKEN}"
    assert body == {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_the_child_stays_up_for_the_next_job_and_exits_when_stdin_closes(server, worker):
    worker.turn("run-1", server.url("ok"))
    assert worker.until_done()[1]["status"] == "ok"
    worker.turn("run-2", server.url("echo"), messages=[{"role": "user", "content": "again"}])
    _deltas, done = worker.until_done()
    assert (done["runId"], done["status"], done["text"]) == ("run-2", "ok", "again")
    assert worker.close() == 0


def test_a_stream_ending_after_the_finish_reason_without_done_is_complete(server, worker):
    worker.turn("run-1", server.url("no-done"))
    assert worker.until_done()[1]["text"] == "all"


@pytest.mark.parametrize(
    ("script", "kind", "message"),
    [
        ("error-event", "rate_limit", "too many requests"),
        ("http-500", "http", "inference request failed: HTTP 500: provider exploded"),
        ("http-429", "rate_limit", "inference request failed: HTTP 429: slow down"),
        ("http-502-text", "http", "inference request failed: HTTP 502: <html>bad gateway</html>"),
        (
            "malformed",
            "malformed",
            "inference stream is malformed: invalid JSON in stream event "
            "(Expecting property name enclosed in double quotes)",
        ),
        ("truncated", "malformed", "inference stream ended before the reply was complete"),
        ("garbage-line", "malformed", "inference stream is malformed: unexpected line in event stream: hello there"),
        ("nameless-call", "malformed", "inference stream is malformed: tool call 0 has no name"),
        ("refusal", "refusal", "model refused: not this one"),
        ("empty", "malformed", "inference stream is malformed: stream ended without content or finish_reason"),
    ],
)
def test_failures_end_the_turn_with_an_error_kind_and_message(server, worker, script, kind, message):
    worker.turn("run-1", server.url(script))
    _deltas, done = worker.until_done()
    assert done == {"type": "done", "runId": "run-1", "status": "error", "error": {"kind": kind, "message": message}}


def test_a_refused_token_is_an_error_whose_message_does_not_contain_it(server, worker):
    worker.send(
        {
            "type": "turn",
            "runId": "run-1",
            "model": "m",
            "messages": [],
            "inference": {"url": server.url("ok"), "token": "wrong-secret-token"},
        }
    )
    _deltas, done = worker.until_done()
    assert done["status"] == "error"
    assert done["error"]["kind"] == "unauthorized"
    assert "wrong-secret-token" not in json.dumps(done)


def test_an_unreachable_endpoint_is_a_connection_error(worker):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker.turn("run-1", f"http://127.0.0.1:{port}/v1/ok")
    _deltas, done = worker.until_done()
    assert done["error"] == {"kind": "connection", "message": "inference endpoint unreachable: connection refused"}


def test_a_stalled_stream_times_out(server, worker):
    worker.turn("run-1", server.url("stall"), timeoutMs=300)
    _deltas, done = worker.until_done()
    assert done["error"] == {"kind": "timeout", "message": "inference request timed out after 300 ms"}


def test_cancel_closes_the_connection_and_the_turn_ends_aborted_with_the_text_so_far(server, worker):
    worker.turn("run-1", server.url("stall"))
    assert worker.next()["delta"] == "first"
    worker.send({"type": "cancel", "runId": "run-1"})
    done = worker.next()
    assert done == {"type": "done", "runId": "run-1", "status": "aborted", "text": "first"}
    assert server.hung_up.wait(5)  # the HTTP connection was really closed
    worker.turn("run-2", server.url("ok"))  # and the child is still good for the next turn
    assert worker.until_done()[1]["status"] == "ok"


def test_the_gateway_aborting_the_run_ends_the_turn_aborted(server, worker):
    worker.turn("run-1", server.url("aborted-event"))
    assert worker.until_done()[1] == {"type": "done", "runId": "run-1", "status": "aborted", "text": "so far"}


def test_a_cancel_for_a_waiting_turn_aborts_it_before_it_starts(server, worker):
    worker.turn("run-1", server.url("stall"))
    worker.turn("run-2", server.url("ok"))
    assert worker.next()["runId"] == "run-1"  # run-1's first delta: run-2 waits behind it
    worker.send({"type": "cancel", "runId": "run-2"})
    worker.send({"type": "cancel", "runId": "run-1"})
    done_events = [worker.until_done()[1], worker.until_done()[1]]
    assert [(event["runId"], event["status"]) for event in done_events] == [("run-1", "aborted"), ("run-2", "aborted")]
    assert len(server.requests) == 1  # run-2 never called the model


def test_closing_stdin_mid_turn_aborts_it_and_ends_the_child(server, worker):
    worker.turn("run-1", server.url("stall"))
    worker.next()
    assert worker.close() == 0
    assert worker.next()["status"] == "aborted"


def test_malformed_jobs_are_answered_or_ignored_without_killing_the_child(server, worker):
    worker.process.stdin.write("not json\n")
    worker.send({"type": "turn"})  # no runId: nothing to answer
    worker.send({"type": "turn", "runId": "bad", "inference": "nope"})
    assert worker.next() == {
        "type": "done",
        "runId": "bad",
        "status": "error",
        "error": {"kind": "unknown", "message": "worker received a malformed turn job"},
    }
    worker.turn("good", server.url("ok"), cwd=str(ROOT))
    assert worker.until_done()[1]["status"] == "ok"


def test_a_missing_workspace_directory_is_an_error(server, worker, tmp_path):
    worker.turn("run-1", server.url("ok"), cwd=str(tmp_path / "gone"))
    assert worker.until_done()[1]["error"] == {
        "kind": "unknown",
        "message": "the environment's workspace is not available",
    }


# --- tool calls -------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}]
TOOL_CONTEXT = [
    {"role": "user", "content": "What is in a.txt?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALLS[0]]},
    {"role": "tool", "tool_call_id": "call_a", "content": "hello"},
    {"role": "user", "content": "And the listing?"},
]


def plan_job(tmp_path, plan: dict, **agent) -> dict:
    """A turn job running the mock model's tool plan as an agent loop in ``tmp_path``."""
    return {
        "messages": [{"role": "user", "content": f"TOOL_PLAN: {json.dumps(plan)}"}],
        "cwd": str(tmp_path),
        "agent": {"maxSteps": 8, "tools": True, **agent},
    }


def test_a_turn_is_an_agent_loop_whose_tools_run_in_its_workspace(worker, tmp_path):
    (tmp_path / "a.txt").write_text("hello from the node\n")
    plan = {
        "steps": [{"text": "Let me look.", "calls": [{"name": "read", "arguments": {"path": "a.txt"}}]}],
        "final": "a.txt says: {last_tool_result}",
    }
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan))
        events, done = worker.until_done()
        sent = mock.requests

    kinds = [(event["type"], event.get("key") or event.get("phase")) for event in events if event["type"] != "delta"]
    assert kinds == [("message", "s1.a"), ("tool", "start"), ("message", "s1.r1")]
    assistant = next(event["message"] for event in events if event.get("key") == "s1.a")
    result = next(event["message"] for event in events if event.get("key") == "s1.r1")
    assert assistant["content"][1] == {
        "type": "toolCall",
        "id": "call_0_0",
        "name": "read",
        "arguments": {"path": "a.txt"},
    }
    assert result["role"] == "toolResult" and result["toolCallId"] == "call_0_0" and not result["isError"]
    assert "hello from the node" in result["content"][0]["text"]
    assert done["status"] == "ok" and done["text"].startswith("a.txt says: ") and "hello from the node" in done["text"]
    assert {tool["function"]["name"] for tool in sent[0]["tools"]} >= {"read", "write", "edit", "exec"}
    assert sent[1]["messages"][-1]["role"] == "tool"


def test_without_agent_tools_the_model_is_offered_none(worker, tmp_path):
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", cwd=str(tmp_path))
        _events, done = worker.until_done()
        sent = mock.requests

    assert done["status"] == "ok"
    assert "tools" not in sent[0]


def test_an_exec_waits_for_the_gateways_answer(worker, tmp_path):
    plan = {"steps": [{"calls": [{"name": "exec", "arguments": {"command": "echo ran > proof"}}]}], "final": "done"}
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan))
        question = next(event for event in iter(worker.next, None) if event["type"] == "approval")
        assert question["command"] == "echo ran > proof" and question["workdir"] == str(tmp_path.resolve())
        assert not (tmp_path / "proof").exists()  # nothing runs before the answer
        worker.send({"type": "approval", "runId": "run-1", "toolCallId": question["toolCallId"], "allowed": True})
        _events, done = worker.until_done()

    assert done["status"] == "ok"
    assert (tmp_path / "proof").read_text() == "ran\n"


def policy_snapshot(**fields) -> dict:
    return {
        "version": 1,
        "security": "allowlist",
        "ask": "on-miss",
        "askFallback": "deny",
        "autoAllowSkills": False,
        "allowlist": [],
        **fields,
    }


@pytest.mark.parametrize(
    ("policy", "runs"),
    [
        (policy_snapshot(security="full", ask="off"), True),
        (policy_snapshot(allowlist=[{"id": "e1", "pattern": "touch"}]), True),
        (policy_snapshot(security="deny"), False),
        (policy_snapshot(ask="off"), False),
    ],
    ids=["full", "allowlisted", "deny", "a miss with ask off"],
)
def test_what_the_launchs_policy_decides_is_decided_here_without_asking(worker, tmp_path, policy, runs):
    plan = {"steps": [{"calls": [{"name": "exec", "arguments": {"command": "touch proof"}}]}], "final": "ok"}
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan, execPolicy=policy))
        events, done = worker.until_done()

    assert done["status"] == "ok"
    assert not [event for event in events if event["type"] == "approval"]
    assert (tmp_path / "proof").exists() is runs
    result = next(event["message"] for event in events if event.get("key") == "s1.r1")
    assert result["isError"] is not runs
    if not runs:
        assert result["content"][0]["text"].startswith("exec denied:")


def test_what_the_launchs_policy_asks_about_is_put_to_the_gateway(worker, tmp_path):
    plan = {"steps": [{"calls": [{"name": "exec", "arguments": {"command": "echo ran > proof"}}]}], "final": "ok"}
    policy = policy_snapshot(allowlist=[{"id": "e1", "pattern": "git"}])
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan, execPolicy=policy))
        question = next(event for event in iter(worker.next, None) if event["type"] == "approval")
        worker.send({"type": "approval", "runId": "run-1", "toolCallId": question["toolCallId"], "allowed": True})
        _events, done = worker.until_done()

    assert done["status"] == "ok" and (tmp_path / "proof").exists()


def test_a_denied_exec_is_the_tools_error_and_the_turn_goes_on(worker, tmp_path):
    plan = {"steps": [{"calls": [{"name": "exec", "arguments": {"command": "echo ran > proof"}}]}], "final": "ok"}
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan))
        question = next(event for event in iter(worker.next, None) if event["type"] == "approval")
        answer = {"type": "approval", "runId": "run-1", "toolCallId": question["toolCallId"], "allowed": False}
        worker.send({**answer, "reason": "exec denied by an operator"})
        events, done = worker.until_done()

    result = next(event["message"] for event in events if event.get("key") == "s1.r1")
    assert result["isError"] and "denied by an operator" in result["content"][0]["text"]
    assert done["status"] == "ok" and not (tmp_path / "proof").exists()


def test_a_cancel_while_an_exec_waits_for_its_answer_aborts_the_turn(worker, tmp_path):
    plan = {"steps": [{"calls": [{"name": "exec", "arguments": {"command": "echo ran > proof"}}]}], "final": "x"}
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan))
        next(event for event in iter(worker.next, None) if event["type"] == "approval")
        worker.send({"type": "cancel", "runId": "run-1"})
        events, done = worker.until_done()

    assert done["status"] == "aborted" and not (tmp_path / "proof").exists()
    result = next(event["message"] for event in events if event.get("key") == "s1.r1")
    assert result["details"].get("aborted") is True


def test_a_cancel_kills_a_running_command(worker, tmp_path):
    plan = {
        "steps": [{"calls": [{"name": "exec", "arguments": {"command": "echo $$ > pid; sleep 60; touch late"}}]}],
        "final": "x",
    }
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan))
        question = next(event for event in iter(worker.next, None) if event["type"] == "approval")
        worker.send({"type": "approval", "runId": "run-1", "toolCallId": question["toolCallId"], "allowed": True})
        deadline = time.monotonic() + 10
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.send({"type": "cancel", "runId": "run-1"})
        _events, done = worker.until_done()

    assert done["status"] == "aborted"
    shell = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{shell}").exists() or "Z" in Path(f"/proc/{shell}/stat").read_text().split()[2]
    assert not (tmp_path / "late").exists()


def test_the_step_limit_ends_the_turn_with_an_error(worker, tmp_path):
    plan = {"steps": [{"calls": [{"name": "ls"}]}] * 5, "final": "never"}
    with MockOpenAI() as mock:
        worker.turn("run-1", f"{mock.base_url}/chat/completions", **plan_job(tmp_path, plan, maxSteps=2))
        _events, done = worker.until_done()

    assert done["status"] == "error" and done["error"]["kind"] == "step_limit"
    assert "after 2 model steps" in done["error"]["message"]


@pytest.mark.parametrize("agent", ["tools", {"maxSteps": 0}, {"tools": "yes"}, {"execSlots": {"count": 0}}])
def test_a_malformed_agent_spec_makes_a_malformed_job(server, worker, agent):
    worker.turn("run-1", server.url("ok"), agent=agent)

    assert worker.until_done()[1]["error"]["message"].startswith("worker received a malformed turn job")
    assert server.requests == []


# --- Turn.ask: one model call of many, in this process ---------------------------------------


def turn_for(url: str, seen: list[tuple[str, str]] | None = None, *, timeout_ms: int = 10_000) -> Turn:
    job = TurnJob(run_id="r", model="m", messages=[], url=url, token=TOKEN, timeout_ms=timeout_ms, cwd=None)
    return Turn(job, on_delta=lambda piece, text: (seen if seen is not None else []).append((piece, text)))


def test_ask_runs_a_tool_plan_of_the_mock_model_step_by_step():
    """What the agent loop does with a Turn: ask, run the calls, answer them, ask again, until a final text."""
    plan = {
        "steps": [
            {"calls": [{"name": "read", "arguments": {"path": "a.txt"}}]},
            {"calls": [{"name": "ls"}, {"name": "nope", "arguments": "{bad"}], "stream_chunks": 1},
        ],
        "final": "a.txt says {tool_result:call_0_0}",
    }
    results = {"read": "hello", "ls": "a.txt", "nope": "unknown tool"}
    seen: list[tuple[str, str]] = []
    with MockOpenAI() as mock:
        turn = turn_for(f"{mock.base_url}/chat/completions", seen)
        messages: list[dict] = [{"role": "user", "content": f"TOOL_PLAN: {json.dumps(plan)}"}]
        steps = []
        while (reply := turn.ask(messages, TOOLS)).tool_calls:
            steps.append([(call.id, call.name, call.arguments) for call in reply.tool_calls])
            messages.append(
                {"role": "assistant", "content": reply.text, "tool_calls": [c.as_openai() for c in reply.tool_calls]}
            )
            messages += [{"role": "tool", "tool_call_id": c.id, "content": results[c.name]} for c in reply.tool_calls]
        sent = mock.requests

    assert steps == [
        [("call_0_0", "read", '{"path": "a.txt"}')],
        [("call_1_0", "ls", "{}"), ("call_1_1", "nope", "{bad")],
    ]
    assert (reply.text, reply.finish_reason) == ("a.txt says hello", "stop")
    assert turn.text == "a.txt says hello"
    assert seen[-1] == ("hello", "a.txt says hello")  # deltas carry the text of the current call
    assert [request["tools"] for request in sent] == [TOOLS] * 3
    assert sent[2]["messages"] == messages


def test_ask_after_a_cancel_calls_no_model(server):
    turn = turn_for(server.url("ok"))
    turn.cancel()

    with pytest.raises(TurnCancelled):
        turn.ask([{"role": "user", "content": "hi"}])
    assert server.requests == []


def test_ask_is_cancelled_when_the_gateway_aborted_the_run(server):
    seen: list[tuple[str, str]] = []
    turn = turn_for(server.url("aborted-event"), seen)

    with pytest.raises(TurnCancelled):
        turn.ask([{"role": "user", "content": "hi"}])
    assert turn.text == "so far" and seen == [("so far", "so far")]


def test_ask_fails_with_the_kind_and_a_message_without_the_token(server):
    server.scripts["quotes-the-token"] = [event({"error": {"kind": "http", "message": f"bad token {TOKEN}"}}), DONE]
    turn = turn_for(server.url("quotes-the-token"))

    with pytest.raises(TurnFailed) as info:
        turn.ask([{"role": "user", "content": "hi"}])

    assert (info.value.kind, info.value.message) == ("http", "bad token [redacted]")


def test_every_call_of_a_turn_shares_its_time_limit(server):
    turn = turn_for(server.url("ok"), timeout_ms=1000)
    assert turn.ask([{"role": "user", "content": "hi"}]).text == "Hello"
    time.sleep(1.05)  # the turn's time is up, though this call has not started

    with pytest.raises(TurnFailed) as info:
        turn.ask([{"role": "user", "content": "hi"}])

    assert (info.value.kind, info.value.message) == ("timeout", "inference request timed out after 1000 ms")
