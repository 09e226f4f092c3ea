"""OpenClaw's own terminal UI (``openclaw tui --url … --token …``, through the workplace's ``openclaw-cli`` tool) in
a pseudo-terminal against a real gateway process whose model is the tests' mock OpenAI server: it connects and
shows the session's history, a sent message's reply streams in, Escape aborts the running turn with one
``chat.abort`` (no retry without ``preserveSideRuns``), ``/new`` opens a successor session, ``/sessions`` lists and
switches sessions, ``/models`` lists the configured model and picking it sets the session's model for its next
turn, and ``/status`` is answered by the gateway, never by the model.

What the TUI called is read from the gateway's own access log (one JSON line per call: method and outcome).
Skipped without the tool; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sessions_app.models import Run, RunStatus, Session
from tests.e2e.test_openclaw_compat import wait_until
from tests.support.clients import call_once
from tests.support.mock_openai import MockOpenAI, slow
from tests.support.openclaw_cli import TOOL, require_openclaw_cli
from tests.support.processes import start_gateway, stop_and_remove
from tests.support.terminal import PtyProgram

pytestmark = [pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]

MODEL = "mock-model"
STREAMED_WORDS = "alpha beta gamma delta epsilon zeta"
# Long enough that Escape lands while the turn still streams.
ABORTED_WORDS = " ".join(f"word{index}" for index in range(60))
WORD_DELAY_S = 0.25
# Node's start-up and the TUI's first connect take a few seconds on a loaded 2-core machine.
CONNECT_WAIT_S = 60
STEP_WAIT_S = 20


@pytest.fixture(scope="module")
def mock_model():
    with MockOpenAI().start() as server:
        yield server


@pytest.fixture(scope="module")
def access_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tui-gateway") / "gateway.log"


@pytest.fixture(scope="module")
def tui_gateway(django_db_setup, django_db_blocker, mock_model, access_log):
    """One gateway for the module, its model the mock server, its JSON log in ``access_log``."""
    require_openclaw_cli()
    server = start_gateway(
        extra_env={
            "OPENCLAW_MODEL_BASE_URL": mock_model.base_url,
            "OPENCLAW_MODEL_API_KEY": "sk-test",
            "OPENCLAW_MODEL": MODEL,
            "OPENCLAW_MODEL_READ_TIMEOUT_S": "5",
            "OPENCLAW_LOG_FILE": str(access_log),
            "OPENCLAW_LOG_FORMAT": "plain",
        }
    )
    yield server
    stop_and_remove([server])


def rpc_calls(access_log: Path, method: str) -> list[str]:
    """The outcome (``ok`` or the error code) of every call of ``method`` the gateway logged, in order."""
    outcomes = []
    for line in access_log.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry.get("logger") == "openclaw.access.rpc" and entry.get("method") == method:
            outcomes.append(entry["outcome"])
    return outcomes


def latest_run_status(session_key: str) -> str | None:
    return Run.objects.filter(session__key=session_key).order_by("-created_at").values_list("status", flat=True).first()


def run_command(tui: PtyProgram, command: str) -> int:
    """A slash command typed as a person types it (its completion list shows meanwhile), then Enter."""
    mark = tui.mark()
    tui.type(command, per_key_s=0.02)
    tui.type("\r")
    return mark


def test_the_openclaw_tui_chats_aborts_and_runs_its_commands(tui_gateway, mock_model, access_log):
    # The TUI opens the agent's main session; it exists with one exchange, so connecting shows history.
    call_once(tui_gateway, "sessions.create", {"key": "main", "label": "Main from the wire"})
    call_once(
        tui_gateway,
        "chat.send",
        {"sessionKey": "agent:main:main", "message": "Reply exactly: earlier answer", "idempotencyKey": "tui-pre"},
    )
    call_once(tui_gateway, "agent.wait", {"runId": "tui-pre", "timeoutMs": 15_000})

    with PtyProgram([str(TOOL), "tui", tui_gateway.url, tui_gateway.token]) as tui:
        shown = tui.wait_for("connected | idle", timeout=CONNECT_WAIT_S)
        tui.wait_for("earlier answer")
        assert "failed" not in tui.text(), tui.text()[-2000:]

        # Send: the reply streams in (the status line says so while its words arrive) and the turn ends ok.
        mock_model.script(slow(STREAMED_WORDS, WORD_DELAY_S))
        mark = tui.mark()
        tui.type("Tell me the Greek letters\r")
        tui.wait_for(re.compile(r"streaming"), since=mark, timeout=STEP_WAIT_S)
        tui.wait_for(STREAMED_WORDS, since=mark, timeout=STEP_WAIT_S)
        wait_until(
            lambda: Run.objects.filter(session__key="agent:main:main", status=RunStatus.OK).count() == 2, STEP_WAIT_S
        )

        # Abort: Escape while the reply streams stops the turn with one chat.abort, accepted as the TUI sent it.
        mock_model.script(slow(ABORTED_WORDS, WORD_DELAY_S))
        mark = tui.mark()
        tui.type("Count for me\r")
        tui.wait_for("word2", since=mark, timeout=STEP_WAIT_S)
        tui.type("\x1b")
        shown = tui.wait_for("run aborted", since=mark, timeout=STEP_WAIT_S)
        wait_until(lambda: latest_run_status("agent:main:main") == RunStatus.ABORTED, STEP_WAIT_S)
        assert "word59" not in tui.text(mark)
        assert rpc_calls(access_log, "chat.abort") == ["ok"], shown[-2000:]

        # /new: a new session, the successor of the one the TUI had open.
        mark = run_command(tui, "/new")
        shown = tui.wait_for(re.compile(r"session tui-[0-9a-f-]+"), since=mark, timeout=STEP_WAIT_S)
        assert "failed" not in shown, shown[-2000:]
        new_session = Session.objects.get(key__startswith="agent:main:tui-")
        assert new_session.parent_session_key == "agent:main:main"

        # /sessions: the picker lists both sessions (OpenClaw's picker cuts keys to 30 characters), the one made
        # over the wire by its label with the aborted reply's words as its last message; picking it switches back.
        mark = run_command(tui, "/sessions")
        shown = tui.wait_for("Main from the wire (main)", since=mark, timeout=STEP_WAIT_S)
        shown = tui.wait_for(new_session.key.removeprefix("agent:main:")[:30], since=mark, timeout=STEP_WAIT_S)
        assert "failed" not in shown, shown[-2000:]
        assert "word0 word1 word2" in shown
        mark = tui.mark()
        tui.type("wire", per_key_s=0.02)
        tui.type("\r")
        tui.wait_for("session main ", since=mark, timeout=STEP_WAIT_S)

        # /models: the picker lists the configured model; picking it sets it on the session (sessions.patch, which
        # OpenClaw's clients send with operator.write).
        mark = run_command(tui, "/models")
        shown = tui.wait_for(MODEL, since=mark, timeout=STEP_WAIT_S)
        assert "failed" not in shown, shown[-2000:]
        tui.type("\r")
        shown = tui.wait_for(re.compile(r"model set (to|failed)"), since=mark, timeout=STEP_WAIT_S)
        assert re.search(rf"model set to \S*{MODEL}", shown), shown[-2000:]
        # The session's next turn asks the provider for that model.
        tui.type("Reply exactly: after the pick\r")
        wait_until(lambda: latest_run_status("agent:main:main") == RunStatus.OK, STEP_WAIT_S)
        assert mock_model.snapshot()["requests"][-1]["model"] == MODEL

        # /status: answered by the gateway (its status card), never sent to the model.
        requests_before = len(mock_model.snapshot()["requests"])
        mark = run_command(tui, "/status")
        shown = tui.wait_for("OpenClaw gateway", since=mark, timeout=STEP_WAIT_S)
        assert f"Model: {MODEL}" in shown or f"/{MODEL}" in shown, shown[-2000:]
        tui.wait_for("connected | idle", since=mark, timeout=STEP_WAIT_S)
        assert len(mock_model.snapshot()["requests"]) == requests_before
